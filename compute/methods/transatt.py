"""Transformer attribution (Chefer et al. 2021a; "LRP" in AttCAT's code, "GAE" in Mask-LRP's tables; METHODS.md
4.3, 5.2, 14.13): per layer A_bar^l = mean_h (dF/dA^{l,h} * R^{A,l,h})^+ (gradient of the target logit times the
LRP relevance of the attention probabilities, positive part per head), then ROLL from layer 1 (add I, row-normalise,
later layers on the left), the explained ([CLS]) row with its own entry set to 0. Layer view l = that row of the
rollout up to layer l; matrices = A_bar^l."""

from __future__ import annotations

import torch

from ._internals.aggregate import valid_block
from ._internals.base import MethodResult
from ._internals.relevance import RelevanceMethod, gradient_weighted_rollout, positive_head_mean
from .lrp import LRP


class TransAtt(RelevanceMethod):
    name = "transatt"
    description = "gradient x LRP attention relevance (positive, head mean), rolled out over layers"
    reference = "Chefer et al. (2021a); METHODS.md 4.3, 5.2, 14.13"
    has_layer_views = True
    has_matrices = True
    passes = frozenset({"forward", "backward", "lrp"})  # the gradient weighting

    run_options = LRP.run_options
    def from_relevance(self, rel, gp, target, cap):
        R = rel.attention.transpose(0, 1)  # [B, L, H, n, n]
        if rel.attention_grad is not None:  # a decoder's pass carried the plain dF/dA (its plain rows)
            GR = rel.attention_grad.transpose(0, 1).to(R.dtype) * R
        else:
            GR = torch.stack(gp.grads(target)["attentions"], dim=1).to(R.dtype).mul_(R)  # one copy, then in place
        maps = valid_block(positive_head_mean(GR), cap.mask)  # [B, L, n, n]
        views = gradient_weighted_rollout(maps, cap.mask, cap.explain_pos)
        return MethodResult(scores=views[:, -1], layer_scores=views, matrices=maps)
