"""AttnLRP (docs/methods.md 7) in float64 on tiny random models: an independent reference that writes the rules at the
products themselves (the model's own forward with its eager attention, MLP and norms replaced by forms whose
gradient is the rule's), conservation where nothing absorbs, foil = target minus foil, and batch invariance.
(lxt's own numbers: tests/test_attnlrp_lxt.py; every family alone = padded batch: tests/test_families.py.)"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_layer_views_alone_equal_batch, random_batch, tiny_model
from families import family_model

from compute.adapters import adapter_for
from compute.errors import AttrscopeError
from compute.methods import get_method

LENGTHS = [7, 3, 9, 1]


def _capture(ad, lengths=LENGTHS):
    batch = random_batch("llama", lengths)
    with torch.no_grad():
        return batch, ad.capture(batch, frozenset())


def _half(a, b, op):
    """The uniform rule on a product: each operand's gradient half the plain one, the value the product's."""
    return 0.5 * op(a, b.detach()) + 0.5 * op(a.detach(), b)


def _llama_reference(monkeypatch, model, batch, target, foil=None):
    """R at every layer's input [L, B, n] of a Llama-block model (Llama, Qwen2, Mixtral), with its modules' forwards
    replaced:
    Q K^T and A V through ``_half`` inside a rewritten eager attention, the gated product through ``_half``, the
    activation's identity rule as f(x).detach() + (x - x.detach()) f(x)/x, RMSNorm with its 1/rms detached (the
    values stay the model's: HF's float32 RMSNorm); Mixtral's experts with the uniform rule at the routing product
    too (the method's 1/4 at the experts' input and 1/2 at the routing weights)."""
    import transformers.models.llama.modeling_llama as ml
    import transformers.models.mixtral.modeling_mixtral as mx
    import transformers.models.qwen2.modeling_qwen2 as mq

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        key, value = ml.repeat_kv(key, module.num_key_value_groups), ml.repeat_kv(value, module.num_key_value_groups)
        logits = _half(query, key.transpose(2, 3), torch.matmul) * scaling
        if attention_mask is not None:
            logits = logits + attention_mask
        A = torch.softmax(logits, dim=-1, dtype=torch.float32).to(query.dtype)
        return _half(A, value, torch.matmul).transpose(1, 2).contiguous(), A

    def mlp(self, x):
        g = self.gate_proj(x)
        a = self.act_fn(g)
        a = a.detach() + (g - g.detach()) * (a / (g + 1e-10)).detach()
        return self.down_proj(_half(a, self.up_proj(x), torch.mul))

    def rms(orig):
        def forward(self, x):
            inv = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return orig(self, x).detach() + (x - x.detach()) * (self.weight * inv).detach()
        return forward

    def experts(self, hidden_states, top_k_index, top_k_weights):
        """Mixtral's experts with the uniform rule at the gated product and at the routing product."""
        out = torch.zeros_like(hidden_states)
        for e in range(self.num_experts):
            token, slot = torch.where(top_k_index == e)
            gate, up = torch.nn.functional.linear(hidden_states[token], self.gate_up_proj[e]).chunk(2, dim=-1)
            a = self.act_fn(gate)
            a = a.detach() + (gate - gate.detach()) * (a / (gate + 1e-10)).detach()
            y = torch.nn.functional.linear(_half(a, up, torch.mul), self.down_proj[e])
            out = out.index_add(0, token, _half(y, top_k_weights[token, slot, None], torch.mul))
        return out

    for mod, prefix in ((ml, "Llama"), (mq, "Qwen2"), (mx, "Mixtral")):
        monkeypatch.setattr(mod, "eager_attention_forward", attention)
        if prefix == "Mixtral":
            monkeypatch.setattr(mod.MixtralExperts, "forward", experts)
        else:
            monkeypatch.setattr(getattr(mod, f"{prefix}MLP"), "forward", mlp)
        norm = getattr(mod, f"{prefix}RMSNorm")
        monkeypatch.setattr(norm, "forward", rms(norm.forward))
    ad = adapter_for(model)
    with torch.no_grad():
        X = ad.embeddings()(batch["input_ids"])
    X.requires_grad_(True)
    h = ad.embeddings().register_forward_hook(lambda *_: X)
    try:
        out = model(**batch, output_hidden_states=True)
    finally:
        h.remove()
    b = torch.arange(len(target))
    F = out.logits[b, target]
    if foil is not None:
        F = F - out.logits[b, foil]
    hs = out.hidden_states[:ad.n_layers]  # the inputs of layers 1..L (hidden_states[0] is X)
    grads = torch.autograd.grad(F.sum(), hs)
    return torch.stack([(x * g).sum(-1) for x, g in zip(hs, grads)]) * batch["attention_mask"], F.detach()


