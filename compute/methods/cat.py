"""CAT (Qiang et al. 2022, the AttCAT ablation; METHODS.md 4.2): CAT_j = sum_l <dF/dh^l_j, h^l_j>, signed.

h^l are the layer INPUTS h^0..h^{L-1} (the reference code's choice, 14.8); ``layers="outputs"`` takes h^1..h^L as
the paper's text does. Layer view l = the term of layer l."""

from __future__ import annotations

from ..options import Option
from ._internals.base import MethodResult
from ._internals.gradients import GradientMethod, cat_terms


class Cat(GradientMethod):
    name = "cat"
    description = "sum over layers of gradient . hidden state at each token (AttCAT without the attention weight)"
    reference = "Qiang et al. (2022) AttCAT, ablation CAT; METHODS.md 4.2"
    signed = True
    has_layer_views = True

    run_options = (
        Option("attcat_layers", choices=("inputs", "outputs"), param="layers", passed="set", resume=True,
               help="cat/attcat: layer inputs h^0..h^L-1 (reference code) or outputs h^1..h^L (paper) "
                    "[default: inputs]."),
    )
    def from_grads(self, gp, grads, cap):
        terms = cat_terms(gp, grads, self.params.get("layers", "inputs")) * cap.mask[:, None]
        return MethodResult(scores=terms.sum(1), layer_scores=terms)
