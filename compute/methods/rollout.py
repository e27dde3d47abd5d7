"""Attention rollout (Abnar & Zuidema 2020; METHODS.md 1.2 ROLL, 2.4): (A_bar + I) row-normalised, later layers on
the left. Layer view l = row of the explained token in M^l ... M^1. Nothing zeroed (the ALTI convention)."""

from __future__ import annotations

from ._internals.aggregate import add_identity_row_normalise, rows_of_products, valid_pairs
from ._internals.base import Method, MethodResult


class Rollout(Method):
    name = "rollout"
    description = "attention rollout: product of row-normalised (head-mean attention + I) over layers"
    reference = "Abnar & Zuidema 2020; METHODS.md 1.2 (ROLL), 2.4"
    needs = frozenset({"attentions"})
    has_layer_views = True
    has_matrices = True

    def compute(self, cap, adapter, target):
        return self._rows(cap, cap.explain_pos)  # [B, L, n]

    def compute_rows(self, cap, adapter, steps, rows):
        return self._rows(cap, steps.grid, steps)

    def _rows(self, cap, pos, steps=None) -> MethodResult:
        # Every layer's M^l = (A_bar^l + I) / rowsum at once, on the valid block (pad rows become identity rows,
        # never reached): [L, B, n, n].
        mats = add_identity_row_normalise(valid_pairs(cap.stack("attentions").mean(dim=2), cap.mask))
        layer_scores = rows_of_products(mats, pos)
        if steps is not None:
            layer_scores = steps.rows(layer_scores)
        stored = valid_pairs(mats, cap.mask).transpose(0, 1)
        return MethodResult(scores=layer_scores[:, -1], layer_scores=layer_scores, matrices=stored)
