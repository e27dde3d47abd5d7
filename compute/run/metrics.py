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
    if cfg.resume:  # a resumed complete store kept its metrics: say which the new values replace
        from store import open_store

        from ..evaluate import parse_metric_specs

        with open_store(plan.output) as s:
            there = {name for m in s.metric_methods for name in s.metric_names(m)}
        again = [stored for stored, _, _ in parse_metric_specs(ecfg.metrics) if stored in there]
        if again:
            progress.message(f"--metrics: recomputing {', '.join(again)}, already in store '{plan.output}' (the new "
                             "values replace the old)")
    return evaluate_store(plan.output, ecfg, lm=lm, progress=progress)
