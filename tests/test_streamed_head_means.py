"""Layer-streamed rollout and W_FIXEDRES (issue 36 item 1): products of per-layer matrices made from the heads' mean
attention alone. Where the stack of every layer's attention fits the block budget the capture takes the head means
from it (one operation for every layer: the op budgets); above it the capture keeps none ("layer_means") and the
method folds each layer's head mean into the running product as a forward of its own makes the layer: one layer's
[B, H, n, n] and the running [B, n, n] product alive, never every layer's [B, n, n] (34 GB at 16,384 tokens on a 7B
model). Both paths give the same numbers (float64, padded batches, post-LN BERT, GPT-2, Llama; 1e-10 of scale)."""

from __future__ import annotations

import pytest
import torch

from compute.adapters import adapter_for
from compute.methods import REGISTRY
from compute.methods._internals.aggregate import row_at
from compute.run.steps import Steps
from conftest import random_batch, tiny_model
from tensors_made import Made
from test_layer_streaming import LENGTHS, streamed, tiny_padded
from test_layer_streaming_methods import attentions_alive, close, run

PRODUCTS = ("rollout", "w_fixedres")


@pytest.fixture(scope="module", params=["bert", "gpt2", "llama"])
def model(request):
    return tiny_padded(request.param, torch.float64)


def test_the_capture_keeps_the_head_means_below_the_budget_and_none_above(model, monkeypatch):
    _, ad, batch = model
    needs = REGISTRY["rollout"].needs
    assert needs == REGISTRY["w_fixedres"].needs == frozenset({"layer_means"})
    with torch.no_grad():
        stacked = ad.capture(batch, needs)
        streamed(monkeypatch)
        light = ad.capture(batch, needs)
    assert len(stacked.attention_mean) == ad.n_layers and stacked.attentions == []
    assert light.attention_mean == [] and light.attentions == [] and light.stacks == {}


@pytest.mark.parametrize("name", PRODUCTS)
@pytest.mark.parametrize("kept", ["all", "cls", "none"])
def test_streamed_products_give_the_stacked_results(model, monkeypatch, name, kept):
    """--matrices all: every layer's matrix, as the stacked path's; cls: their explained rows [B, L, 1, n]; none: no
    matrix. The views (from the running product where not every layer's matrix is kept) within 1e-10 of scale."""
    _, ad, batch = model
    method = REGISTRY[name]()
    cap, ref = run(method, ad, batch)
    assert cap.attention_mean  # the stacked path
    streamed(monkeypatch)
    light, got = run(method, ad, batch, kept)
    assert not light.attention_mean
    close(got.scores, ref.scores)
    close(got.layer_scores, ref.layer_scores)
    if kept == "none":
        assert got.matrices is None
    elif kept == "cls":
        assert got.matrix_rows
        close(got.matrices, row_at(ref.matrices, cap.explain_pos)[:, :, None])
    else:
        assert not got.matrix_rows
        close(got.matrices, ref.matrices)


@pytest.mark.parametrize("name", PRODUCTS)
def test_streamed_products_make_no_stack_of_every_layer(model, monkeypatch, name):
    """Nothing of every layer's n x n is made, in the capture or the method: no [L, B, n, n] nor [B, L, n, n]
    (today's capture wrote the streamed head means into an [L, B, n, n] stack)."""
    _, ad, batch = model
    method = REGISTRY[name]()
    streamed(monkeypatch)
    with Made() as rec:
        run(method, ad, batch, "cls")
    B, n = batch["input_ids"].shape
    stacks = [s for s in rec.shapes if len(s) == 4 and s[-2:] == (n, n) and ad.n_layers in s[:2]]
    assert stacks == []
    assert (B, n, n) in rec.shapes  # the running product


@pytest.mark.parametrize("name", PRODUCTS)
def test_streamed_generation_rows_are_the_stacked_ones(monkeypatch, name):
    """--task generate: every step's row of the one pass's products, streamed as stacked (a causal model)."""
    ad = adapter_for(tiny_model("llama", dtype=torch.float64, layers=3))
    batch = random_batch("llama", [9, 6])
    steps = Steps.of([5, 3], [[1, 2, 3, 4], [7, 8]], None, batch["input_ids"].device)
    method = REGISTRY[name]()

    def rows():
        with torch.no_grad():
            cap = ad.capture(batch, method.needs)
            cap.kept_matrices, cap.kept_row = "cls", steps.prompt_last
            return cap, method.compute_rows(cap, ad, steps, None)

    cap, ref = rows()
    assert cap.attention_mean
    streamed(monkeypatch)
    light, got = rows()
    assert not light.attention_mean
    assert got.layer_scores.shape == ref.layer_scores.shape == (6, ad.n_layers, 9)
    close(got.scores, ref.scores)
    close(got.layer_scores, ref.layer_scores)
    close(got.matrices, row_at(ref.matrices, steps.prompt_last)[:, :, None])


@pytest.mark.parametrize("name", PRODUCTS)
def test_beside_decompx_the_narrow_attentions_are_read_a_layer_at_a_time(monkeypatch, name):
    """Streamed beside DecompX, whose capture keeps every layer's attention as the forward made it (bfloat16, no
    stack): the head means are taken from those a layer at a time, in float32, with no forward of their own and no
    stack of them; the numbers are the stacked path's."""
    ad = adapter_for(tiny_model("llama", dtype=torch.bfloat16, layers=3))
    batch = random_batch("llama", LENGTHS)
    method = REGISTRY[name]()
    _, ref = run(method, ad, batch)
    streamed(monkeypatch)
    with torch.no_grad():
        cap = ad.capture(batch, method.needs | REGISTRY["decompx"].needs)
        assert cap.attentions and cap.attentions[0].dtype == torch.bfloat16 and "attentions" not in cap.stacks
        cap.kept_matrices, cap.kept_row = "cls", cap.explain_pos
        made, alive, hooks = attentions_alive(ad)
        try:
            with Made() as rec:
                got = method.compute(cap, ad, None)
        finally:
            for h in hooks:
                h.remove()
    assert made == []  # no forward of its own
    n = batch["input_ids"].shape[1]
    assert [s for s in rec.shapes if len(s) >= 4 and s[-2:] == (n, n) and ad.n_layers in s[:2]] == []
    close(got.scores, ref.scores, 1e-5)
    close(got.layer_scores, ref.layer_scores, 1e-5)
