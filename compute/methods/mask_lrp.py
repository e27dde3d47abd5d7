"""Mask-LRP (Song et al. 2024; METHODS.md 6.2-6.3, 14.14): TransAtt whose relevance propagation keeps only the
heads of a head mask M [L, H] (positional and syntactic heads found by the head-statistics pass): at every layer
the relevance leaving the A.V product towards A and V is multiplied by M[l, h]; the residual branch is untouched.

Reference behaviour by default: the rollout uses each layer's unmasked attention relevance (``rollout_uses_masked``
switches to the paper's eq. 10), no renormalisation (``renormalise``: the paper's rescaling of the kept heads to the
layer's total). With M all ones the method equals ``transatt`` exactly. The mask comes from the run's
/head_masks/mask_lrp (the runner passes it as the ``head_mask`` parameter, recorded in the store)."""

from __future__ import annotations

import torch

from ..errors import AttrscopeError
from .transatt import TransAtt


class MaskLRP(TransAtt):
    """TransAtt's read-out (gradient x attention relevance, ROLL) of a propagation that runs through the mask."""

    name = "mask_lrp"
    description = "TransAtt with relevance propagated through the positional and syntactic heads only"
    reference = "Song et al. (2024); METHODS.md 6.2-6.3, 14.14"

    def head_mask(self, cap):
        mask = self.params.get("head_mask")
        if mask is None:
            raise AttrscopeError("method 'mask_lrp' needs a head mask: attr-compute computes it in its head-statistics "
                                 "pass, or pass --head-mask STORE.h5 to reuse one")
        return torch.as_tensor(mask, dtype=torch.float64, device=cap.input_ids.device)

    def check_architecture(self, adapter):
        super().check_architecture(adapter)
        mask = self.params.get("head_mask")
        if mask is not None:
            shape = tuple(torch.as_tensor(mask).shape)
            if shape != (adapter.n_layers, adapter.n_heads):
                raise AttrscopeError(f"method 'mask_lrp': the head mask is {shape[0]} x {shape[1]} but the model has "
                                     f"{adapter.n_layers} layers x {adapter.n_heads} heads: compute the mask with this model")

    def options(self):
        return {"rollout_uses_masked": bool(self.params.get("rollout_uses_masked", False)),
                "renormalise": bool(self.params.get("renormalise", False))}
