"""ALTI-l2 (the reference's "ours_l2"; METHODS.md 2.2): ALTI with L2 distances and ||y_i||_2.

Unlike L1, the L2 distance needs no vectors: ||y_i - T_ij||^2 = ||y_i||^2 - 2 <y_i, T_ij> + ||T_ij||^2, with ||T_ij||^2
from the head Gram matrices (as the norm family) and <y_i, T_ij> from one [n, d] x [d, d] product and per-head
[n, dh] x [dh, n] products (``decomposed_inner``): O(n d^2 + n^2 d + n^2 H^2), no n^2 x d block at all."""

from __future__ import annotations

import torch

from .alti import Alti
from ._internals.decomposition import LayerParts, decomposed_inner, decomposed_sq_norms, diagonal_vectors


class AltiL2(Alti):
    name = "alti_l2"
    description = "ALTI with L2 distances (ALTI-l2)"
    reference = "Ferrando et al. (2022), Table 4-5; METHODS.md 2.2"
    narrow_attention = True  # read only through the Gram form, inner products and own vectors, a block at a time

    def proximities(self, p: LayerParts, kind: str, y: torch.Tensor) -> torch.Tensor:
        """||y_i||_2 - ||y_i - T_ij||_2 for every i, j [*, n, n], in the stable form
        (||y||^2 - ||y - T||^2) / (||y|| + ||y - T||) = (2 <y, T> - ||T||^2) / (...): no difference of nearly equal
        norms. The diagonal, whose T_ii carries the residual and can come close to y_i (where the distance from
        expanded squares would lose digits), is computed from the vectors themselves."""
        # entries i = j are overwritten below: their residual terms are not computed here
        inner = decomposed_inner(p, kind, y, diagonal=False)
        sq = decomposed_sq_norms(p, kind, diagonal=False)
        y_norm = torch.linalg.vector_norm(y, dim=-1)[..., None]
        num = 2 * inner - sq  # ||y||^2 - ||y - T||^2
        dist = (y_norm.square() - num).clamp_min_(0).sqrt_()
        own = diagonal_vectors(p, kind)  # T_ii [*, n, d]
        D = y - own
        num.diagonal(dim1=-2, dim2=-1).copy_(torch.linalg.vecdot(own, D + y))
        dist.diagonal(dim1=-2, dim2=-1).copy_(torch.linalg.vector_norm(D, dim=-1))
        return num / (y_norm + dist).clamp_min_(torch.finfo(dist.dtype).tiny)
