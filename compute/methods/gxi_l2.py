"""GxI_l2 (METHODS.md 2.4): a_j = ||E_j * dF/dE_j||_2, gradient times input on the embedding-module output."""

from __future__ import annotations

import torch

from ._internals.base import MethodResult
from ._internals.gradients import GRADIENT_INPUT, GradientMethod, wide


class GxIL2(GradientMethod):
    name = "gxi_l2"
    description = "L2 norm of gradient x input at each token's embedding (embedding-module output)"
    reference = "Shrikumar et al. (2016); Ferrando et al. (2022) baselines; METHODS.md 2.4"
    run_options = (GRADIENT_INPUT,)
    input_only = True

    def from_grads(self, gp, grads, cap):
        a = torch.linalg.vector_norm(wide(gp.X) * wide(grads["X"]), dim=-1)
        return MethodResult(scores=a * cap.mask)
