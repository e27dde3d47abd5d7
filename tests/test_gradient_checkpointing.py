"""The checkpointed gradient pass (issue 36 item 2): where the plain pass's activations would exceed the pass's memory
(compute.memory_model.checkpoints), every layer is recomputed in the backward and each layer's attention and its
gradient are reduced in backward hooks to what the methods keep (checkpointed.AttentionTerm), so that no two layers'
[B, H, n, n] are alive at once; below it the plain pass (one backward through the kept graph: the op budgets). Both
give the same numbers."""

from __future__ import annotations

import weakref

import pytest
import torch
from conftest import MASK_ID, assert_batch_invariant, captured_tiny, random_batch, tiny_task_model
from families import family_capture

from compute import memory_model as mm
from compute.adapters import adapter_for
from compute.methods import get_method
from compute.methods._internals import gradients
from compute.methods._internals.base import class_target

METHODS = ("grad_l2", "gxi_l2", "gxi_mean", "grads", "attgrads", "cat", "attcat", "gae", "ig_l2", "ig_mean")
VARIANTS = [(name, {}) for name in METHODS] + [("attgrads", {"variant": "gradsam"}), ("cat", {"layers": "outputs"}),
                                               ("attcat", {"layers": "outputs"})]


def checkpointed(monkeypatch):
    monkeypatch.setattr(gradients, "IG_CPU_BYTES", 0)  # every pass beyond its memory: checkpointed


def method(name: str, params: dict, decoder: bool):
    params = dict(params)
    if name.startswith("ig_"):
        params["steps"] = 5
        if decoder:
            params["baseline"] = "zero"
    return get_method(name, **params)


def fresh(cap):
    """A copy with its own memo, declaring the gradient methods' passes as a run does (undeclared, the pass records
    the LRP tensors and is never checkpointed)."""
    return type(cap)(**{**cap.__dict__, "memo": {}, "stacks": {}, "passes": frozenset({"forward", "backward"})})


def results(m, cap, ad, target, ckpt: bool):
    """What ``m`` stores, its pass checkpointed or not (``ckpt``: checked)."""
    c = fresh(cap)
    with torch.no_grad():
        res = m.compute(c, ad, target)
    if not m.name.startswith("ig_"):
        assert the_pass(c).checkpointed is ckpt
    return {f: getattr(res, f) for f in ("scores", "layer_scores", "matrices") if getattr(res, f) is not None} | {
        f"value {k}": v for k, v in (res.example_values or {}).items()}


def assert_same(plain: dict, ckpt: dict) -> None:
    """Every value within 1e-6 of the scale, in float64."""
    assert plain.keys() == ckpt.keys()
    for k, x in plain.items():
        assert x.dtype == torch.float64
        scale = float(x.abs().max()) or 1.0
        torch.testing.assert_close(ckpt[k], x, rtol=0, atol=1e-6 * scale, msg=k)


def the_pass(cap):
    (gp,) = [v for k, v in cap.memo.items() if k[0] == "gradient_pass"]
    return gp


@pytest.mark.parametrize("arch", ["bert", "llama", "gpt2"])
def test_checkpointed_and_plain_passes_give_the_same_numbers(arch, monkeypatch):
    """Classification on a padded batch, float64: every method and variant, every value it stores."""
    _, ad, _, cap = captured_tiny(arch)
    target = cap.logits.argmax(-1)
    for name, params in VARIANTS:
        plain = results(method(name, params, arch != "bert"), cap, ad, target, False)
        with monkeypatch.context() as mp:
            checkpointed(mp)
            ckpt = results(method(name, params, arch != "bert"), cap, ad, target, True)
        assert_same(plain, ckpt)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_checkpointed_next_token_is_the_plain_pass(family, monkeypatch):
    """A causal LM explaining the next word after each example's last real token (right-padded batch)."""
    ad = adapter_for(tiny_task_model(family, "next-token"), "next-token")
    ad.mask_token_id = MASK_ID
    with torch.no_grad():
        cap = family_capture(ad, random_batch(family, [7, 4, 9]), frozenset())
    for name, params in VARIANTS:
        plain = results(method(name, params, True), cap, ad, cap.pred, False)
        with monkeypatch.context() as mp:
            checkpointed(mp)
            ckpt = results(method(name, params, True), cap, ad, cap.pred, True)
        assert_same(plain, ckpt)


@pytest.mark.parametrize("arch", ["bert", "llama"])
@pytest.mark.parametrize("name", METHODS)
def test_checkpointed_pass_is_batch_invariant(arch, name, monkeypatch):
    checkpointed(monkeypatch)
    params = {"steps": 4} if name.startswith("ig") else {}
    assert_batch_invariant(arch, name, params=params, declared=True)


