"""W_FIXEDRES (METHODS.md 3.1): 0.5 * head-mean attention + 0.5 I; row-stochastic, multiplied (PROD).
(Identical per layer to rollout's (A_bar + I)/2; kept under GlobEnc's name for its table.) Above the block budget
the layers stream as rollout's (issue 36, HeadMeanProduct)."""

from __future__ import annotations

import torch

from ._internals.aggregate import valid_pairs
from ._internals.layerwise import HeadMeanProduct


class WFixedRes(HeadMeanProduct):
    name = "w_fixedres"
    description = "W_FIXEDRES: half head-mean attention, half identity, multiplied over layers"
    reference = "Modarressi et al. (2022) Table 1; METHODS.md 3.1"

    def from_means(self, A_bar, mask):
        return fixed_residual(A_bar, mask)


def fixed_residual(A_bar: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """0.5 A_bar + 0.5 I on the valid block ([..., B, n, n])."""
    M = A_bar.mul(0.5)
    M.diagonal(dim1=-2, dim2=-1).add_(0.5)
    return valid_pairs(M, mask)
