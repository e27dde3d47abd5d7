"""LOdds (METHODS.md 8.2): mean over 9 levels of log(pk / p0), the log-ratio of the class probability after and
before the top-k tokens are perturbed. Lower = more faithful."""

from __future__ import annotations

import numpy as np

from .base import EvalExample, Metric, MetricResult, Predictor
from .perturbation import (LEVEL_DEFAULTS, LEVEL_OVERRIDES, chosen_class, level_curves, resolve_settings,
                           token_id_settings)

DEFAULTS = dict(LEVEL_DEFAULTS)

PRESETS = {
    # AttCAT Table 1: LOdds with [PAD] replacement (its paper text; the REF computes deletion too), gold label.
    "attcat": {"levels": "ninths", "perturbation": "pad", "protect": "cls_sep", "cls": "label", "side": "top",
               "attend": "all", "skip_last": True},
    # Mask-LRP Table 1: the same convention.
    "masklrp": {"levels": "ninths", "perturbation": "pad", "protect": "cls_sep", "cls": "label", "side": "top",
                "attend": "all", "skip_last": True},
    # NOT in the NormXLogit paper (it reports no LOdds): its AOPC perturbation, for a like-for-like companion number.
    "normxlogit": {"levels": "tenths", "perturbation": "mask", "protect": "cls", "cls": "predicted", "side": "top",
                   "attend": "original", "skip_last": False},
}


class LOdds(Metric):
    name = "lodds"
    description = "mean over 9 levels of log(pk / p0) when the top-k tokens are perturbed"
    reference = "AttCAT (Qiang et al. 2022), Mask-LRP (Song et al. 2024); METHODS.md 8.2"
    higher_is_better = False
    needs_model = True
    order = 40
    presets = PRESETS
    overridable = LEVEL_OVERRIDES

    @classmethod
    def context_settings(cls, ctx):
        return token_id_settings(ctx)

    def __init__(self, **settings):
        """Settings as AOPC's, without absolute."""
        super().__init__(**resolve_settings(self.name, settings, DEFAULTS, PRESETS))

    def evaluate(self, examples: list[EvalExample], predictor: Predictor | None) -> MetricResult:
        s = self.settings
        lc = level_curves(examples, predictor, s, chosen_class(examples, s["cls"]), self.name)
        with np.errstate(divide="ignore", invalid="ignore"):
            lo = np.log(lc.pk / lc.p0[:, None])  # [E, 9]; a probability of exactly 0 gives -inf, kept honest
        return MetricResult(values=lo.mean(1), curves=lo, levels=lc.counts)