def test_the_choice_follows_the_memory_model(monkeypatch):
    """The pass checkpoints where the model's plain row exceeds the pass's memory, and the two count a row alike."""
    _, ad, _, cap = captured_tiny("llama")
    B, n = cap.input_ids.shape
    shape = mm.ModelShape("tiny", layers=ad.n_layers, d=int(ad.config.hidden_size), heads=ad.n_heads,
                          kv_heads=ad.n_heads, d_ff=int(ad.config.intermediate_size), vocab=120)
    run = mm.Run(n, 8, mm.Budgets(0, 0, 0, 0, gradients.IG_CPU_BYTES))
    for ckpt, sdpa in ((False, False), (True, False), (True, True)):
        assert mm.pass_row(shape, run, ckpt, sdpa) == gradients.row_bytes(ad, n, 8, ckpt, sdpa)
    row = gradients.row_bytes(ad, n, 8)
    for budget, expected in ((B * row, False), (B * row - 1, True)):
        monkeypatch.setattr(gradients, "IG_CPU_BYTES", budget)
        c = fresh(cap)
        with torch.no_grad():
            get_method("grad_l2").compute(c, ad, c.pred)
        assert the_pass(c).checkpointed is expected
        assert mm.checkpoints(shape, mm.Run(n, 8, mm.Budgets(0, 0, 0, 0, budget // B))) is expected


def test_a_batch_reduces_every_methods_terms_in_one_backward(monkeypatch):
    """The runner gives the batch's terms to the pass (cap.attention_terms): one backward (one recomputation of
    each layer) serves gae, attcat, grads and attgrads; a term asked for later costs one more."""
    checkpointed(monkeypatch)
    _, ad, _, cap = captured_tiny("llama")
    names = ("gae", "attcat", "grads", "attgrads")
    ms = [get_method(n) for n in names]
    cap = fresh(cap)
    cap.attention_terms = frozenset().union(*(m.attention_terms for m in ms))
    target = cap.pred  # one tensor for every method, as the runner's (the pass memoises by its identity)
    with torch.no_grad():
        for m in ms:
            m.compute(cap, ad, target)
    gp = the_pass(cap)
    assert gp._hooks.calls == [2] * ad.n_layers  # the forward and one recomputation
    with torch.no_grad():
        get_method("attgrads", variant="gradsam").compute(cap, ad, target)
    assert gp._hooks.calls == [3] * ad.n_layers


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_checkpointed_pass_keeps_one_layers_attention_at_a_time(arch, monkeypatch):
    """Every attention the forward and the backward's recomputations make, and every gradient of one: when the next
    is made, none made before is alive (the layer's activations are freed before the next layer's are made). The
    eager recomputation's (a model without the attention interface; with it, a chunk of heads at a time:
    test_head_chunks.py)."""
    checkpointed(monkeypatch)
    _, ad, _, cap = captured_tiny(arch, lengths=(9, 5, 12))
    monkeypatch.setattr(type(ad.model), "_supports_attention_backend", False)
    made, alive_at_next = [], []

    def at_next(*_):
        alive_at_next.append(sum(r() is not None for r in made))

    def on_grad(g):
        at_next()
        made.append(weakref.ref(g))

    def keep(_m, _i, out):
        made.append(weakref.ref(out[1]))
        if out[1].requires_grad and len(made) <= ad.n_layers:  # the forward's (the backward runs through them)
            out[1].register_hook(on_grad)

    hooks = []
    for layer in ad.layers():
        module = ad.attention_probs_module(layer)
        hooks += [module.register_forward_pre_hook(at_next), module.register_forward_hook(keep)]
    try:
        c = fresh(cap)
        with torch.no_grad():
            get_method("gae").compute(c, ad, c.pred)
    finally:
        for h in hooks:
            h.remove()
    L = ad.n_layers
    assert the_pass(c).checkpointed
    assert len(made) == 3 * L  # the forward's, the recomputed and the gradients
    assert len(alive_at_next) == 3 * L and max(alive_at_next) == 0, alive_at_next
    assert all(r() is None for r in made)
    assert the_pass(c).attentions == []  # nothing of [B, H, n, n] kept with the pass


def test_integrated_gradients_checkpoint_where_one_row_does_not_fit(monkeypatch):
    _, ad, _, cap = captured_tiny("llama")
    n = cap.input_ids.shape[1]
    row = gradients.row_bytes(ad, n, 8)
    assert not gradients.checkpoints(ad, 1, n, 8, row) and gradients.checkpoints(ad, 1, n, 8, row - 1)
    calls = []
    real = gradients.layer_checkpoints
    monkeypatch.setattr(gradients, "layer_checkpoints", lambda *a, **k: calls.append(k) or real(*a, **k))
    target = class_target(cap, 1)
    R = cap.input_ids.shape[0] * (5 + 2)  # (5 steps and the two ends) per example
    for memory, ckpt in ((row * R, False), (row - 1, True)):
        calls.clear()
        with torch.no_grad():
            gradients.integrated_gradients(fresh(cap), ad, gradients.Explained(), target, steps=5, rule="riemann",
                                           baseline="zero", memory_bytes=memory)
        chunk = gradients.rows_per_pass(ad, n, 8, memory, ckpt, sdpa=ckpt)  # checkpointed: the SDPA attention
        assert chunk == (R if not ckpt else max(1, (row - 1) // gradients.row_bytes(ad, n, 8, True, sdpa=True)))
        assert calls == ([{"sdpa": True}] * -(-R // chunk) if ckpt else [])
