"""Small generation stores (task "generate", format 2.0) written with StoreWriter directly (numpy only): the store
tests check their round trip, the TUI tests draw them, so neither depends on a model run."""

from __future__ import annotations

import numpy as np

from store import ExampleData, MethodLayout, StoreWriter

L = 2
LABELS = {0: "target", 1: "foil"}
TASK = {"name": "generate", "options": {"max_new_tokens": 6}}

# (prompt tokens, generated tokens, foil of each step or None) per example; GPT-2 style strings.
PROMPTS = [
    (["The", "Ġcat", "Ġsat", "Ġon"], ["Ġthe", "Ġmat", "."], ["Ġa", "Ġbed", "!"]),
    (["Paris", "Ġis", "Ġthe", "Ġcapital", "Ġof"], ["ĠFrance", ",", "Ġand", "Ġit", "Ġis", "Ġbig"], None),
    (["Hello"], [], None),  # EOS at the first step: T = 0
    (["A", "Ġfilm", "Ġthat"], ["Ġbores", "Ġand", "Ġdrags"], None),
]


def layouts() -> list[MethodLayout]:
    return [MethodLayout("attention", signed=False, n_layer_views=L, matrices="all", n_matrix_layers=L,
                         description="last layer attention", params={"store_dtype": "float32"}),
            MethodLayout("grad", signed=True, description="gradient"),
            MethodLayout("ig", signed=True, example_values=("ig_delta",), description="integrated gradients")]


def generation_examples(seed: int = 0) -> list[ExampleData]:
    """The examples of PROMPTS, every step array filled everywhere (the writer stores NaN after each step's
    position)."""
    rng = np.random.default_rng(seed)
    out = []
    for i, (prompt, generated, foils) in enumerate(PROMPTS):
        tokens = prompt + generated
        n, P, T = len(tokens), len(prompt), len(generated)
        text = "".join(t.replace("Ġ", " ") for t in prompt)
        starts = np.cumsum([0] + [len(t) for t in tokens[:-1]])
        spans = np.stack([starts, starts + [len(t) for t in tokens]], axis=1)
        res = {"attention": {"step_scores": rng.random((T, n)), "step_layer_scores": rng.random((T, L, n)),
                             "matrices": rng.random((L, n, n))},
               "grad": {"step_scores": rng.normal(size=(T, n))},
               "ig": {"step_scores": rng.normal(size=(T, n)),
                      "example_values": {"ig_delta": rng.normal(size=T) * 1e-3}}}
        probs = rng.uniform(0.2, 0.9, size=T)
        fields = {}
        if foils is not None:
            fields = dict(step_foil_tokens=np.arange(T) + 900, step_foil_probs=probs * 0.5,
                          task_info={"foils": list(foils)})
        out.append(ExampleData(row=i, id=f"gen{i}", text=text, pair=None, token_ids=np.arange(n) + 100 * i,
                               tokens=tokens, spans=spans, segment=np.zeros(n, dtype=np.int8), label=-1, pred=0,
                               probs=np.array([np.nan, np.nan]), target=0, explain_pos=P - 1, n_orig_tokens=n,
                               truncated=False, prompt_len=P, step_probs=probs,
                               step_outputs=np.log(probs) + 3.0, results=res, **fields))
    return out


def write_generation_store(path, examples: list[ExampleData] | None = None, *, complete: bool = True,
                           methods: list[MethodLayout] | None = None) -> list[ExampleData]:
    """A generation store at ``path`` holding ``examples`` (default: generation_examples()), committed in two
    windows; returns them."""
    exs = generation_examples() if examples is None else examples
    w = StoreWriter.create(str(path), n_layers=L, n_heads=2, labels=LABELS, methods=methods or layouts(),
                           provenance={"task": "generate"}, attrs={"model_id": "tiny-gpt2"}, task=TASK)
    w.append(exs[:2])
    w.append(exs[2:])
    w.close(complete=complete, summary={"examples": len(exs)} if complete else None)
    return exs
