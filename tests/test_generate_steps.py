"""--task generate, step by step (compute/run/steps.py): for every method, step t of a batch of generations equals a
next-token explanation of the prefix (prompt + the first t generated tokens) with the generated token as target,
to 1e-5 of the scale, on tiny random Llama and GPT-2 models in float64 and 12 prompts; also contrasted with each
step's runner-up (top2) and with given foils."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from compute.adapters import adapter_for
from compute.errors import AttrscopeError
from compute.methods import REGISTRY, get_method
from compute.models import LoadedModel
from compute.run.dispatch import Timings, launch_steps_batch, run_batch
from compute.run.steps import Steps
from compute.tasks import TaskRows, get_task
from conftest import MASK_ID, tiny_task_model

# 12 prompts: their lengths and how many tokens each generated (0: EOS came first)
PROMPTS = [3, 7, 1, 5, 9, 4, 6, 2, 8, 5, 3, 10]
STEPS = [4, 2, 3, 0, 1, 4, 3, 2, 1, 3, 4, 2]
# mask_lrp's head mask (2 layers x 4 heads) given, as its head-statistics pass would give one
PARAMS = {"ig_l2": {"steps": 4}, "ig_mean": {"steps": 4},
          "mask_lrp": {"head_mask": np.array([[1, 0, 1, 1], [0, 1, 1, 0]], dtype=np.float64)}}


@functools.cache
def loaded(arch: str) -> LoadedModel:
    """The tiny model of ``arch`` (2 layers: a first and a last one, where the methods differ), made once."""
    model = tiny_task_model(arch, "next-token", seed=3, layers=2)
    ad = adapter_for(model, "next-token")
    ad.mask_token_id = MASK_ID
    return LoadedModel(model=model, tokenizer=None, adapter=ad, task=get_task("next-token"),
                       info={"model_type": arch})


def every_method(adapter) -> list[str]:
    out = []
    for name in REGISTRY:
        m = get_method(name, **PARAMS.get(name, {}))
        try:
            m.check_task("next-token")
            m.check_architecture(adapter)
        except AttrscopeError:
            continue
        out.append(name)
    return out


def generations(seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(5, 120, (p,), generator=g).tolist() for p in PROMPTS]
    made = [torch.randint(5, 120, (t,), generator=g).tolist() for t in STEPS]
    foils = [torch.randint(5, 120, (t,), generator=g).tolist() for t in STEPS]
    return prompts, made, foils


def step_segments(prompts, made) -> int:
    """How many segments the gradient methods' forward runs in (gradients.StepForward): from each step index's
    furthest explained position + 1 over the examples that have that step."""
    from compute.methods._internals.gradients import cut_columns

    need = [max(len(p) + k for p, g in zip(prompts, made) if len(g) > k) for k in range(max(map(len, made)))]
    return len(cut_columns(sorted(set(need))))


def padded(seqs: list[list[int]]) -> dict:
    n = max(map(len, seqs))
    ids = torch.zeros(len(seqs), n, dtype=torch.long)
    mask = torch.zeros(len(seqs), n, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = torch.as_tensor(s)
        mask[b, :len(s)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def prefixes_run(lm, names, prompts, made, foils):
    """The reference: every step's prefix as one example of a next-token batch, its generated token the target."""
    seqs, rows = [], TaskRows.plain([])
    for p, gen, foil in zip(prompts, made, foils):
        for t, tok in enumerate(gen):
            seqs.append(p + gen[:t])
            rows = TaskRows(**{k: getattr(rows, k) + getattr(TaskRows.plain([-1]), k) for k in
                               TaskRows.__dataclass_fields__})
            rows.position[-1], rows.target_token[-1] = len(seqs[-1]) - 1, tok
            rows.foil_token[-1] = -1 if foil is None else foil[t]
    methods = {n: get_method(n, **PARAMS.get(n, {})) for n in names}
    return seqs, run_batch(lm, methods, padded(seqs), rows, "label", 2, "cls", Timings())


def steps_run(lm, names, prompts, made, foils, contrast):
    methods = {n: get_method(n, **PARAMS.get(n, {})) for n in names}
    steps = Steps.of([len(p) for p in prompts], made, foils, torch.device("cpu"))
    enc = padded([p + g for p, g in zip(prompts, made)])
    return steps, launch_steps_batch(lm, methods, enc, steps, contrast, "cls", Timings()).result()


