"""N_RESLN, GlobEnc and W_RES on pre-LN blocks (docs/methods.md 6.1) on tiny random float64 models of every pre-LN
family: the GlobEnc vectors, materialised, sum with the unassigned terms to every layer's output (the last layer's
through the final norm: the model's last hidden state), their Gram-matrix norms are GlobEnc's matrices, N_RESLN is
N_RES, and W_RES's diagonal is 1 - r of the materialised vectors. (Batch invariance: tests/test_families.py and
tests/test_methods_preln.py run every method defined for the family.)"""

from __future__ import annotations

import pytest
import torch
from conftest import random_batch, tiny_model
from families import FAMILIES, VARIANTS, family_capture, family_model, model_task

from compute.adapters import adapter_for
from compute.methods import get_method
from compute.methods._internals.decomposition import NEEDS, attention_vectors, layer_parts, operands
from compute.methods._internals.pre_ln import BlockSteps, with_final_output

LENGTHS = [7, 3, 5, 1]


def _models():
    yield "gpt2", lambda: tiny_model("gpt2", layers=2)
    yield "llama", lambda: tiny_model("llama", layers=2)
    for family in (*FAMILIES, *VARIANTS):
        yield family, lambda family=family: family_model(family)


PRE_LN = [(name, make) for name, make in _models() if adapter_for(make(), model_task(make())).pre_ln]


@pytest.fixture(scope="module", params=PRE_LN, ids=[name for name, _ in PRE_LN])
def pre_ln(request):
    model = request.param[1]()
    ad = adapter_for(model, model_task(model))
    with torch.no_grad():
        cap = family_capture(ad, random_batch("bert", LENGTHS), NEEDS)
    return ad, cap


def globenc_vectors(ad, cap, l):
    """(layer l's parts, its GlobEnc vectors [B, i, j, d] materialised)."""
    p = with_final_output(layer_parts(cap, ad, l), ad)
    n = p.A.shape[-1]
    U, diag, scale = operands(p, "glob")
    return p, attention_vectors(p, slice(0, n), U, diag, scale)


@torch.no_grad()
def test_globenc_parts_sum_to_every_layer_output(pre_ln):
    ad, cap = pre_ln
    L = ad.n_layers
    norm = ad.final_norm()
    for l in range(L):
        p, parts = globenc_vectors(ad, cap, l)
        bias = p.b_O if p.rho is None else p.weights.gamma_o[l] * p.b_O / p.rho[..., None]
        steps = BlockSteps(ad, l)
        own = steps.mlp_step(p.x if steps.parallel else p.t)  # the token's own MLP step, assigned to no token
        if l < L - 1:
            got = parts.sum(2) + bias + own
        else:  # the final norm, linearised at the real scale of the last layer's output, then its beta
            beta = getattr(norm, "bias", None)
            got = parts.sum(2) + p.final_linear(bias + own) / p.sigma_f[..., None]
            got = got + (0 if beta is None else beta)
        want = cap.hidden_states[l + 1]  # the model's own: the next layer's input, or the final norm's output
        for b, k in enumerate(LENGTHS):
            # 1e-5: HF computes RMSNorm in float32 inside a float64 model
            torch.testing.assert_close(got[b, :k], want[b, :k], rtol=0, atol=1e-5, msg=f"layer {l}")


@torch.no_grad()
def test_globenc_norm_resln_and_w_res_on_pre_ln(pre_ln):
    ad, cap = pre_ln
    L = ad.n_layers
    glob, resln, res, wres = (get_method(name).compute(cap, ad, cap.pred)
                              for name in ("globenc", "norm_resln", "norm_res", "w_res"))
    torch.testing.assert_close(resln.matrices, res.matrices, rtol=0, atol=0)  # N_RESLN is N_RES on pre-LN blocks
    for l in range(L):
        _, parts = globenc_vectors(ad, cap, l)
        N = torch.linalg.vector_norm(parts, dim=-1)
        own = torch.diagonal(parts, dim1=1, dim2=2).transpose(1, 2)  # [B, n, d]
        other = torch.linalg.vector_norm(parts.sum(2) - own, dim=-1)
        r = other / (other + torch.linalg.vector_norm(own, dim=-1))
        for b, k in enumerate(LENGTHS):
            torch.testing.assert_close(glob.matrices[b, l, :k, :k], N[b, :k, :k], rtol=1e-8, atol=1e-10)
            W = wres.matrices[b, l, :k, :k]
            # r reads the real residual stream, which HF's float32 RMSNorm on the attention output rounds
            tol = 1e-10 if ad.block.attn_out_norm is None else 1e-6
            torch.testing.assert_close(torch.diagonal(W), 1 - r[b, :k], rtol=0, atol=tol)
            torch.testing.assert_close(W.sum(-1), torch.ones(k, dtype=W.dtype), rtol=0, atol=tol)
            assert not glob.matrices[b, l, k:].any() and not wres.matrices[b, l, :, k:].any()
    tol = 1e-8 if ad.block.attn_out_norm is None else 1e-6  # W_RES's rows: 1 - r to the rounding of r (above)
    for b, k in enumerate(LENGTHS):  # views sum to 1 (GlobEnc's PROD scaled, W_RES row-stochastic)
        for out in (glob, wres):
            torch.testing.assert_close(out.layer_scores[b, :, :k].sum(-1), torch.ones(L, dtype=torch.float64),
                                       rtol=0, atol=tol)


@torch.no_grad()
def test_groups_of_layers_and_examples_give_the_same_matrices(pre_ln, monkeypatch):
    """A budget of one (layer, example) per group (compute.methods._internals.decomposition.layer_groups): the last
    layer's final norm is taken in its own group of every example as in the one stack."""
    import compute.methods._internals.budget as budget

    ad, cap = pre_ln
    whole = {name: get_method(name).compute(cap, ad, cap.pred).matrices for name in ("globenc", "w_res")}
    cap.memo.clear()
    monkeypatch.setattr(budget, "CPU_STACK_BYTES", 1)
    for name, M in whole.items():
        torch.testing.assert_close(get_method(name).compute(cap, ad, cap.pred).matrices, M, rtol=1e-12, atol=1e-14)
