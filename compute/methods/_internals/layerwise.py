"""Base for methods that build one token-to-token matrix per layer and multiply them (METHODS.md 1.2 PROD).

Final = row of the explained token in M^L ... M^1; layer view l = that row of M^l ... M^1; stored matrices = the
per-layer M^l before aggregation. Row-stochastic families (ALTI, W_*, N_FIXEDRES) are multiplied as they are; the
unnormalised norm families are scaled per layer and their views normalised to sum 1 (a scalar changes nothing else).

The per-layer matrices of every layer are computed at once, on stacks of layers ([K, B, ...]: ``layer_groups``,
usually one stack of all layers); only the products step through the layers. Where a batch's stack of every layer's
attention would exceed the block budget (compute.attention_streaming, the capture's "layer_parts") the layers are
streamed instead (issue 36): each layer's matrix made as a forward makes the layer, one layer's [B, H, n, n] alive at
a time, keeping what the store keeps of the matrices (Captured.kept_matrices: every layer's, their kept rows, none)
and the running product M^l ... M^1 whose rows are the views. The products made from the heads' mean attention alone
(``HeadMeanProduct``: rollout, W_FIXEDRES) stream the same way, each layer's head mean taken from its attention alone.
"""

from __future__ import annotations

import torch

from ... import interrupts
from ...adapters.base import head_mean
from .aggregate import mean_row_scaled, prod_rows_normalised, row_at, rows_of_products, valid_pairs
from .base import Method, MethodResult
from . import budget as block_budget
from .budget import work_bytes
from .decomposition import STREAMED_NEEDS, LayerParts, layer_parts, over_layers, streamed_layers, streams


