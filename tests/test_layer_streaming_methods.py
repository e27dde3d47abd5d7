"""Layer-streamed decomposition methods (issue 36 item 1): the norm family, GlobEnc, W_RES, ALTI, ALTI-l2,
ALTI-Logit and Value Zeroing read the capture's "layer_parts", which it stacks where every layer's [B, H, n, n] fits the block budget
(compute.attention_streaming) and otherwise keeps none of: the methods then take each layer as a forward of their
own makes it (Adapter.each_layer), one layer's attention alive at a time, keeping only what --matrices keeps and the
running product of the views. Both paths give the same numbers (float64, padded batches, post-LN BERT and pre-LN
Llama)."""

from __future__ import annotations

import weakref

import pytest
import torch

from compute.adapters import adapter_for
from compute.methods import REGISTRY
from compute.methods._internals.aggregate import row_at
from conftest import random_batch, tiny_model
from tensors_made import Made
from test_layer_streaming import LENGTHS, streamed, tiny_padded

STREAMED = ("norm_n", "norm_fixedres", "norm_res", "norm_resln", "globenc", "w_res", "alti", "alti_l2",
            "value_zeroing")


@pytest.fixture(scope="module", params=["bert", "llama"])
def model(request):
    return tiny_padded(request.param, torch.float64)


def close(got, ref, tol=1e-10):
    """Within ``tol`` of the reference's scale."""
    assert got.shape == ref.shape
    scale = ref.abs().max().clamp_min(1e-300)
    assert float((got - ref).abs().max() / scale) <= tol


def run(method, ad, batch, kept="all", target=None):
    with torch.no_grad():
        cap = ad.capture(batch, method.needs)
        if kept != "all":
            cap.kept_matrices, cap.kept_row = kept, cap.explain_pos
        return cap, method.compute(cap, ad, cap.pred if target is None else target)


def test_the_capture_keeps_the_layers_below_the_budget_and_none_above(model, monkeypatch):
    _, ad, batch = model
    needs = REGISTRY["norm_n"].needs
    assert needs == frozenset({"layer_parts"})
    with torch.no_grad():
        stacked = ad.capture(batch, needs)
        streamed(monkeypatch)
        light = ad.capture(batch, needs)
    assert len(stacked.attentions) == ad.n_layers and len(stacked.values) == ad.n_layers
    assert len(stacked.hidden_states) == ad.n_layers + 1
    for name in ("attentions", "hidden_states", "values", "ln1_in", "ln1_out", "ln2_in", "ln2_out", "attn_out"):
        assert getattr(light, name) == [], name
    assert light.stacks == {}


@pytest.mark.parametrize("name", STREAMED + ("alti_logit",))
def test_streamed_methods_give_the_stacked_results(model, monkeypatch, name):
    _, ad, batch = model
    method = REGISTRY[name]()
    _, ref = run(method, ad, batch)
    streamed(monkeypatch)
    cap, got = run(method, ad, batch)
    assert not cap.attentions
    for key in ("scores", "layer_scores"):
        close(getattr(got, key), getattr(ref, key))
    if ref.matrices is None:
        assert got.matrices is None
        return
    close(got.matrices, ref.matrices)
    assert not got.matrix_rows


@pytest.mark.parametrize("name", STREAMED)
@pytest.mark.parametrize("kept", ["cls", "none"])
def test_streamed_methods_keep_only_the_stored_rows(model, monkeypatch, name, kept):
    """--matrices cls: the explained row of every layer's matrix [B, L, 1, n] and the views from the running
    product; none: no matrix at all."""
    _, ad, batch = model
    method = REGISTRY[name]()
    cap, ref = run(method, ad, batch)
    streamed(monkeypatch)
    _, got = run(method, ad, batch, kept)
    close(got.scores, ref.scores)
    close(got.layer_scores, ref.layer_scores)
    if kept == "none":
        assert got.matrices is None
        return
    rows = row_at(ref.matrices, cap.explain_pos)[:, :, None]  # [B, L, 1, n]
    assert got.matrix_rows
    close(got.matrices, rows)


@pytest.mark.parametrize("name", ("norm_resln", "globenc", "alti", "alti_logit", "value_zeroing", "rollout",
                                  "w_fixedres"))
def test_a_streamed_example_alone_is_its_row_of_the_batch(model, monkeypatch, name):
    """Padding and batching change nothing: each example streamed alone gives its row of the streamed batch."""
    arch, ad, batch = model
    method = REGISTRY[name]()
    streamed(monkeypatch)
    cap, whole = run(method, ad, batch, "cls")
    for b, n in enumerate(LENGTHS):
        one = {k: v[b:b + 1, :n] if v.dim() == 2 else v for k, v in batch.items()}
        _, alone = run(method, ad, one, "cls", target=cap.pred[b:b + 1])
        # 1e-6 of scale: Llama's RMSNorm runs in float32 inside the float64 model (conftest), batched or alone
        close(alone.scores[0], whole.scores[b, :n], 1e-6)
        close(alone.layer_scores[0], whole.layer_scores[b, :, :n], 1e-6)
        if whole.matrices is not None:  # ALTI-Logit keeps no matrices
            close(alone.matrices[0], whole.matrices[b, :, :, :n], 1e-6)
        assert not whole.scores[b, n:].any()


