"""The LRP family on pre-LN decoder blocks (docs/methods.md 8) in float64 on tiny random models: an independent
reference that writes every rule explicitly, layer by layer top-down, from the forward's recorded tensors (the
method reads them off one modified backward pass); all-ones head mask = transatt; padding and batch invariance;
one-line refusals where no rule set is written."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import assert_layer_views_alone_equal_batch, random_batch, tiny_model, tiny_task_model
from families import family_capture, family_heads, family_model

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


def _reference(model, batch, target, pos, seen, head_mask=None, head="score", foil=None):
    """(R at every layer's input [L, B, n], R^{A,l} [L, B, H, n, n]) with every rule written out top-down; the
    relevance starts at the head's output row ``pos``: one at the target, minus one at the foil (-1: none)."""
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
    x, y = rec[head]
    R = torch.zeros_like(y)
    R[torch.arange(B), pos, target] = 1.0
    if foil is not None:
        R[torch.arange(B), pos, foil.clamp_min(0)] -= (foil >= 0).to(R.dtype)
    R = _ab(R, x, model.get_submodule(head).weight, y)
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


def test_next_token_equals_the_rules_written_out_from_the_lm_head_with_a_foil(monkeypatch):
    """--task next-token: the relevance starts at the language-model head's row at the explained position, one at the
    target word minus one at the foil (an example without one: the target alone)."""
    from conftest import tiny_task_model
    from families import family_capture

    seen = _float64_model(monkeypatch)
    model = tiny_task_model("llama", "next-token", layers=3)
    ad = adapter_for(model, "next-token")
    batch = random_batch("llama", LENGTHS)
    with torch.no_grad():
        cap = family_capture(ad, batch, frozenset())
    cap.foil = torch.tensor([5, -1, 7, 9])
    target = torch.tensor([11, 12, 13, 9])  # the last: foil = target, nothing to explain
    lrp = get_method("lrp").compute(cap, ad, target)
    partial = get_method("partial_lrp").compute(cap, ad, target)
    inputs, att = _reference(model, batch, target, cap.explain_pos, seen, head="lm_head", foil=cap.foil)
    want = _zero_self(inputs.transpose(0, 1) * cap.mask[:, None], cap.explain_pos)
    assert want[:3].abs().max() > 1e-3 and (want[3] == 0).all()
    for name in ("lrp", "partial_lrp", "transatt", "mask_lrp"):
        get_method(name).check_task("next-token")  # the run's check
    torch.testing.assert_close(lrp.layer_scores, want, rtol=0, atol=1e-8)
    b = torch.arange(len(LENGTHS))
    rows = att.clamp_min(0).mean(2).transpose(0, 1)[b, :, cap.explain_pos]
    torch.testing.assert_close(partial.layer_scores, _zero_self(rows * cap.mask[:, None], cap.explain_pos),
                               rtol=0, atol=1e-8)


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_next_token_relevance_starts_at_one_through_a_soft_capped_head(family):
    """The logit soft-capping after the LM head (c tanh(z / c)) is elementwise: its identity rule hands the head's
    output the explained logit's relevance, one, not the cap's derivative; the alpha1-beta0 rule of the head
    conserves it, so the last hidden state's relevance sums to 1 per example."""
    from compute.methods._internals.gradients import spec_from
    from families import family_capture

    model = family_model(family, "next-token")
    assert model.config.final_logit_softcapping
    ad = adapter_for(model, "next-token")
    with torch.no_grad():
        cap = family_capture(ad, random_batch("llama", LENGTHS), frozenset())
    gp = gradient_pass(cap, ad, spec_from({"rules": "chefer_decoder"}))
    last = gp.hidden_states[-1] * gp.grads(cap.pred)["hidden"][-1]
    torch.testing.assert_close(last.sum((1, 2)), torch.ones(len(LENGTHS), dtype=last.dtype), rtol=0, atol=1e-7)


MOE = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"]


@pytest.mark.parametrize("family", MOE)
def test_experts_rule_equals_the_rules_written_out_per_token_and_conserves(family):
    """The routed experts with the routing fixed as in the forward: per token and chosen expert, its routing weight
    times its output's relevance through the down projection (alpha1-beta0, four products), half to the gate's and
    half to the up projection's output (the gated product's uniform rule, the activation's identity), the [gate |
    up] projection (alpha1-beta0); each token's relevance conserved (no bias), nothing to the router."""
    from compute.methods._internals.chefer_decoder_rules import chefer_decoder_rules

    model = family_model(family, family_heads(family)[0])
    ad = adapter_for(model, family_heads(family)[0])
    moe = model.model.layers[0].mlp
    experts = moe.experts
    g0 = torch.Generator().manual_seed(3)
    x = torch.randn(11, 32, generator=g0, dtype=torch.float64)
    with torch.no_grad():
        _, w, idx = moe.gate(x)
    g = torch.randn(11, 32, generator=g0, dtype=torch.float64)
    with chefer_decoder_rules(ad):
        xg = x.clone().requires_grad_(True)
        wg = w.detach().clone().requires_grad_(True)
        y = experts(xg, idx, wg)
        gx, gw = torch.autograd.grad(y, (xg, wg), g, allow_unused=True)
    with torch.no_grad():
        assert torch.equal(y, experts(x, idx, w))  # the module's own value
        assert gw is None or (gw == 0).all()  # the routing fixed
        want = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(idx.shape[1]):
                e = int(idx[t, j])
                W_gu, W_d = experts.gate_up_proj[e], experts.down_proj[e]
                gu = x[t:t + 1] @ W_gu.T
                gate, up = gu.chunk(2, dim=-1)
                h = experts.act_fn(gate) * up
                o = h @ W_d.T
                R_h = _ab(w[t, j].to(o.dtype) * o * g[t:t + 1], h, W_d, o)
                want[t] += _ab(torch.cat([R_h / 2, R_h / 2], dim=-1), x[t:t + 1], W_gu, gu)[0]
        got = x * gx
        assert want.abs().max() > 1e-3
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10 * float(want.abs().max()))
        scale = float((y * g).abs().sum(-1).max())  # the rules' eps moves a sum by ~1e-9 / Z of its terms
        torch.testing.assert_close(got.sum(-1), (y * g).sum(-1), rtol=0, atol=1e-6 * scale)


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe", "gpt2", "cohere", "falcon_7b", "opt", "olmo",
                                    "granite", "olmoe", "bloom", "falcon", "falcon_rw", "falcon_1ln", "mpt",
                                    "modernbert"])