class LayerwiseProduct(Method):
    needs = STREAMED_NEEDS
    has_layer_views = True
    has_matrices = True
    row_stochastic = False
    # reads the attention only through decomposition.gram_quadratic: a streamed layer's is kept in the model's dtype
    narrow_attention = False
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
        budget = work_bytes(A.device, block_budget.CPU_STACK_BYTES)

        mats = over_layers(cap, adapter, lambda p: self.stack_matrices(p, adapter),
                           self.bytes_per_row((n, H, d, d_ff), A.element_size()), budget, eps_quirk=self.eps_quirk)
        return valid_pairs(mats, cap.mask)

    def layer_matrix(self, cap, adapter, l: int) -> torch.Tensor:
        """M^l [B, n, n] of one layer (tests; the same numbers as ``layer_matrices``)."""
        return self.stack_matrices(layer_parts(cap, adapter, l, eps_quirk=self.eps_quirk), adapter)

    def streamed(self, cap) -> bool:
        """Whether this batch's layers stream (the capture kept none of the decomposition's lists)."""
        return "layer_parts" in self.needs and streams(cap)

    def each_layer_matrix(self, cap, adapter, fn) -> None:
        """fn(M^l [B, n, n], valid block) for every layer l in turn, as a forward of its own makes the layer
        (``streamed_layers``)."""
        streamed_layers(cap, adapter, lambda p: fn(valid_pairs(self.stack_matrices(p, adapter), p.mask)),
                        eps_quirk=self.eps_quirk, narrow_attention=self.narrow_attention)

    def streamed_views(self, cap, adapter, pos: torch.Tensor) -> MethodResult:
        """The views of rows ``pos`` ([B], or [B, S]: [B, S, L, n]) and the kept matrices, a layer at a time
        (``each_layer_matrix``). Where every layer's matrix is kept the views are those of the stacked path, from
        them; else from the running product M^l ... M^1 (one [B, n, n] carried, no [L, B, n, n]: a row of it at
        layer l needs all of M^{l-1} ... M^1, the later layers multiplying on the left), the same to rounding."""
        keep = cap.kept_matrices
        kept, views, product = [], [], []

        def consume(M):
            if keep == "all":
                kept.append(M)
                return
            if keep == "cls":
                kept.append(row_at(M, cap.kept_row))
            if not self.row_stochastic:  # as prod_rows_normalised: each layer over its mean row sum
                M = mean_row_scaled(M, cap.mask)
            P = torch.bmm(M, product.pop()) if product else M
            product.append(P)
            b = torch.arange(P.shape[0], device=P.device)
            views.append(P[b[:, None], pos] if pos.dim() == 2 else P[b, pos])

        self.each_layer_matrix(cap, adapter, consume)
        if keep == "all":
            mats = torch.stack(kept)
            return MethodResult(scores=None, layer_scores=self._views(mats, pos, cap.mask),
                                matrices=mats.transpose(0, 1))
        V = torch.stack(views, dim=-2)
        if not self.row_stochastic:
            V = V / V.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(V.dtype).tiny)
        return MethodResult(scores=None, layer_scores=V, matrices=torch.stack(kept, 1)[:, :, None] if kept else None,
                            matrix_rows=True)

    def _views(self, mats: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return rows_of_products(mats, pos) if self.row_stochastic else prod_rows_normalised(mats, pos, mask)

    def compute(self, cap, adapter, target):
        self.check_architecture(adapter)
        if self.streamed(cap):
            res = self.streamed_views(cap, adapter, cap.explain_pos)
            res.scores = res.layer_scores[:, -1]
            return res
        mats = self.layer_matrices(cap, adapter)
        views = self._views(mats, cap.explain_pos, cap.mask)
        return MethodResult(scores=views[:, -1], layer_scores=views, matrices=mats.transpose(0, 1))

    def compute_rows(self, cap, adapter, steps, rows):
        """Every step's row of the one pass's products (a causal model's row e of M^l depends on tokens up to e)."""
        self.check_architecture(adapter)
        if self.streamed(cap):
            res = self.streamed_views(cap, adapter, steps.grid)
            res.layer_scores = views = steps.rows(res.layer_scores)
            res.scores = views[:, -1]
            return res
        mats = self.layer_matrices(cap, adapter)
        views = steps.rows(self._views(mats, steps.grid, cap.mask))
        return MethodResult(scores=views[:, -1], layer_scores=views, matrices=mats.transpose(0, 1))


class HeadMeanProduct(LayerwiseProduct):
    """A product of per-layer matrices made from each layer's head-mean attention alone (rollout, W_FIXEDRES), row
    stochastic. The capture's "layer_means": below the block budget the head means of every layer at once, from the
    stack of every layer's attention (one operation for every layer: the op budgets); above it none, and each layer's
    head mean is taken as a forward of the method's own makes the layer (``each_head_mean``: its attention in the
    model's dtype, summed in float32), folded into the running product and dropped (issue 36: no [L, B, n, n])."""

    needs = frozenset({"layer_means"})
    row_stochastic = True

    def from_means(self, A_bar: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """M^l on the valid block from the head means ``A_bar`` [..., B, n, n] (one layer, or layers stacked first)."""
        raise NotImplementedError

    def layer_matrices(self, cap, adapter) -> torch.Tensor:
        return self.from_means(cap.stack("attention_mean"), cap.mask)  # every layer at once: [L, B, n, n]

    def layer_matrix(self, cap, adapter, l: int) -> torch.Tensor:
        return self.from_means(cap.stack("attention_mean")[l], cap.mask)

    def streamed(self, cap) -> bool:
        """Whether the capture kept no head means nor a stack of the attentions they come from: the layers stream."""
        return not cap.attention_mean and "attentions" not in cap.stacks

    def each_layer_matrix(self, cap, adapter, fn) -> None:
        each_head_mean(cap, adapter, lambda A_bar: fn(self.from_means(A_bar, cap.mask)))


def each_head_mean(cap, adapter, fn) -> None:
    """fn(the heads' mean of layer l's attention [B, n, n], float32 at least) for every layer l in turn: from the
    capture's attentions where it kept them as the forward made them (another method's: DecompX's narrow lists), else
    as a forward of its own makes the layer (Adapter.each_layer with the attention alone: one layer's [B, H, n, n]
    alive at a time; a layer shared across depths, ALBERT's, at each depth)."""
    if cap.attentions:
        for a in cap.attentions:
            interrupts.check()  # a stop asked for: between layers
            fn(head_mean(a))
        return

    def layer(_l, one):
        interrupts.check()  # a stop asked for: between layers
        fn(head_mean(one.attentions[0]))

    adapter.each_layer(cap, layer, frozenset({"attentions"}))


def row_normalise(M: torch.Tensor) -> torch.Tensor:
    return M / M.sum(-1, keepdim=True).clamp_min(torch.finfo(M.dtype).tiny)
