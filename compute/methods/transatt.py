"""Transformer attribution (Chefer et al. 2021a; "LRP" in AttCAT's code, "GAE" in Mask-LRP's tables; METHODS.md
4.3, 5.2, 14.13): per layer A_bar^l = mean_h (dF/dA^{l,h} * R^{A,l,h})^+ (gradient of the target logit times the
LRP relevance of the attention probabilities, positive part per head), then ROLL from layer 1 (add I, row-normalise,
later layers on the left), the explained ([CLS]) row with its own entry set to 0. Layer view l = that row of the
rollout up to layer l; matrices = A_bar^l."""

from __future__ import annotations

import torch

from ._internals.aggregate import valid_block
from ._internals.base import MethodResult
from ._internals.relevance import WEIGHTED_MAPS, RelevanceMethod, gradient_weighted_rollout
from .lrp import LRP


class TransAtt(RelevanceMethod):
    name = "transatt"
    description = "gradient x LRP attention relevance (positive, head mean), rolled out over layers"
    reference = "Chefer et al. (2021a); METHODS.md 4.3, 5.2, 14.13"
    has_layer_views = True
    has_matrices = True
    passes = frozenset({"forward", "backward", "lrp"})  # the gradient weighting

    run_options = LRP.run_options

    def __init__(self, **params):
        super().__init__(**params)
        # a checkpointed pass's (decoders), reduced a layer at a time: the masked R^{A,l} where mask_lrp asks
        self.attention_terms = (WEIGHTED_MAPS[bool(self.params.get("rollout_uses_masked", False))],)

    def attention_maps(self, rel, gp, target) -> torch.Tensor:
        """mean_h (dF/dA R^{A,l})^+ [L, B, n, n]: the decoder's pass carried the plain dF/dA (its plain rows) or
        reduced the maps in its backward; an encoder's plain dF/dA is its gradient pass's."""
        carried = rel.attention_grad is not None or rel.maps is not None
        return rel.map(self.attention_terms[0], None if carried else torch.stack(gp.grads(target)["attentions"]))

    def from_relevance(self, rel, gp, target, cap):
        maps = valid_block(self.attention_maps(rel, gp, target).transpose(0, 1), cap.mask)  # [B, L, n, n]
        views = gradient_weighted_rollout(maps, cap.mask, cap.explain_pos)
        return MethodResult(scores=views[:, -1], layer_scores=views, matrices=maps)