def test_relevance_conserved_where_the_attention_adds_nothing(family):
    """W_O = 0 (the attention adds nothing) and no bias: the head (the score head, or the causal LM's through its
    logit scale), the residual adds, the norms' identity (LayerNorm's centring), the activations', the gated
    products' halves, the routed experts and Qwen2-MoE's shared expert under its fixed sigmoid gate conserve the
    explained logit's one, so each example's relevance sums to 1 at every layer's input (to the rules' eps; to HF's
    float32 RMSNorm inside a float64 model)."""
    from families import family_capture

    from compute.methods._internals.gradients import spec_from
    from compute.methods._internals.relevance import decoder_relevance

    task = "classification" if family == "gpt2" else family_heads(family)[0]
    model = tiny_task_model("gpt2", task, layers=3) if family == "gpt2" else family_model(family, task, layers=3)
    ad = adapter_for(model, task)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name.endswith(ad.block.out_proj + ".weight"):
                p.zero_()
    with torch.no_grad():
        cap = family_capture(ad, random_batch("llama", LENGTHS), frozenset())
    rel = decoder_relevance(cap, ad, spec_from({}), cap.pred)
    torch.testing.assert_close(rel.inputs.sum(-1), torch.ones(ad.n_layers, len(LENGTHS), dtype=torch.float64),
                               rtol=1e-6, atol=0)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3", "starcoder2",
                                    "phi3", "gpt_bigcode", "olmo2", "gpt_neox", "phi", "gptj", "stablelm", "mixtral",
                                    "qwen2_moe", "qwen3_moe", "gpt2", "cohere", "olmoe", "opt", "olmo", "granite",
                                    "bloom", "falcon", "mpt", "modernbert"])
@pytest.mark.parametrize("name", ["lrp", "transatt"])
def test_alone_equals_padded_batch(family, name):
    """Each example alone = in a padded batch (1e-5 of the scale); pads get nothing and nothing is NaN (a causal LM
    only, Cohere's: its next token)."""
    from families import family_capture

    model = tiny_model(family, layers=2) if family in ("llama", "gpt2") else family_model(family)
    ad = adapter_for(model, "classification" if family in ("llama", "gpt2") else family_heads(family)[0])
    assert_layer_views_alone_equal_batch(get_method(name), ad, "llama", scale_floor=1e-30, capture=family_capture)


