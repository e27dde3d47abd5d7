"""GxI_mu (METHODS.md 2.4): a_j = (1/d) sum_k |E_jk dF/dE_jk|, the mean absolute gradient x input."""

from __future__ import annotations

from ._internals.base import MethodResult
from ._internals.gradients import GRADIENT_INPUT, GradientMethod, wide


class GxIMean(GradientMethod):
    name = "gxi_mean"
    description = "mean absolute gradient x input over the hidden dimensions of each token's embedding"
    reference = "Shrikumar et al. (2016); Ferrando et al. (2022) baselines; METHODS.md 2.4"
    run_options = (GRADIENT_INPUT,)
    input_only = True

    def from_grads(self, gp, grads, cap):
        a = (wide(gp.X) * wide(grads["X"])).abs().mean(dim=-1)
        return MethodResult(scores=a * cap.mask)
