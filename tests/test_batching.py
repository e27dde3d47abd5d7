"""Issue 26, the run's batching: a token budget with length buckets, methods whose cost grows faster than n run on
length-homogeneous parts of a batch where one is cut (the same results), padded inputs gathered at once,
tokenisation ahead on a worker, and no host sync while a batch is queued."""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time

import numpy as np
import pytest
import torch

from conftest import MASK_ID, random_batch, tiny_model
from compute.run.batches import SLACK, Tokenized, batches, encode, parts

HEAVY = ("value_zeroing", "decompx", "decompx_nohead", "alti", "alti_l2", "alti_logit")


def padded_sum(lengths, groups, exponent=1):
    return sum(len(g) * max(lengths[i] for i in g) ** exponent for g in groups)


# --- batches and parts -----------------------------------------------------------------------------------------------
def mixed_lengths(seed=0):
    """60 short sentences and 10 long joined ones (the issue's mixed set), shuffled together."""
    rng = np.random.default_rng(seed)
    lengths = list(rng.integers(8, 45, 60)) + list(rng.integers(150, 170, 10))
    rng.shuffle(lengths)
    return [int(x) for x in lengths]


@pytest.mark.parametrize("exponent", [1, 2])
def test_batches_of_mixed_lengths_pad_little_and_respect_both_bounds(exponent):
    lengths = mixed_lengths()
    out = batches(lengths, 32, 2048, exponent)
    assert sorted(i for b in out for i in b) == list(range(len(lengths)))  # every row once
    for b in out:
        assert [lengths[i] for i in b] == sorted((lengths[i] for i in b), reverse=True)  # longest first
        assert len(b) <= 32 and (len(b) == 1 or len(b) * lengths[b[0]] <= 2048)
        # a length bucket for the run's most length-sensitive method
        assert len(b) * lengths[b[0]] ** exponent <= (1 + SLACK) * sum(lengths[i] ** exponent for i in b)
        assert parts([lengths[i] for i in b], exponent) == [slice(0, len(b))]  # such a batch is one part
    # sorted batches of 32 (the old cut) padded the long examples' batch with short ones: 3x the sum of n^2
    old = [sorted(range(70), key=lambda i: -lengths[i])[k:k + 32] for k in range(0, 70, 32)]
    real = sum(n ** exponent for n in lengths)
    assert padded_sum(lengths, old, exponent) > 1.8 * real and padded_sum(lengths, out, exponent) <= 1.15 * real


def test_a_batch_never_exceeds_the_token_budget_except_one_long_example_alone():
    lengths = [300, 20, 20, 20, 10, 10, 10, 10]
    out = batches(lengths, 100, 64)
    assert out[0] == [0] and all(len(b) * lengths[b[0]] <= 64 for b in out[1:])
    assert batches(lengths, 1, 10**6) == [[i] for i in range(8)]  # --batch-size 1: one example each


@pytest.mark.parametrize("exponent", [1, 2, 3])
def test_parts_pad_a_sorted_batch_by_at_most_the_slack(exponent):
    lengths = sorted(mixed_lengths(1), reverse=True)
    cut = parts(lengths, exponent)
    assert cut[0].start == 0 and cut[-1].stop == len(lengths)
    assert all(a.stop == b.start for a, b in zip(cut, cut[1:]))  # consecutive ranges of rows
    for s in cut:
        part = lengths[s]
        assert len(part) * part[0] ** exponent <= (1 + SLACK) * sum(n ** exponent for n in part)
    capped = parts(lengths, exponent, tokens=200)
    assert all(len(lengths[s]) == 1 or len(lengths[s]) * lengths[s.start] <= 200 for s in capped)


def test_encode_pads_right_like_one_example_at_a_time():
    ids = [[2, 7, 8, 3], [2, 9, 3], [2, 5, 6, 7, 8, 3]]
    tok = Tokenized(ids, [[0] * len(x) for x in ids], None, [[0] * len(x) for x in ids], [len(x) for x in ids])
    enc = encode(tok, [2, 0, 1], pad_id=0, device=torch.device("cpu"))
    assert enc["input_ids"].tolist() == [[2, 5, 6, 7, 8, 3], [2, 7, 8, 3, 0, 0], [2, 9, 3, 0, 0, 0]]
    assert enc["attention_mask"].tolist() == [[1] * 6, [1] * 4 + [0] * 2, [1] * 3 + [0] * 3]
    assert enc["token_type_ids"].tolist() == [[0] * 6] * 3 and enc["input_ids"].dtype == torch.long


