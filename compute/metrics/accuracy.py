"""Perturbed accuracy (NormXLogit's and DecompX's "Accuracy", METHODS.md 8.2 / 12.5 Table 3): the fraction of the 9
perturbation levels at which the model still predicts the gold label. A faithful ranking removes what the model needs
first, so the accuracy falls: lower = more faithful."""

from __future__ import annotations

import numpy as np

from .aopc import PRESETS as AOPC_PRESETS
from .base import EvalExample, Metric, MetricResult, Predictor
from .perturbation import (LEVEL_DEFAULTS, LEVEL_OVERRIDES, chosen_class, level_curves, resolve_settings,
                           token_id_settings)

# The class read is always the gold label, so AOPC's cls and absolute have no meaning here.
PRESETS = {name: {k: v for k, v in p.items() if k not in ("cls", "absolute")} for name, p in AOPC_PRESETS.items()}
DEFAULTS = {k: v for k, v in {**LEVEL_DEFAULTS, **PRESETS["normxlogit"]}.items() if k != "cls"}


class PerturbedAccuracy(Metric):
    name = "accuracy"
    description = "fraction of the 9 top-k perturbation levels at which the argmax still equals the gold label"
    reference = "NormXLogit (Abbasi et al.) Table 3, DecompX (Modarressi et al. 2023) Table 1; METHODS.md 8.2"
    higher_is_better = False
    needs_model = True
    order = 50
    presets = PRESETS
    overridable = tuple(k for k in LEVEL_OVERRIDES if k != "cls")  # always the gold label

    @classmethod
    def context_settings(cls, ctx):
        return token_id_settings(ctx)

    def __init__(self, **settings):
        """Settings as AOPC's without cls and absolute; defaults = the NormXLogit preset ([MASK] replacement, needs
        mask_id)."""
        super().__init__(**resolve_settings(self.name, settings, DEFAULTS, PRESETS))

    def evaluate(self, examples: list[EvalExample], predictor: Predictor | None) -> MetricResult:
        gold = chosen_class(examples, "label")  # [E], -1 without a label -> NaN
        lc = level_curves(examples, predictor, self.settings, gold, self.name)
        correct = np.where(lc.ok[:, None], (lc.top == gold[:, None]).astype(np.float64), np.nan)  # [E, 9]
        return MetricResult(values=correct.mean(1), curves=correct, levels=lc.counts)
