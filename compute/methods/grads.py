"""Grads (METHODS.md 4.3, Mask-LRP's definition; AttCAT's own generator is broken, 14.12): the gradient of the
target output with respect to the last layer's attention probabilities, averaged over heads and the real query
rows, positive part; the explained ([CLS]) column set to 0."""

from __future__ import annotations

import torch

from ._internals.base import MethodResult
from ._internals.checkpointed import AttentionTerm
from ._internals.gradients import GradientMethod, valid_mean_rows


def last_gradient_rows(A, dA, cap):
    """dF/dA of the last layer, summed over the heads given (the term's mean divides), mean over the real query
    rows: [1, B, n]."""
    return valid_mean_rows(dA.sum(2).transpose(0, 1), cap.mask).transpose(0, 1)


class Grads(GradientMethod):
    name = "grads"
    description = "positive part of the gradient w.r.t. last-layer attention, mean over heads and query rows"
    reference = "Song et al. (2024) Mask-LRP baselines; Qiang et al. (2022); METHODS.md 4.3"

    attention_terms = (AttentionTerm("grads", heads=last_gradient_rows, last=True),)

    def from_grads(self, gp, grads, cap):
        g = gp.term(grads, self.attention_terms[0])[0].clamp_min(0)  # [B, n]
        g = g * cap.mask
        g[torch.arange(g.shape[0], device=g.device), cap.explain_pos] = 0
        return MethodResult(scores=g)
