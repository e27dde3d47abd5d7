"""Evidence average precision (NormXLogit's BLiMP evaluation, METHODS.md 8.7): does the ranking put the evidence
tokens first? Unlike the dot product it ignores the score scale, so it needs no normalisation choice."""

from __future__ import annotations

import numpy as np

from .base import EvalExample, Metric, MetricResult
from .dot_product import evidence_view, parse_exclude, random_baseline
from .spearman import check_choice, descending_order


def average_precision(s: np.ndarray, e: np.ndarray) -> float:
    """AP = sum_r (Recall_r - Recall_{r-1}) * Precision_r over ranks r (descending score, ties by position), evidence
    = positives. Recall only moves at an evidence rank, by 1/R, so AP = mean of Precision_r at the evidence ranks."""
    hits = e[descending_order(s)].astype(np.float64)  # [m] 1 where rank r holds an evidence token
    precision = np.cumsum(hits) / np.arange(1, hits.size + 1)  # [m]
    return float((hits * precision).sum() / hits.sum())


def expected_random_ap(R: int, N: int) -> float:
    """Exact expectation of AP over uniformly random rankings of N tokens with R evidence tokens:
    (1/N) * (H_N + (R-1)/(N-1) * (N - H_N)), H_N the N-th harmonic number (1 when N = 1).

    Derivation: rank k holds evidence with probability R/N; given that, the k-1 ranks above hold (k-1)(R-1)/(N-1)
    evidence tokens on average, so E[Precision_k | evidence at k] = (1 + (k-1)(R-1)/(N-1)) / k; sum over k, / R."""
    if N == 1:
        return 1.0
    H = float((1.0 / np.arange(1, N + 1)).sum())
    return (H + (R - 1) / (N - 1) * (N - H)) / N


class EvidenceAveragePrecision(Metric):
    """Average precision of the evidence tokens in the method's ranking (higher = evidence ranked first).

    An evidence token ranked first, with no other evidence, gives 1; ranked last of n gives 1/n. Settings:
    * ``exclude``: as dot_product: "none" (default), "explained", "specials", "explained+specials"; removed from the
      ranking before AP is taken.
    * ``random``: the per-example baseline reported in the summary: "exact" (default: the expected AP of a uniformly
      random ranking, :func:`expected_random_ap`) or "prevalence" (|evidence| / n_kept, the common approximation,
      which underestimates it: 1 evidence token among 10 has prevalence 0.1 but expected AP 0.293).
    NaN where the example has no evidence among the kept positions. ``curves[:, 0]`` = the example's random baseline,
    ``levels[:, 0]`` = n_kept; the summary adds "random", their mean over the examples with a value."""

    name = "average_precision"
    description = "average precision of the evidence tokens in the attribution ranking (BLiMP)"
    reference = "Abbasi et al., NormXLogit, evidence alignment; METHODS.md 8.7"
    higher_is_better = True
    needs_evidence = True
    order = 100

    @classmethod
    def context_settings(cls, ctx):
        # a masked word's own position (the mask) is not a candidate for its evidence: METHODS.md 8.7 removes it
        explained = {"exclude": "explained"} if ctx.task == "masked-token" else {}
        return {"signed": ctx.signed, **explained}

    def __init__(self, exclude="none", random: str = "exact", **settings):
        super().__init__(exclude=parse_exclude(exclude), random=check_choice("random", random, ("exact", "prevalence")),
                         **settings)

    def evaluate(self, examples: list[EvalExample], predictor=None) -> MetricResult:
        E = len(examples)
        values = np.full(E, np.nan)
        curves = np.full((E, 1), np.nan)
        levels = np.full((E, 1), -1, dtype=np.int64)
        for i, ex in enumerate(examples):
            view = evidence_view(ex, self.settings["exclude"])
            if view is None:
                continue
            s, e = view
            R, N = int(e.sum()), int(e.size)
            values[i] = average_precision(s, e)
            curves[i, 0] = expected_random_ap(R, N) if self.settings["random"] == "exact" else R / N
            levels[i, 0] = N
        return MetricResult(values=values, curves=curves, levels=levels)

    def summary(self, result: MetricResult) -> dict:
        out = super().summary(result)
        out["random"] = random_baseline(result)
        return out
