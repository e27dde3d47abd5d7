"""Small stores of every task (format 1.4), written with StoreWriter directly (numpy only): the store tests check
their round trip, the TUI tests draw them."""

from __future__ import annotations

import math

import numpy as np

from store import ExampleData, MethodLayout, StoreWriter

L = 2
LABELS = {
    "classification": {0: "negative", 1: "positive"},
    "regression": {0: "value"},
    "masked-token": {0: "target", 1: "foil"},
    "next-token": {0: "target", 1: "foil"},
    "qa": {0: "start", 1: "end"},
}
OPTIONS = {"regression": {"regression_rank": "ascending"}}

# (tokens, task words, target token id, foil token id) of the language model examples; the explained position is
# the [MASK] (masked-token) or the last token (next-token).
MASKED = [
    (["[CLS]", "the", "keys", "to", "the", "cabinet", "[MASK]", "on", "the", "table", ".", "[SEP]"],
     {"target": "are", "foil": "is"}, 2024, 2003),
    (["[CLS]", "the", "author", "[MASK]", "a", "novel", ".", "[SEP]"], {"target": "wrote"}, 2626, -1),
    (["[CLS]", "dogs", "[MASK]", "loudly", ".", "[SEP]"], {"target": "bark", "foil": "barks"}, 11286, 27693),
]
NEXT = [
    (["The", "Ġcat", "Ġsat", "Ġon", "Ġthe"], {"target": " mat", "foil": " moon"}, 2603, 8824),
    (["Paris", "Ġis", "Ġthe", "Ġcapital", "Ġof"], {"target": " France"}, 4881, -1),
]
# (question tokens, context tokens, explained span (start, end), predicted span, answer) of the qa examples; token
# positions count [CLS] question [SEP] context [SEP].
QA = [
    (["who", "won", "?"], ["the", "denver", "broncos", "won", "the", "game", "."], (6, 7), (6, 7), "Denver Broncos"),
    (["where", "is", "it", "?"], ["it", "lies", "in", "northern", "france", "."], (9, 10), (10, 10),
     "northern France"),
]


def _example(i: int, tokens: list[str], n_layers: int, **fields) -> ExampleData:
    rng = np.random.default_rng(500 + i)
    n = len(tokens)
    spans = np.stack([np.arange(n), np.arange(n) + 1], axis=1)
    segment = fields.pop("segment", np.zeros(n, dtype=np.int8))
    text = fields.pop("text", " ".join(t.lstrip("Ġ") for t in tokens if not t.startswith("[")))
    res = {"rollout": {"scores": rng.random(n), "layer_scores": rng.random((n_layers, n))},
           "grad": {"scores": rng.normal(size=n)}}
    base = dict(row=i, id=f"ex{i}", text=text, pair=None, token_ids=np.arange(n) + 100 * i, tokens=tokens,
                spans=spans, segment=segment, label=-1, pred=0, target=0, explain_pos=0, n_orig_tokens=n,
                truncated=False, results=res)
    base.update(fields)
    return ExampleData(**base)


def task_examples(task: str) -> list[ExampleData]:
    """The examples of one task, every task field set as attr-compute sets it (docs/store.md)."""
    out = []
    if task == "classification":
        for i, words in enumerate([["a", "fine", "film"], ["dull", "and", "long"]]):
            tokens = ["[CLS]", *words, "[SEP]"]
            out.append(_example(i, tokens, L, label=i, pred=1, target=1, probs=np.array([0.3, 0.7]),
                                output=1.25 - i))
    elif task == "regression":
        for i, (words, value, gold) in enumerate([(["a", "fine", "film"], 3.75, 4.0),
                                                   (["dull", "and", "long"], -0.5, math.nan)]):
            tokens = ["[CLS]", *words, "[SEP]"]
            out.append(_example(i, tokens, L, probs=np.array([value]), output=value, gold_value=gold))
    elif task in ("masked-token", "next-token"):
        for i, (tokens, words, target, foil) in enumerate(MASKED if task == "masked-token" else NEXT):
            pos = tokens.index("[MASK]") if task == "masked-token" else len(tokens) - 1
            p_target = 0.6 - 0.2 * i
            p_foil = 0.1 + 0.15 * i if foil >= 0 else math.nan
            # output: target logit minus foil logit, or the target logit without a foil
            output = math.log(p_target / p_foil) if foil >= 0 else 7.5
            if i == 2:
                output = -0.25  # the model prefers the foil
            out.append(_example(i, list(tokens), L, explain_pos=pos, target_token=target, foil_token=foil,
                                probs=np.array([p_target, p_foil]), output=output, task_info=words))
    elif task == "qa":
        for i, (question, context, (s, e), (ps, pe), answer) in enumerate(QA):
            tokens = ["[CLS]", *question, "[SEP]", *context, "[SEP]"]
            n = len(tokens)
            segment = np.array([-1] + [0] * len(question) + [-1] + [1] * len(context) + [-1], dtype=np.int8)
            evidence = np.zeros(n, dtype=bool)
            evidence[s:e + 1] = True  # the gold answer's tokens
            out.append(_example(i, tokens, L, text=" ".join(question), pair=" ".join(context), segment=segment,
                                explain_pos=s, span_end=e, pred=ps, pred_end=pe, probs=np.array([0.8, 0.55]),
                                output=9.5 - i, evidence=evidence, task_info={"answer": answer}))
    else:
        raise ValueError(task)
    return out


def layouts() -> list[MethodLayout]:
    return [MethodLayout("rollout", signed=False, n_layer_views=L, description="rollout"),
            MethodLayout("grad", signed=True, description="gradient")]


def write_task_store(path, task: str, examples: list[ExampleData] | None = None, *, complete: bool = True,
                     task_attr: bool = True) -> list[ExampleData]:
    """A store of ``task`` at ``path`` holding ``examples`` (default: task_examples(task)); returns them."""
    exs = task_examples(task) if examples is None else examples
    w = StoreWriter.create(str(path), n_layers=L, n_heads=2, labels=LABELS[task], methods=layouts(),
                           provenance={"task": task}, attrs={"model_id": f"tiny-{task}"},
                           evidence=task == "qa",
                           task={"name": task, "options": OPTIONS.get(task, {})} if task_attr else None)
    w.append(exs)
    w.close(complete=complete, summary={"examples": len(exs)} if complete else None)
    return exs
