"""W_FIXEDRES (METHODS.md 3.1): 0.5 * head-mean attention + 0.5 I; row-stochastic, multiplied (PROD).
(Identical per layer to rollout's (A_bar + I)/2; kept under GlobEnc's name for its table.)"""

from __future__ import annotations

import torch

from ._internals.aggregate import valid_pairs
from ._internals.layerwise import LayerwiseProduct


class WFixedRes(LayerwiseProduct):
    name = "w_fixedres"
    description = "W_FIXEDRES: half head-mean attention, half identity, multiplied over layers"
    reference = "Modarressi et al. (2022) Table 1; METHODS.md 3.1"
    needs = frozenset({"attention_mean"})
    row_stochastic = True

    def layer_matrices(self, cap, adapter):
        return fixed_residual(cap.stack("attention_mean"), cap.mask)  # every layer at once: [L, B, n, n]

    def layer_matrix(self, cap, adapter, l):
        return fixed_residual(cap.stack("attention_mean")[l], cap.mask)


def fixed_residual(A_bar: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """0.5 A_bar + 0.5 I on the valid block ([..., B, n, n])."""
    M = A_bar.mul(0.5)
    M.diagonal(dim1=-2, dim2=-1).add_(0.5)
    return valid_pairs(M, mask)
