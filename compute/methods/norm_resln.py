"""N_RESLN (Kobayashi et al. 2021; METHODS.md 3.1): ||T_i(x_j)||_2 = ||gamma1 * P z+_{i<-j}||_2 / sigma1_i.

Aggregated unnormalised like GlobEnc's table (default), or row-normalised before the product like ALTI's "Norm
Rollout" baseline (``row_normalise=True``, set by --preset alti; METHODS.md 2.4 and 14.6). Pre-LN blocks have no LN1 on
the residual path: there N_RESLN is N_RES, ||z+_{i<-j}||_2 (docs/methods.md 6.1)."""

from __future__ import annotations

from ._internals.decomposition import decomposed_norms
from ._internals.layerwise import LayerwiseProduct, row_normalise


class NormResLN(LayerwiseProduct):
    name = "norm_resln"
    description = "N_RESLN: norm of the LN1-linearised contributions (attention + residual + LN1)"
    reference = "Kobayashi et al. (2021); Modarressi et al. (2022); METHODS.md 3.1, 2.4; docs/methods.md 6.1"
    narrow_attention = True  # its norms read the attention only through the head-Gram form

    def __init__(self, row_normalise: bool = False, **params):
        super().__init__(row_normalise=row_normalise, **params)
        self.row_stochastic = row_normalise

    def stack_matrices(self, p, adapter):
        N = decomposed_norms(p, "res" if adapter.pre_ln else "resln")
        return row_normalise(N) if self.params["row_normalise"] else N
