"""W_RES (METHODS.md 3.1): attention with its diagonal replaced by the N_ENC context-mixing ratio.

A' = head-mean attention with a zero diagonal, rows renormalised; W_RES = diag(r) A' + diag(1 - r), where
r_i = ||sum_{j!=i} x~_{i<-j}|| / (||sum_{j!=i} x~_{i<-j}|| + ||x~_{i<-i}||) with the GlobEnc vectors x~.
sum_j x~_{i<-j} is LN2's linear part of (s_i - b_O) (METHODS.md 10), so r costs O(n H d), no n x n x d tensor.
Pre-LN blocks (docs/methods.md 6.1): GlobEnc's pre-LN vectors, whose sum is h_i - b_O (through the final norm's linear
part in the last layer)."""

from __future__ import annotations

import torch

from ._internals.aggregate import valid_pairs
from ._internals.decomposition import diagonal_vectors
from ._internals.layerwise import LayerwiseProduct, row_normalise
from ._internals.pre_ln import check_final_norm, with_final_output


def vector_sum(p, kind: str) -> torch.Tensor:
    """sum_j x~_{i<-j} [*, n, d] of the GlobEnc vectors of ``kind``: "enc" (post-LN) or "glob" (pre-LN)."""
    if kind == "enc":
        return p.ln2_linear(p.ln1_linear(p.s - p.b_O)) / (p.sigma1 * p.sigma2)[..., None]
    # the residual stream after attention less b_O (through the attention-output norm at its real scale)
    total = p.t - (p.b_O if p.rho is None else p.vector(p.weights.gamma_o) * p.b_O / p.rho[..., None])
    if not p.has_last:
        return total
    top = p.final_linear(total[-1] if p.stacked else total) / p.sigma_f[..., None]  # through the final norm
    return torch.cat([total[:-1], top[None]]) if p.stacked else top


def mixing_ratio(p, kind: str = "enc") -> torch.Tensor:
    """r_i [B, n] from the GlobEnc vectors of ``kind``."""
    total = vector_sum(p, kind)
    own = diagonal_vectors(p, kind)  # x~_{i<-i}
    other = torch.linalg.vector_norm(total - own, dim=-1)
    own_norm = torch.linalg.vector_norm(own, dim=-1)
    return other / (other + own_norm).clamp_min(torch.finfo(other.dtype).tiny)


class WRes(LayerwiseProduct):
    name = "w_res"
    description = "W_RES: attention off the diagonal scaled by GlobEnc's mixing ratio r, 1 - r on the diagonal"
    reference = "Modarressi et al. (2022) Table 1; METHODS.md 3.1; docs/methods.md 6.1"
    row_stochastic = True
    # a streamed layer's attention kept in the model's dtype: its head mean is accumulated in the vectors' dtype
    narrow_attention = True

    def check_architecture(self, adapter) -> None:
        super().check_architecture(adapter)
        if adapter.pre_ln:
            check_final_norm(adapter, self.name)

    def stack_matrices(self, p, adapter):
        A_bar = valid_pairs(p.A.mean(dim=-3, dtype=p.x.dtype), p.mask)
        off = A_bar.clone()
        off.diagonal(dim1=-2, dim2=-1).zero_()
        off = row_normalise(off)
        r = mixing_ratio(with_final_output(p, adapter), "glob") if adapter.pre_ln else mixing_ratio(p)
        off.mul_(r[..., None]).diagonal(dim1=-2, dim2=-1).copy_(1 - r)
        return off
