"""Full LRP (Chefer et al. 2021a rules; Mask-LRP's "LRP" baseline; METHODS.md 5.2): the relevance of the target's
one-hot logit propagated to the encoder input (the embedding output; embeddings are not propagated), summed over
hidden dims, the explained ([CLS]) token set to 0 as in the reference. Layer view l = the same at the input of layer
l (view 1 is the final attribution). Signed: the residual rule can hand a token negative relevance."""

from __future__ import annotations


from ..options import Option
from ._internals.base import MethodResult
from ._internals.relevance import RelevanceMethod, zero_self


class LRP(RelevanceMethod):
    name = "lrp"
    description = "layer-wise relevance propagation to the encoder input (Chefer's rules), summed over hidden dims"
    reference = "Chefer et al. (2021a); Song et al. (2024) baselines; METHODS.md 5.1-5.2"
    signed = True
    has_layer_views = True

    run_options = (
        Option("lrp_dtype", "auto", choices=("auto", "float64", "mixed", "model"), show_default=True, param="dtype",
               resume=True,
               help="Precision of the LRP family (lrp, partial_lrp, transatt, mask_lrp): float64 (forward and rules "
                    "in float64), mixed (float64 forward, float32 rules), model "
                    "(the model's dtype, the reference), auto (float64: the others miss the float64 numbers by more "
                    "than 1e-3 of the scale; see docs/method-details.md, LRP precision)."),
    )

    def from_relevance(self, rel, gp, target, cap):
        views = rel.inputs.transpose(0, 1) * cap.mask[:, None]  # [B, L, n]: input of layer 1 .. L
        views = zero_self(views, cap.explain_pos)
        return MethodResult(scores=views[:, 0], layer_scores=views)
