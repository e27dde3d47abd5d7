"""ALTI-l2 (the reference's "ours_l2"; METHODS.md 2.2): ALTI with L2 distances and ||y_i||_2."""

from __future__ import annotations

import torch

from .alti import Alti


class AltiL2(Alti):
    name = "alti_l2"
    description = "ALTI with L2 distances (ALTI-l2)"
    reference = "Ferrando et al. (2022), Table 4-5; METHODS.md 2.2"
    ord = 2
    block_copies = 2

    @staticmethod
    def proximity_(Z: torch.Tensor, ys: torch.Tensor, ys_norm: torch.Tensor) -> torch.Tensor:
        """sigma_i (||y_i||_2 - ||y_i - T_ij||_2), overwriting Z, in the stable form
        (||ys||^2 - ||ys - Z||^2) / (||ys|| + ||ys - Z||) = <Z, 2 ys - Z> / (...): no difference of nearly equal norms."""
        D = ys - Z
        dist = torch.linalg.vector_norm(D, dim=-1)
        num = torch.linalg.vecdot(Z, D.add_(ys))
        return num / (ys_norm + dist).clamp_min(torch.finfo(dist.dtype).tiny)
