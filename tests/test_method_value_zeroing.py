"""Value Zeroing (docs/methods.md): on tiny float64 models of every post-LN architecture the batched matrices equal
a straightforward loop that runs the whole model once per (layer, token) with that token's value vectors zeroed by
a hook; rows are distributions; blocks of zeroed tokens do not change the result; pre-LN models are refused."""

from __future__ import annotations

import pytest
import torch
from conftest import ARCHS, random_batch, tiny_model

from compute.adapters import adapter_for
from compute.errors import AttrscopeError
from compute.methods import get_method
from compute.methods._internals.aggregate import rows_of_products

LENGTHS = [7, 3, 5, 1]


def zeroed_output_loop(model, ad, ids: list[int], l: int) -> torch.Tensor:
    """[n, n]: row i, column j = 1 - cos(real output_i of layer l, output_i with v_j zeroed), one forward per j."""
    x = torch.tensor([ids])
    enc = {"input_ids": x, "attention_mask": torch.ones_like(x)}
    enc = ad.forward_inputs(enc)
    real = model(**enc, output_hidden_states=True).hidden_states[l + 1][0]
    n = len(ids)
    D = torch.zeros(n, n, dtype=real.dtype)
    for j in range(n):
        def zero_j(_m, _inp, out, j=j):
            out = out.clone()
            out[:, j] = 0
            return out
        h = ad.value_module(ad.layers()[l]).register_forward_hook(zero_j)
        try:
            zeroed = model(**enc, output_hidden_states=True).hidden_states[l + 1][0]
        finally:
            h.remove()
        D[:, j] = 1 - torch.nn.functional.cosine_similarity(zeroed, real, dim=-1)
    return D


@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_value_zeroing_equals_one_forward_per_zeroed_token(arch):
    model = tiny_model(arch)
    ad = adapter_for(model)
    batch = random_batch(arch, LENGTHS)
    m = get_method("value_zeroing")
    cap = ad.capture(batch, m.needs)
    res = m.compute(cap, ad, cap.pred)
    L = ad.n_layers
    assert res.matrices.shape == (len(LENGTHS), L, max(LENGTHS), max(LENGTHS))
    for b, n in enumerate(LENGTHS):
        ids = batch["input_ids"][b, :n].tolist()
        mats = []
        for l in range(L):
            D = zeroed_output_loop(model, ad, ids, l)
            assert (D > 1e-6).all()  # every token moves every output a little: the test can see each entry
            C = D / D.sum(-1, keepdim=True)
            mats.append(C)
            torch.testing.assert_close(res.matrices[b, l, :n, :n], C, rtol=1e-9, atol=1e-12)
        # pad rows and columns are zero; the rollout is PROD without identity, read at the explained row
        assert not res.matrices[b, :, n:].any() and not res.matrices[b, :, :, n:].any()
        views = rows_of_products([M[None] for M in mats], cap.explain_pos[b:b + 1])[0]
        torch.testing.assert_close(res.layer_scores[b, :, :n], views, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(res.scores[b, :n], views[-1], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(res.scores[b, :n].sum(), torch.tensor(1.0, dtype=torch.float64))


@torch.no_grad()
def test_value_zeroing_blocks_of_one_token_give_the_same_matrices():
    model = tiny_model("bert")
    ad = adapter_for(model)
    batch = random_batch("bert", LENGTHS)
    whole, one = get_method("value_zeroing"), get_method("value_zeroing", memory_mb=1)
    cap = ad.capture(batch, whole.needs)
    import compute.methods.value_zeroing as vz
    real = vz.tokens_per_block
    try:  # one zeroed token per block
        vz.tokens_per_block = lambda *a, **k: 1
        blocked = one.compute(cap, ad, cap.pred)
    finally:
        vz.tokens_per_block = real
    torch.testing.assert_close(blocked.matrices, whole.compute(cap, ad, cap.pred).matrices, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_value_zeroing_refuses_pre_ln_models(arch):
    ad = adapter_for(tiny_model(arch))
    with pytest.raises(AttrscopeError, match="value_zeroing.*pre-LN"):
        get_method("value_zeroing").check_architecture(ad)