def attentions_alive(ad):
    """Weak references to every attention a forward makes, and at each layer's attention the count of earlier ones
    still alive (the hooks are removed by the caller)."""
    made, alive = [], []
    hooks = [ad.attention_probs_module(layer).register_forward_hook(
        lambda _m, _i, out: made.append(weakref.ref(out[1]))) for layer in ad.layers()]
    hooks += [ad.attention_probs_module(layer).register_forward_pre_hook(
        lambda *_: alive.append(sum(r() is not None for r in made))) for layer in ad.layers()]
    return made, alive, hooks


@pytest.mark.parametrize("name", STREAMED + ("alti_logit", "rollout", "w_fixedres"))
def test_the_streamed_path_never_holds_two_layers_attention(model, monkeypatch, name):
    """When a layer's attention is made, no earlier layer's [B, H, n, n] is alive: not the runner's capture's, not the
    method's own forward's (in which each layer's is dropped as its end hook returns)."""
    _, ad, batch = model
    method = REGISTRY[name]()
    streamed(monkeypatch)
    made, alive, hooks = attentions_alive(ad)
    try:
        run(method, ad, batch, "cls")
    finally:
        for h in hooks:
            h.remove()
    assert len(made) == 2 * ad.n_layers  # the capture's forward, then the method's
    assert alive == [0] * (2 * ad.n_layers)
    assert all(r() is None for r in made)


@pytest.mark.parametrize("name", ("norm_n", "globenc", "alti_l2", "alti", "value_zeroing", "rollout", "w_fixedres"))
def test_a_half_precision_model_streams_as_it_stacks(monkeypatch, name):
    """bfloat16 Llama: the norm family and ALTI-l2 keep a streamed layer's attention in bfloat16 and widen it a block
    of queries at a time, ALTI a block of sources at a time, rollout and W_FIXEDRES sum its head mean in float32 (as
    the capture sums it); all give the stacked path's float32 numbers."""
    ad = adapter_for(tiny_model("llama", dtype=torch.bfloat16, layers=3))
    batch = random_batch("llama", LENGTHS)
    method = REGISTRY[name]()
    _, ref = run(method, ad, batch)
    streamed(monkeypatch)
    _, got = run(method, ad, batch, "cls")
    assert got.scores.dtype == torch.float32
    close(got.scores, ref.scores, 1e-5)
    close(got.layer_scores, ref.layer_scores, 1e-5)


def layer_attention_copies(made, B, H, n):
    """The floating-point tensors of one layer's attention size: at least B H n^2 numbers, two dimensions n."""
    return [(s, dt) for s, dt in made
            if dt.is_floating_point and s.count(n) >= 2 and torch.Size(s).numel() >= B * H * n * n]


@pytest.mark.parametrize("name", ("alti", "alti_logit", "w_res"))
def test_streamed_alti_keeps_the_attention_narrow_and_copies_it_by_blocks(monkeypatch, name):
    """Issue 36: a bfloat16 model's streamed layer reaches ALTI's proximities (W_RES's head mean) in bfloat16, and
    no float32 copy of the whole layer's attention is made there (ALTI's dense form widens and lays out a block of
    sources at a time, here one source: a 1-byte block budget; W_RES accumulates the mean in float32); the numbers
    are the stacked path's."""
    from compute.methods import alti as alti_module

    cls = type(REGISTRY[name]()) if name == "w_res" else alti_module.Alti

    ad = adapter_for(tiny_model("llama", dtype=torch.bfloat16, layers=3))
    batch = random_batch("llama", LENGTHS)
    method = REGISTRY[name]()
    _, ref = run(method, ad, batch)
    streamed(monkeypatch)
    monkeypatch.setattr(alti_module, "CPU_BLOCK_BYTES", 1)
    seen = []
    stack_matrices = cls.stack_matrices

    def watched(self, p, adapter):
        with Made(new_only=True) as rec:
            out = stack_matrices(self, p, adapter)
        seen.append((p.A.dtype, layer_attention_copies(rec.made, *p.A.shape[:2], p.A.shape[-1])))
        return out

    monkeypatch.setattr(cls, "stack_matrices", watched)
    _, got = run(method, ad, batch, "cls")
    assert seen == [(torch.bfloat16, [])] * ad.n_layers
    close(got.scores, ref.scores, 1e-5)
    close(got.layer_scores, ref.layer_scores, 1e-5)