@pytest.mark.parametrize("family", ["llama", "qwen2", "mixtral"])
def test_attnlrp_equals_the_rules_written_at_the_products(monkeypatch, family):
    model = tiny_model("llama", layers=3) if family == "llama" else family_model(family, layers=3)
    ad = adapter_for(model)
    batch, cap = _capture(ad)
    res = get_method("attnlrp").compute(cap, ad, cap.pred)
    want, F = _llama_reference(monkeypatch, model, batch, cap.pred)
    assert res.layer_scores.shape == (len(LENGTHS), ad.n_layers, max(LENGTHS))
    torch.testing.assert_close(res.layer_scores, want.transpose(0, 1), rtol=0, atol=1e-10)
    torch.testing.assert_close(res.scores, want[0], rtol=0, atol=1e-10)
    assert res.scores.abs().max() > 1e-3  # not vacuous
    assert not torch.isclose(res.scores.sum(-1), F).all()  # the softmax absorbs (docs/methods.md 7.3)


def test_the_model_is_unchanged_by_the_rules():
    """The hooks return the modules' own values: the pass's logits are the model's, bit for bit, and the hooks are
    gone after it (a plain gradient pass on the same batch is the plain gradient)."""
    from compute.methods._internals.gradients import gradient_pass, spec_from

    model = family_model("qwen2_moe")
    ad = adapter_for(model)
    batch, cap = _capture(ad)
    gp = gradient_pass(cap, ad, spec_from({"rules": "attnlrp"}))
    assert torch.equal(gp.logits, cap.logits)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    plain = get_method("gxi_mean").compute(cap, ad, cap.pred).scores
    assert not torch.allclose(plain, get_method("attnlrp").compute(cap, ad, cap.pred).scores)


@pytest.mark.parametrize("family", ["gpt_neox", "llama"])
def test_conservation_where_nothing_absorbs(family):
    """A bias-free model whose attention outputs nothing (W_O = 0): the norms' and activations' identity rules, the
    gated product's uniform rule, the residual adds and the score head conserve relevance, so the tokens'
    relevance sums to the logit at every layer's input. GPT-NeoX (LayerNorm, GELU) to 1e-9 (the identity rule's
    stabiliser, f(x) / (x + 1e-10), moves it by about 1e-10 of the logit); Llama to HF's float32
    rounding of RMSNorm's output inside a float64 model (the rule conserves the exact linearised output)."""
    if family == "llama":
        model, out = tiny_model("llama", layers=3), "self_attn.o_proj.weight"
    else:
        model, out = family_model("gpt_neox", layers=3), "attention.dense.weight"
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name.endswith(out):
                p.zero_()
    ad = adapter_for(model)
    batch, cap = _capture(ad)
    res = get_method("attnlrp").compute(cap, ad, cap.pred)
    F = cap.logits[torch.arange(len(LENGTHS)), cap.pred]
    tol = dict(rtol=1e-9, atol=0) if family == "gpt_neox" else dict(rtol=1e-6, atol=0)
    torch.testing.assert_close(res.layer_scores.sum(-1), F[:, None].expand(-1, ad.n_layers), **tol)


def test_foil_is_target_minus_foil():
    """The backward is linear in its start: target minus foil = the two explanations' difference (to 1e-6 of the
    scale: HF's eager attention takes the softmax, and so its backward, in float32 inside a float64 model)."""
    model = tiny_model("llama", layers=2, num_labels=3)
    ad = adapter_for(model)
    batch, cap = _capture(ad)
    m = get_method("attnlrp")
    target, foil = torch.tensor([0, 1, 2, 0]), torch.tensor([1, 2, 0, -1])
    per = {c: m.compute(_capture(ad)[1], ad, torch.full((4,), c)).scores for c in range(3)}
    cap.foil = foil
    got = m.compute(cap, ad, target).scores
    b = torch.arange(4)
    want = torch.stack([per[int(t)][i] - (per[int(f)][i] if f >= 0 else 0) for i, (t, f) in enumerate(zip(target, foil))])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6 * float(want.abs().max()))
    assert (got[b, :] != per[0]).any()


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "mixtral", "gemma3", "qwen2_moe", "bert"])
def test_alone_equals_padded_batch(family):
    """Each example alone = in a padded, batched float32 pass (1e-5 of the scale); no NaN at pads and masked keys."""
    if family in ("llama", "bert"):
        model = tiny_model(family, layers=2, dtype=torch.float32)
    else:
        model = family_model(family, dtype=torch.float32)
    ad = adapter_for(model)
    assert_layer_views_alone_equal_batch(get_method("attnlrp"), ad, "llama" if family != "bert" else "bert")


def test_refused_in_one_line_where_no_hook_reaches():
    ad = adapter_for(family_model("deberta-v2"))
    with pytest.raises(AttrscopeError) as err:
        get_method("attnlrp").check_architecture(ad)
    assert "\n" not in str(err.value) and "deberta-v2" in str(err.value) and "relative-position" in str(err.value)
