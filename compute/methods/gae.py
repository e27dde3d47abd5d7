"""GAE, generic attention explainability (Chefer et al. 2021b; METHODS.md 5.2, 14.13): per layer
A_bar^l = mean_h (dF/dA^{l,h} * A^{l,h})^+ (gradient of the target logit times the attention probabilities, positive
part per head), aggregated additively: R = I, R <- R + A_bar^l R for l = 1..L (no normalisation). Final = the
explained row of R; layer view l = that row after layer l; matrices = A_bar^l. Nothing is zeroed. Defined for any
architecture that exposes attention probabilities (decoders explain their last real token)."""

from __future__ import annotations

from ._internals.aggregate import rows_of_products, valid_pairs
from ._internals.base import MethodResult
from ._internals.checkpointed import AttentionTerm
from ._internals.gradients import GradientMethod


def positive_products(A, dA, cap):
    """sum_h (dF/dA^{l,h} * A^{l,h})^+ over the heads given on the valid block: [K, B, n, n] (A_bar^l: the term's
    mean over every head)."""
    return valid_pairs((dA * A).clamp_min_(0).sum(2), cap.mask)


class GAE(GradientMethod):
    name = "gae"
    description = "gradient x attention (positive, head mean), added up over layers: R <- R + A_bar R"
    reference = "Chefer et al. (2021b); METHODS.md 5.2, 14.13"
    has_layer_views = True
    has_matrices = True
    attention_terms = (AttentionTerm("gae", heads=positive_products),)

    def from_grads(self, gp, grads, cap):
        maps = gp.term(grads, self.attention_terms[0])  # [L, B, n, n]
        steps = maps.clone()
        steps.diagonal(dim1=-2, dim2=-1).add_(1)
        views = rows_of_products(steps, cap.explain_pos)  # e^T (I + A^l) ... (I + A^1)
        return MethodResult(scores=views[:, -1], layer_scores=views, matrices=maps.transpose(0, 1))
