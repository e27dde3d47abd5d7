"""Faithfulness metrics (METHODS.md section 8), looked up by name. ``attr-compute metrics`` lists them."""

from __future__ import annotations

from ..errors import UsageError
from .accuracy import PerturbedAccuracy
from .aopc import AOPC
from .average_precision import EvidenceAveragePrecision
from .base import EvalExample, Metric, MetricResult, Predictor
from .comprehensiveness import Comprehensiveness
from .dot_product import EvidenceDotProduct
from .jaccard import Jaccard25, SeedSpearman
from .kendall import KendallTau
from .lodds import LOdds
from .precision_at_k import PrecisionAtK
from .spearman import SpearmanWithSaliency
from .sufficiency import Sufficiency

REGISTRY: dict[str, type[Metric]] = {m.name: m for m in (
    Comprehensiveness, Sufficiency, AOPC, LOdds, PerturbedAccuracy, KendallTau, SpearmanWithSaliency, PrecisionAtK,
    EvidenceDotProduct, EvidenceAveragePrecision, Jaccard25, SeedSpearman)}


def presets_of(name: str) -> dict:
    """The paper presets a metric has (METHODS.md 8.2): {preset: settings}."""
    import importlib

    module = importlib.import_module(REGISTRY[name].__module__)
    return dict(getattr(module, "PRESETS", {}) or {})


def get_metric(name: str, **settings) -> Metric:
    if name not in REGISTRY:
        raise UsageError(f"unknown metric '{name}': choose from {', '.join(REGISTRY)}")
    return REGISTRY[name](**settings)


__all__ = ["REGISTRY", "EvalExample", "Metric", "MetricResult", "Predictor", "get_metric", "presets_of"]
