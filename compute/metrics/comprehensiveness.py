"""Comprehensiveness (ALTI REF ``aupc.py --bins`` + ``evaluation.ipynb``; METHODS.md 8.1, 14.2): how much the
probability of the predicted class falls when the top-ranked tokens are deleted. Higher = more faithful."""

from __future__ import annotations

from ..errors import AttrscopeError
from .base import EvalExample, Metric, MetricResult, Predictor
from .perturbation import alti_deletion, running

VARIANTS = ("alti", "eraser")


def check_variant(metric: str, settings: dict) -> dict:
    """Fill in and check the one setting of comprehensiveness / sufficiency."""
    unknown = sorted(set(settings) - {"variant"})
    if unknown:
        raise AttrscopeError(f"{metric}: unknown setting(s) {', '.join(unknown)}: the only one is variant")
    s = {"variant": "alti", **settings}
    if s["variant"] not in VARIANTS:
        raise AttrscopeError(f"{metric}: variant must be alti or eraser, not {s['variant']!r}")
    return s


class Comprehensiveness(Metric):
    name = "comprehensiveness"
    description = ("mean drop of the predicted-class probability when the top 1/5/10/20/50% of the ranked tokens are "
                   "deleted ([CLS] and final [SEP] kept), /6")
    reference = "Ferrando et al. 2022 (ALTI) aupc.py; DeYoung et al. 2020 (ERASER); METHODS.md 8.1, 14.2"
    higher_is_better = True
    needs_model = True
    order = 10

    def __init__(self, **settings):
        super().__init__(**check_variant(self.name, settings))

    def evaluate(self, examples: list[EvalExample], predictor: Predictor | None) -> MetricResult:
        """variant "alti": curve = running minimum of p over the 6 levels (level 0 = the unperturbed re-encoded
        input = f(x)), value = sum over levels 1..5 of (f(x) - curve) / 6. "eraser": the same on the raw p."""
        p, f, j = alti_deletion(examples, predictor, sufficiency=False)  # [E, 6], [E], [E, 6]
        curve = running(p, "min") if self.settings["variant"] == "alti" else p
        values = (f[:, None] - curve[:, 1:]).sum(1) / 6.0  # [E]; NaN rows (m == 0) stay NaN
        return MetricResult(values=values, curves=curve, levels=j)
