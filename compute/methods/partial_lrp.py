"""Partial LRP (Voita et al. 2019 as in Chefer's generator; METHODS.md 4.3, 5.2): the relevance that reaches the
attention probabilities of a layer, R^{A,l} (LRP rules, one-hot target logit), positive part per head, head mean,
the explained ([CLS]) row with its own entry set to 0. Final = last layer (the reference); layer view l = layer l."""

from __future__ import annotations

from ._internals.aggregate import row_at, valid_block
from ._internals.base import MethodResult
from ._internals.relevance import RELEVANCE_MAPS, RelevanceMethod, zero_self
from .lrp import LRP


class PartialLRP(RelevanceMethod):
    name = "partial_lrp"
    description = "LRP relevance of the attention probabilities (positive part, head mean), explained row"
    reference = "Voita et al. (2019); Chefer et al. (2021a) baselines; METHODS.md 4.3, 5.2"
    has_layer_views = True
    has_matrices = True

    run_options = LRP.run_options
    attention_terms = (RELEVANCE_MAPS,)  # a checkpointed pass's, reduced a layer at a time

    def from_relevance(self, rel, gp, target, cap):
        maps = valid_block(rel.map(RELEVANCE_MAPS).transpose(0, 1), cap.mask)  # [B, L, n, n]
        views = zero_self(row_at(maps, cap.explain_pos), cap.explain_pos)
        return MethodResult(scores=views[:, -1], layer_scores=views, matrices=maps)
