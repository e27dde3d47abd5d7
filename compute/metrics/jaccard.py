"""Robustness across seeds (ALTI, METHODS.md 8.6): the same method on the same example in two models that differ only
in their fine-tuning seed (MultiBERTs) should rank the tokens alike. ``EvalExample.paired_scores`` holds the other
store's scores; examples the two models predict differently are left out (NaN), as in ALTI's robustness notebook."""

from __future__ import annotations

import math

import numpy as np

from ..errors import UsageError
from .base import EvalExample, Metric, MetricResult
from .spearman import check_aligned, check_choice, dense_ranks, descending_order


def paired(ex: EvalExample, same_pred: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """(scores, paired scores), both float64 [n], or None where there is no pair or (``same_pred``) the two models
    predict different classes; an unknown ``paired_pred`` counts as different."""
    if ex.paired_scores is None:
        return None
    if same_pred and (ex.paired_pred is None or int(ex.paired_pred) != int(ex.pred)):
        return None
    return np.asarray(ex.scores, dtype=np.float64), check_aligned(ex, ex.paired_scores, "paired_scores")


class Jaccard25(Metric):
    """Jaccard similarity of the top ceil(0.25 n) tokens of the two rankings (n includes the special tokens).

    Ranking: descending score, ties by position (the REF sorts the dense ranks with Python's stable sort, reverse=True,
    which is the same order). Settings: ``fraction`` (default 0.25), ``same_pred`` (default True: NaN where the paired
    model predicts another class)."""

    name = "jaccard_25"
    description = "Jaccard similarity of the top-25% tokens between two seeds' attributions (robustness)"
    reference = "Ferrando et al. (2022) ALTI, robustness across MultiBERTs seeds; METHODS.md 8.6"
    higher_is_better = True
    order = 110
    needs_other_store = True

    def __init__(self, fraction: float = 0.25, same_pred: bool = True, **settings):
        if not 0 < float(fraction) <= 1:
            raise UsageError(f"metric setting fraction={fraction!r} must be in (0, 1]")
        super().__init__(fraction=float(fraction), same_pred=bool(same_pred), **settings)

    def evaluate(self, examples: list[EvalExample], predictor=None) -> MetricResult:
        values = np.full(len(examples), np.nan)
        for i, ex in enumerate(examples):
            pair = paired(ex, self.settings["same_pred"])
            if pair is None or pair[0].size == 0:
                continue
            a, b = pair
            n = a.size
            k = math.ceil(self.settings["fraction"] * n)
            top_a = np.zeros(n, dtype=bool)
            top_b = np.zeros(n, dtype=bool)
            top_a[descending_order(a)[:k]] = True
            top_b[descending_order(b)[:k]] = True
            values[i] = (top_a & top_b).sum() / (top_a | top_b).sum()
        return MetricResult(values=values)


class SeedSpearman(Metric):
    """The classic Spearman formula 1 - 6 sum d^2 / (n (n^2 - 1)) between the two seeds' dense ranks.

    METHODS.md 8.6 says "on dense ranks normalised by n". In the REF (ALTI's robustness.ipynb) the ranks are
    ``get_normalized_rank`` = pandas dense rank / n, and its own ``spearmanr`` then dense-ranks those normalised ranks
    again before taking d. x / n is strictly increasing, so the re-ranking gives back the dense ranks and the
    normalisation has NO effect on the REF's value: d = dense_rank(a) - dense_rank(b), 1-based. That is the default
    (``ranks="dense"``).

    Taken literally (d on the normalised ranks, d / n) it does change the value: sum d^2 shrinks by n^2, so the value
    is 1 - 6 sum d^2 / (n^3 (n^2 - 1)) >= 1 - 2 / n^2 (no ties), close to 1 for every pair of rankings, not a
    correlation any more. Offered as ``ranks="normalised"`` for completeness only.

    With ties the formula is not the tie-corrected Spearman (scipy.stats.spearmanr would give another number; dense
    ranks also make two all-tied vectors score 1 where scipy gives NaN): this follows the REF. NaN for n < 2.
    Settings: ``ranks`` ("dense" | "normalised"), ``same_pred`` (default True)."""

    name = "seed_spearman"
    description = "Spearman formula on dense ranks between two seeds' attributions (robustness)"
    reference = "Ferrando et al. (2022) ALTI, robustness across MultiBERTs seeds; METHODS.md 8.6"
    higher_is_better = True
    order = 120
    needs_other_store = True

    def __init__(self, ranks: str = "dense", same_pred: bool = True, **settings):
        super().__init__(ranks=check_choice("ranks", ranks, ("dense", "normalised")), same_pred=bool(same_pred),
                         **settings)

    def evaluate(self, examples: list[EvalExample], predictor=None) -> MetricResult:
        values = np.full(len(examples), np.nan)
        for i, ex in enumerate(examples):
            pair = paired(ex, self.settings["same_pred"])
            if pair is None or pair[0].size < 2 or not (np.isfinite(pair[0]).all() and np.isfinite(pair[1]).all()):
                continue
            a, b = pair
            n = a.size
            d = dense_ranks(a) - dense_ranks(b)  # [n]
            if self.settings["ranks"] == "normalised":
                d = d / n
            values[i] = 1.0 - 6.0 * (d * d).sum() / (n * (n * n - 1.0))
        return MetricResult(values=values)
