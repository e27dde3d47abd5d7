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
        self.add_views(view, np.ravel(values)[None])

    def add_views(self, first: int, values: np.ndarray, sizes: np.ndarray | None = None) -> None:
        """Values of the views ``first``, ``first + 1``, ... at once: row k of ``values`` [K, N] belongs to view
        ``first + k``; its columns are the examples' values one after the other, ``sizes`` of them each (None: one
        example). Non-finite values are left out. The sums are each example's sum added in example order, so the
        statistics do not depend on how examples were batched (a merged store's equal a single run's, bit for bit)."""
        x = np.asarray(values, dtype=np.float64)
        k, total = x.shape
        if not total:
            return
        sizes = np.asarray([total] if sizes is None else sizes, dtype=np.int64)
        finite = np.isfinite(x)
        clean = finite.all()
        s = self.summary[first:first + k]
        s[:, _F["count"]] += finite.sum(axis=1)
        a = np.abs(x)
        low, high, high_abs = (x, x, a) if clean else (  # non-finite values lower no minimum, raise no maximum
            np.where(finite, x, np.inf), np.where(finite, x, -np.inf), np.where(finite, a, -np.inf))
        s[:, _F["min"]] = np.minimum(s[:, _F["min"]], low.min(axis=1))
        s[:, _F["max"]] = np.maximum(s[:, _F["max"]], high.max(axis=1))
        s[:, _F["max_abs"]] = np.maximum(s[:, _F["max_abs"]], high_abs.max(axis=1))
        z = x if clean else np.where(finite, x, 0.0)  # adding 0.0 leaves a running sum as it was
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        for field, term in (("sum", z), ("sum_sq", z * z)):
            per_example = np.add.reduceat(term, starts, axis=1)
            per_example[:, sizes == 0] = 0.0  # reduceat gives an empty segment its next value
            # a sequential scan from the running total: the same additions in the same order however batched
            s[:, _F[field]] = np.cumsum(np.concatenate([s[:, _F[field]][:, None], per_example], axis=1), axis=1)[:, -1]
        bins = hist_bins(a) + (np.arange(k) * schema.SCALE_N_BINS)[:, None]
        if not clean:
            bins = bins[finite]
        self.hist[first:first + k] += np.bincount(bins.ravel(), minlength=k * schema.SCALE_N_BINS).reshape(k, -1)

    def add_example(self, layout: dict, result: dict) -> None:
        """One example's arrays as the writer stores them (scores [n], layer_scores [V, n], matrices [L, r, n])."""
        self.add_batch(layout, {key: [value] for key, value in result.items() if value is not None})

    def add_batch(self, layout: dict, results: dict[str, list[np.ndarray]], dtypes: dict | None = None) -> None:
        """Several examples' arrays at once, per key a list with one array per example, as ``add_example`` takes
        them: each view's values of all of them in one vectorised pass. ``dtypes``: per key the dtype the values are
        stored in (they are counted as readers will read them, e.g. matrices rounded to float16)."""
        def add(first: int, key: str, rows: int) -> None:
            arrays = results[key]
            sizes = [a.size // rows for a in arrays]
            if all(a.ndim == 1 or a.shape[-2] == 1 or a.ndim == 2 for a in arrays):  # [n], [V, n], [L, 1, n]: side
                x = np.concatenate(arrays, axis=-1).reshape(rows, -1)  # by side along the last axis at once
            else:  # [L, n, n]
                x = np.concatenate([a.reshape(rows, -1) for a in arrays], axis=1)
            if dtypes and key in dtypes:
                x = x.astype(dtypes[key], copy=False)
            self.add_views(first, x, sizes)

        add(0, "scores", 1)
        v = int(layout.get("n_layer_views") or 0)
        if v:
            add(1, "layer_scores", v)
        if layout.get("matrices", "none") != "none":
            add(1 + v, "matrices", int(layout["n_matrix_layers"]))

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
