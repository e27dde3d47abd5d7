"""Value Zeroing (docs/methods.md): on tiny float64 models of every post-LN architecture the batched matrices equal
a straightforward loop that runs the whole model once per (layer, token) with that token's value vectors zeroed by
a hook; rows are distributions; blocks of zeroed tokens do not change the result; pre-LN blocks (docs/methods.md 6.2) against their own forward
with the value zeroed by a hook."""

from __future__ import annotations

import pytest
import torch
from conftest import ARCHS, random_batch, tiny_model
from families import family_capture, model_task

from compute.adapters import adapter_for
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


def own_forward_distances(model, ad, enc: dict, l: int) -> torch.Tensor:
    """[B, n, n]: 1 - cos between layer l's real output and its output in the model's own forward with token j's
    value vectors zeroed by a hook on the value module (only the value columns of a fused q/k/v output), one
    forward per j; the layer output is read by a hook on the layer (before the final norm in the last layer)."""
    layer = ad.layers()[l]
    outs = []
    grab = layer.register_forward_hook(lambda _m, _i, out: outs.append(out if torch.is_tensor(out) else out[0]))
    try:
        model(**enc)
        real = outs.pop()
        B, n, _ = real.shape
        D = torch.zeros(B, n, n, dtype=real.dtype)
        for j in range(n):
            def zero_j(_m, _inp, out, j=j):
                width = out.shape[-1]
                # the value columns: their indices mapped as fractions, below any clamp a value_of applies (OLMo)
                marks = (torch.arange(width, dtype=torch.float64) + 1) / (width + 1)
                cols = (ad.value_of(marks[None, None]) * (width + 1) - 1).round().long().flatten().unique()
                out = out.clone()
                out[:, j, cols] = 0
                return out
            h = ad.value_module(layer).register_forward_hook(zero_j)
            try:
                model(**enc)
            finally:
                h.remove()
            D[:, :, j] = 1 - torch.nn.functional.cosine_similarity(outs.pop(), real, dim=-1)
    finally:
        grab.remove()
    return D


def pre_ln_models():
    from families import FAMILIES, VARIANTS, family_model

    yield from (("gpt2", lambda: tiny_model("gpt2", layers=2)), ("llama", lambda: tiny_model("llama", layers=2)))
    for family in (*FAMILIES, *VARIANTS):
        yield family, lambda family=family: family_model(family)


PRE_LN = [(name, make) for name, make in pre_ln_models() if adapter_for(make(), model_task(make())).pre_ln]


@pytest.mark.parametrize("name,make", PRE_LN, ids=[name for name, _ in PRE_LN])
@torch.no_grad()
def test_value_zeroing_on_pre_ln_equals_zeroing_in_the_models_own_forward(name, make):
    """docs/methods.md 6.2: every pre-LN block (sequential, parallel, norms on the sublayers' outputs, no norm before
    attention) against its own forward with the value zeroed, float64, to 1e-6; pad rows and columns 0."""
    model = make()
    ad = adapter_for(model, model_task(model))
    batch = random_batch("bert", LENGTHS)
    m = get_method("value_zeroing")
    m.check_architecture(ad)
    cap = family_capture(ad, batch, m.needs)
    res = m.compute(cap, ad, cap.pred)
    for l in range(ad.n_layers):
        D = own_forward_distances(model, ad, ad.forward_inputs(batch), l)
        for b, n in enumerate(LENGTHS):
            # the batch's own forward: a pad key gets attention 0, so pads change nothing for the real rows
            Db = D[b, :n, :n]
            assert (Db[:, :n].sum(-1) > 1e-6).all()  # every row moves: the test sees the normalisation
            C = Db / Db.sum(-1, keepdim=True)
            torch.testing.assert_close(res.matrices[b, l, :n, :n], C, rtol=0, atol=1e-6, msg=f"{name} layer {l}")
            assert not res.matrices[b, l, n:].any() and not res.matrices[b, l, :, n:].any()
    for b, n in enumerate(LENGTHS):
        views = rows_of_products(list(res.matrices[b:b + 1, :, :n, :n].transpose(0, 1)), cap.explain_pos[b:b + 1])[0]
        torch.testing.assert_close(res.layer_scores[b, :, :n], views, rtol=1e-9, atol=1e-12)
