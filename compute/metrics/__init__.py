"""Faithfulness metrics (METHODS.md section 8), looked up by name. ``attr-compute metrics`` lists them.

Everything about a metric (direction, order, presets, needs) is declared on its class (``base.Metric``); the
registry only collects the classes, in their declared order."""

from __future__ import annotations

from ..errors import UsageError
from .accuracy import PerturbedAccuracy
from .aopc import AOPC
from .average_precision import EvidenceAveragePrecision
from .base import EvalExample, Metric, MetricContext, MetricResult, Predictor
from .comprehensiveness import Comprehensiveness
from .dot_product import EvidenceDotProduct
from .jaccard import Jaccard25, SeedSpearman
from .kendall import KendallTau
from .lodds import LOdds
from .precision_at_k import PrecisionAtK
from .spearman import SpearmanWithSaliency
from .sufficiency import Sufficiency

_CLASSES = (Comprehensiveness, Sufficiency, AOPC, LOdds, PerturbedAccuracy, KendallTau, SpearmanWithSaliency,
            PrecisionAtK, EvidenceDotProduct, EvidenceAveragePrecision, Jaccard25, SeedSpearman)
REGISTRY: dict[str, type[Metric]] = {m.name: m for m in sorted(_CLASSES, key=lambda m: m.order)}


def presets_of(name: str) -> dict:
    """The paper presets a metric has (METHODS.md 8.2): {preset: settings}."""
    return dict(REGISTRY[name].presets)


def preset_names() -> list[str]:
    """Every preset name some metric has (each is a paper of compute/papers.py)."""
    return list(dict.fromkeys(p for m in REGISTRY.values() for p in m.presets))


def get_metric(name: str, **settings) -> Metric:
    if name not in REGISTRY:
        raise UsageError(f"unknown metric '{name}': choose from {', '.join(REGISTRY)}")
    return REGISTRY[name](**settings)


__all__ = ["REGISTRY", "EvalExample", "Metric", "MetricContext", "MetricResult", "Predictor", "get_metric",
           "preset_names", "presets_of"]