# --- a heavy method on parts of a batch gives the whole batch's results -------------------------------------------
def test_every_field_of_a_capture_is_cut_for_a_part():
    from compute.adapters import Captured, adapter_for
    from compute.run.parts import cut_capture

    model = tiny_model("bert", dtype=torch.float32)
    ad = adapter_for(model)
    needs = frozenset({"hidden_states", "attentions", "values", "ln1", "ln2"})
    cap = ad.capture(random_batch("bert", [9, 7, 4]), needs)
    part = cut_capture(cap, slice(1, 3), 7)
    assert part.input_ids.shape == (2, 7) and part.attentions[0].shape[-2:] == (7, 7) and part.memo == {}
    assert part.hidden_states[0].shape == (2, 7, cap.hidden_states[0].shape[-1]) and part.output is None
    torch.testing.assert_close(part.hidden_states[2], cap.hidden_states[2][1:3, :7], rtol=0, atol=0)
    fake = dataclasses.make_dataclass("Later", [("new_thing", object, None)], bases=(Captured,))
    with pytest.raises(TypeError, match="Captured.new_thing"):  # a field added later is not silently left whole
        cut_capture(fake(**{f.name: getattr(cap, f.name) for f in dataclasses.fields(cap)}, new_thing=1),
                    slice(0, 1), 9)


@pytest.mark.parametrize("name", HEAVY)
def test_a_heavy_method_on_parts_equals_the_whole_batch_and_each_example_alone(name):
    """float32, lengths far apart (4 parts): the parts' results put back equal the unsplit batch's and each example
    computed alone, to 1e-5."""
    from compute.adapters import adapter_for
    from compute.methods import get_method
    from compute.run.dispatch import Timings, run_batch
    from compute.tasks import TaskRows, get_task
    from compute.models import LoadedModel

    lengths = [30, 29, 14, 13, 5, 4]
    model = tiny_model("bert", dtype=torch.float32)
    ad = adapter_for(model)
    ad.mask_token_id = MASK_ID
    lm = LoadedModel(model=model, tokenizer=None, adapter=ad, task=get_task("classification"),
                     info={"model_type": "bert"})
    batch = random_batch("bert", lengths)
    m = {name: get_method(name)}
    assert m[name].cost_exponent == 2 and len(parts(lengths, 2)) == 4
    rows = TaskRows.plain([-1] * len(lengths))
    split = run_batch(lm, m, batch, rows, "predicted", 2, "all", Timings(), lengths=lengths)
    whole = run_batch(lm, m, batch, rows, "predicted", 2, "all", Timings())
    for key, x in whole.results[name].items():
        y = split.results[name][key]
        for b, n in enumerate(lengths):
            cut = (b, ..., slice(0, n), slice(0, n)) if key == "matrices" else (b, ..., slice(0, n))
            scale = max(float(np.abs(x[cut]).max()), 1.0)
            np.testing.assert_allclose(y[cut], x[cut], rtol=1e-5, atol=1e-5 * scale, err_msg=f"{name} {key} {b}")
            alone = run_batch(lm, m, {k: v[b:b + 1, :n] for k, v in batch.items()}, TaskRows.plain([-1]),
                              "predicted", 2, "all", Timings())
            np.testing.assert_allclose(y[cut], alone.results[name][key][(0,) + cut[1:]], rtol=1e-5,
                                       atol=1e-5 * scale, err_msg=f"{name} {key} {b} alone")


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_matrices_cls_is_the_explained_row_of_all_cut_on_the_device(arch):
    """--matrices cls keeps each matrix's explained row ([B, L, 1, n], cut before the copy to the host): the row of
    --matrices all at the explained position ([CLS]; a decoder's last real token), also on parts of a batch."""
    from compute.adapters import adapter_for
    from compute.methods import get_method
    from compute.models import LoadedModel
    from compute.run.dispatch import Timings, run_batch
    from compute.tasks import TaskRows, get_task

    lengths = [30, 29, 14, 5]
    model = tiny_model(arch, dtype=torch.float32)
    lm = LoadedModel(model=model, tokenizer=None, adapter=adapter_for(model), task=get_task("classification"),
                     info={"model_type": arch})
    batch = random_batch(arch, lengths)
    methods = {name: get_method(name) for name in ("rollout", "alti")}
    rows = TaskRows.plain([-1] * 4)
    full = run_batch(lm, methods, batch, rows, "predicted", 2, "all", Timings())
    cls = run_batch(lm, methods, batch, rows, "predicted", 2, "cls", Timings(), lengths=lengths)
    pos = full.outcome.explain_pos
    assert pos.tolist() == ([0] * 4 if arch == "bert" else [n - 1 for n in lengths])
    for name in methods:
        got = cls.results[name]["matrices"]
        assert got.shape == (4, 3, 1, 30)
        for b, n in enumerate(lengths):
            np.testing.assert_allclose(got[b, :, 0, :n], full.results[name]["matrices"][b, :, pos[b], :n],
                                       rtol=1e-5, atol=1e-6)


