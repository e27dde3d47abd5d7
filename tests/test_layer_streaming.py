"""Layer-streamed capture (issue 36 item 1): the head-mean attentions that raw attention reads ("attention_mean") are
taken from each layer's attention as the forward makes it, so that at most one layer's [B, H, n, n] is alive at once,
where the stack of every layer's would exceed the block budget (compute.memory_model.streams_attention); below it they
come from that stack, one operation for every layer. Both give the same numbers. (Rollout and W_FIXEDRES keep none
above the budget: tests/test_streamed_head_means.py.)"""

from __future__ import annotations

import weakref

import pytest
import torch

from compute import memory_model as mm
from compute.adapters import adapter_for
from compute.methods import REGISTRY
from compute.methods._internals import budget
from compute.run.parts import cut_capture
from conftest import random_batch, tiny_model

STREAMED = ("raw_attention",)
LENGTHS = [9, 5, 12, 1]  # padded: the streamed means hold the pad rows as the stack's do


def tiny_padded(arch: str, dtype: torch.dtype):
    """(arch, a 3-layer tiny model's adapter, a padded batch of LENGTHS)."""
    return arch, adapter_for(tiny_model(arch, dtype=dtype, layers=3)), random_batch(arch, LENGTHS)


@pytest.fixture(scope="module", params=["bert", "llama"])
def model(request):
    return tiny_padded(request.param, torch.float32)


def streamed(monkeypatch):
    monkeypatch.setattr(budget, "CPU_STACK_BYTES", 0)  # every stack above the budget: layer by layer


def watch_attentions(ad):
    """Weak references to every attention the forward makes, and the hooks that take them (removed by the caller)."""
    made = []
    hooks = [ad.attention_probs_module(layer).register_forward_hook(lambda _m, _i, out: made.append(
        weakref.ref(out[1]))) for layer in ad.layers()]
    return made, hooks


def test_the_switch_follows_the_memory_model(model):
    _, ad, batch = model
    B, n = batch["input_ids"].shape
    stack = ad.n_layers * B * ad.n_heads * n * n * 4
    assert mm.streams_attention(ad.n_layers, ad.n_heads, B, n, stack) is False
    assert mm.streams_attention(ad.n_layers, ad.n_heads, B, n, stack - 1) is True
    assert ad.streams_attention(batch["input_ids"]) is (stack > budget.CPU_STACK_BYTES)


def test_streamed_capture_keeps_one_layers_attention_at_a_time(model, monkeypatch):
    _, ad, batch = model
    streamed(monkeypatch)
    made, hooks = watch_attentions(ad)
    # each attention's reference checked when the next layer's attention is made
    alive_at_next = []
    hooks += [ad.attention_probs_module(layer).register_forward_pre_hook(
        lambda *_: alive_at_next.append([r() is not None for r in made])) for layer in ad.layers()]
    try:
        with torch.no_grad():
            cap = ad.capture(batch, frozenset({"attention_mean"}))
    finally:
        for h in hooks:
            h.remove()
    L = ad.n_layers
    assert len(made) == L and len(alive_at_next) == L
    assert all(not any(alive) for alive in alive_at_next)  # no earlier layer's [B, H, n, n] when the next starts
    assert all(r() is None for r in made)
    assert cap.attentions == [] and "attentions" not in cap.stacks
    st = cap.stack("attention_mean")
    assert st.shape == (L, *batch["input_ids"].shape, batch["input_ids"].shape[1]) and st.dtype == torch.float32
    assert all(m._base is st for m in cap.attention_mean)  # views of the stack made at the first layer: no copy


def test_stacked_and_streamed_head_means_are_the_same_numbers(model, monkeypatch):
    _, ad, batch = model
    with torch.no_grad():
        full = ad.capture(batch, frozenset({"attentions"}))
        stacked = ad.capture(batch, frozenset({"attention_mean"}))
        both = ad.capture(batch, frozenset({"attentions", "attention_mean"}))
        streamed(monkeypatch)
        layered = ad.capture(batch, frozenset({"attention_mean"}))
    ref = full.stack("attentions").mean(dim=2)
    assert stacked.attentions == [] and "attentions" not in stacked.stacks  # the stack dropped once reduced
    assert torch.equal(both.stack("attentions"), full.stack("attentions"))
    for cap in (stacked, both, layered, full):  # a capture of every head's serves the head means too
        assert torch.equal(cap.stack("attention_mean"), ref)


@pytest.mark.parametrize("name", STREAMED)
def test_streamed_methods_give_the_stacked_results(model, monkeypatch, name):
    _, ad, batch = model
    method, target = REGISTRY[name](), torch.zeros(len(LENGTHS), dtype=torch.long)
    assert method.needs == frozenset({"attention_mean"})
    with torch.no_grad():
        ref = REGISTRY[name]().compute(ad.capture(batch, frozenset({"attentions", "attention_mean"})), ad, target)
        streamed(monkeypatch)
        got = method.compute(ad.capture(batch, method.needs), ad, target)
    for key in ("scores", "layer_scores", "matrices"):
        assert torch.equal(getattr(got, key), getattr(ref, key)), key


def test_a_part_of_a_streamed_capture_is_cut_as_its_attentions(model, monkeypatch):
    _, ad, batch = model
    streamed(monkeypatch)
    with torch.no_grad():
        cap = ad.capture(batch, frozenset({"attention_mean"}))
    part = cut_capture(cap, slice(1, 3), 5)
    assert len(part.attention_mean) == ad.n_layers
    assert torch.equal(part.stack("attention_mean"), cap.stack("attention_mean")[:, 1:3, :5, :5])


def test_a_model_without_eager_attention_is_named(monkeypatch):
    ad = adapter_for(tiny_model("bert", dtype=torch.float32, layers=2))
    ad.model.config._attn_implementation = "sdpa"
    streamed(monkeypatch)
    with pytest.raises(Exception, match="attn_implementation='eager'"):
        with torch.no_grad():
            ad.capture(random_batch("bert", [6]), frozenset({"attention_mean"}))


@pytest.mark.parametrize("family", ["albert", "opt_postln"])
def test_streamed_head_means_of_a_family_without_description(family, monkeypatch):
    """The generic capture (the model class's own record; ALBERT's one layer called at every depth): layer by layer
    as from the stack."""
    from families import family_capture, family_model, family_heads

    task = family_heads(family)[0]
    ad = adapter_for(family_model(family, task, layers=3, dtype=torch.float32), task)
    batch = random_batch("bert", LENGTHS)
    with torch.no_grad():
        ref = family_capture(ad, batch, frozenset({"attentions"})).stack("attentions").mean(dim=2)
        streamed(monkeypatch)
        cap = family_capture(ad, batch, frozenset({"attention_mean"}))
    assert cap.attentions == [] and torch.equal(cap.stack("attention_mean"), ref)
