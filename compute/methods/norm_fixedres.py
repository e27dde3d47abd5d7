"""N_FIXEDRES (METHODS.md 3.1): 0.5 * (N row-normalised) + 0.5 I, a fixed residual; row-stochastic, multiplied."""

from __future__ import annotations

import torch

from ._internals.aggregate import valid_pairs
from ._internals.decomposition import decomposed_norms
from ._internals.layerwise import LayerwiseProduct, row_normalise


class NormFixedRes(LayerwiseProduct):
    name = "norm_fixedres"
    description = "N_FIXEDRES: half the row-normalised attention-vector norms, half identity, multiplied"
    reference = "Modarressi et al. (2022) Table 1; METHODS.md 3.1"
    narrow_attention = True  # its norms read the attention only through the head-Gram form
    row_stochastic = True

    def stack_matrices(self, p, adapter):
        N = row_normalise(valid_pairs(decomposed_norms(p, "n"), p.mask))
        return 0.5 * N + 0.5 * torch.eye(N.shape[-1], dtype=N.dtype, device=N.device)
