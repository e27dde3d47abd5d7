"""Attention rollout (Abnar & Zuidema 2020; METHODS.md 1.2 ROLL, 2.4): (A_bar + I) row-normalised, later layers on
the left. Layer view l = row of the explained token in M^l ... M^1. Nothing zeroed (the ALTI convention).
Above the block budget the layers stream (issue 36, HeadMeanProduct): each layer's M^l folded into the running
product as a forward makes the layer."""

from __future__ import annotations

import torch

from ._internals.aggregate import add_identity_row_normalise_, valid_pairs
from ._internals.layerwise import HeadMeanProduct


class Rollout(HeadMeanProduct):
    name = "rollout"
    description = "attention rollout: product of row-normalised (head-mean attention + I) over layers"
    reference = "Abnar & Zuidema 2020; METHODS.md 1.2 (ROLL), 2.4"

    def from_means(self, A_bar: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # M^l = (A_bar^l + I) / rowsum on the valid block, in place on its copy (the capture's head means are
        # shared); its pad rows, identity rows there, zeroed as stored (a real token's row never reaches them)
        return valid_pairs(add_identity_row_normalise_(valid_pairs(A_bar, mask)), mask)
