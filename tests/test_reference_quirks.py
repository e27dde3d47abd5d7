"""Reference quirks that attrscope reproduces on request (docs/departures.md): ALTI's F.pairwise_distance epsilon
under --preset alti, checked against the authors' formula on a tiny float64 model."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from conftest import TINY_LENGTHS
from conftest import captured_tiny as setup

import reference as R
from compute.methods import get_method
from compute.runner import RunConfig, method_params


def authors_alti_matrices(model, ids) -> np.ndarray:
    """ALTI as the authors' code computes it (METHODS.md 2.2 with its quirks): sigma without the LayerNorm epsilon,
    y rebuilt from the contributions, d_ij = F.pairwise_distance(T_ij, y_i, p=1) (1e-6 added to every component of
    T - y), c_ij = max(0, ||y_i||_1 - d_ij), rows normalised. [L, n, n] float64."""
    _, att, hs = R.forward64(model, ids)
    mats = []
    for l in range(att.shape[0]):
        D = R.layer_terms(model, hs, att, l, quirk=True)
        b_tilde = D["g1"] * (D["b_O"] - D["b_O"].mean()) / D["sigma1"][:, None] + D["be1"]
        T = torch.from_numpy(D["T"])
        y = T.sum(1) + torch.from_numpy(b_tilde)
        dist = F.pairwise_distance(T, y[:, None, :].expand_as(T), p=1)  # eps=1e-6, torch's default
        c = (y.abs().sum(-1)[:, None] - dist).clamp_min(0)
        mats.append((c / c.sum(-1, keepdim=True)).numpy())
    return np.stack(mats)


@torch.no_grad()
def test_alti_preset_reproduces_the_authors_pairwise_distance():
    model, ad, batch, _ = setup("bert")
    params = method_params("alti", RunConfig(preset="alti"))
    cap = ad.capture(batch, get_method("alti").needs)
    assert params["pairwise_eps"] == 1e-6 and params["eps_quirk"] is True
    preset = get_method("alti", **params).compute(cap, ad, cap.pred)
    without = get_method("alti", eps_quirk=True).compute(cap, ad, cap.pred)
    for b, k in enumerate(TINY_LENGTHS):
        want = authors_alti_matrices(model, batch["input_ids"][b, :k].tolist())
        got = preset.matrices[b, :, :k, :k].numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        if k > 1:  # the epsilon is what separates the two: far above float64 rounding
            assert np.abs(without.matrices[b, :, :k, :k].numpy() - want).max() > 1e-9
    assert "pairwise_eps" not in method_params("alti", RunConfig())  # the default measures without it
