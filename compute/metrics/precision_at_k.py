"""Precision@K on question answering (AttCAT, Mask-LRP; METHODS.md 8.5): how many gold-answer tokens are among the K
highest-scored tokens."""

from __future__ import annotations

import numpy as np

from ..errors import UsageError
from .base import EvalExample, Metric, MetricResult
from .spearman import descending_order


class PrecisionAtK(Metric):
    """count = |evidence ∩ top-K positions| per example (top by score, ties by position).

    ``EvalExample.evidence`` marks the gold answer span; NaN without it, or where no answer token is among the kept
    positions (an answer truncated away has nothing to find). Settings: ``k`` (default 20, Mask-LRP; AttCAT reports
    10..50), ``exclude_specials`` (default True: [CLS]/[SEP] are never answer tokens and are left out of the ranking).
    The value is the count (AttCAT reports its mean); the summary adds "mean_count", "mean_evidence_len" and
    "precision" = 100 * mean(count) / mean(evidence length) (Mask-LRP's form), over the examples with a value.
    ``curves[:, 0]`` = count at level min(k, n_kept), ``curves[:, 1]`` = count at level n_kept, which is the evidence
    length: the summary reads it from there, so it survives concatenating results and is stored per example."""

    name = "precision_at_k"
    description = "number of gold answer tokens among the top-K attributed tokens (QA)"
    reference = "Qiang et al. (2022) AttCAT; Song et al. (2024) Mask-LRP; METHODS.md 8.5"
    higher_is_better = True
    needs_evidence = True
    order = 80

    @classmethod
    def context_settings(cls, ctx):
        return {"k": ctx.k}

    def __init__(self, k: int = 20, exclude_specials: bool = True, **settings):
        if int(k) < 1:
            raise UsageError(f"metric setting k={k!r} must be a positive number of tokens")
        super().__init__(k=int(k), exclude_specials=bool(exclude_specials), **settings)

    def evaluate(self, examples: list[EvalExample], predictor=None) -> MetricResult:
        E = len(examples)
        k = self.settings["k"]
        values = np.full(E, np.nan)
        curves = np.full((E, 2), np.nan)
        levels = np.full((E, 2), -1, dtype=np.int64)
        for i, ex in enumerate(examples):
            if ex.evidence is None:
                continue
            scores = np.asarray(ex.scores, dtype=np.float64)  # [n]
            evidence = np.asarray(ex.evidence, dtype=bool)  # [n]
            if evidence.shape != scores.shape:
                raise ValueError(f"example {ex.id}: evidence has shape {evidence.shape}, expected {scores.shape}")
            keep = ~np.asarray(ex.special, dtype=bool) if self.settings["exclude_specials"] else np.ones_like(evidence)
            s, e = scores[keep], evidence[keep]
            if not e.any():
                continue
            count = int(e[descending_order(s)[:k]].sum())
            values[i] = count
            curves[i] = (count, e.sum())
            levels[i] = (min(k, e.size), e.size)
        return MetricResult(values=values, curves=curves, levels=levels)

    def summary(self, result: MetricResult) -> dict:
        out = super().summary(result)
        v = np.asarray(result.values, dtype=np.float64)
        length = np.full(v.shape, np.nan) if result.curves is None else np.asarray(result.curves, np.float64)[:, 1]
        ok = np.isfinite(v) & np.isfinite(length)  # evidence length = count at level n_kept
        mean_count = float(v[ok].mean()) if ok.any() else float("nan")
        mean_len = float(length[ok].mean()) if ok.any() else float("nan")
        out["mean_count"] = mean_count
        out["mean_evidence_len"] = mean_len
        out["precision"] = 100.0 * mean_count / mean_len if ok.any() and mean_len > 0 else float("nan")
        return out
