"""ALTI, GlobEnc and the N/W family on tiny random float64 models of every post-LN architecture: the decomposition
identities of METHODS.md 11.1-11.5, the Gram trick, and agreement with the naive reference of tests/reference.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import ARCHS, random_batch, tiny_model

import reference as R
from compute.adapters import adapter_for
from compute.methods import get_method
from compute.methods._internals.aggregate import prod_rows_normalised
from compute.methods._internals import budget
from compute.methods._internals.decomposition import (NEEDS, attention_vectors, decomposed_inner, decomposed_norms,
                                                      decomposed_sq_norms, diagonal_vectors, layer_parts, layer_stack,
                                                      operands)
from compute.methods.w_res import mixing_ratio

LENGTHS = [8, 3, 6, 1]  # padded batch, including a single-token example
DECOMP = ["alti", "alti_l2", "globenc", "norm_n", "norm_fixedres", "norm_res", "norm_resln", "w_fixedres", "w_res"]


@pytest.fixture(scope="module", params=ARCHS)
def captured(request):
    arch = request.param
    model = tiny_model(arch)
    ad = adapter_for(model)
    batch = random_batch(arch, LENGTHS)
    with torch.no_grad():
        cap = ad.capture(batch, NEEDS)
    return arch, model, ad, batch, cap


def _valid(cap, b):
    return int(cap.lengths[b])


@torch.no_grad()
def test_attention_block_identity(captured):
    """11.1: sum_j T_i(x_j) + gamma1 P b_O / sigma1_i + beta1 == LN1 output, to 1e-8."""
    _, _, ad, _, cap = captured
    for l in range(ad.n_layers):
        p = layer_parts(cap, ad, l)
        n = p.A.shape[-1]
        T = attention_vectors(p, slice(0, n), *operands(p, "resln"))  # [B, n, n, d]
        rebuilt = T.sum(2) + p.b_tilde
        for b in range(len(LENGTHS)):
            k = _valid(cap, b)
            torch.testing.assert_close(rebuilt[b, :k], p.y[b, :k], rtol=0, atol=1e-8)


@torch.no_grad()
def test_globenc_identity_through_ln2(captured):
    """11.2: sum_j x~_{i<-j} + gamma2 P(b~_i + FFN(y_i)) / sigma2_i + beta2 == LN2 output, to 1e-8."""
    _, _, ad, _, cap = captured
    for l in range(ad.n_layers):
        p = layer_parts(cap, ad, l)
        n = p.A.shape[-1]
        X = attention_vectors(p, slice(0, n), *operands(p, "enc"))  # x~ for all i, j
        ffn = p.t - p.y  # t_i = y_i + FFN(y_i)
        rebuilt = X.sum(2) + p.ln2_linear(p.b_tilde + ffn) / p.sigma2[..., None] + p.beta2
        for b in range(len(LENGTHS)):
            k = _valid(cap, b)
            torch.testing.assert_close(rebuilt[b, :k], p.y2[b, :k], rtol=0, atol=1e-8)


@torch.no_grad()
def test_gram_trick_equals_materialised_norms(captured):
    """11.3: Gram-matrix norms equal the norms of the materialised vectors (N, N_RES, N_RESLN = ALTI path, N_ENC)."""
    _, _, ad, _, cap = captured
    for l in range(ad.n_layers):
        p = layer_parts(cap, ad, l)
        n = p.A.shape[-1]
        for kind in ("n", "res", "resln", "enc"):
            full = torch.linalg.vector_norm(attention_vectors(p, slice(0, n), *operands(p, kind)), dim=-1)
            torch.testing.assert_close(decomposed_norms(p, kind), full, rtol=1e-9, atol=1e-10)


@torch.no_grad()
def test_inner_products_and_squared_norms_without_vectors_equal_the_materialised_ones(captured):
    """ALTI-l2's shortcut: <y_i, T_ij> and ||T_ij||^2 from products of weights and values equal the ones of the built
    vectors; diagonal=False leaves every off-diagonal entry as it is; the self vectors are T_ii."""
    _, _, ad, _, cap = captured
    gen = torch.Generator().manual_seed(3)
    for l in range(ad.n_layers):
        p = layer_parts(cap, ad, l)
        n = p.A.shape[-1]
        y = torch.randn(p.x.shape, generator=gen, dtype=p.x.dtype)
        off = ~torch.eye(n, dtype=torch.bool)
        for kind in ("n", "res", "resln", "enc"):
            T = attention_vectors(p, slice(0, n), *operands(p, kind))  # [B, i, j, d]
            inner = torch.linalg.vecdot(T, y[:, :, None])
            torch.testing.assert_close(decomposed_inner(p, kind, y), inner, rtol=1e-9, atol=1e-10)
            torch.testing.assert_close(decomposed_inner(p, kind, y, diagonal=False)[:, off], inner[:, off],
                                       rtol=1e-9, atol=1e-10)
            sq = torch.linalg.vecdot(T, T)
            torch.testing.assert_close(decomposed_sq_norms(p, kind), sq, rtol=1e-9, atol=1e-10)
            torch.testing.assert_close(decomposed_sq_norms(p, kind, diagonal=False)[:, off], sq[:, off],
                                       rtol=1e-9, atol=1e-10)
            torch.testing.assert_close(diagonal_vectors(p, kind), torch.diagonal(T, dim1=1, dim2=2).transpose(1, 2),
                                       rtol=1e-9, atol=1e-10)


@torch.no_grad()
def test_a_captured_stack_is_made_once_and_remade_only_for_a_replaced_list(captured):
    """Captured.stack copies the layer list once: a second call returns the same tensor without a copy (it once made
    a new one on every call, the layer views' base being the concatenation rather than its reshaped view), and a list
    replaced since (a copy with other tensors) is stacked again from its new entries."""
    import dataclasses

    from op_counting import count

    _, _, _, _, cap = captured
    for name in ("attentions", "values", "hidden_states"):
        first = cap.stack(name)
        assert count(lambda: cap.stack(name)).total == 0
        assert cap.stack(name) is first
        for l, layer in enumerate(getattr(cap, name)):
            assert layer.data_ptr() == first[l].data_ptr()
    other = dataclasses.replace(cap, attentions=[a * 2 for a in cap.attentions], stacks=dict(cap.stacks))
    torch.testing.assert_close(other.stack("attentions"), 2 * cap.stack("attentions"))
    assert other.stack("attentions").data_ptr() != cap.stack("attentions").data_ptr()


@torch.no_grad()
def test_a_stack_of_layers_equals_its_layers_one_by_one(captured):
    """Every function on a stack of all layers ([L, B, ...], weights broadcast over the batch) gives each layer's own
    numbers, and so does a stack of some layers for some examples."""
    _, _, ad, _, cap = captured
    gen = torch.Generator().manual_seed(4)
    whole, part = layer_stack(cap, ad), layer_stack(cap, ad, slice(1, 3), slice(1, 3))
    y = torch.randn(whole.x.shape, generator=gen, dtype=whole.x.dtype)
    for kind in ("n", "res", "resln", "enc"):
        got = [decomposed_norms(whole, kind), decomposed_inner(whole, kind, y), diagonal_vectors(whole, kind),
               decomposed_norms(part, kind)]
        for l in range(ad.n_layers):
            p = layer_parts(cap, ad, l)
            torch.testing.assert_close(got[0][l], decomposed_norms(p, kind), rtol=1e-12, atol=1e-13)
            torch.testing.assert_close(got[1][l], decomposed_inner(p, kind, y[l]), rtol=1e-12, atol=1e-13)
            torch.testing.assert_close(got[2][l], diagonal_vectors(p, kind), rtol=1e-12, atol=1e-13)
            if l in (1, 2):
                torch.testing.assert_close(got[3][l - 1], decomposed_norms(p, kind)[1:3], rtol=1e-12, atol=1e-13)


@torch.no_grad()
@pytest.mark.parametrize("name", DECOMP)
def test_groups_of_layers_and_examples_do_not_change_the_result(captured, name, monkeypatch):
    """With the working memory of a stack forced to one (layer, example), every method computes group by group and
    gives the numbers of the single stack of all layers."""
    _, _, ad, _, cap = captured
    whole = get_method(name).compute(cap, ad, cap.pred)
    monkeypatch.setattr(budget, "CPU_STACK_BYTES", 1)
    cap.memo.clear()
    split = get_method(name).compute(cap, ad, cap.pred)
    cap.memo.clear()
    for what in ("scores", "layer_scores", "matrices"):
        torch.testing.assert_close(getattr(split, what), getattr(whole, what), rtol=1e-12, atol=1e-13)


@torch.no_grad()
def test_stacked_weights_cached_across_batches_follow_weight_changes(captured):
    """The stacked weights (and gamma P W_O) are kept across batches: changing a weight in place (or replacing it) must
    not reuse them."""
    _, _, ad, _, cap = captured
    layer = ad.layers()[0]
    out, ln1 = ad.out_proj(layer), ad.ln1(layer)
    saved = out.weight.clone(), ln1.weight

    def check():
        p = layer_parts(cap, ad, 0)
        n = p.A.shape[-1]
        for kind in ("n", "resln"):
            full = torch.linalg.vector_norm(attention_vectors(p, slice(0, n), *operands(p, kind)), dim=-1)
            torch.testing.assert_close(decomposed_norms(p, kind), full, rtol=1e-9, atol=1e-10)

    try:
        check()
        out.weight.mul_(1.7)
        check()
        ln1.weight = torch.nn.Parameter(ln1.weight * 0.5)
        check()
    finally:
        out.weight.copy_(saved[0])
        ln1.weight = saved[1]


@torch.no_grad()
def test_alti_matrices_are_row_stochastic_with_zero_pad_columns(captured):
    """11.4: C >= 0, rows sum to 1, pad rows and columns are 0; views sum to 1; n = 1 gives [[1]]."""
    _, _, ad, _, cap = captured
    for name in ("alti", "alti_l2"):
        res = get_method(name).compute(cap, ad, cap.pred)
        C = res.matrices
        assert torch.all(C >= 0)
        for b in range(len(LENGTHS)):
            k = _valid(cap, b)
            torch.testing.assert_close(C[b, :, :k, :k].sum(-1), torch.ones(ad.n_layers, k, dtype=C.dtype))
            assert torch.all(C[b, :, :, k:] == 0) and torch.all(C[b, :, k:, :] == 0)
            torch.testing.assert_close(res.layer_scores[b, :, :k].sum(-1), torch.ones(ad.n_layers, dtype=C.dtype))
        single = LENGTHS.index(1)
        assert torch.all(C[single, :, 0, 0] == 1) and float(res.scores[single, 0]) == 1.0


@torch.no_grad()
def test_w_res_diagonal_is_one_minus_mixing_ratio(captured):
    """11.5: W_RES and W_FIXEDRES are row-stochastic; W_RES has diagonal 1 - r_i and off-diagonal mass r_i."""
    _, _, ad, _, cap = captured
    wres = get_method("w_res")
    for l in range(ad.n_layers):
        p = layer_parts(cap, ad, l)
        r = mixing_ratio(p)
        W = wres.layer_matrix(cap, ad, l)
        F = get_method("w_fixedres").layer_matrix(cap, ad, l)
        for b in range(len(LENGTHS)):
            k = _valid(cap, b)
            Wb = W[b, :k, :k]
            torch.testing.assert_close(Wb.sum(-1), torch.ones(k, dtype=W.dtype))
            torch.testing.assert_close(F[b, :k, :k].sum(-1), torch.ones(k, dtype=W.dtype))
            torch.testing.assert_close(torch.diagonal(Wb), 1 - r[b, :k])
            if k > 1:
                torch.testing.assert_close(Wb.sum(-1) - torch.diagonal(Wb), r[b, :k])
            assert torch.all((r[b, :k] >= 0) & (r[b, :k] <= 1))


@torch.no_grad()
@pytest.mark.parametrize("variant", ["clean", "alti_preset", "ln2"])
def test_every_method_equals_the_reference_definition(captured, variant):
    """Each example of the padded batch, method by method, against tests/reference.py (float64, 1e-8)."""
    arch, model, ad, batch, cap = captured
    opts = {"clean": {}, "alti_preset": {"quirk": True, "row_normalise_resln": True}, "ln2": {"ln2": True}}[variant]
    names = {"clean": DECOMP, "alti_preset": ["alti", "alti_l2", "norm_resln"], "ln2": ["alti", "alti_l2"]}[variant]
    params = {"clean": {}, "alti_preset": {"eps_quirk": True}, "ln2": {"ln2": True}}[variant]
    got = {}
    for name in names:
        p = dict(params) if name.startswith("alti") else {}
        if name == "norm_resln" and variant == "alti_preset":
            p = {"row_normalise": True}
        got[name] = get_method(name, **p).compute(cap, ad, cap.pred)
    for b in range(len(LENGTHS)):
        k = _valid(cap, b)
        ids = batch["input_ids"][b, :k].tolist()
        _, att, hs = R.forward64(model, ids)
        ref = R.decomposition_methods(model, hs, att, names, **opts)
        for name in names:
            final, views, mats = ref[name]
            res = got[name]
            np.testing.assert_allclose(res.matrices[b, :, :k, :k].numpy(), mats, rtol=1e-8, atol=1e-10,
                                       err_msg=f"{arch} {name} matrices")
            np.testing.assert_allclose(res.layer_scores[b, :, :k].numpy(), views, rtol=1e-8, atol=1e-10,
                                       err_msg=f"{arch} {name} views")
            np.testing.assert_allclose(res.scores[b, :k].numpy(), final, rtol=1e-8, atol=1e-10)


@torch.no_grad()
def test_alti_query_blocks_do_not_change_the_result():
    """The memory budget only changes how many source tokens are processed at once."""
    model = tiny_model("bert")
    ad = adapter_for(model)
    cap = ad.capture(random_batch("bert", [9, 5]), NEEDS)
    whole = get_method("alti", memory_mb=1024).compute(cap, ad, cap.pred)
    one_row = get_method("alti", memory_mb=0).compute(cap, ad, cap.pred)  # tokens_per_block -> 1 token per block
    torch.testing.assert_close(whole.matrices, one_row.matrices, rtol=1e-12, atol=1e-14)


def test_long_unnormalised_products_do_not_overflow_float32():
    """Norm matrices with entries ~1e4 over 24 layers overflow a plain float32 product; the scaled one does not."""
    g = torch.Generator().manual_seed(0)
    n, L = 40, 24
    mats64 = [1e4 * torch.rand(1, n, n, generator=g, dtype=torch.float64) for _ in range(L)]
    mask = torch.ones(1, n, dtype=torch.bool)
    pos = torch.zeros(1, dtype=torch.long)
    plain = torch.zeros(1, n, dtype=torch.float32)
    plain[0, 0] = 1
    for M in mats64:
        plain = plain @ M[0].float()
    assert not torch.isfinite(plain).all()
    got = prod_rows_normalised([M.float() for M in mats64], pos, mask)
    want = prod_rows_normalised(mats64, pos, mask)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-7)
