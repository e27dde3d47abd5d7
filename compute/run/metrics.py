"""Stage 7, metrics: the faithfulness metrics asked with --metrics, over the finished store, with the run's model."""

from __future__ import annotations

from ..models import LoadedModel
from .plan import RunPlan
from .progress import Progress


def compute_metrics(plan: RunPlan, lm: LoadedModel, progress: Progress) -> dict:
    from ..evaluate import EvalConfig, evaluate_store

    cfg = plan.cfg
    ecfg = cfg.eval or EvalConfig(metrics=cfg.metrics, preset=cfg.preset)
    if ecfg.preset is None:
        ecfg.preset = cfg.preset
    return evaluate_store(plan.output, ecfg, lm=lm, message=progress.message)
