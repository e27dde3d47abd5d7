"""ALTI-l2 (the reference's "ours_l2"; METHODS.md 2.2): ALTI with L2 distances and ||y_i||_2."""

from __future__ import annotations

import torch

from .alti import Alti


class AltiL2(Alti):
    name = "alti_l2"
    description = "ALTI with L2 distances (ALTI-l2)"
    reference = "Ferrando et al. (2022), Table 4-5; METHODS.md 2.2"
    ord = 2

    @staticmethod
    def proximity(y, y_norm, T):
        """||y||_2 - ||y - T||_2 as (||y||^2 - ||y - T||^2) / (||y|| + ||y - T||) = (2<y,T> - ||T||^2) / (...):
        no difference of two nearly equal norms in float32."""
        dist = torch.linalg.vector_norm(y - T, dim=-1)
        num = (T * (2 * y - T)).sum(-1)
        return num / (y_norm + dist).clamp_min(torch.finfo(dist.dtype).tiny)
