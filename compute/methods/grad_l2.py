"""Grad_l2 (METHODS.md 2.4): a_j = ||dF/dE_j||_2 over the embedding-module output, divided by the sum over tokens
(ALTI's reference normalises this one baseline only)."""

from __future__ import annotations

import torch

from ._internals.base import MethodResult
from ._internals.gradients import GRADIENT_INPUT, GradientMethod, wide


class GradL2(GradientMethod):
    name = "grad_l2"
    description = "L2 norm of the gradient of the target output at each token's embedding, normalised to sum 1"
    reference = "Simonyan et al. (2014) saliency; Ferrando et al. (2022) baselines; METHODS.md 2.4"
    run_options = (GRADIENT_INPUT,)
    input_only = True

    def from_grads(self, gp, grads, cap):
        a = torch.linalg.vector_norm(wide(grads["X"]), dim=-1) * cap.mask
        return MethodResult(scores=a / a.sum(-1, keepdim=True).clamp_min(torch.finfo(a.dtype).tiny))
