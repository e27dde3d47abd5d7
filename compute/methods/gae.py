"""GAE, generic attention explainability (Chefer et al. 2021b; METHODS.md 5.2, 14.13): per layer
A_bar^l = mean_h (dF/dA^{l,h} * A^{l,h})^+ (gradient of the target logit times the attention probabilities, positive
part per head), aggregated additively: R = I, R <- R + A_bar^l R for l = 1..L (no normalisation). Final = the
explained row of R; layer view l = that row after layer l; matrices = A_bar^l. Nothing is zeroed. Defined for any
architecture that exposes attention probabilities (decoders explain their last real token)."""

from __future__ import annotations

import torch

from ._internals.aggregate import rows_of_products, valid_block
from ._internals.base import MethodResult
from ._internals.gradients import GradientMethod, wide


class GAE(GradientMethod):
    name = "gae"
    description = "gradient x attention (positive, head mean), added up over layers: R <- R + A_bar R"
    reference = "Chefer et al. (2021b); METHODS.md 5.2, 14.13"
    has_layer_views = True
    has_matrices = True

    def from_grads(self, gp, grads, cap):
        maps = [valid_block((wide(G) * wide(A)).clamp_min(0).mean(1), cap.mask)
                for A, G in zip(gp.attentions, grads["attentions"])]
        eye = torch.eye(maps[0].shape[-1], dtype=maps[0].dtype, device=maps[0].device)
        views = rows_of_products([eye + M for M in maps], cap.explain_pos)  # e^T (I + A^l) ... (I + A^1)
        return MethodResult(scores=views[:, -1], layer_scores=views, matrices=torch.stack(maps, dim=1))
