"""ALTI-Logit (docs/methods.md) on tiny float64 models: each layer's contributions sum to that layer's attention
update of the target logit; on pre-LN decoders the directions reproduce the model's own logit from the final
residual stream (the paper's exact setting); on post-LN encoders they equal explicit products of the frozen
Jacobians written here (LN2, feed-forward with zero-origin slopes, LN1 per layer, then the head); views are the
contributions carried to the inputs by ALTI's rollout of the layers below, summed into the final score."""

from __future__ import annotations

import pytest
import torch
from conftest import ARCHS, PRE_LN_ARCHS, alone_vs_batch_tol, random_batch, tiny_model

from compute.adapters import adapter_for
from compute.methods import get_method
from compute.methods._internals.decomposition import layer_parts
from compute.methods.alti_logit import at

LENGTHS = [7, 3, 5, 1]


def _run(arch, target=None):
    model = tiny_model(arch, num_labels=3)
    ad = adapter_for(model)
    m = get_method("alti_logit")
    with torch.no_grad():
        cap = ad.capture(random_batch(arch, LENGTHS), m.needs)
        t = cap.pred if target is None else target
        return model, ad, cap, m, t, m.compute(cap, ad, t)


@pytest.mark.parametrize("arch", ARCHS + PRE_LN_ARCHS)
@torch.no_grad()
def test_layer_contributions_sum_to_the_layers_attention_update_of_the_logit(arch):
    """sum_j Delta^l_j = <g^l, attention update of the explained token without b_O> for every layer, and the
    ALTI-tracked views keep each layer's total (ALTI's rows sum to 1) so the final score sums to sum_l sum_j."""
    model, ad, cap, m, t, res = _run(arch)
    delta, G = m.layer_contributions(cap, ad, t), m.directions(cap, ad, t)
    e = cap.explain_pos
    for l in range(ad.n_layers):
        p = layer_parts(cap, ad, l)
        after_attention = cap.ln2_in[l] if ad.pre_ln else cap.ln1_in[l]
        update = at(after_attention, e) - at(cap.hidden_states[l], e) - p.b_O
        torch.testing.assert_close(delta[:, l].sum(-1), (G[:, l] * update).sum(-1), rtol=1e-10, atol=1e-12)
        assert delta[:, l].abs().sum() > 1e-6
    torch.testing.assert_close(res.layer_scores.sum(-1), delta.sum(-1), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(res.scores, res.layer_scores.sum(1), rtol=1e-12, atol=1e-14)
    for b, n in enumerate(LENGTHS):
        assert not res.scores[b, n:].any()


@pytest.mark.parametrize("arch", PRE_LN_ARCHS)
@torch.no_grad()
def test_pre_ln_directions_give_the_models_logit_from_the_final_residual_stream(arch):
    """logit_c = <g, r_final> + <u, beta_f>: the final norm frozen at its real scale, the score row u (no bias)."""
    model, ad, cap, m, t, _ = _run(arch)
    for c in range(3):
        target = torch.full_like(t, c)
        g = m.directions(cap, ad, target)[:, 0]
        r = at(m._final_state(cap, ad), cap.explain_pos)
        beta = getattr(ad.final_norm(), "bias", None)
        const = 0 if beta is None else model.score.weight[c] @ beta
        # Llama's RMSNorm runs in float32 inside a float64 model (conftest): float32 tolerances there
        torch.testing.assert_close((g * r).sum(-1) + const, cap.logits[:, c], **alone_vs_batch_tol(arch, 1e-10, 1e-12))


def _ln_jacobian(gamma, sigma):
    d = gamma.shape[0]
    P = torch.eye(d, dtype=gamma.dtype) - 1.0 / d
    return torch.diag(gamma) @ P / sigma


@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_post_ln_directions_are_products_of_the_frozen_jacobians(arch):
    model, ad, cap, m, t, _ = _run(arch)
    G = m.directions(cap, ad, t)
    for b in range(len(LENGTHS)):
        e = int(cap.explain_pos[b])
        dense, act, classifier = ad.head_parts()
        pre = dense(cap.hidden_states[-1][b, e])
        g = classifier.weight[int(t[b])] @ torch.diag(act(pre) / pre) @ dense.weight  # the head, frozen
        for l in range(ad.n_layers - 1, -1, -1):
            layer = ad.layers()[l]
            ln1, ln2 = ad.ln1(layer), ad.ln2(layer)
            lin1, act1, lin2 = ad.ffn_parts(layer)
            s, tt = cap.ln1_in[l][b, e], cap.ln2_in[l][b, e]
            sig1 = (s.var(unbiased=False) + ln1.eps).sqrt()
            sig2 = (tt.var(unbiased=False) + ln2.eps).sqrt()
            h = lin1(ln1(s))
            J_ffn = torch.eye(s.shape[0], dtype=s.dtype) + lin2.weight @ torch.diag(act1(h) / h) @ lin1.weight
            g = g @ _ln_jacobian(ln2.weight, sig2) @ J_ffn @ _ln_jacobian(ln1.weight, sig1)
            torch.testing.assert_close(G[b, l], g, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
@torch.no_grad()
def test_views_are_contributions_carried_to_the_inputs_by_altis_rollout(arch):
    model, ad, cap, m, t, res = _run(arch)
    C = get_method("alti").compute(cap, ad, t).matrices  # [B, L, n, n] from the ALTI method itself
    delta = m.layer_contributions(cap, ad, t)
    for l in range(ad.n_layers):
        v = delta[:, l]
        for k in range(l - 1, -1, -1):
            v = torch.einsum("bj,bjs->bs", v, C[:, k])
        torch.testing.assert_close(res.layer_scores[:, l], v, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(res.layer_scores[:, 0], delta[:, 0], rtol=0, atol=0)  # layer 1: the inputs themselves
