"""N_RES (METHODS.md 3.1): ||z+_{i<-j}||_2, the attention vectors plus the residual x_i on the diagonal.
Aggregated unnormalised (PROD, views scaled to sum 1)."""

from __future__ import annotations

from ._internals.decomposition import decomposed_norms
from ._internals.layerwise import LayerwiseProduct


class NormRes(LayerwiseProduct):
    name = "norm_res"
    description = "N_RES: norm of attention vectors plus the residual on the diagonal, multiplied over layers"
    reference = "Kobayashi et al. (2021); Modarressi et al. (2022) Table 1; METHODS.md 3.1"
    narrow_attention = True  # its norms read the attention only through the head-Gram form

    def stack_matrices(self, p, adapter):
        return decomposed_norms(p, "res")
