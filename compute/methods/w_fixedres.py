"""W_FIXEDRES (METHODS.md 3.1): 0.5 * head-mean attention + 0.5 I; row-stochastic, multiplied (PROD).
(Identical per layer to rollout's (A_bar + I)/2; kept under GlobEnc's name for its table.)"""

from __future__ import annotations

import torch

from ._internals.layerwise import LayerwiseProduct


class WFixedRes(LayerwiseProduct):
    name = "w_fixedres"
    description = "W_FIXEDRES: half head-mean attention, half identity, multiplied over layers"
    reference = "Modarressi et al. (2022) Table 1; METHODS.md 3.1"
    needs = frozenset({"attentions"})
    row_stochastic = True

    def layer_matrix(self, cap, adapter, l):
        A_bar = cap.attentions[l].mean(dim=1)
        return 0.5 * A_bar + 0.5 * torch.eye(A_bar.shape[-1], dtype=A_bar.dtype, device=A_bar.device)
