"""The checkpointed gradient pass of the methods that read no attention (issue 36): grad_l2, gxi_l2, gxi_mean, cat
and integrated gradients take only dF/dX or dF/dh, so their checkpointed layers run their attention through torch's
scaled_dot_product_attention (no [B, H, n, n] made in the forward, the recomputation or the backward); a batch whose
methods declare attention terms (or declare nothing) keeps the eager attention. Both give the eager plain pass's
numbers."""

from __future__ import annotations

import pytest
import torch
from conftest import MASK_ID, captured_tiny
from tensors_made import Made

from compute.methods import get_method
from compute.methods._internals import gradients
from test_gradient_checkpointing import checkpointed, method, the_pass

# the methods that read no attention, and their variants
NO_ATTENTION = [("grad_l2", {}), ("gxi_l2", {}), ("gxi_mean", {}), ("cat", {}), ("cat", {"layers": "outputs"}),
                ("ig_l2", {}), ("ig_mean", {})]


def declared(cap, terms=frozenset()):
    """A copy with its own memo, declaring passes and attention terms as the runner does (dispatch._capture_for)."""
    return type(cap)(**{**cap.__dict__, "memo": {}, "stacks": {}, "passes": frozenset({"forward", "backward"}),
                        "attention_terms": terms})


def stored(m, cap, ad, target) -> dict:
    with torch.no_grad():
        res = m.compute(cap, ad, target)
    return {f: getattr(res, f) for f in ("scores", "layer_scores", "matrices") if getattr(res, f) is not None} | {
        f"value {k}": v for k, v in (res.example_values or {}).items()}


# GPT-2's eager attention is float64 throughout in a float64 model; Llama's takes its softmax in float32
# (modeling_llama.eager_attention_forward), so its eager pass is itself only float32-exact (6e-8 of scale seen)
TOLERANCE = {"gpt2": 1e-10, "llama": 1e-6}


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_sdpa_checkpointed_pass_is_the_eager_plain_pass(arch, monkeypatch):
    """A padded float64 batch (its causal and padding mask): every value each method stores, checkpointed with the
    SDPA attention against the plain eager pass."""
    _, ad, _, cap = captured_tiny(arch)
    target = cap.logits.argmax(-1)
    assert ad.model.config._attn_implementation == "eager"
    for name, params in NO_ATTENTION:
        plain_cap = declared(cap)
        plain = stored(method(name, params, True), plain_cap, ad, target)
        if not name.startswith("ig_"):
            assert not the_pass(plain_cap).checkpointed and not the_pass(plain_cap).sdpa
        with monkeypatch.context() as mp:
            checkpointed(mp)
            c = declared(cap)
            ckpt = stored(method(name, params, True), c, ad, target)
        if not name.startswith("ig_"):
            assert the_pass(c).checkpointed and the_pass(c).sdpa
        assert ad.model.config._attn_implementation == "eager"  # set back after the pass
        assert plain.keys() == ckpt.keys()
        for k, x in plain.items():
            scale = float(x.abs().max()) or 1.0
            torch.testing.assert_close(ckpt[k], x, rtol=0, atol=TOLERANCE[arch] * scale, msg=f"{name} {params} {k}")


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("name", ["grad_l2", "cat", "ig_l2"])
def test_sdpa_checkpointed_pass_makes_no_attention_map(arch, name, monkeypatch):
    """No tensor of the heads' [H, n, n] is made by the pass (forward, recomputations, backward): the mask's
    [B, 1, n, n] only."""
    checkpointed(monkeypatch)
    _, ad, _, cap = captured_tiny(arch)
    B, n = cap.input_ids.shape
    c = declared(cap)
    with Made() as rec:
        stored(method(name, {}, True), c, ad, cap.pred)
    heads = [s for s in rec.shapes if len(s) >= 3 and s[-2:] == (n, n) and s[-3] == ad.n_heads]
    assert heads == []
    assert any(s[-2:] == (n, n) for s in rec.shapes)  # the mask (the check sees [.., n, n] tensors)


def test_a_batch_with_attention_terms_or_undeclared_keeps_the_eager_attention(monkeypatch):
    """gae's terms read A and dF/dA; an undeclared batch (attention_terms None) may ask for any later."""
    checkpointed(monkeypatch)
    _, ad, _, cap = captured_tiny("llama")
    gae = get_method("gae")
    for c in (declared(cap, frozenset(gae.attention_terms)), declared(cap, None)):
        with torch.no_grad():
            get_method("grad_l2").compute(c, ad, cap.pred)
        gp = the_pass(c)
        assert gp.checkpointed and not gp.sdpa
        with torch.no_grad():
            gae.compute(c, ad, cap.pred)


def test_a_term_asked_of_an_sdpa_pass_is_refused(monkeypatch):
    """A pass run with the SDPA attention has no attention to reduce: a term asked for later is an error naming it
    (the runner declares every method's terms: dispatch._capture_for)."""
    checkpointed(monkeypatch)
    _, ad, _, cap = captured_tiny("gpt2")
    c = declared(cap)
    with torch.no_grad():
        get_method("grad_l2").compute(c, ad, cap.pred)
        assert the_pass(c).sdpa
        with pytest.raises(RuntimeError, match="gae"):
            get_method("gae").compute(c, ad, cap.pred)


def test_sdpa_only_where_the_model_supports_it(monkeypatch):
    """A model class without SDPA support (_supports_sdpa False) keeps its eager attention when checkpointed."""
    checkpointed(monkeypatch)
    _, ad, _, cap = captured_tiny("gpt2")
    monkeypatch.setattr(type(ad.model), "_supports_sdpa", False)
    c = declared(cap)
    with torch.no_grad():
        get_method("grad_l2").compute(c, ad, cap.pred)
    assert the_pass(c).checkpointed and not the_pass(c).sdpa


def test_integrated_gradients_rows_count_the_sdpa_layer(monkeypatch):
    """IG's checkpointed rows run the SDPA attention: a row is the layers' inputs and one layer without its
    [H, n, n] maps (row_bytes), so more rows go through one pass."""
    _, ad, _, cap = captured_tiny("llama")
    n = cap.input_ids.shape[1]
    d = int(ad.config.hidden_size)
    eager = gradients.row_bytes(ad, n, 8, True)
    sdpa = gradients.row_bytes(ad, n, 8, True, sdpa=True)
    assert eager - sdpa == n * (3 * ad.n_heads * n - n) * 8
    assert sdpa == ad.n_layers * n * d * 8 + n * (16 * d + n) * 8
    memory = gradients.row_bytes(ad, n, 8) - 1  # one row's plain pass does not fit: checkpointed
    assert gradients.rows_per_pass(ad, n, 8, memory, True, sdpa=True) == memory // sdpa
    assert ad.mask_token_id == MASK_ID
