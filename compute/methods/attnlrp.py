"""AttnLRP (Achtibat et al. 2024; docs/methods.md 7): LRP with AttnLRP's rules for norms, elementwise functions,
the softmax and the products of attention and gated MLPs, computed as lxt's efficient AttnLRP computes it: one
gradient pass of the explained logit (less the foil's) in the model's dtype with the rules' modified backward, the
relevance of a tensor being the tensor times its modified gradient. Scores: the signed relevance at the embedding
output summed over the hidden dimension, unnormalised (lxt's); layer view l: the same at the input of layer l."""

from __future__ import annotations

from dataclasses import replace

from ..errors import AttrscopeError
from ._internals.attnlrp_rules import unsupported
from ._internals.base import MethodResult
from ._internals.gradients import GradientMethod, cat_terms


class AttnLRP(GradientMethod):
    name = "attnlrp"
    description = "AttnLRP relevance at the embedding output (lxt's rules, one modified backward), summed over hidden dims"
    reference = "Achtibat et al. (2024); docs/methods.md 7"
    signed = True
    has_layer_views = True
    op_budget = 1.5  # of a bare forward + backward: the rules' hooks add a few ops per norm, activation, projection

    def __init__(self, **params):
        super().__init__(**params)
        # the explained output is the logit (less the foil's): the rules start at a logit, never a probability
        self.spec = replace(self.spec, output="logit", rules="attnlrp")

    def check_architecture(self, adapter):
        why = unsupported(adapter)
        if why is not None:
            raise AttrscopeError(f"method '{self.name}' has no AttnLRP rule set for the '{adapter.config.model_type}' "
                                 f"architecture: {why}; choose lrp, gae or a gradient method")

    def from_grads(self, gp, grads, cap):
        views = cat_terms(gp, grads, "inputs") * cap.mask[:, None]  # [B, L, n]: <X, g> at layer 1's input .. L's
        return MethodResult(scores=views[:, 0], layer_scores=views)
