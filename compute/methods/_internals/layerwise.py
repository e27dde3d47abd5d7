"""Base for methods that build one token-to-token matrix per layer and multiply them (METHODS.md 1.2 PROD).

Final = row of the explained token in M^L ... M^1; layer view l = that row of M^l ... M^1; stored matrices = the
per-layer M^l before aggregation. Row-stochastic families (ALTI, W_*, N_FIXEDRES) are multiplied as they are; the
unnormalised norm families are scaled per layer and their views normalised to sum 1 (a scalar changes nothing else).

The per-layer matrices of every layer are computed at once, on stacks of layers ([K, B, ...]: ``layer_groups``,
usually one stack of all layers); only the products step through the layers.
"""

from __future__ import annotations

import torch

from .aggregate import prod_rows_normalised, rows_of_products, valid_pairs
from .base import Method, MethodResult
from .budget import work_bytes
from .decomposition import NEEDS, LayerParts, layer_parts, over_layers

# CPU working memory of one stack of layers: the projected value vectors and a few attention-sized temporaries stay
# close to the caches (a GPU takes a share of its memory: budget.work_bytes).
CPU_STACK_BYTES = 32 << 20


class LayerwiseProduct(Method):
    needs = NEEDS
    has_layer_views = True
    has_matrices = True
    row_stochastic = False
    eps_quirk = False  # the parts' LayerNorm sigma without epsilon (ALTI's reference; Alti sets it per instance)

    def stack_matrices(self, p: LayerParts, adapter) -> torch.Tensor:
        """M^l [*, n, n] for the layers of ``p`` (one layer [B, ...] or a stack [K, B, ...]; row = receiving token
        i, column = source token j)."""
        raise NotImplementedError

    def bytes_per_row(self, p_shape: tuple[int, int, int, int], itemsize: int) -> int:
        """Working memory of ``stack_matrices`` per (layer, example): the projected value vectors [n, H, d] and
        three attention-sized [H, n, n] temporaries. p_shape = (n, H, d, d_ff)."""
        n, H, d, _ = p_shape
        return itemsize * n * H * (d + 3 * n)

    def layer_matrices(self, cap, adapter) -> torch.Tensor:
        """M^l of every layer, [L, B, n, n], valid block only."""
        A = cap.stack("attentions")
        n, H = A.shape[-1], A.shape[2]
        d = cap.stack("hidden_states").shape[-1]
        d_ff = getattr(adapter.config, "intermediate_size", None) or 4 * d
        budget = work_bytes(A.device, CPU_STACK_BYTES)

        mats = over_layers(cap, adapter, lambda p: self.stack_matrices(p, adapter),
                           self.bytes_per_row((n, H, d, d_ff), A.element_size()), budget, eps_quirk=self.eps_quirk)
        return valid_pairs(mats, cap.mask)

    def layer_matrix(self, cap, adapter, l: int) -> torch.Tensor:
        """M^l [B, n, n] of one layer (tests; the same numbers as ``layer_matrices``)."""
        return self.stack_matrices(layer_parts(cap, adapter, l, eps_quirk=self.eps_quirk), adapter)

    def compute(self, cap, adapter, target):
        self.check_architecture(adapter)
        mats = self.layer_matrices(cap, adapter)
        if self.row_stochastic:
            views = rows_of_products(mats, cap.explain_pos)
        else:
            views = prod_rows_normalised(mats, cap.explain_pos, cap.mask)
        return MethodResult(scores=views[:, -1], layer_scores=views, matrices=mats.transpose(0, 1))

    def compute_rows(self, cap, adapter, steps, rows):
        """Every step's row of the one pass's products (a causal model's row e of M^l depends on tokens up to e)."""
        self.check_architecture(adapter)
        mats = self.layer_matrices(cap, adapter)
        views = steps.rows(rows_of_products(mats, steps.grid) if self.row_stochastic
                           else prod_rows_normalised(mats, steps.grid, cap.mask))
        return MethodResult(scores=views[:, -1], layer_scores=views, matrices=mats.transpose(0, 1))


def row_normalise(M: torch.Tensor) -> torch.Tensor:
    return M / M.sum(-1, keepdim=True).clamp_min(torch.finfo(M.dtype).tiny)
