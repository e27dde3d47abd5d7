"""W_RES (METHODS.md 3.1): attention with its diagonal replaced by the N_ENC context-mixing ratio.

A' = head-mean attention with a zero diagonal, rows renormalised; W_RES = diag(r) A' + diag(1 - r), where
r_i = ||sum_{j!=i} x~_{i<-j}|| / (||sum_{j!=i} x~_{i<-j}|| + ||x~_{i<-i}||) with the GlobEnc vectors x~.
sum_j x~_{i<-j} is LN2's linear part of (s_i - b_O) (METHODS.md 10), so r costs O(n H d), no n x n x d tensor."""

from __future__ import annotations

import torch

from ._internals.aggregate import valid_pairs
from ._internals.decomposition import diagonal_vectors
from ._internals.layerwise import LayerwiseProduct, row_normalise


def mixing_ratio(p) -> torch.Tensor:
    """r_i [B, n] from the N_ENC vectors."""
    total = p.ln2_linear(p.ln1_linear(p.s - p.b_O)) / (p.sigma1 * p.sigma2)[..., None]  # sum_j x~_{i<-j}
    own = diagonal_vectors(p, "enc")  # x~_{i<-i}
    other = torch.linalg.vector_norm(total - own, dim=-1)
    own_norm = torch.linalg.vector_norm(own, dim=-1)
    return other / (other + own_norm).clamp_min(torch.finfo(other.dtype).tiny)


class WRes(LayerwiseProduct):
    name = "w_res"
    description = "W_RES: attention off the diagonal scaled by GlobEnc's mixing ratio r, 1 - r on the diagonal"
    pre_ln_ok = False  # needs LayerNorm on the residual path (METHODS.md section 9)
    reference = "Modarressi et al. (2022) Table 1; METHODS.md 3.1"
    row_stochastic = True

    def stack_matrices(self, p, adapter):
        A_bar = valid_pairs(p.A.mean(dim=-3), p.mask)
        off = A_bar.clone()
        off.diagonal(dim1=-2, dim2=-1).zero_()
        off = row_normalise(off)
        r = mixing_ratio(p)
        off.mul_(r[..., None]).diagonal(dim1=-2, dim2=-1).copy_(1 - r)
        return off
