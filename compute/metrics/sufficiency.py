"""Sufficiency (ALTI REF ``aupc.py --bins`` + ``evaluation.ipynb``; METHODS.md 8.1, 14.2): how far the probability
of the predicted class stays below the full input's when ONLY the top-ranked tokens are kept. Lower = more faithful."""

from __future__ import annotations

from .base import EvalExample, Metric, MetricResult, Predictor
from .comprehensiveness import check_variant
from .perturbation import alti_deletion, running


class Sufficiency(Metric):
    name = "sufficiency"
    description = ("mean gap between the full input's predicted-class probability and that of the top 1/5/10/20/50% "
                   "of the ranked tokens alone ([CLS] + kept + [SEP]), /6")
    reference = "Ferrando et al. 2022 (ALTI) aupc.py; DeYoung et al. 2020 (ERASER); METHODS.md 8.1, 14.2"
    higher_is_better = False
    needs_model = True
    order = 20

    def __init__(self, **settings):
        super().__init__(**check_variant(self.name, settings))

    def evaluate(self, examples: list[EvalExample], predictor: Predictor | None) -> MetricResult:
        """variant "alti": curve = running maximum of p over the 6 levels INCLUDING level 0 (the empty input
        [CLS][SEP]); value = sum over levels 1..5 of (f(x) - curve) / 6, f(x) = p of the full re-encoded input
        (comprehensiveness' level 0, evaluated in the same call). "eraser": the same on the raw p."""
        p, f, j = alti_deletion(examples, predictor, sufficiency=True)  # [E, 6], [E], [E, 6]
        curve = running(p, "max") if self.settings["variant"] == "alti" else p
        values = (f[:, None] - curve[:, 1:]).sum(1) / 6.0  # [E]
        return MetricResult(values=values, curves=curve, levels=j)