def assert_steps_equal_prefixes(names, ref, got, seqs, steps):
    assert got.outcome.explain_pos.tolist() == ref.outcome.explain_pos.tolist()
    for key in ("target_token", "foil_token", "pred"):
        assert np.asarray(got.outcome.__dict__[key]).tolist() == np.asarray(ref.outcome.__dict__[key]).tolist(), key
    np.testing.assert_allclose(got.outcome.output, ref.outcome.output, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got.outcome.probs, ref.outcome.probs, rtol=1e-5, atol=1e-9)
    first = np.cumsum([0] + steps.counts)[:-1]  # each example's step 0: its prompt alone
    for name in names:
        if "matrices" in ref.results[name]:  # per example: a class-independent method's pass, its prompt's last row
            have = got.results[name].get("matrices")
            assert (have is None) == REGISTRY[name].class_specific, name
            for b, (r, c) in enumerate(zip(first, steps.counts)):
                if have is not None and c:
                    k = len(seqs[r])
                    np.testing.assert_allclose(have[b][..., :k], ref.results[name]["matrices"][r][..., :k],
                                               rtol=0, atol=1e-5 * max(float(np.abs(have[b]).max()), 1e-30))
                    assert (have[b][..., k:] == 0).all(), name
        for key, want in ref.results[name].items():
            if key == "matrices":
                continue
            have = got.results[name][key]
            for r, s in enumerate(seqs):
                k = len(s)
                w, h = want[r][..., :k], have[r]
                scale = max(float(np.abs(w).max()), 1e-30)
                assert (h[..., k:] == 0).all(), (name, key, r)  # nothing after the step's position
                np.testing.assert_allclose(h[..., :k], w, rtol=0, atol=1e-5 * scale, err_msg=f"{name} {key} step row {r}")
        for key, want in ref.values[name].items():
            np.testing.assert_allclose(got.values[name][key], want, rtol=1e-5, atol=1e-7, err_msg=f"{name} {key}")


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_every_step_equals_the_next_token_run_on_its_prefix(arch):
    lm = loaded(arch)
    names = every_method(lm.adapter)
    assert len(names) >= 20, names
    prompts, made, _ = generations()
    seqs, ref = prefixes_run(lm, names, prompts, made, [None] * len(made))
    steps, got = steps_run(lm, names, prompts, made, None, None)
    assert steps.counts == STEPS and len(seqs) == sum(STEPS)
    assert (np.asarray(got.outcome.foil_token) == -1).all()
    assert_steps_equal_prefixes(names, ref, got, seqs, steps)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("contrast", ["top2", "column"])
def test_contrasted_steps_equal_the_foil_runs_on_their_prefixes(arch, contrast):
    """--contrast top2: each step against its runner-up (the most probable other token, read off the step's
    logits); --contrast-column: against the given foils; both equal the next-token run with that foil. The
    class-specific methods: the others do not read the foil (their steps are the uncontrasted test's)."""
    lm = loaded(arch)
    names = [n for n in every_method(lm.adapter) if REGISTRY[n].class_specific]
    assert len(names) >= 15, names
    prompts, made, foils = generations()
    steps, got = steps_run(lm, names, prompts, made, foils if contrast == "column" else None, contrast)
    per_step = np.asarray(got.outcome.foil_token)
    if contrast == "top2":  # the runner-up: the argmax of the step's logits without the generated token
        seqs = [p + g[:t] for p, g in zip(prompts, made) for t in range(len(g))]
        with torch.no_grad():
            logits = lm.model(**padded(seqs)).logits
        at = logits[torch.arange(len(seqs)), torch.as_tensor([len(s) - 1 for s in seqs])]
        at[torch.arange(len(seqs)), steps.target] = float("-inf")
        assert per_step.tolist() == at.argmax(-1).tolist()
    else:
        assert per_step.tolist() == [f for row in foils for f in row]
    it = iter(per_step.tolist())
    step_foils = [[next(it) for _ in g] for g in made]
    seqs, ref = prefixes_run(lm, names, prompts, made, step_foils)
    assert_steps_equal_prefixes(names, ref, got, seqs, steps)