def test_streamed_value_zeroing_casts_one_layers_feed_forward_at_a_time(monkeypatch):
    """A bfloat16 post-LN model: the streamed path casts each layer's feed-forward weights to float32 while that layer
    is processed (every layer's float32 stack, stacked_ffn's, is never made) and gives the stacked path's numbers."""
    ad = adapter_for(tiny_model("bert", dtype=torch.bfloat16, layers=3))
    batch = random_batch("bert", LENGTHS)
    method = REGISTRY["value_zeroing"]()
    _, ref = run(method, ad, batch)
    ad.__dict__.pop("_stacked_weights", None)  # the stacked path's cache of every layer's float32 weights
    streamed(monkeypatch)
    _, got = run(method, ad, batch, "cls")
    assert not any(key[0] == "ffn" for key in ad.__dict__.get("_stacked_weights", {}))
    close(got.scores, ref.scores, 1e-5)
    close(got.layer_scores, ref.layer_scores, 1e-5)


def test_the_pruned_form_bounds_its_pairs_by_blocks_of_queries(model, monkeypatch):
    """ALTI's pruned form on a streamed layer: its pair bounds ||A_ij||_2 max_k ||U_jk|| are taken a block of queries
    at a time within the block budget (no [B, H, n, n] of squares beside the layer's attention: on the
    tiny-but-long model the peak of the streamed ALTI), with the numbers of the stacked path's dense form."""
    from compute.methods import alti as alti_module

    _, ad, batch = model
    ref = run(REGISTRY["alti"](l1_path="dense"), ad, batch)[1]
    streamed(monkeypatch)
    monkeypatch.setattr(alti_module, "CPU_BLOCK_BYTES", 1)
    seen = []
    stack_matrices = alti_module.Alti.stack_matrices

    def watched(self, p, adapter):
        with Made(new_only=True) as rec:
            out = stack_matrices(self, p, adapter)
        seen.append(layer_attention_copies(rec.made, *p.A.shape[:2], p.A.shape[-1]))
        return out

    monkeypatch.setattr(alti_module.Alti, "stack_matrices", watched)
    got = run(REGISTRY["alti"](l1_path="pruned"), ad, batch)[1]
    assert seen == [[]] * ad.n_layers
    close(got.matrices, ref.matrices)
    close(got.scores, ref.scores)


def test_streamed_alti_logit_holds_no_layer_matrices(model, monkeypatch):
    """Streamed, ALTI-Logit's record keeps per layer M^l = (C^{l-1} ... C^1)^T Z^l [B, n, d] (the explained token's
    contributions carried to the inputs), not every layer's ALTI matrix [L, B, n, n] and values; its numbers are
    the stacked path's (test_streamed_methods_give_the_stacked_results)."""
    _, ad, batch = model
    method = REGISTRY["alti_logit"]()
    streamed(monkeypatch)
    with torch.no_grad():
        cap = ad.capture(batch, method.needs)
        rec = method.record(cap, ad)
    B, n = batch["input_ids"].shape
    assert rec.C is None and rec.v is None and rec.A_e is None
    assert rec.M.shape == (ad.n_layers, B, n, ad.model.config.hidden_size)


def test_head_gram_blocks_are_formed_a_layer_at_a_time(model):
    """The head Gram blocks of P = W^T W, P in float64 a layer at a time (no [L, d, d] stack of P beside them: 2 GB
    in float32 at 7B): the upper block triangle of every layer's P."""
    from compute.methods._internals.decomposition import stacked_weights

    _, ad, _ = model
    weights = stacked_weights(ad, torch.float64, torch.device("cpu"))
    weights.derived.clear()
    L, d, _ = weights.W_O.shape
    H = ad.model.config.num_attention_heads
    with Made(new_only=True) as rec:
        blocks, index = weights.gram_blocks("n", H)
    assert not [s for s, _ in rec.made if s == (L, d, d)]
    P = weights.W_O.transpose(-1, -2) @ weights.W_O
    dh = d // H
    for g in range(H):
        close(blocks[g], P[:, g * dh:(g + 1) * dh, :(g + 1) * dh], 1e-14)
    assert index[1, 3] == index[3, 1] == 3 * 4 // 2 + 1


def test_a_streamed_layer_run_again_adds_nothing_to_its_lists(model, monkeypatch):
    """Value Zeroing runs a layer's norm and MLP modules again for each block of zeroed tokens inside its layer: the
    forward's capture hooks on them keep nothing of those calls (they kept a [k, n, d] input and output a block, a
    layer's [n, n, d] twice, until the layer ended). When each layer's method work ends its lists hold that layer's
    entries alone."""
    _, ad, batch = model
    method = REGISTRY["value_zeroing"]()
    streamed(monkeypatch)
    sizes = []
    each_layer = ad.each_layer

    def watched(cap, fn):
        def after(l, one):
            fn(l, one)
            sizes.append({name: len(getattr(one, name)) for name in ("attentions", "hidden_states", "values",
                                                                       "ln1_in", "ln1_out", "ln2_in", "ln2_out")})
        each_layer(cap, after)

    monkeypatch.setattr(ad, "each_layer", watched)
    run(method, ad, batch, "cls")
    one = {"attentions": 1, "hidden_states": 2, "values": 1, "ln1_in": 1, "ln1_out": 1, "ln2_in": 1, "ln2_out": 1}
    assert sizes == [one] * ad.n_layers
