"""AttCAT (Qiang et al. 2022; METHODS.md 4.2): AttCAT_j = sum_l CAT^l_j * alpha^l_j, signed.

alpha^l_j is the attention token j RECEIVES in layer l: mean over heads, then over the real query rows (not the
[CLS] row, 14.8). With ``mask_specials`` (--preset attcat) [CLS]/[SEP] are masked as keys during the explanation
pass, so their alpha, and their score, is 0. Layer view l = CAT^l * alpha^l."""

from __future__ import annotations

from ._internals.base import MethodResult
from ._internals.checkpointed import AttentionTerm
from ._internals.gradients import GradientMethod, cat_terms, valid_mean_rows
from .cat import Cat


def received(A, dA, cap):
    """alpha^l_j (the term's mean over the heads of this sum): the attention token j receives, summed over the heads
    given, mean over the real query rows [K, B, n]."""
    return valid_mean_rows(A.sum(2).transpose(0, 1), cap.mask).transpose(0, 1)


class AttCat(GradientMethod):
    name = "attcat"
    description = "sum over layers of (gradient . hidden state) x attention received, per token"
    reference = "Qiang et al. (2022) AttCAT, NeurIPS; METHODS.md 4.2"
    signed = True
    has_layer_views = True
    run_options = Cat.run_options
    attention_terms = (AttentionTerm("attcat", heads=received, grad=False),)

    def from_grads(self, gp, grads, cap):
        layers = self.params.get("layers", "inputs")
        terms = cat_terms(gp, grads, layers)  # [B, L, n]
        # the attention of layer l acts on h^{l-1} (its input): the same layer index in both variants
        alpha = gp.term(grads, self.attention_terms[0]).transpose(0, 1)  # [B, L, n]
        views = terms * alpha * cap.mask[:, None]
        return MethodResult(scores=views.sum(1), layer_scores=views)
