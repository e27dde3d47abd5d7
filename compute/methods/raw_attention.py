"""Raw attention (METHODS.md 2.4): head-mean attention, row of the explained position. Nothing zeroed."""

from __future__ import annotations

import torch

from ._internals.aggregate import row_at, valid_block
from ._internals.base import Method, MethodResult


class RawAttention(Method):
    name = "raw_attention"
    description = "head-mean attention of each layer; final = row of the explained token in the last layer"
    reference = "METHODS.md 2.4 (ALTI baselines), 4.3 without the [CLS,CLS] zeroing"
    needs = frozenset({"attentions"})
    has_layer_views = True
    has_matrices = True

    def compute(self, cap, adapter, target):
        # A_bar^l = mean_h A^{l,h}; pad queries/keys zeroed so stored matrices hold only the valid block.
        mats = torch.stack([valid_block(A.mean(dim=1), cap.mask) for A in cap.attentions], dim=1)  # [B, L, n, n]
        layer_scores = row_at(mats, cap.explain_pos)  # [B, L, n]
        return MethodResult(scores=layer_scores[:, -1], layer_scores=layer_scores, matrices=mats)
