"""N (Kobayashi et al. 2020; METHODS.md 3.1): ||z_{i<-j}||_2 = ||sum_h A_ij^h u_j^h||_2, attention only.
Aggregated unnormalised (PROD, views scaled to sum 1)."""

from __future__ import annotations

from ._internals.decomposition import decomposed_norms
from ._internals.layerwise import LayerwiseProduct


class NormN(LayerwiseProduct):
    name = "norm_n"
    description = "N: norm of the attention-weighted value vectors ||sum_h A u||, multiplied over layers"
    reference = "Kobayashi et al. (2020); Modarressi et al. (2022) Table 1; METHODS.md 3.1"
    narrow_attention = True  # its norms read the attention only through the head-Gram form

    def stack_matrices(self, p, adapter):
        return decomposed_norms(p, "n")