def test_methods_that_grow_faster_than_n_declare_it():
    from compute.methods import REGISTRY

    assert {name for name, m in REGISTRY.items() if m.cost_exponent > 1} == set(HEAVY)


# --- no host sync while a batch is queued ---------------------------------------------------------------------------
def test_launching_a_batch_reads_nothing_back_from_the_device(monkeypatch):
    """Queuing the forward pass, the task's parts and outcome, the methods (stand-ins) on parts of the batch and the
    copies of the results never reads a tensor's value on the host (on a GPU each read waits for every kernel queued
    before it); reading the results does, once. (The model's own forward reads one in transformers 5's mask
    helpers: not this project's code.)"""
    from compute.adapters import adapter_for
    from compute.methods import get_method
    from compute.methods._internals.base import MethodResult
    from compute.models import LoadedModel
    from compute.run.dispatch import Timings, launch_batch
    from compute.tasks import TaskRows, get_task

    model = tiny_model("bert", dtype=torch.float32)
    ad = adapter_for(model)
    lm = LoadedModel(model=model, tokenizer=None, adapter=ad, task=get_task("classification"),
                     info={"model_type": "bert"})
    lengths = [30, 29, 14, 5]
    batch = random_batch("bert", lengths)

    def stand_in(self, cap, adapter, target):
        B, n = cap.input_ids.shape
        return MethodResult(scores=cap.mask.float() * target[:, None],
                            layer_scores=torch.ones(B, adapter.n_layers, n), matrices=torch.ones(B, 3, n, n))

    methods = {name: get_method(name) for name in ("rollout", "alti", "decompx")}
    for m in methods.values():
        monkeypatch.setattr(type(m), "compute", stand_in)
    read = []  # where code of this project (compute/) read a tensor's value (the model's library is not ours)
    for attr in ("item", "tolist", "cpu", "__bool__", "__int__", "__float__"):
        real = getattr(torch.Tensor, attr)

        def spy(self, *a, _attr=attr, _real=real, **k):
            caller = sys._getframe(1).f_code.co_filename
            if f"{os.sep}compute{os.sep}" in caller:
                read.append((_attr, caller))
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, attr, spy)
    for target in ("predicted", "label"):
        rows = TaskRows.plain([1, 0, 1, 0])
        pending = launch_batch(lm, methods, batch, rows, target, 2, "cls", Timings(), lengths=lengths)
        assert read == [], target
        out = pending.result()
        assert out.results["alti"]["scores"].shape == (4, 30) and list(out.outcome.pred.shape) == [4]


# --- tokenisation ahead on a worker ----------------------------------------------------------------------------------
def test_ahead_makes_items_on_a_worker_in_order_and_raises_its_error_in_the_consumer():
    from compute.ahead import ahead

    threads = []

    def items(fail_at=None):
        for i in range(5):
            threads.append(threading.current_thread().name)
            if i == fail_at:
                raise ValueError("bad row 3")
            yield i

    assert list(ahead(items())) == [0, 1, 2, 3, 4] and set(threads) == {"attrscope-ahead"}
    got = []
    with pytest.raises(ValueError, match="bad row 3"):
        for x in ahead(items(fail_at=3)):
            got.append(x)
    assert got == [0, 1, 2]

    made = []

    def slow():
        for i in range(100):
            made.append(i)
            time.sleep(0.01)
            yield i

    it = ahead(slow(), depth=1)
    assert next(it) == 0
    it.close()  # the consumer stops early: the worker stops too, after at most its current item and the queue's
    time.sleep(0.1)
    assert len(made) <= 4


