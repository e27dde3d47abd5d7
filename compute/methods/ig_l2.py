"""IG_l2 (METHODS.md 2.4): integrated gradients on the embedding-module output, L2 norm over the hidden dims.
The completeness delta sum IG - (F(x) - F(x')) is stored per example ("ig_delta")."""

from __future__ import annotations

import torch

from ._internals.gradients import IntegratedGradientsMethod


class IGL2(IntegratedGradientsMethod):
    name = "ig_l2"
    description = "integrated gradients from a [MASK] baseline, L2 norm over each token's embedding dims"
    reference = "Sundararajan et al. (2017); Ferrando et al. (2022) baselines; METHODS.md 2.4"

    def aggregate(self, attr):
        return torch.linalg.vector_norm(attr, dim=-1)
