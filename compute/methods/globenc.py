"""GlobEnc (Modarressi et al. 2022; METHODS.md 3.1-3.2): N_ENC = ||x~_{i<-j}||_2 with
x~_{i<-j} = gamma2 * P T_i(x_j) / sigma2_i (the N_RESLN vectors taken through LN2 with the real sigma2_i; the FFN
enters only through sigma2). Aggregated unnormalised (PROD; views scaled to sum 1, which changes no ranking).
Pre-LN blocks (docs/methods.md 6.1): the residual path carries no norm, so x~_{i<-j} = z+_{i<-j} (N_RES's vectors),
through the final norm in the last layer."""

from __future__ import annotations

from ._internals.decomposition import decomposed_norms
from ._internals.layerwise import LayerwiseProduct
from ._internals.pre_ln import check_final_norm, with_final_output


class GlobEnc(LayerwiseProduct):
    name = "globenc"
    description = "GlobEnc: norms of contributions through attention, residual, LN1 and LN2 (N_ENC), multiplied"
    reference = "Modarressi, Fayyaz, Yaghoobzadeh, Pilehvar (2022), NAACL; METHODS.md 3.1-3.2; docs/methods.md 6.1"
    narrow_attention = True  # its norms read the attention only through the head-Gram form

    def check_architecture(self, adapter) -> None:
        super().check_architecture(adapter)
        if adapter.pre_ln:
            check_final_norm(adapter, self.name)

    def stack_matrices(self, p, adapter):
        if adapter.pre_ln:
            return decomposed_norms(with_final_output(p, adapter), "glob")
        return decomposed_norms(p, "enc")
