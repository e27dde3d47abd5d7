"""AOPC (METHODS.md 8.2, 14.10): area over the perturbation curve, the mean fall of the class probability over 9
levels of most-important tokens perturbed (deleted, or replaced by [PAD] / [MASK]). Higher = more faithful.

The four papers differ in every detail; PRESETS holds each one's convention and the settings name them all."""

from __future__ import annotations

import numpy as np

from .base import EvalExample, Metric, MetricResult, Predictor
from .perturbation import (LEVEL_DEFAULTS, LEVEL_OVERRIDES, chosen_class, level_curves, resolve_settings,
                           token_id_settings)

DEFAULTS = {**LEVEL_DEFAULTS, "absolute": False}

# METHODS.md 8.2. pad_id / mask_id are the tokenizer's and come from the caller.
PRESETS = {
    # AttCAT Table 1: AOPC by deletion, |p0 - pk| (REF), i/9 of the length, specials kept, gold label, PAD attended.
    "attcat": {"levels": "ninths", "perturbation": "delete", "protect": "cls_sep", "cls": "label", "side": "top",
               "absolute": True, "attend": "all", "skip_last": True},
    # Mask-LRP Table 1: [PAD] replacement, signed, otherwise as AttCAT.
    "masklrp": {"levels": "ninths", "perturbation": "pad", "protect": "cls_sep", "cls": "label", "side": "top",
                "absolute": False, "attend": "all", "skip_last": True},
    # NormXLogit Table 1 (encoders): [MASK] replacement, 10..90%, only [CLS] kept, predicted class, original mask.
    "normxlogit": {"levels": "tenths", "perturbation": "mask", "protect": "cls", "cls": "predicted", "side": "top",
                   "absolute": False, "attend": "original", "skip_last": False},
    # DecompX Tables 1, A.1 (A.2: side bottom; its analysis_v3.ipynb): [MASK] for floor(r * m) of the m ranked tokens,
    # r = 0.1..0.9 ([CLS] and every [SEP] never ranked nor masked), signed drop of the unperturbed input's predicted
    # class, attention mask kept. The REF's ties (numpy argsort, top taken from its end) may order differently.
    "decompx": {"levels": "ranked_tenths", "perturbation": "mask", "protect": "cls_sep", "cls": "predicted",
                "side": "top", "absolute": False, "attend": "original", "skip_last": False},
}


class AOPC(Metric):
    name = "aopc"
    description = "mean over 9 levels of p0 - pk, the class probability fall when the top-k tokens are perturbed"
    reference = ("AttCAT (Qiang et al. 2022), Mask-LRP (Song et al. 2024), NormXLogit (Abbasi et al.), DecompX "
                 "(Modarressi et al. 2023); METHODS.md 8.2")
    higher_is_better = True
    needs_model = True
    order = 30
    presets = PRESETS
    overridable = LEVEL_OVERRIDES

    @classmethod
    def context_settings(cls, ctx):
        return token_id_settings(ctx)

    def __init__(self, **settings):
        """Settings: levels ninths|tenths|ranked_tenths, perturbation delete|pad|mask, protect cls_sep|cls, cls
        label|predicted, side top|bottom, absolute, attend all|original, skip_last (None: True for ninths), pad_id,
        mask_id, and preset attcat|masklrp|normxlogit|decompx (its values under the caller's)."""
        super().__init__(**resolve_settings(self.name, settings, DEFAULTS, PRESETS))

    def evaluate(self, examples: list[EvalExample], predictor: Predictor | None) -> MetricResult:
        s = self.settings
        lc = level_curves(examples, predictor, s, chosen_class(examples, s["cls"]), self.name)
        drop = lc.p0[:, None] - lc.pk  # [E, 9]
        if s["absolute"]:
            drop = np.abs(drop)
        return MetricResult(values=drop.mean(1), curves=lc.pk, levels=lc.counts)