@pytest.mark.parametrize("family", ["llama", "mixtral", "cohere"])
def test_next_token_alone_equals_padded_batch(family):
    """--task next-token: mask_lrp (a mask of every other head), each example alone = in a padded batch."""
    from families import family_capture

    model = tiny_task_model("llama", "next-token", layers=2) if family == "llama" else family_model(family,
                                                                                                  "next-token")
    ad = adapter_for(model, "next-token")
    mask = np.array([[(l + h) % 2 for h in range(ad.n_heads)] for l in range(ad.n_layers)], dtype=np.float64)
    assert_layer_views_alone_equal_batch(get_method("mask_lrp", head_mask=mask), ad, "llama", scale_floor=1e-30,
                                         capture=family_capture)


@pytest.mark.parametrize("family", ["phi3", "gpt_bigcode", "olmo2", "gpt_neox", "phi", "gptj", "stablelm", "mixtral",
                                    "qwen2_moe", "qwen3_moe", "gpt2", "cohere", "olmoe", "opt", "olmo", "granite",
                                    "bloom", "falcon", "mpt", "modernbert"])
def test_mask_lrp_beyond_llamas_block(family):
    """A fused [q | k | v] projection (Phi-3: grouped value heads; GPT-BigCode: one shared value head; GPT-NeoX: per
    head), norms after the sublayers (OLMo 2: the add's operands are the norms' outputs, the attention's skip its own
    input) or a parallel block (GPT-NeoX, Phi: one add of three operands): the rollout's unmasked R^{A,l} is rebuilt from the
    value columns of the fused output; all ones = transatt; a mask changes the result; padding invariance 1e-5."""
    model = tiny_model("gpt2", layers=2) if family == "gpt2" else family_model(family)
    ad = adapter_for(model, "classification" if family == "gpt2" else family_heads(family)[0])
    lengths = [5, 9, 2]
    batch = random_batch("llama", lengths)
    with torch.no_grad():
        cap = family_capture(ad, batch, frozenset())
    L, H = ad.n_layers, ad.n_heads
    ones = get_method("mask_lrp", head_mask=np.ones((L, H))).compute(cap, ad, cap.pred)
    plain = get_method("transatt").compute(cap, ad, cap.pred)
    torch.testing.assert_close(ones.layer_scores, plain.layer_scores, rtol=0, atol=1e-12)
    torch.testing.assert_close(ones.matrices, plain.matrices, rtol=0, atol=1e-12)
    mask = np.array([[(l + h) % 2 for h in range(H)] for l in range(L)], dtype=np.float64)
    m = get_method("mask_lrp", head_mask=mask)
    got = m.compute(cap, ad, cap.pred)
    assert torch.isfinite(got.layer_scores).all()
    assert not torch.allclose(got.layer_scores, plain.layer_scores, rtol=1e-6, atol=0)
    for b, n in enumerate(lengths):
        with torch.no_grad():
            alone_cap = family_capture(ad, {k: v[b:b + 1, :n] for k, v in batch.items()}, frozenset())
        alone = m.compute(alone_cap, ad, cap.pred[b:b + 1])
        scale = max(float(alone.layer_scores.abs().max()), 1e-30)
        torch.testing.assert_close(got.layer_scores[b, :, :n], alone.layer_scores[0], rtol=0, atol=1e-5 * scale)


def test_float64_twin_of_a_grouped_experts_model_runs_the_eager_loop():
    """A checkpoint's default experts kernel (the grouped matmul) has no float64 form: the LRP family's float64 twin
    runs the experts' eager loop (the same function), and gives what a float64 eager model gives."""
    model = family_model("mixtral", dtype=torch.float32)
    model.set_experts_implementation("grouped_mm")
    ad = adapter_for(model)
    batch, cap = _capture(ad)
    got = get_method("lrp").compute(cap, ad, cap.pred)
    eager = adapter_for(family_model("mixtral", dtype=torch.float32).double())
    want = get_method("lrp", dtype="model").compute(_capture(eager)[1], eager, cap.pred)
    assert model.config._experts_implementation == "grouped_mm"  # the model itself is left as it is
    torch.testing.assert_close(got.layer_scores, want.layer_scores.to(got.layer_scores.dtype), rtol=0,
                               atol=1e-6 * float(want.layer_scores.abs().max()))


