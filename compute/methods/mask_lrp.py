"""Mask-LRP (Song et al. 2024; METHODS.md 6.2-6.3, 14.14): TransAtt whose relevance propagation keeps only the
heads of a head mask M [L, H] (positional and syntactic heads found by the head-statistics pass): at every layer
the relevance leaving the A.V product towards A and V is multiplied by M[l, h]; the residual branch is untouched.

Defaults (METHODS.md 6.2-6.3, 14.14): the rollout uses each layer's unmasked attention relevance (as the reference;
``rollout_uses_masked`` switches to the paper's eq. 10), no renormalisation (``renormalise``: the paper's rescaling of
the kept heads to the layer's total), and the rolled-out relevance is R^{A,l} after the 1/2 of the A.V rule, so with
M all ones the method equals ``transatt`` exactly (11.6). The reference code departs from that last point: with a
head mask it saves the attention relevance BEFORE the 1/2 (its BERT.py keeps ``cam1_preserve``), so its maps are
exactly twice TransAtt's and its all-ones MGAE is not its GAE; ``rollout_unhalved`` reproduces it (on under
``--preset masklrp``; docs/departures.md measures the effect). The mask comes from the run's /head_masks/mask_lrp
(the runner passes it as the ``head_mask`` parameter, recorded in the store)."""

from __future__ import annotations

import torch

from ..errors import AttrscopeError
from ..options import Option, at_least, existing_file
from .transatt import TransAtt


class MaskLRP(TransAtt):
    """TransAtt's read-out (gradient x attention relevance, ROLL) of a propagation that runs through the mask."""

    name = "mask_lrp"
    description = "TransAtt with relevance propagated through the positional and syntactic heads only"
    reference = "Song et al. (2024); METHODS.md 6.2-6.3, 14.14"
    run_options = (
        *TransAtt.run_options,
        # the head-statistics pass that makes the head mask (compute.head_pass); a resumed run reads the store's mask
        Option("head_stats_data", metavar="DATASET",
               help="mask_lrp: dataset of the head-statistics pass [default: the run's dataset]."),
        Option("head_stats_limit", type=int, metavar="N", check=at_least(1),
               help="mask_lrp: use the first N examples for the head statistics."),
        Option("parses", path=True, check=existing_file,
               help="mask_lrp: dependency parses as CoNLL-U (default: spaCy, pip install 'attrscope[parse]')."),
        Option("head_mask", path=True, metavar="STORE.h5",
               help="mask_lrp: reuse the head masks of another store instead of computing them."),
        Option("pos_self", choices=("exclude", "count"),
               help="Positional statistics: offset 0 excluded (the paper) or counted (the reference) "
                    "[default: exclude; count under --preset masklrp]."),
        Option("mask_combine", "union", choices=("union", "sum"), show_default=True, param="combine", resume=True,
               help="mask_lrp: union (the reference) or sum (the paper) of the positional and syntactic masks."),
        Option("mask_rollout", "unmasked", choices=("unmasked", "masked"), show_default=True, resume=True,
               param="rollout_uses_masked", to_param=lambda v: v == "masked",
               help="mask_lrp: roll out each layer's unmasked attention relevance (the reference) or the masked one."),
        Option("mask_renormalise", False, type=bool, param="renormalise", to_param=bool, resume=True,
               help="mask_lrp: rescale the kept heads' relevance to the layer's total (the paper's variant)."),
        Option("mask_rollout_unhalved", type=bool, flags=("--mask-rollout-unhalved/--mask-rollout-halved",),
               param="rollout_unhalved", passed="given", param_default=False, resume=True,
               help="mask_lrp: roll out the attention relevance before the 1/2 of the A.V rule, as the reference code "
                    "does (maps 2x TransAtt's), or after it, so that an all-ones mask gives TransAtt "
                    "[default: halved; unhalved under --preset masklrp]."),
    )

    def head_mask(self, cap):
        mask = self.params.get("head_mask")
        if mask is None:
            raise AttrscopeError("method 'mask_lrp' needs a head mask: attr-compute computes it in its head-statistics "
                                 "pass, or pass --head-mask STORE.h5 to reuse one")
        # made once per device, the same tensor every batch: a host-to-device copy per batch waits for the device,
        # and the batch's propagations are memoised by the mask tensor
        device = cap.input_ids.device
        kept = self.__dict__.get("_mask_tensor")
        if kept is None or kept[0] != device or kept[1] is not mask:
            kept = self._mask_tensor = (device, mask, torch.as_tensor(mask, dtype=torch.float64, device=device))
        return kept[2]

    def check_architecture(self, adapter):
        super().check_architecture(adapter)
        mask = self.params.get("head_mask")
        if mask is not None:
            shape = tuple(torch.as_tensor(mask).shape)
            if shape != (adapter.n_layers, adapter.n_heads):
                raise AttrscopeError(f"method 'mask_lrp': the head mask is {shape[0]} x {shape[1]} but the model has "
                                     f"{adapter.n_layers} layers x {adapter.n_heads} heads: compute the mask with this model")

    def attention_maps(self, rel, gp, target):
        maps = super().attention_maps(rel, gp, target)
        # the reference's cam1_preserve: the A.V relevance before its 1/2 (a power of two: the maps exactly twice)
        return 2 * maps if self.params.get("rollout_unhalved") else maps

    def options(self):
        return {"rollout_uses_masked": bool(self.params.get("rollout_uses_masked", False)),
                "renormalise": bool(self.params.get("renormalise", False))}
