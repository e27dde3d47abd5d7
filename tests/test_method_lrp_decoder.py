"""The LRP family on pre-LN decoder blocks (docs/methods.md 8) in float64 on tiny random models: an independent
reference that writes every rule explicitly, layer by layer top-down, from the forward's recorded tensors (the
method reads them off one modified backward pass); all-ones head mask = transatt; padding and batch invariance;
one-line refusals where no rule set is written."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import assert_layer_views_alone_equal_batch, random_batch, tiny_model
from families import family_heads, family_model

from compute.adapters import adapter_for
from compute.errors import AttrscopeError
from compute.methods import get_method
from compute.methods._internals.gradients import gradient_pass

LENGTHS = [7, 3, 9, 1]


def _ab(R, x, W, y_unbiased):
    """alpha1-beta0 (bias ignored), written with the four products: Z = x+ W+^T + x- W-^T,
    R_in = x+ (S W+) + x- (S W-)."""
    xp, xn, Wp, Wn = x.clamp_min(0), x.clamp_max(0), W.clamp_min(0), W.clamp_max(0)
    Z = xp @ Wp.T + xn @ Wn.T
    assert torch.allclose(Z - (x.abs() @ W.abs().T + y_unbiased) / 2, torch.zeros_like(Z), atol=1e-12)
    S = R / (Z + 1e-9)
    return xp * (S @ Wp) + xn * (S @ Wn)


def _div(a, b):
    """a / b, 0 where b == 0 (a pad token's zero relevance over its zero value)."""
    return torch.where(b != 0, a / torch.where(b != 0, b, 1), 0)


def _add(a, b, R):
    """Chefer's add rule: LRP-0 per operand, both rescaled per example to |sum R_a| / (|sum R_a| + |sum R_b|) of the
    example's total."""
    Ra, Rb = a * _div(R, a + b), b * _div(R, a + b)
    sa, sb = Ra.sum((1, 2), keepdim=True), Rb.sum((1, 2), keepdim=True)
    tot = R.sum((1, 2), keepdim=True)
    return (Ra * _div(_div(sa.abs(), sa.abs() + sb.abs()) * tot, sa),
            Rb * _div(_div(sb.abs(), sa.abs() + sb.abs()) * tot, sb))


def _float64_model(monkeypatch):
    """HF's Llama takes the RMSNorm and the softmax in float32 inside a float64 model; both in float64, for the method
    and the reference alike, so that the comparison is to float64 rounding. The attention keeps (q, k after rotary)."""
    import transformers.models.llama.modeling_llama as ml

    seen = []

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        key, value = ml.repeat_kv(key, module.num_key_value_groups), ml.repeat_kv(value, module.num_key_value_groups)
        z = torch.matmul(query, key.transpose(2, 3)) * scaling
        A = torch.softmax(z + attention_mask, dim=-1)
        seen.append((query.detach(), key.detach(), z.detach(), A.detach()))
        return torch.matmul(A, value).transpose(1, 2).contiguous(), A

    def rms(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    monkeypatch.setattr(ml, "eager_attention_forward", attention)
    monkeypatch.setattr(ml.LlamaRMSNorm, "forward", rms)
    return seen


def _reference(model, batch, target, pos, seen, head_mask=None):
    """(R at every layer's input [L, B, n], R^{A,l} [L, B, H, n, n]) with every rule written out top-down."""
    import transformers.models.llama.modeling_llama as ml

    rec = {}

    def keep(name):
        def hook(m, inp, out):
            rec[name] = (inp[0].detach() if inp else None, (out[0] if isinstance(out, tuple) else out).detach())
        return hook

    handles = []
    for name, m in model.named_modules():
        if isinstance(m, (torch.nn.Linear, ml.LlamaRMSNorm, ml.LlamaDecoderLayer, ml.LlamaAttention, ml.LlamaMLP)):
            handles.append(m.register_forward_hook(keep(name)))
    cos_sin = []
    handles.append(model.model.rotary_emb.register_forward_hook(lambda m, i, o: cos_sin.append(o)))
    seen.clear()
    try:
        with torch.no_grad():
            model(**batch)
    finally:
        for h in handles:
            h.remove()
    cos, sin = cos_sin[0]
    cfg = model.config
    H, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    B, n = batch["input_ids"].shape
    dh = cfg.hidden_size // H
    x, y = rec["score"]
    R = torch.zeros_like(y)
    R[torch.arange(B), pos, target] = 1.0
    R = _ab(R, x, model.score.weight, y)
    # the final RMSNorm: the identity (elementwise linear with rms detached: LRP-0 gives R_in = R_out)
    inputs, attention = [], []
    for li in range(cfg.num_hidden_layers - 1, -1, -1):
        p = f"model.layers.{li}."
        lin = lambda r: (rec[p + r][0], model.get_submodule(p + r).weight, rec[p + r][1])  # noqa: E731
        h, mlp_out = rec[p + "post_attention_layernorm"][0], rec[p + "mlp"][1]
        R_h, R_mlp = _add(h, mlp_out, R)
        R_prod = _ab(R_mlp, *lin("mlp.down_proj"))
        R_n2 = _ab(R_prod / 2, *lin("mlp.gate_proj")) + _ab(R_prod / 2, *lin("mlp.up_proj"))  # uniform; act identity
        R_h = R_h + R_n2  # the norm's identity, the fan-out's sum
        xin, attn_out = rec[p + "input_layernorm"][0], rec[p + "self_attn"][1]
        R_x, R_att = _add(xin, attn_out, R_h)
        ctx = rec[p + "self_attn.o_proj"][0]
        R_ctx = _ab(R_att, *lin("self_attn.o_proj"))
        S = _div(R_ctx, ctx).view(B, n, H, dh).transpose(1, 2)  # [B, H, n, dh]
        if head_mask is not None:
            S_masked = S * torch.as_tensor(head_mask[li], dtype=S.dtype)[None, :, None, None]
        else:
            S_masked = S
        q, k, z, A = seen[li]
        V = rec[p + "self_attn.v_proj"][1].view(B, n, Hkv, dh).transpose(1, 2).repeat_interleave(H // Hkv, 1)
        attention.insert(0, A * (S @ V.transpose(-1, -2)) / 2)  # unmasked R^{A,l}: the half to A
        R_A = A * (S_masked @ V.transpose(-1, -2)) / 2
        R_V = V * (A.transpose(-1, -2) @ S_masked) / 2  # [B, H, n, dh]
        R_v = R_V.view(B, Hkv, H // Hkv, n, dh).sum(2).transpose(1, 2).reshape(B, n, -1)
        R_z = torch.where(A > 0, z * (R_A - A * R_A.sum(-1, keepdim=True)), 0)  # AttnLRP's softmax rule
        Sz = _div(R_z, z) * model.model.layers[li].self_attn.scaling
        R_qr, R_kr = q * (Sz @ k) / 2, k * (Sz.transpose(-1, -2) @ q) / 2
        # rotary: a linear rotation per position, LRP-0 back through it (R / value, its transpose, times value)
        q0 = rec[p + "self_attn.q_proj"][1].view(B, n, H, dh).transpose(1, 2).requires_grad_(True)
        k0 = rec[p + "self_attn.k_proj"][1].view(B, n, Hkv, dh).transpose(1, 2)
        k0 = k0.repeat_interleave(H // Hkv, 1).requires_grad_(True)
        with torch.enable_grad():
            qr, kr = ml.apply_rotary_pos_emb(q0, k0, cos, sin)
            gq, gk = torch.autograd.grad((qr * _div(R_qr, q)).sum() + (kr * _div(R_kr, k)).sum(), (q0, k0))
        R_q = (q0 * gq).detach().transpose(1, 2).reshape(B, n, -1)
        R_k = (k0 * gk).detach().view(B, Hkv, H // Hkv, n, dh).sum(2).transpose(1, 2).reshape(B, n, -1)
        R_n1 = (_ab(R_q, *lin("self_attn.q_proj")) + _ab(R_k, *lin("self_attn.k_proj"))
                + _ab(R_v, *lin("self_attn.v_proj")))
        R = R_x + R_n1
        inputs.insert(0, R.sum(-1))
    return torch.stack(inputs), torch.stack(attention)


def _capture(ad, lengths=LENGTHS):
    batch = random_batch("llama", lengths)
    with torch.no_grad():
        return batch, ad.capture(batch, frozenset())


def _zero_self(v, pos):
    v = v.clone()
    v[torch.arange(v.shape[0]), ..., pos] = 0
    return v


def test_lrp_and_partial_lrp_equal_the_rules_written_out(monkeypatch):
    seen = _float64_model(monkeypatch)
    model = tiny_model("llama", layers=3)
    ad = adapter_for(model)
    batch, cap = _capture(ad)
    lrp = get_method("lrp").compute(cap, ad, cap.pred)
    partial = get_method("partial_lrp").compute(cap, ad, cap.pred)
    inputs, att = _reference(model, batch, cap.pred, cap.explain_pos, seen)
    want = _zero_self(inputs.transpose(0, 1) * cap.mask[:, None], cap.explain_pos)
    assert want.abs().max() > 1e-3  # not vacuous
    torch.testing.assert_close(lrp.layer_scores, want, rtol=0, atol=1e-8)
    torch.testing.assert_close(lrp.scores, want[:, 0], rtol=0, atol=1e-8)
    b = torch.arange(len(LENGTHS))
    rows = att.clamp_min(0).mean(2).transpose(0, 1)[b, :, cap.explain_pos]  # [B, L, n]
    rows = _zero_self(rows * cap.mask[:, None], cap.explain_pos)
    torch.testing.assert_close(partial.layer_scores, rows, rtol=0, atol=1e-8)


def test_mask_lrp_with_a_head_mask_equals_the_rules_written_out(monkeypatch):
    """The mask on the relevance leaving A.V, per query head (grouped heads share a value head); the rollout reads the
    unmasked R^{A,l}; all ones = transatt."""
    seen = _float64_model(monkeypatch)
    model = tiny_model("llama", layers=3)
    ad = adapter_for(model)
    batch, cap = _capture(ad)
    mask = [[1, 0, 1, 1], [0, 1, 1, 0], [1, 1, 0, 1]]
    m = get_method("mask_lrp", head_mask=torch.tensor(mask, dtype=torch.float64).numpy())
    got = m.compute(cap, ad, cap.pred)
    _, att = _reference(model, batch, cap.pred, cap.explain_pos, seen, head_mask=mask)
    grads = torch.stack(gradient_pass(cap, ad, m.spec).grads(cap.pred)["attentions"], dim=1)  # the plain dF/dA
    maps = (grads * att.transpose(0, 1)).clamp_min(0).mean(2) * (cap.mask[:, None, :, None] & cap.mask[:, None, None])
    torch.testing.assert_close(got.matrices, maps, rtol=0, atol=1e-8)
    ones = get_method("mask_lrp", head_mask=torch.ones(3, 4, dtype=torch.float64).numpy()).compute(cap, ad, cap.pred)
    plain = get_method("transatt").compute(cap, ad, cap.pred)
    torch.testing.assert_close(ones.layer_scores, plain.layer_scores, rtol=0, atol=1e-12)
    assert not torch.allclose(got.layer_scores, plain.layer_scores)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3", "starcoder2",
                                    "phi3", "gpt_bigcode", "olmo2", "gpt_neox", "phi", "gptj", "stablelm"])
@pytest.mark.parametrize("name", ["lrp", "transatt"])
def test_alone_equals_padded_batch(family, name):
    """Each example alone = in a padded batch (1e-5 of the scale); pads get nothing and nothing is NaN."""
    model = tiny_model("llama", layers=2) if family == "llama" else family_model(family)
    ad = adapter_for(model)
    assert_layer_views_alone_equal_batch(get_method(name), ad, "llama", scale_floor=1e-30)


@pytest.mark.parametrize("family", ["phi3", "gpt_bigcode", "olmo2", "gpt_neox", "phi", "gptj", "stablelm"])
def test_mask_lrp_beyond_llamas_block(family):
    """A fused [q | k | v] projection (Phi-3: grouped value heads; GPT-BigCode: one shared value head; GPT-NeoX: per
    head), norms after the sublayers (OLMo 2: the add's operands are the norms' outputs, the attention's skip its own
    input) or a parallel block (GPT-NeoX, Phi: one add of three operands): the rollout's unmasked R^{A,l} is rebuilt from the
    value columns of the fused output; all ones = transatt; a mask changes the result; padding invariance 1e-5."""
    model = family_model(family)
    ad = adapter_for(model)
    lengths = [5, 9, 2]
    batch = random_batch("llama", lengths)
    with torch.no_grad():
        cap = ad.capture(batch, frozenset())
    L, H = ad.n_layers, ad.n_heads
    ones = get_method("mask_lrp", head_mask=np.ones((L, H))).compute(cap, ad, cap.pred)
    plain = get_method("transatt").compute(cap, ad, cap.pred)
    torch.testing.assert_close(ones.layer_scores, plain.layer_scores, rtol=0, atol=1e-12)
    torch.testing.assert_close(ones.matrices, plain.matrices, rtol=0, atol=1e-12)
    mask = np.array([[(l + h) % 2 for h in range(H)] for l in range(L)], dtype=np.float64)
    m = get_method("mask_lrp", head_mask=mask)
    got = m.compute(cap, ad, cap.pred)
    assert torch.isfinite(got.layer_scores).all() and not torch.allclose(got.layer_scores, plain.layer_scores)
    for b, n in enumerate(lengths):
        with torch.no_grad():
            alone_cap = ad.capture({k: v[b:b + 1, :n] for k, v in batch.items()}, frozenset())
        alone = m.compute(alone_cap, ad, cap.pred[b:b + 1])
        scale = max(float(alone.layer_scores.abs().max()), 1e-30)
        torch.testing.assert_close(got.layer_scores[b, :, :n], alone.layer_scores[0], rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize("family, why", [("mixtral", "mixture-of-experts"),
                                         ("gpt2", "Conv1D"),
                                         ("opt", "not one module"), ("olmo", "clip_qkv"),
                                         ("granite", "residual multiplier")])
def test_refused_in_one_line_where_no_rule_set_is_written(family, why):
    if family == "gpt2":
        ad = adapter_for(tiny_model("gpt2"))
    else:
        ad = adapter_for(family_model(family), family_heads(family)[0])
    for name in ("lrp", "partial_lrp", "transatt", "mask_lrp"):
        with pytest.raises(AttrscopeError) as err:
            get_method(name).check_architecture(ad)
        assert "\n" not in str(err.value) and why in str(err.value)


def test_float64_holds_one_layers_float64_weights_at_a_time():
    """--lrp-dtype auto (float64) on a float32 decoder without a float64 copy of it (issue 36): whenever a module's
    forward starts, the float64 tensors of a weight's shape alive are at most the modules outside the layers'
    (embeddings, head) and one layer's; the numbers are a float64 model's own (to 1e-12)."""
    import copy
    import gc

    from torch.nn.modules.module import register_module_forward_pre_hook

    model = tiny_model("llama", layers=6, dtype=torch.float32)
    ad = adapter_for(model)
    batch = random_batch("llama", LENGTHS)
    with torch.no_grad():
        cap = ad.capture(batch, frozenset())
    shapes = {tuple(p.shape) for p in model.parameters() if p.dim() == 2}
    layer_bytes = sum(p.numel() for p in ad.layers()[0].parameters() if p.dim() == 2) * 8
    in_layers = {id(p) for layer in ad.layers() for p in layer.parameters()}
    outside_bytes = sum(p.numel() for p in model.parameters() if p.dim() == 2 and id(p) not in in_layers) * 8
    seen = []

    def wide_weight_bytes(*_):
        seen.append(sum(o.numel() * 8 for o in gc.get_objects() if issubclass(type(o), torch.Tensor)
                        and o.dtype == torch.float64 and tuple(o.shape) in shapes))

    handle = register_module_forward_pre_hook(wide_weight_bytes)
    try:
        got = get_method("transatt").compute(cap, ad, cap.pred)
    finally:
        handle.remove()
    assert len(seen) > 6 and max(seen) <= outside_bytes + layer_bytes, (max(seen), outside_bytes, layer_bytes)
    assert next(model.parameters()).dtype == torch.float32  # the model as it was
    ad64 = adapter_for(copy.deepcopy(model).to(torch.float64))
    with torch.no_grad():
        cap64 = ad64.capture(batch, frozenset())
    want = get_method("transatt").compute(cap64, ad64, cap.pred)
    torch.testing.assert_close(got.layer_scores, want.layer_scores, rtol=0, atol=1e-12)
    torch.testing.assert_close(got.matrices, want.matrices, rtol=0, atol=1e-12)
