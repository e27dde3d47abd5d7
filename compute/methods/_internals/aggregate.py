"""Aggregation over layers (METHODS.md 1.2). Later layers multiply on the LEFT: R^l = M^l R^{l-1}.

Per-layer matrices come stacked layer first, [L, B, n, n] (one tensor: every per-layer step below is one batched
operation over all layers); only the products themselves step through the layers."""

from __future__ import annotations

import torch


def valid_block(M: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Zero every row and column of a padded [B, n, n] (or [B, L, n, n]) matrix that belongs to a pad position."""
    m = mask.to(M.dtype)
    if M.dim() == 4:
        m = m[:, None]
    return M * m[..., :, None] * m[..., None, :]


def valid_pairs(M: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``valid_block`` of [..., B, n, n]: one layer's [B, n, n], or layers stacked first [L, B, n, n]."""
    m = mask.to(M.dtype)
    return M * (m[:, :, None] * m[:, None, :])


def add_identity_row_normalise(M: torch.Tensor) -> torch.Tensor:
    """ROLL's per-layer step: (M + I) / rowsum(M + I). Pad rows of a valid-block matrix become identity rows."""
    M = M + torch.eye(M.shape[-1], dtype=M.dtype, device=M.device)
    return M / M.sum(dim=-1, keepdim=True)


def add_identity_row_normalise_(M: torch.Tensor) -> torch.Tensor:
    """``add_identity_row_normalise`` in place on ``M`` (no second [L, B, n, n] beside it): the same numbers where
    M has no -0.0 (x + 0 turns it into +0.0 off the diagonal; attention's head means have none)."""
    M.diagonal(dim1=-2, dim2=-1).add_(1.0)
    return M.div_(M.sum(dim=-1, keepdim=True))


def rows_of_products(mats: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Row ``pos`` of every prefix product: out[:, l] = e_pos^T M^{l+1} M^l ... M^1, for l = 0..L-1.

    mats: [L, B, n, n] (or a list of L [B, n, n]; layer 1 first); pos: [B]. Returns [B, L, n]. With pos [B, S] (the
    rows of several positions of each example: a generation's steps) [B, S, L, n].
    Only vector-matrix products (O(L^2 n^2)), never the full n x n products: one batched product per layer.
    """
    L = len(mats)
    B, n, _ = mats[0].shape
    if pos.dim() == 2:
        S = pos.shape[1]
        V = torch.zeros(B, S, L, n, dtype=mats[0].dtype, device=mats[0].device)
        b = torch.arange(B, device=V.device)[:, None]
        V[b, torch.arange(S, device=V.device)[None], :, pos] = 1.0
        for k in range(L - 1, -1, -1):  # the S rows of an example share its matrices: one product per layer
            V[:, :, k:] = torch.bmm(V[:, :, k:].reshape(B, S * (L - k), n), mats[k]).view(B, S, L - k, n)
        return V
    V = torch.zeros(B, L, n, dtype=mats[0].dtype, device=mats[0].device)
    V[torch.arange(B, device=V.device), :, pos] = 1.0
    # Apply M^k from the top down to every prefix that contains it (rows l >= k).
    for k in range(L - 1, -1, -1):
        V[:, k:] = torch.bmm(V[:, k:], mats[k])
    return V


def row_at(M: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Row ``pos[b]`` of each [B, n, n] (or [B, L, n, n] -> [B, L, n]) matrix."""
    b = torch.arange(M.shape[0], device=M.device)
    if M.dim() == 3:
        return M[b, pos]
    return M[b, :, pos]


def rows_at(M: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Row ``pos[b]`` of every layer's matrix of a layer-stacked [L, B, n, n]: [B, L, n] (pos [B, S]: [B, S, L, n])."""
    b = torch.arange(M.shape[1], device=M.device)
    if pos.dim() == 2:
        return M[:, b[:, None], pos].permute(1, 2, 0, 3)
    return M[:, b, pos].transpose(0, 1)


def prod_rows_normalised(mats: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """PROD (METHODS.md 1.2, no identity added): row ``pos`` of M^l ... M^1 for every l, each view scaled to sum 1.
    mats [L, B, n, n] (or a list of L [B, n, n]).

    Unnormalised norm matrices multiply into numbers that overflow float32 on long inputs and deep models, so each
    layer's matrix is first divided by its mean row sum (one positive scalar per example and layer). A scalar leaves
    the normalised views unchanged. Returns [B, L, n] (pos [B, S]: [B, S, L, n])."""
    mats = torch.stack(list(mats)) if isinstance(mats, (list, tuple)) else mats
    V = rows_of_products(mean_row_scaled(mats, mask), pos)
    return V / V.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(mats.dtype).tiny)


def mean_row_scaled(mats: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each [B, n, n] matrix of ``mats`` ([..., B, n, n]) divided by its mean row sum over the valid rows."""
    n_valid = mask.sum(-1).to(mats.dtype).clamp_min(1)[:, None, None]
    return mats / (mats.sum(dim=(-2, -1), keepdim=True) / n_valid).clamp_min(torch.finfo(mats.dtype).tiny)
