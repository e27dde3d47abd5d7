"""DecompX without the classification head (docs/methods.md "DecompX"): the score of token j is the norm of its part
of the explained token's final vector, ||x^L_{e<-j}||_2 (the reference's aggregated "norm" output); layer view l the
same after layer l. Class-independent and non-negative."""

from __future__ import annotations

import torch

from ._internals.base import MethodResult
from .decompx import DecompXBase


class DecompXNoHead(DecompXBase):
    name = "decompx_nohead"
    description = "DecompX stopped at the last layer: norm of each token's part of the explained token's vector"
    reference = "Modarressi et al. (2023), ACL; docs/methods.md"

    def compute(self, cap, adapter, target):
        views = self.layer_views(cap, adapter)
        return MethodResult(scores=views[:, -1], layer_scores=views)

    def compute_rows(self, cap, adapter, steps, rows):
        views = torch.linalg.vector_norm(self.step_rows(cap, adapter, steps), dim=-1)
        return MethodResult(scores=views[:, -1], layer_scores=views)
