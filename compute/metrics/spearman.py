"""Spearman correlation with a saliency map (GlobEnc's faithfulness evaluation, METHODS.md 3.3 and 8.4).

Also holds the rank helpers the other ranking metrics share (average and dense ranks, the stable descending order)."""

from __future__ import annotations

import numpy as np

from ..errors import UsageError
from .base import EvalExample, Metric, MetricResult


def descending_order(x: np.ndarray) -> np.ndarray:
    """Positions by score, highest first; ties keep position order (a stable sort of -x). [n] -> [n] int."""
    return np.argsort(-np.asarray(x, dtype=np.float64), kind="stable")


def _tie_groups(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ascending stable order of x [n], the tie group of each sorted element [n] and each group's first sorted index."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    new = np.ones(x.size, dtype=bool)
    new[1:] = xs[1:] != xs[:-1]
    return order, np.cumsum(new) - 1, np.flatnonzero(new)


def average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties get the mean of the ranks they span (scipy.stats.rankdata(method='average')). [n] -> [n]."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return np.zeros(0)
    order, group, starts = _tie_groups(x)
    counts = np.diff(np.append(starts, x.size))
    ranks = np.empty(x.size)
    ranks[order] = (starts + (counts + 1) / 2.0)[group]
    return ranks


def dense_ranks(x: np.ndarray) -> np.ndarray:
    """1-based dense ranks: equal values share a rank, no gaps (rankdata(method='dense'), pandas rank('dense'))."""
    x = np.asarray(x, dtype=np.float64)
    order, group, _ = _tie_groups(x)
    ranks = np.empty(x.size)
    ranks[order] = group + 1.0
    return ranks


def spearman_rho(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of the average ranks (scipy.stats.spearmanr). NaN when either vector is constant, has
    fewer than 2 entries or a non-finite value."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.size < 2 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("nan")
    ra = average_ranks(a)
    rb = average_ranks(b)
    ra -= ra.mean()
    rb -= rb.mean()
    den = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    if den == 0:
        return float("nan")
    return float(np.clip((ra * rb).sum() / den, -1.0, 1.0))


def keep_mask(ex: EvalExample, exclude_specials: bool) -> np.ndarray:
    """[n] bool: the positions a metric looks at."""
    n = np.asarray(ex.scores).shape[-1]
    if exclude_specials:
        return ~np.asarray(ex.special, dtype=bool)
    return np.ones(n, dtype=bool)


def check_aligned(ex: EvalExample, other: np.ndarray, what: str) -> np.ndarray:
    """The other per-token vector as float64 [n]; a length that differs from the example's tokens is a caller bug."""
    other = np.asarray(other, dtype=np.float64)
    n = np.asarray(ex.scores).shape[-1]
    if other.shape != (n,):
        raise ValueError(f"example {ex.id}: {what} has shape {other.shape}, expected ({n},)")
    return other


def check_choice(setting: str, value, choices: tuple[str, ...]) -> str:
    """A setting's value, or a one-line error naming the choices."""
    if value not in choices:
        raise UsageError(f"metric setting {setting}={value!r} is not one of {', '.join(choices)}")
    return value


class SpearmanWithSaliency(Metric):
    """Spearman rank correlation between the method's scores and a saliency method's scores of the same store.

    GlobEnc (Modarressi et al. 2022) correlates its CLS row with gradient x input (L2 over the hidden size) over every
    position, [CLS] and [SEP] included, ties as average ranks, and reports mean +- std over examples. Settings:
    ``saliency`` (name of the other method in the store, default "gxi_l2"), ``exclude_specials`` (default False)."""

    name = "spearman"
    description = "Spearman correlation with a saliency method's scores (GlobEnc), per example"
    reference = "Modarressi et al. (2022) GlobEnc, Table 1; METHODS.md 3.3, 8.4"
    higher_is_better = True
    order = 70
    needs_saliency = True

    @classmethod
    def context_settings(cls, ctx):
        return {"saliency": ctx.saliency}

    def __init__(self, saliency: str = "gxi_l2", exclude_specials: bool = False, **settings):
        super().__init__(saliency=str(saliency), exclude_specials=bool(exclude_specials), **settings)

    def evaluate(self, examples: list[EvalExample], predictor=None) -> MetricResult:
        values = np.full(len(examples), np.nan)
        name = self.settings["saliency"]
        for i, ex in enumerate(examples):
            sal = ex.other_scores.get(name) if ex.other_scores else None
            if sal is None:
                continue  # the store has no such method for this example: NaN
            sal = check_aligned(ex, sal, f"saliency '{name}'")
            keep = keep_mask(ex, self.settings["exclude_specials"])
            values[i] = spearman_rho(np.asarray(ex.scores, dtype=np.float64)[keep], sal[keep])
        return MetricResult(values=values)
