"""Base for methods that build one token-to-token matrix per layer and multiply them (METHODS.md 1.2 PROD).

Final = row of the explained token in M^L ... M^1; layer view l = that row of M^l ... M^1; stored matrices = the
per-layer M^l before aggregation. Row-stochastic families (ALTI, W_*, N_FIXEDRES) are multiplied as they are; the
unnormalised norm families are scaled per layer and their views normalised to sum 1 (a scalar changes nothing else).
"""

from __future__ import annotations

import torch

from ... import interrupts
from .aggregate import prod_rows_normalised, rows_of_products, valid_block
from .base import Method, MethodResult
from .decomposition import NEEDS


class LayerwiseProduct(Method):
    needs = NEEDS
    has_layer_views = True
    has_matrices = True
    row_stochastic = False

    def layer_matrix(self, cap, adapter, l: int) -> torch.Tensor:
        """M^l [B, n, n] (row = receiving token i, column = source token j)."""
        raise NotImplementedError

    def compute(self, cap, adapter, target):
        self.check_architecture(adapter)
        mats = []
        for l in range(adapter.n_layers):
            interrupts.check()  # a stop asked for: between layers
            mats.append(valid_block(self.layer_matrix(cap, adapter, l), cap.mask))
        if self.row_stochastic:
            views = rows_of_products(mats, cap.explain_pos)
        else:
            views = prod_rows_normalised(mats, cap.explain_pos, cap.mask)
        return MethodResult(scores=views[:, -1], layer_scores=views, matrices=torch.stack(mats, dim=1))


def row_normalise(M: torch.Tensor) -> torch.Tensor:
    return M / M.sum(-1, keepdim=True).clamp_min(torch.finfo(M.dtype).tiny)
