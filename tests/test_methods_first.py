"""Mathematical properties of raw_attention, rollout, norm, logat and normxlogit on tiny random models in float64,
and agreement with the naive reference of tests/reference.py, for every supported architecture."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import ARCHS, MASK_ID, assert_batch_invariant, random_batch, tiny_model

import reference as R
from compute.adapters import adapter_for
from compute.methods import REGISTRY, get_method
from compute.methods._internals.aggregate import rows_of_products

LENGTHS = [9, 4, 7, 1 + 1]  # includes a 2-token example ([CLS] [SEP])
ALL_NEEDS = frozenset({"attentions", "hidden_states"})


def _run(arch, name, lengths=LENGTHS, dtype=torch.float64, target=None, seed=0):
    model = tiny_model(arch, seed=seed, dtype=dtype)
    ad = adapter_for(model)
    batch = random_batch(arch, lengths)
    cap = ad.capture(batch, ALL_NEEDS)
    t = cap.pred if target is None else target
    with torch.no_grad():
        return model, ad, batch, cap, get_method(name).compute(cap, ad, t), t


def _unpadded(batch, b):
    k = int(batch["attention_mask"][b].sum())
    return batch["input_ids"][b, :k].tolist(), k


@pytest.mark.parametrize("arch", ARCHS)
def test_raw_attention_rows_are_distributions_and_match_reference(arch):
    model, _, batch, cap, res, _ = _run(arch, "raw_attention")
    L = model.config.num_hidden_layers if arch != "distilbert" else model.config.n_layers
    for b in range(len(LENGTHS)):
        ids, n = _unpadded(batch, b)
        mats = res.matrices[b].numpy()
        assert mats.shape[0] == L
        np.testing.assert_allclose(mats[:, :n, :n].sum(-1), 1.0, atol=1e-12)
        assert np.all(mats[:, :, n:] == 0) and np.all(mats[:, n:, :] == 0)  # pad rows and columns
        _, att, _ = R.forward64(model, ids)
        final, views, A = R.raw_attention(att)
        np.testing.assert_allclose(mats[:, :n, :n], A, atol=1e-12)
        np.testing.assert_allclose(res.layer_scores[b, :, :n].numpy(), views, atol=1e-12)
        np.testing.assert_allclose(res.scores[b, :n].numpy(), final, atol=1e-12)


@pytest.mark.parametrize("arch", ARCHS)
def test_rollout_is_row_stochastic_and_matches_explicit_products(arch):
    model, _, batch, cap, res, _ = _run(arch, "rollout")
    for b in range(len(LENGTHS)):
        ids, n = _unpadded(batch, b)
        views = res.layer_scores[b].numpy()
        assert np.all(views >= 0)
        np.testing.assert_allclose(views[:, :n].sum(-1), 1.0, atol=1e-12)  # each prefix product is row-stochastic
        assert np.all(views[:, n:] == 0)
        np.testing.assert_allclose(res.matrices[b, :, :n, :n].sum(-1).numpy(), 1.0, atol=1e-12)
        _, att, _ = R.forward64(model, ids)
        final, ref_views, mats = R.rollout(att)
        np.testing.assert_allclose(views[:, :n], ref_views, atol=1e-12)
        np.testing.assert_allclose(res.matrices[b, :, :n, :n].numpy(), mats, atol=1e-12)
        np.testing.assert_allclose(res.scores[b, :n].numpy(), final, atol=1e-12)


@torch.no_grad()
def test_rollout_single_token_is_one():
    # n = 1: every matrix is [[1]] and the attribution is all on the token itself.
    model = tiny_model("bert")
    ad = adapter_for(model)
    cap = ad.capture({"input_ids": torch.tensor([[2]]), "attention_mask": torch.ones(1, 1, dtype=torch.long)},
                     ALL_NEEDS)
    res = get_method("rollout").compute(cap, ad, cap.pred)
    assert res.scores.tolist() == [[1.0]]
    assert torch.all(res.matrices == 1.0)


def test_rows_of_products_equals_full_products_at_any_position():
    g = torch.Generator().manual_seed(3)
    B, L, n = 3, 5, 6
    mats = [torch.rand(B, n, n, generator=g, dtype=torch.float64) for _ in range(L)]
    pos = torch.tensor([0, 3, 5])
    got = rows_of_products(mats, pos)
    for b in range(B):
        P = torch.eye(n, dtype=torch.float64)
        for l in range(L):
            P = mats[l][b] @ P  # later layers on the left
            torch.testing.assert_close(got[b, l], P[pos[b]], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("arch", ARCHS)
def test_norm_is_the_embedding_output_norm(arch):
    model, _, batch, cap, res, _ = _run(arch, "norm")
    for b in range(len(LENGTHS)):
        ids, n = _unpadded(batch, b)
        _, _, hs = R.forward64(model, ids)
        np.testing.assert_allclose(res.scores[b, :n].numpy(), R.norm(hs), rtol=1e-12)
        assert np.all(res.scores[b, n:].numpy() == 0)


@pytest.mark.parametrize("arch", ARCHS)
def test_logat_at_cls_of_last_layer_is_the_models_logit(arch):
    # METHODS.md 11.9: the head applied at the explained position of the last layer is the model's own logit.
    for target_class in (0, 1):
        model, _, batch, cap, res, t = _run(arch, "logat", target=torch.full((len(LENGTHS),), target_class))
        b = torch.arange(len(LENGTHS))
        torch.testing.assert_close(res.scores[b, cap.explain_pos], cap.logits[:, target_class], rtol=1e-12, atol=1e-12)
        for i in range(len(LENGTHS)):
            ids, n = _unpadded(batch, i)
            _, _, hs = R.forward64(model, ids)
            final, views = R.logat(model, hs, target_class)
            np.testing.assert_allclose(res.layer_scores[i, :, :n].numpy(), views, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["logat", "normxlogit", "decompx", "alti_logit"])
@torch.no_grad()
def test_all_class_scores_equal_single_target_runs(arch, name):
    m = get_method(name)
    model = tiny_model(arch)
    ad = adapter_for(model)
    cap = ad.capture(random_batch(arch, LENGTHS), ALL_NEEDS | m.needs)
    all_classes = m.compute_classes(cap, ad, 2)
    for c in range(2):
        single = m.compute(cap, ad, torch.full((len(LENGTHS),), c)).scores
        torch.testing.assert_close(all_classes[:, c], single, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_normxlogit_is_norm_times_logat_per_layer(arch):
    model, ad, batch, cap, res, t = _run(arch, "normxlogit")
    norm = get_method("norm").compute(cap, ad, t).scores
    logat = get_method("logat").compute(cap, ad, t)
    torch.testing.assert_close(res.layer_scores, norm[:, None] * logat.layer_scores, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(res.scores, res.layer_scores[:, -1])
    for b in range(len(LENGTHS)):
        ids, n = _unpadded(batch, b)
        _, _, hs = R.forward64(model, ids)
        final, views = R.normxlogit(model, hs, int(t[b]))
        np.testing.assert_allclose(res.layer_scores[b, :, :n].numpy(), views, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_example_alone_equals_example_in_padded_batch_float32(arch, name):
    """Batch composition and padding must not change a result: 1e-5 in float32."""
    assert_batch_invariant(arch, name)


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
@torch.no_grad()
def test_half_precision_model_gives_float32_results_close_to_float32(low):
    batch = random_batch("bert", [6, 4])
    out = {}
    for dtype in (torch.float32, low):
        model = tiny_model("bert", dtype=dtype)
        ad = adapter_for(model)
        ad.mask_token_id = MASK_ID
        cap = ad.capture(batch, frozenset().union(*(m.needs for m in REGISTRY.values())))
        half = {"head_mask": [[(l + h) % 2 for h in range(ad.n_heads)] for l in range(ad.n_layers)]}
        out[dtype] = {name: get_method(name, **(half if name == "mask_lrp" else {})).compute(
            cap, ad, torch.zeros(2, dtype=torch.long)).scores for name in REGISTRY}
    for name in REGISTRY:
        # the LRP rules run on a float64 copy of the model (--lrp-dtype auto, compute.methods._internals.relevance);
        # never a half-precision forward
        lrp = name in ("lrp", "partial_lrp", "transatt", "mask_lrp")
        assert out[low][name].dtype == (torch.float64 if lrp else torch.float32)
        if lrp:
            # half precision rounds the weights: another model, and the LRP rules divide by sums that pass near zero, so
            # their result is not continuous in the weights (docs/method-details.md: LRP precision); only finiteness is checked
            assert torch.isfinite(out[low][name]).all()
            continue
        scale = float(out[torch.float32][name].abs().max())
        torch.testing.assert_close(out[low][name], out[torch.float32][name], rtol=0.1, atol=0.1 * scale)
