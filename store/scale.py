"""Scale statistics of a method's views over a whole store (for "global" colour normalisation in the TUI).

The writer accumulates them while it appends and stores them when the store is complete
(/methods/<m>/scale); for a store without them (older, still being written, or killed) the reader accumulates them
once on request, incrementally as the store grows. One accumulator serves both, so the numbers are the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import schema

_F = {name: i for i, name in enumerate(schema.SCALE_SUMMARY_FIELDS)}


def _empty_summary(k: int) -> np.ndarray:
    s = np.zeros((k, len(schema.SCALE_SUMMARY_FIELDS)))
    s[:, _F["min"]], s[:, _F["max"]] = np.inf, -np.inf
    return s


def hist_bins(values: np.ndarray) -> np.ndarray:
    """The histogram bin of every |x| (bin 0: below 10**SCALE_LOG10_MIN, zeros and NaN included)."""
    a = np.abs(np.asarray(values, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        pos = (np.log10(a) - schema.SCALE_LOG10_MIN) * schema.SCALE_BINS_PER_DECADE
    pos = np.nan_to_num(pos, nan=-1.0, neginf=-1.0, posinf=float(schema.SCALE_N_BINS))
    return np.clip(np.floor(pos).astype(np.int64) + 1, 0, schema.SCALE_N_BINS - 1)


def bin_upper_edge(b: int) -> float:
    """Upper bound of |x| in histogram bin ``b``."""
    if b >= schema.SCALE_N_BINS - 1:
        return np.inf
    return 10.0 ** (schema.SCALE_LOG10_MIN + b / schema.SCALE_BINS_PER_DECADE)


class ScaleAccumulator:
    """Running count, min, max, max |x|, sum, sum of squares and |x| histogram of each view of one method."""

    def __init__(self, views: list[str], summary: np.ndarray | None = None, hist: np.ndarray | None = None):
        self.views = list(views)
        k = len(self.views)
        self.summary = _empty_summary(k) if summary is None else np.array(summary, dtype=np.float64)
        self.hist = np.zeros((k, schema.SCALE_N_BINS), np.int64) if hist is None else np.array(hist, dtype=np.int64)

    def add(self, view: int, values: np.ndarray) -> None:
        x = np.asarray(values, dtype=np.float64).ravel()
        x = x[np.isfinite(x)]
        if not x.size:
            return
        s = self.summary[view]
        s[_F["count"]] += x.size
        s[_F["min"]] = min(s[_F["min"]], x.min())
        s[_F["max"]] = max(s[_F["max"]], x.max())
        s[_F["max_abs"]] = max(s[_F["max_abs"]], np.abs(x).max())
        s[_F["sum"]] += x.sum()
        s[_F["sum_sq"]] += np.dot(x, x)
        self.hist[view] += np.bincount(hist_bins(x), minlength=schema.SCALE_N_BINS)

    def add_example(self, layout: dict, result: dict) -> None:
        """One example's arrays as the writer stores them (scores [n], layer_scores [V, n], matrices [L, r, n])."""
        self.add(0, result["scores"])
        v = int(layout.get("n_layer_views") or 0)
        for i in range(v):
            self.add(1 + i, result["layer_scores"][i])
        if layout.get("matrices", "none") != "none":
            for i in range(int(layout["n_matrix_layers"])):
                self.add(1 + v + i, result["matrices"][i])

    def stats(self) -> dict[str, "ViewScale"]:
        return {name: ViewScale.from_arrays(self.summary[i], self.hist[i]) for i, name in enumerate(self.views)}


@dataclass(frozen=True)
class ViewScale:
    """The scale of one view over a store."""

    count: int
    min: float
    max: float
    max_abs: float
    mean: float
    std: float
    hist: np.ndarray  # [SCALE_N_BINS] counts of |x|

    @classmethod
    def from_arrays(cls, summary: np.ndarray, hist: np.ndarray) -> "ViewScale":
        s = dict(zip(schema.SCALE_SUMMARY_FIELDS, (float(v) for v in summary)))
        n = int(s["count"])
        mean = s["sum"] / n if n else float("nan")
        var = max(s["sum_sq"] / n - mean * mean, 0.0) if n else float("nan")
        return cls(n, s["min"] if n else float("nan"), s["max"] if n else float("nan"),
                   s["max_abs"] if n else float("nan"), mean, float(np.sqrt(var)), np.asarray(hist, dtype=np.int64))

    def quantile_abs(self, q: float) -> float:
        """An upper bound of the q-quantile of |x| (the upper edge of its histogram bin, at most max |x|)."""
        if not self.count:
            return float("nan")
        cum = np.cumsum(self.hist)
        b = int(np.searchsorted(cum, q * cum[-1], side="left"))
        return float(min(bin_upper_edge(b), self.max_abs))