def forward_rows(lm, run) -> list[int]:
    """The rows of every forward of ``lm``'s model while ``run()`` runs."""
    seen = []

    def hook(_m, args, kwargs):
        x = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs.get("inputs_embeds")
        seen.append(int((x if x is not None else args[0]).shape[0]))

    h = lm.model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        run()
    finally:
        h.remove()
    return seen


def test_gradients_and_integrated_gradients_share_one_forward_for_every_step():
    """The input-gradient methods and integrated gradients run their forward on the B sequences (the path's B x
    (steps + 2) rows), never on the R step rows: the steps share it (in segments of columns), one backward per step
    index."""
    lm = loaded("llama")
    prompts, made, _ = generations()
    B, R = len(prompts), sum(STEPS)
    seen = forward_rows(lm, lambda: steps_run(lm, ["grad_l2", "gxi_mean", "gxi_l2", "ig_l2", "ig_mean"], prompts,
                                              made, None, "top2"))
    path = B * (PARAMS["ig_l2"]["steps"] + 2)
    assert set(seen) == {B, path}, seen
    assert seen.count(path) == step_segments(prompts, made) > 1  # ig_l2 and ig_mean share the integration


def test_decompx_reads_every_step_off_the_one_pass(monkeypatch):
    """decompx and decompx_nohead decompose the pass over the B sequences once (each step's rows read off it),
    not the R step rows."""
    from compute.methods._internals import token_vectors

    lm = loaded("llama")
    prompts, made, _ = generations()
    stacked = []
    real = token_vectors.Layers.__init__

    def spy(self, cap, ad):  # the layers a propagation reads
        stacked.append(cap.mask.shape[0])
        real(self, cap, ad)

    monkeypatch.setattr(token_vectors.Layers, "__init__", spy)
    steps_run(lm, ["decompx", "decompx_nohead"], prompts, made, None, None)
    assert stacked == [len(prompts)]


@pytest.mark.parametrize("rows", [1, 5, 13])
def test_integrated_gradients_of_steps_do_not_depend_on_the_rows_of_a_pass(monkeypatch, rows):
    """The CPU's integration passes are capped at the rows whose one layer fits gradients.CPU_CACHE_BYTES (faster
    than one pass of every row): the steps' attributions and deltas are those of one pass of all 72 path rows, to
    1e-10 in float64, with ``rows`` rows a pass (the last pass shorter)."""
    from compute.methods._internals import gradients

    lm = loaded("llama")
    prompts, made, _ = generations()
    names = ["ig_l2", "ig_mean"]
    one_pass = forward_rows(lm, lambda: steps_run(lm, names, prompts, made, None, None))
    _, whole = steps_run(lm, names, prompts, made, None, None)
    n = max(len(p) + len(g) for p, g in zip(prompts, made))
    layer = gradients.row_bytes(lm.adapter, n, 8) // lm.adapter.n_layers
    monkeypatch.setattr(gradients, "CPU_CACHE_BYTES", rows * layer)
    assert gradients.cpu_cache_rows(lm.adapter, n, 8) == rows
    path = len(prompts) * (PARAMS["ig_l2"]["steps"] + 2)
    seen = forward_rows(lm, lambda: steps_run(lm, names, prompts, made, None, None))
    segments = step_segments(prompts, made)  # a forward per segment of columns
    assert [s for s in one_pass if s != len(prompts)] == [path] * segments
    chunks = [rows] * (path // rows) + [path % rows] * (path % rows > 0)
    assert [s for s in seen if s != len(prompts)] == [c for c in chunks for _ in range(segments)]
    _, got = steps_run(lm, names, prompts, made, None, None)
    for name in names:
        for key, want in whole.results[name].items():
            for r, (w, h) in enumerate(zip(want, got.results[name][key])):
                np.testing.assert_allclose(h, w, rtol=0, atol=1e-10 * max(float(np.abs(w).max()), 1e-30),
                                           err_msg=f"{name} {key} step row {r}")
        for key, want in whole.values[name].items():
            np.testing.assert_allclose(got.values[name][key], want, rtol=0, atol=1e-10, err_msg=f"{name} {key}")
