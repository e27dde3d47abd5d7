"""DecompX on long inputs (issue 36): where the float32 stack of every layer's attention would exceed the block budget
the capture keeps each layer's attention as the forward made it (the model's dtype, one tensor a layer) and the
propagation builds a layer's step (its attention widened, its weights cast to float32) when it reaches it. The
numbers are the stacked path's; no float32 stack of every layer's attention or feed-forward weights is made."""

from __future__ import annotations

import pytest
import torch
from conftest import random_batch, tiny_model
from tensors_made import Made

from compute.adapters import adapter_for
from compute.methods import get_method

LENGTHS = [9, 4, 7, 2]
METHODS = ("decompx", "decompx_nohead")


def _narrow(monkeypatch):
    """Every capture above the block budget (the long-input path at test sizes)."""
    import compute.methods._internals.budget as budget

    monkeypatch.setattr(budget, "CPU_STACK_BYTES", 1)


def _results(ad, batch, classes: bool):
    """Each method's scores and layer views (and decompx's every class where the model has a sequence head), and
    the captures."""
    out, caps = {}, []
    for name in METHODS:
        m = get_method(name)
        with torch.no_grad():
            cap = ad.capture(batch, m.needs)
            res = m.compute(cap, ad, torch.zeros(len(LENGTHS), dtype=torch.long))
            out[name] = [res.scores, res.layer_scores]
            if classes and name == "decompx":
                out[name].append(m.compute_classes(cap, ad, 2))
        caps.append(cap)
    return out, caps


@pytest.mark.parametrize("k", [None, 3])
@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_the_narrow_capture_gives_the_stacked_results(arch, k, monkeypatch):
    """BERT (post-LN) and Llama (pre-LN) in float64, a padded batch, whole and in blocks of 3 source tokens (each
    layer's step rebuilt for every block): both methods' scores, layer views and every class equal the stacked
    capture's to 1e-10 of their scale; the narrow capture made no stack of the attentions."""
    import compute.methods._internals.token_vectors as tv

    if k is not None:
        monkeypatch.setattr(tv, "source_blocks", lambda *a: k)
    model = tiny_model(arch, layers=3)
    ad = adapter_for(model)
    batch = random_batch(arch, LENGTHS)
    stacked, caps = _results(ad, batch, arch == "bert")
    assert all("attentions" in cap.stacks for cap in caps)  # below the budget: today's stacks
    _narrow(monkeypatch)
    narrow, caps = _results(ad, batch, arch == "bert")
    for cap in caps:
        assert "attentions" not in cap.stacks and len(cap.attentions) == 3
        assert len({a.untyped_storage().data_ptr() for a in cap.attentions}) == 3  # one tensor a layer
    for name in METHODS:
        for got, want in zip(narrow[name], stacked[name], strict=True):
            scale = want.abs().max()
            assert scale > 0
            torch.testing.assert_close(got, want, rtol=0, atol=1e-10 * scale)


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_a_bfloat16_model_widens_one_layer_at_a_time(arch, name, monkeypatch):
    """A bfloat16 BERT and Llama above the block budget: the capture keeps the attentions in bfloat16, one tensor a
    layer; no float32 tensor holds more than one layer's [B, H, n, n] attention, or more than one layer's
    feed-forward weights; each layer's attention is widened (float32 [B H, n, n] made) when the propagation reaches
    it."""
    _narrow(monkeypatch)
    L = 3
    model = tiny_model(arch, layers=L, dtype=torch.bfloat16)
    ad = adapter_for(model)
    batch = random_batch(arch, LENGTHS)
    B, n = batch["input_ids"].shape
    cfg = model.config
    H, d, d_ff = cfg.num_attention_heads, cfg.hidden_size, cfg.intermediate_size
    m = get_method(name)
    with torch.no_grad(), Made() as spy:
        cap = ad.capture(batch, m.needs)
        res = m.compute(cap, ad, torch.zeros(B, dtype=torch.long))
    assert "attentions" not in cap.stacks and {a.dtype for a in cap.attentions} == {torch.bfloat16}
    assert res.layer_scores.dtype == torch.float32 and torch.isfinite(res.layer_scores).all()
    wide = [shape for shape, dtype in spy.made if dtype == torch.float32]
    attention = [s for s in wide if s[-2:] == (n, n) and len(s) >= 3]
    assert attention and all(torch.Size(s).numel() <= B * H * n * n for s in attention)
    ffn = [s for s in wide if sorted(s[-2:]) == sorted((d, d_ff))]
    assert ffn and all(len(s) == 2 or s[0] == 1 for s in ffn)


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_a_padded_batch_is_propagated_an_example_at_a_time_at_its_length(arch, monkeypatch):
    """A right-padded batch long enough to trim (TRIM_TOKENS lowered to the test's size): each example goes through
    the layers alone at its real length, and both methods' scores, layer views and every class equal the whole
    padded batch's to 1e-10 of their scale (float64), padded sources 0; whole and in blocks of 3 source tokens."""
    import compute.methods._internals.token_vectors as tv

    model = tiny_model(arch, layers=3)
    ad = adapter_for(model)
    batch = random_batch(arch, LENGTHS)
    monkeypatch.setattr(tv, "TRIM_TOKENS", 10 ** 9)
    whole, _ = _results(ad, batch, arch == "bert")
    monkeypatch.setattr(tv, "TRIM_TOKENS", 1)
    seen = []
    for run in ("_propagate_post_ln", "_propagate_pre_ln"):
        def spy(cap, adapter, src, *a, _run=getattr(tv, run)):
            seen.append((src.B, src.n))
            return _run(cap, adapter, src, *a)
        monkeypatch.setattr(tv, run, spy)
    for k in (None, 3):
        if k is not None:
            monkeypatch.setattr(tv, "source_blocks", lambda *a: k)
        seen.clear()
        trimmed, _ = _results(ad, batch, arch == "bert")
        assert seen == [(1, m) for m in LENGTHS] * len(METHODS)
        for name in METHODS:
            for got, want in zip(trimmed[name], whole[name], strict=True):
                scale = want.abs().max()
                assert scale > 0
                torch.testing.assert_close(got, want, rtol=0, atol=1e-10 * scale)
            for b, m in enumerate(LENGTHS):
                assert not trimmed[name][0][b, m:].any() and not trimmed[name][1][b, :, m:].any()


def test_short_unpadded_or_gpu_batches_are_propagated_at_once():
    """The batch at once: below TRIM_TOKENS, without padding, with padding before the real tokens, a row asked for
    in the padding, padding within TRIM_WASTE of the work, or on a GPU."""
    from compute.methods._internals.token_vectors import TRIM_TOKENS, _trim

    n = TRIM_TOKENS
    right = torch.arange(n) < torch.tensor([n, n // 2])[:, None]
    e = torch.zeros(2, 1, dtype=torch.long)
    assert _trim(right, e) == [n, n // 2]
    assert _trim(right[:, :n - 1], e) is None  # short
    assert _trim(torch.ones(2, n, dtype=torch.bool), e) is None
    assert _trim(right.flip(1), e) is None  # left padding
    assert _trim(right, torch.tensor([[0], [n - 1]])) is None
    assert _trim(torch.arange(n) < torch.tensor([n, n - 1])[:, None], e) is None  # 1.6% of the work
    assert _trim(right[:1], e[:1]) is None
    assert _trim(right.to("meta"), e.to("meta")) is None
