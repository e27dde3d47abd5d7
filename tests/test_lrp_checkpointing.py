"""The LRP family and AttnLRP on decoders, checkpointed (issue 36): where the plain pass (float64, over the doubled
batch for transatt and mask_lrp) would exceed the pass's memory, every layer is recomputed in the backward with the
rules' hooks in place (a float32 model's layer widened inside its recomputation too), and each layer's R^{A,l} (and
the plain dF/dA) are reduced in backward hooks to the [n, n] maps the methods keep; below it the plain pass (the op
budgets). Both give the same numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import captured_tiny

from compute.methods import get_method
from compute.methods._internals import gradients

MASK = np.array([[1, 0, 1, 1], [0, 1, 1, 0], [1, 1, 0, 1]], dtype=np.float64)
VARIANTS = [("lrp", {}), ("partial_lrp", {}), ("transatt", {}), ("attnlrp", {}),
            ("mask_lrp", {"head_mask": MASK}), ("mask_lrp", {"head_mask": MASK, "rollout_uses_masked": True}),
            ("mask_lrp", {"head_mask": MASK, "rollout_unhalved": True})]


def checkpointed(monkeypatch):
    monkeypatch.setattr(gradients, "IG_CPU_BYTES", 0)  # every pass beyond its memory: checkpointed


def fresh(cap, m):
    """A copy with its own memo, declaring the method's passes as a run does."""
    return type(cap)(**{**cap.__dict__, "memo": {}, "stacks": {}, "passes": m.passes})


def the_passes(cap):
    return [v for k, v in cap.memo.items() if k[0] == "gradient_pass"]


def results(name, params, cap, ad, target, ckpt: bool) -> dict:
    m = get_method(name, **params)
    c = fresh(cap, m)
    with torch.no_grad():
        res = m.compute(c, ad, target)
    passes = the_passes(c)
    assert passes and all(gp.checkpointed is ckpt for gp in passes)
    if ckpt:
        assert all(gp.attentions == [] for gp in passes)  # nothing of [L, B, H, n, n] kept with the pass
    return {f: getattr(res, f) for f in ("scores", "layer_scores", "matrices") if getattr(res, f) is not None}


def assert_same(plain: dict, ckpt: dict) -> None:
    """Every value within 1e-10 of the scale, in float64."""
    assert plain.keys() == ckpt.keys()
    for k, x in plain.items():
        assert x.dtype == torch.float64
        scale = float(x.abs().max()) or 1.0
        assert scale > 1e-12, k  # not vacuous
        torch.testing.assert_close(ckpt[k], x, rtol=0, atol=1e-10 * scale, msg=k)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_checkpointed_and_plain_passes_give_the_same_numbers(arch, dtype, monkeypatch):
    """A padded batch (lengths 7, 4, 9, 1): every method and variant, scores, layer views and matrices. float32: the
    model's layers widened to float64 one at a time, in the forward and in each recomputation."""
    _, ad, _, cap = captured_tiny(arch, dtype=dtype)
    assert ad.n_layers == 3 and ad.n_heads == 4
    target = cap.logits.argmax(-1)
    for name, params in VARIANTS:
        if name == "attnlrp" and dtype == torch.float32:
            continue  # the model's dtype: float32
        plain = results(name, params, cap, ad, target, False)
        with monkeypatch.context() as mp:
            checkpointed(mp)
            ckpt = results(name, params, cap, ad, target, True)
        assert_same(plain, ckpt)


def test_a_batch_of_the_family_shares_one_checkpointed_backward(monkeypatch):
    """The runner gives the batch's terms to the pass (cap.attention_terms): lrp, partial_lrp and transatt read one
    doubled pass, one recomputation of each layer."""
    checkpointed(monkeypatch)
    _, ad, _, cap = captured_tiny("llama")
    ms = [get_method(n) for n in ("lrp", "partial_lrp", "transatt")]
    cap = type(cap)(**{**cap.__dict__, "memo": {}, "stacks": {},
                       "passes": frozenset().union(*(m.passes for m in ms))})
    cap.attention_terms = frozenset().union(*(m.attention_terms for m in ms))
    target = cap.pred  # one tensor for every method, as the runner's (the pass memoises by its identity)
    with torch.no_grad():
        for m in ms:
            m.compute(cap, ad, target)
    (gp,) = the_passes(cap)
    assert gp.checkpointed and gp._hooks.calls == [2] * ad.n_layers


def test_the_choice_follows_the_pass_memory(monkeypatch):
    """Checkpointed where the pass's rows (doubled for transatt) at float64 exceed the pass's memory."""
    _, ad, _, cap = captured_tiny("llama")
    B, n = cap.input_ids.shape
    row = gradients.row_bytes(ad, n, 8)
    for name, rows in (("lrp", B), ("transatt", 2 * B)):
        for budget, expected in ((rows * row, False), (rows * row - 1, True)):
            monkeypatch.setattr(gradients, "IG_CPU_BYTES", budget)
            m = get_method(name)
            c = fresh(cap, m)
            with torch.no_grad():
                m.compute(c, ad, c.pred)
            assert [gp.checkpointed for gp in the_passes(c)] == [expected], (name, budget)



@pytest.mark.parametrize("name,params", VARIANTS)
def test_a_layers_recomputed_attention_is_freed_before_the_next_layers_recomputation(name, params, monkeypatch):
    """The checkpointed backward keeps one layer's recomputed activations at a time: when layer l-1 is recomputed,
    every [B, H, n, n] or [B H, n, n] tensor made by layer l's recomputation (its softmax, A.V's saved A) is gone.
    The rules' skip operands, kept per layer for the residual add, held each recomputation's stream and with it the
    graph of its attention until the whole backward ended (peaks 1.7-1.9x the memory model's)."""
    import gc
    import weakref

    checkpointed(monkeypatch)
    _, ad, _, cap = captured_tiny("llama")
    L, H = ad.n_layers, ad.n_heads
    calls, made, alive_at = [0] * L, {}, {}

    def squares(out):
        B, n = out.shape[0], out.shape[-1]
        shapes = {(B, H, n, n), (B * H, n, n)}
        return [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and tuple(o.shape) in shapes]

    def hook(l):
        def h(_m, _inp, out):
            calls[l] += 1
            if calls[l] == 1 and l == L - 1:  # the forward's last layer: what exists before any recomputation
                made["before"] = [weakref.ref(t) for t in squares(out[1])]
            if calls[l] > 1:  # the backward's recomputation of layer l: the layers above it are done
                alive_at[l] = {k: sum(r() is not None for r in refs) for k, refs in made.items() if k != "before"}
                seen = {id(r()) for refs in made.values() for r in refs if r() is not None}
                made[l] = [weakref.ref(t) for t in squares(out[1]) if id(t) not in seen]
        return h

    handles = [ad.attention_probs_module(layer).register_forward_hook(hook(l)) for l, layer in enumerate(ad.layers())]
    try:
        results(name, params, cap, ad, cap.logits.argmax(-1), True)
    finally:
        for h in handles:
            h.remove()
    assert calls == [2] * L  # the forward and one recomputation per layer
    assert all(len(made[l]) >= 2 for l in range(L - 1))  # not vacuous: at least the softmax and A.V's A
    assert alive_at == {l: {k: 0 for k in range(l + 1, L)} for l in range(L)}
