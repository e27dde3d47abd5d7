"""ALTI (Ferrando et al. 2022; METHODS.md 2.2-2.3): Aggregation of Layer-wise Token-to-token Interactions.

Per layer: T_i(x_j) = gamma1 * P z+_{i<-j} / sigma1_i (the LN1-linearised contribution of token j to the
attention-block output y_i), d_ij = ||y_i - T_i(x_j)||_1, c_ij = max(0, ||y_i||_1 - d_ij), C_ij = c_ij / sum_k c_ik.
Final = row of the explained token in C^L ... C^1 (no identity: the residual is inside T_i(x_i)).

Options: ``ln2`` (ALTI+LN2, the reference's "ours2": vectors taken through LN2, distances to the real LN2 output),
``eps_quirk`` (the reference's sigma without LayerNorm epsilon, y rebuilt from the contributions; --preset alti),
``memory_mb`` (source tokens are processed in blocks whose [k, n, d] tensors fit this budget).
"""

from __future__ import annotations

import torch

from ..errors import AttrscopeError
from .aggregate import valid_block
from .decomposition import contributions_of_sources, layer_parts, operands, resln_operands, tokens_per_block
from .layerwise import LayerwiseProduct, row_normalise


class Alti(LayerwiseProduct):
    name = "alti"
    description = "ALTI: L1 proximity of each token's LN1-linearised contribution, rolled out over layers"
    reference = "Ferrando, Gallego, Costa-jussa (2022), EMNLP; METHODS.md 2.2-2.3"
    row_stochastic = True
    ord = 1  # the norm of the distances
    block_copies = 1  # [B, k, n, d] tensors alive per source block (the L1 proximity works in place)

    def __init__(self, ln2: bool = False, eps_quirk: bool = False, memory_mb: int = 8, **params):
        super().__init__(ln2=ln2, eps_quirk=eps_quirk, memory_mb=memory_mb, **params)

    @staticmethod
    def proximity_(Z: torch.Tensor, ys: torch.Tensor, ys_norm: torch.Tensor) -> torch.Tensor:
        """sigma_i (||y_i||_1 - ||y_i - T_ij||_1) from Z = sigma_i T_ij and ys = sigma_i y_i, overwriting Z.

        Summed dimension by dimension: each term |ys_k| - |ys_k - Z_k| is bounded by |Z_k|, so float32 does not lose
        small differences of two large sums (cancellation). In place: three passes over the block, no temporaries."""
        Z.sub_(ys).abs_()
        torch.sub(ys.abs(), Z, out=Z)
        return Z.sum(-1)

    def check_architecture(self, adapter) -> None:
        super().check_architecture(adapter)
        if adapter.pre_ln and self.params["ln2"]:
            raise AttrscopeError(f"--alti-ln2 is not defined for the pre-LN architecture '{adapter.config.model_type}' "
                                 "(LN2 is not on its residual path): drop --alti-ln2")

    def layer_matrix(self, cap, adapter, l: int) -> torch.Tensor:
        """C^l [B, n, n]: rows sum to 1 on real tokens; pad rows and columns are 0."""
        p = layer_parts(cap, adapter, l, eps_quirk=self.params["eps_quirk"])
        if adapter.pre_ln:
            # Pre-LN (METHODS.md 1.1, 9): T_i(x_j) = sum_h A u_j + [i=j] x_i with values from LN1(x_j), no LN on T,
            # compared with the residual stream r_i = sum_j T_i(x_j) + b_O (LN2's input).
            U, diag, _ = operands(p, "res")
            return self._proximity_matrix(cap, p.A, U, diag, p.t, torch.ones_like(p.sigma1))
        U, diag, scale = resln_operands(p)
        if self.params["ln2"]:
            # ALTI+LN2: vectors gamma2 P T_ij / sigma2_i against the real LN2 output (the FFN effect included).
            through_ln2 = lambda Z: p.ln2_linear(Z / scale[:, None, :, None]) / p.sigma2[:, None, :, None]  # noqa: E731
            return self._proximity_matrix(cap, p.A, U, diag, p.y2, torch.ones_like(scale), through_ln2, copies=3)
        if self.params["eps_quirk"]:
            # rebuilt as sum_j T_i(x_j) + b~_i, which is LN1 with the quirk's sigma
            y = p.ln1_linear(p.s) / scale[..., None] + p.beta1
        else:
            y = p.y  # the real LN1 output (equal to the rebuilt one with the exact epsilon)
        return self._proximity_matrix(cap, p.A, U, diag, y, scale)

    def _proximity_matrix(self, cap, A, U, diag, y, scale, block_fn=None, copies=None):
        """Row-normalised max(0, ||y_i|| - ||y_i - T_ij||) with T_ij = (sum_h A U_j + [i=j] diag_i) / scale_i, or
        T_ij = block_fn(sum_h A U_j + [i=j] diag_i) when a block transform is given (then scale is 1)."""
        # Work with Z = sigma_i T_ij (no division over the big block): compare it with ys = sigma_i y_i.
        ys = y * scale[..., None]
        ys_norm = torch.linalg.vector_norm(ys, ord=self.ord, dim=-1)
        B, n, d = y.shape
        cols = tokens_per_block(B, n, d, y.element_size(), self.params["memory_mb"] << 20,
                                copies=copies or self.block_copies)
        c = torch.empty(B, n, n, dtype=y.dtype, device=y.device)
        for j0 in range(0, n, cols):
            J = slice(j0, min(n, j0 + cols))
            Z = contributions_of_sources(A, U, diag, J)  # [B, j, i, d] for the source block J
            if block_fn is not None:
                Z = block_fn(Z)
            c[:, :, J] = self.proximity_(Z, ys[:, None], ys_norm[:, None]).transpose(1, 2)
        c = c.clamp_min(0) / scale[..., None]  # the positive scale changes no row after normalisation; kept exact
        return row_normalise(valid_block(c, cap.mask))
