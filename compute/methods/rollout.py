"""Attention rollout (Abnar & Zuidema 2020; METHODS.md 1.2 ROLL, 2.4): (A_bar + I) row-normalised, later layers on
the left. Layer view l = row of the explained token in M^l ... M^1. Nothing zeroed (the ALTI convention)."""

from __future__ import annotations

import torch

from ._internals.aggregate import add_identity_row_normalise, rows_of_products, valid_block
from ._internals.base import Method, MethodResult


class Rollout(Method):
    name = "rollout"
    description = "attention rollout: product of row-normalised (head-mean attention + I) over layers"
    reference = "Abnar & Zuidema 2020; METHODS.md 1.2 (ROLL), 2.4"
    needs = frozenset({"attentions"})
    has_layer_views = True
    has_matrices = True

    def compute(self, cap, adapter, target):
        # Per-layer M^l = (A_bar^l + I) / rowsum, on the valid block (pad rows become identity rows, never reached).
        mats = [add_identity_row_normalise(valid_block(A.mean(dim=1), cap.mask)) for A in cap.attentions]
        layer_scores = rows_of_products(mats, cap.explain_pos)  # [B, L, n]
        stored = valid_block(torch.stack(mats, dim=1), cap.mask)
        return MethodResult(scores=layer_scores[:, -1], layer_scores=layer_scores, matrices=stored)