def test_methods_cut_into_parts_run_part_by_part_and_free_each_part(monkeypatch):
    """With a part budget (auto on CUDA) a quadratic method runs part by part; the methods of one cut share each
    part's capture, made once, and a part's capture is gone before the next one is made (memory: the batch and one
    part). The results equal the whole batch's."""
    import gc
    import weakref

    import compute.run.dispatch as dispatch
    from compute.adapters import adapter_for
    from compute.methods import get_method
    from compute.models import LoadedModel
    from compute.run.dispatch import Timings, run_batch
    from compute.tasks import TaskRows, get_task

    lengths = [12] * 6
    model = tiny_model("bert", dtype=torch.float32)
    lm = LoadedModel(model=model, tokenizer=None, adapter=adapter_for(model), task=get_task("classification"),
                     info={"model_type": "bert"})
    batch = random_batch("bert", lengths)
    methods = {name: get_method(name) for name in ("rollout", "alti", "alti_logit")}
    made, alive = [], []
    cut = dispatch.cut_capture

    def spy(cap, rows, n):
        part = cut(cap, rows, n)
        gc.collect()
        alive.append(sum(r() is not None for r in made))  # earlier parts still held when this one is made
        made.append(weakref.ref(part))
        return part

    monkeypatch.setattr(dispatch, "cut_capture", spy)
    rows = TaskRows.plain([-1] * 6)
    got = run_batch(lm, methods, batch, rows, "predicted", 2, "cls", Timings(), lengths=lengths,
                    part_tokens={"alti": 24, "alti_logit": 24})
    assert len(made) == 3 and alive == [0, 0, 0]  # 3 parts of 2 examples, shared by alti and alti_logit
    whole = run_batch(lm, methods, batch, rows, "predicted", 2, "cls", Timings())
    for name in methods:
        for key, x in whole.results[name].items():
            np.testing.assert_allclose(got.results[name][key], x, rtol=1e-5, atol=1e-6, err_msg=f"{name} {key}")


@pytest.mark.parametrize("lengths", [None, [30, 29, 14, 13, 5, 4]], ids=["whole", "parts"])
def test_methods_of_a_batch_share_their_passes(monkeypatch, lengths):
    """Issue 38.13: ig_l2 and ig_mean of one batch walk the integration path once (one forward with grad, one
    backward), and grad_l2, gxi_l2, cat, attcat share one backward: every method of a batch is given the same target
    tensor (per-target results are memoised by its identity, base.Same). With ``lengths`` an n^2 method (alti) cuts
    the batch into parts beside them."""
    import compute.methods._internals.gradients as G
    from compute.adapters import adapter_for
    from compute.methods import get_method
    from compute.models import LoadedModel
    from compute.run.dispatch import Timings, run_batch
    from compute.tasks import TaskRows, get_task

    lens = lengths or [9, 7, 5, 3]
    model = tiny_model("bert", dtype=torch.float32)
    ad = adapter_for(model)
    ad.mask_token_id = MASK_ID
    lm = LoadedModel(model=model, tokenizer=None, adapter=ad, task=get_task("classification"),
                     info={"model_type": "bert"})
    batch = random_batch("bert", lens)
    rows = TaskRows.plain([-1] * len(lens))
    backwards, forwards = [], []
    real = G.output_grads
    monkeypatch.setattr(G, "output_grads", lambda *a, **k: backwards.append(1) or real(*a, **k))
    handle = model.register_forward_hook(lambda m, i, o: forwards.append(torch.is_grad_enabled()))

    def passes(names):
        backwards.clear()
        forwards.clear()
        out = run_batch(lm, {n: get_method(n, **({"steps": 4} if n.startswith("ig") else {})) for n in names},
                        batch, rows, "predicted", 2, "cls", Timings(), lengths=lengths)
        return out, len(backwards), forwards.count(True)

    try:
        extra = ["alti"] if lengths else []
        _, ig_back, ig_fwd = passes(["ig_l2"] + extra)
        both, back, fwd = passes(["ig_l2", "ig_mean"] + extra)
        assert (back, fwd) == (ig_back, ig_fwd) == (1, 1)  # ig_mean costs no pass of its own
        alone = passes(["ig_mean"] + extra)[0]
        for key, x in alone.results["ig_mean"].items():
            np.testing.assert_array_equal(both.results["ig_mean"][key], x)
        _, grad_back, grad_fwd = passes(["grad_l2", "gxi_l2", "cat", "attcat"] + extra)
        assert (grad_back, grad_fwd) == (1, 1)
    finally:
        handle.remove()