@pytest.mark.parametrize("family", ["olmo", "mpt", "bloom", "opt", "granite", "qwen2_moe"])
def test_the_rules_leave_the_models_values(family):
    """The hooks return the modules' own values (OLMo's and MPT's clip_qkv clamp, BLOOM's and MPT's sublayers adding
    their residual, OPT's MLP on [B n, d], Granite's multipliers, Qwen2-MoE's experts and fixed shared gate): the
    pass's logits are the model's, bit for bit, and no hook is left after it."""
    from compute.methods._internals.gradients import spec_from
    from families import family_capture

    task = family_heads(family)[0]
    model = family_model(family, task)
    ad = adapter_for(model, task)
    with torch.no_grad():
        cap = family_capture(ad, random_batch("llama", LENGTHS), frozenset())
    gp = gradient_pass(cap, ad, spec_from({"rules": "chefer_decoder"}))
    assert torch.equal(gp.logits, cap.logits)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_refused_in_one_line_where_the_experts_layout_is_not_read():
    """Experts whose weights the rule does not read as [gate | up] and down stacks (here: said to carry biases)."""
    model = family_model("mixtral")
    for layer in model.model.layers:
        layer.mlp.experts.has_bias = True
    ad = adapter_for(model)
    with pytest.raises(AttrscopeError) as err:
        get_method("mask_lrp").check_architecture(ad)
    assert "\n" not in str(err.value) and "experts' weights" in str(err.value)


@pytest.mark.parametrize("family, why", [("deberta-v2", "relative-position")])
def test_refused_in_one_line_where_no_rule_set_is_written(family, why):
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

    def wide_weights() -> list:
        return [o for o in gc.get_objects() if issubclass(type(o), torch.Tensor) and o.dtype == torch.float64
                and tuple(o.shape) in shapes]

    # float64 tensors of these shapes that other tests' cached models hold (the whole suite in one process)
    before = {id(o) for o in wide_weights()}

    def wide_weight_bytes(*_):
        seen.append(sum(o.numel() * 8 for o in wide_weights() if id(o) not in before))

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


@pytest.mark.parametrize("dtype", ["model", "float64"])
@pytest.mark.parametrize("family", ["llama", "mixtral", "qwen2_moe", "opt", "gpt2", "olmo", "granite", "bloom"])
def test_the_doubled_pass_plain_half_is_the_plain_gradient(family, dtype):
    """transatt's and mask_lrp's one pass over a doubled batch (rule_rows): its plain half's gradients of the input,
    of every layer's output and of every attention are a plain gradient pass's, on every rule the plain rows meet
    (alpha1-beta0 on Linears and GPT-2's Conv1Ds, OLMo's clip_qkv clamp, the experts' Function and Qwen2-MoE's fixed
    shared gate, OPT's MLP on [B n, d], Granite's residual multiplier in the add rule, BLOOM's sublayers adding
    their residual); its logits are the model's on both halves. "float64": a float32 model's pass widened a layer at
    a time (widened; the rules' weights cast per step) against a float64 copy's plain pass."""
    from compute.methods._internals.gradients import Explained

    if family in ("llama", "gpt2"):
        ad = adapter_for(tiny_model(family, layers=2, dtype=torch.float32), "classification")
    else:
        task = family_heads(family)[0]
        ad = adapter_for(family_model(family, task, dtype=torch.float32), task)
    with torch.no_grad():
        cap = family_capture(ad, random_batch("llama", LENGTHS), frozenset())
    B = cap.input_ids.shape[0]
    doubled = gradient_pass(cap, ad, Explained(dtype=dtype, rules="chefer_decoder", plain_rows=True))
    plain = gradient_pass(cap, ad, Explained(dtype=dtype))
    close = lambda g, w: torch.testing.assert_close(g, w, rtol=0, atol=1e-5 * float(w.detach().abs().max()) + 1e-12)  # noqa: E731
    close(doubled.logits[:B], plain.logits)  # float32 kernels may round a doubled batch's rows otherwise
    close(doubled.logits[B:], plain.logits)
    got, want = doubled.grads(cap.pred), plain.grads(cap.pred)
    for key in ("X", "hidden", "attentions"):
        for g, w in zip(got[key] if key != "X" else [got[key]], want[key] if key != "X" else [want[key]]):
            close(g[:B], w)
