"""Raw attention (METHODS.md 2.4): head-mean attention, row of the explained position. Nothing zeroed."""

from __future__ import annotations

from ._internals.aggregate import rows_at, valid_pairs
from ._internals.base import Method, MethodResult


class RawAttention(Method):
    name = "raw_attention"
    description = "head-mean attention of each layer; final = row of the explained token in the last layer"
    reference = "METHODS.md 2.4 (ALTI baselines), 4.3 without the [CLS,CLS] zeroing"
    needs = frozenset({"attentions"})
    has_layer_views = True
    has_matrices = True

    def compute(self, cap, adapter, target):
        mats = self._mats(cap)
        layer_scores = rows_at(mats, cap.explain_pos)  # [B, L, n]
        return MethodResult(scores=layer_scores[:, -1], layer_scores=layer_scores, matrices=mats.transpose(0, 1))

    def compute_rows(self, cap, adapter, steps, rows):
        mats = self._mats(cap)
        layer_scores = steps.rows(rows_at(mats, steps.grid))  # [R, L, n]
        return MethodResult(scores=layer_scores[:, -1], layer_scores=layer_scores, matrices=mats.transpose(0, 1))

    @staticmethod
    def _mats(cap):
        # A_bar^l = mean_h A^{l,h}; pad queries/keys zeroed so stored matrices hold only the valid block.
        return valid_pairs(cap.stack("attentions").mean(dim=2), cap.mask)  # [L, B, n, n]
