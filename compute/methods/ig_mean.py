"""IG_mu (METHODS.md 2.4): integrated gradients on the embedding-module output, mean |.| over the hidden dims.
The completeness delta sum IG - (F(x) - F(x')) is stored per example ("ig_delta")."""

from __future__ import annotations

from ._internals.gradients import IntegratedGradientsMethod
from .ig_l2 import IGL2


class IGMean(IntegratedGradientsMethod):
    name = "ig_mean"
    description = "integrated gradients from a [MASK] baseline, mean absolute value over each token's embedding dims"
    reference = "Sundararajan et al. (2017); Ferrando et al. (2022) baselines; METHODS.md 2.4"
    run_options = IGL2.run_options

    def aggregate(self, attr):
        return attr.abs().mean(dim=-1)
