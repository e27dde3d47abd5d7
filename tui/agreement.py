"""How far two attributions of one example agree: rank correlation and top-k overlap (numpy).

Both leave the explained token out (its score is the model's own output for several methods and would make every
pair agree). Spearman's rho treats non-finite scores as 0 and ranks a signed method by the score itself (a token that
pushes against the prediction ranks low, as it does in the faithfulness metrics); the top-k overlap is that of the
underlined top-k sets (colors.top_k: a signed method's by |score|), so the column counts what the screen marks.
"""

from __future__ import annotations

import numpy as np

from .colors import top_k


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of the values of ``x`` (ties get the mean of the ranks they span), vectorised."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    # the start of each run of equal values, and each value's run
    starts = np.r_[True, sorted_x[1:] != sorted_x[:-1]]
    run = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    last = np.r_[first[1:], len(x)] - 1
    mean_rank = (first + last) / 2.0 + 1.0
    out = np.empty(len(x), dtype=np.float64)
    out[order] = mean_rank[run]
    return out


def _kept(a: np.ndarray, b: np.ndarray, skip: int | None) -> tuple[np.ndarray, np.ndarray]:
    a = np.nan_to_num(np.asarray(a, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    b = np.nan_to_num(np.asarray(b, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    n = min(len(a), len(b))
    keep = np.ones(n, dtype=bool)
    if skip is not None and 0 <= skip < n:
        keep[skip] = False
    return a[:n][keep], b[:n][keep]


def spearman(a: np.ndarray, b: np.ndarray, skip: int | None = None) -> float:
    """Spearman's rho of two score vectors (Pearson correlation of their tie-averaged ranks). NaN when fewer than
    two tokens remain or one vector is constant (no ranking to compare)."""
    a, b = _kept(a, b, skip)
    if len(a) < 2:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    ra -= ra.mean()
    rb -= rb.mean()
    den = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


def top_k_overlap(a: np.ndarray, b: np.ndarray, k: int, skip: int | None = None,
                  signed: tuple[bool, bool] = (False, False)) -> float:
    """|top-k(a) ∩ top-k(b)| / k of the tokens the screens underline (colors.top_k: the explained one left out, a
    signed method's by |score|); NaN when no token remains."""
    n = min(len(a), len(b)) - (skip is not None and 0 <= skip < min(len(a), len(b)))
    k = min(int(k), n)
    if k <= 0:
        return float("nan")
    return len(top_k(a, signed[0], k, skip) & top_k(b, signed[1], k, skip)) / k
