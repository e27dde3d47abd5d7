"""GlobEnc (Modarressi et al. 2022; METHODS.md 3.1-3.2): N_ENC = ||x~_{i<-j}||_2 with
x~_{i<-j} = gamma2 * P T_i(x_j) / sigma2_i (the N_RESLN vectors taken through LN2 with the real sigma2_i; the FFN
enters only through sigma2). Aggregated unnormalised (PROD; views scaled to sum 1, which changes no ranking)."""

from __future__ import annotations

from ._internals.decomposition import decomposed_norms
from ._internals.layerwise import LayerwiseProduct


class GlobEnc(LayerwiseProduct):
    name = "globenc"
    description = "GlobEnc: norms of contributions through attention, residual, LN1 and LN2 (N_ENC), multiplied"
    pre_ln_ok = False  # needs LayerNorm on the residual path (METHODS.md section 9)
    reference = "Modarressi, Fayyaz, Yaghoobzadeh, Pilehvar (2022), NAACL; METHODS.md 3.1-3.2"

    def stack_matrices(self, p, adapter):
        return decomposed_norms(p, "enc")
