"""Scale statistics of a method's views over a whole store (for "global" colour normalisation in the TUI).

The writer accumulates them while it appends and stores them when the store is complete
(/methods/<m>/scale); for a store without them (older, still being written, or killed) the reader accumulates them
once on request, incrementally as the store grows. One accumulator serves both, so the numbers are the same.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from . import schema

_F = {name: i for i, name in enumerate(schema.SCALE_SUMMARY_FIELDS)}


def _empty_summary(k: int) -> np.ndarray:
    s = np.zeros((k, len(schema.SCALE_SUMMARY_FIELDS)))
    s[:, _F["min"]], s[:, _F["max"]] = np.inf, -np.inf
    return s


def hist_bins(values: np.ndarray) -> np.ndarray:
    """The histogram bin of every |x| (bin 0: below 10**SCALE_LOG10_MIN, zeros and NaN included).

    The bins are those of ``_bins_by_formula`` (floor of 8 log10|x|, counted from 1e-12), looked up instead of
    computed: a float64's top 16 bits (sign cleared) name a range of |x| of width at most 1/16 of its lower end, and a
    bin is 10**(1/8) wide, so each range holds at most one bin edge; ``_bin_tables`` finds it with the formula itself
    (tests/test_store.py checks every float16, every float32 near an edge and the edges' float64 neighbourhoods)."""
    x = np.asarray(values, dtype=np.float64)
    bits = np.ascontiguousarray(x).reshape(-1).view(np.int64)
    out = np.empty(bits.size, np.int64)
    for i in range(0, bits.size, _CHUNK):
        _lookup(bits[i:i + _CHUNK], out[i:i + _CHUNK])
    return out.reshape(x.shape)


def _hist_row(values: np.ndarray) -> np.ndarray:
    """[SCALE_N_BINS] counts of the bins of ``values`` (one row of float64, finite or not)."""
    bits = np.ascontiguousarray(values).view(np.int64)
    counts = np.zeros(schema.SCALE_N_BINS, np.int64)
    out = np.empty(min(bits.size, _CHUNK), np.int64)
    for i in range(0, bits.size, _CHUNK):
        part = bits[i:i + _CHUNK]
        counts += np.bincount(_lookup(part, out[:part.size]), minlength=schema.SCALE_N_BINS)
    return counts


def _lookup(bits: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The bins of float64 values given as their int64 bits, into ``out`` (a chunk at a time: its temporaries stay in
    the cache)."""
    edge, table = _bin_tables()
    u = np.bitwise_and(bits, _ABS_BITS)  # the bits of |x|, ordered as |x| is (NaN's above inf's)
    top = u >> _LOW_BITS
    above = u >= edge[top]
    np.left_shift(top, 1, out=top)
    top += above
    return np.take(table, top, out=out)


_CHUNK = 1 << 15
_ABS_BITS = 0x7FFF_FFFF_FFFF_FFFF
_LOW_BITS = 48


def _bins_by_formula(values: np.ndarray) -> np.ndarray:
    """The histogram's definition, evaluated per value (``hist_bins`` looks its results up)."""
    a = np.abs(np.asarray(values, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        pos = (np.log10(a) - schema.SCALE_LOG10_MIN) * schema.SCALE_BINS_PER_DECADE
    pos = np.nan_to_num(pos, nan=-1.0, neginf=-1.0, posinf=float(schema.SCALE_N_BINS))
    return np.clip(np.floor(pos).astype(np.int64) + 1, 0, schema.SCALE_N_BINS - 1)


@functools.cache
def _bin_tables() -> tuple[np.ndarray, np.ndarray]:
    """Per range of |x| (its float64 bits >> 48): the bits where its bin changes (none: its last), and
    the bins below and from there, interleaved. The edge is found by bisection on the bits with the formula; inside a
    range the formula steps once at most (from a bin to the next, or from inf's bin to NaN's)."""
    first = np.arange(1 << 15, dtype=np.int64) << _LOW_BITS
    last = first | ((1 << _LOW_BITS) - 1)
    below, above = _bins_by_formula(first.view(np.float64)), _bins_by_formula(last.view(np.float64))
    edge = last.copy()  # no step: where the range's bin changes does not matter
    steps = np.flatnonzero(below != above)
    lo, hi = first[steps], last[steps]  # the edge lies in (lo, hi]
    while (lo + 1 < hi).any():
        mid = lo + (hi - lo) // 2
        moved = _bins_by_formula(mid.view(np.float64)) != below[steps]
        hi, lo = np.where(moved, mid, hi), np.where(moved, lo, mid)
    edge[steps] = hi
    return edge, np.stack([below, above], axis=1).ravel()


def bin_upper_edge(b: int) -> float:
    """Upper bound of |x| in histogram bin ``b``."""
    if b >= schema.SCALE_N_BINS - 1:
        return np.inf
    return 10.0 ** (schema.SCALE_LOG10_MIN + b / schema.SCALE_BINS_PER_DECADE)


def view_keys(layout: dict) -> list[tuple[str, int]]:
    """The arrays a method's views come from, in view order, with the rows (views) each holds per example (a
    generation store's per step: its valid cells only count, the NaN after each step's position are left out)."""
    steps = bool(layout.get("steps"))
    keys = [(schema.STEP_SCORES if steps else "scores", 1)]
    v = int(layout.get("n_layer_views") or 0)
    if v:
        keys.append((schema.STEP_LAYER_SCORES if steps else "layer_scores", v))
    if layout.get("matrices", "none") != "none":
        keys.append(("matrices", int(layout["n_matrix_layers"])))
    return keys


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
        low, high = x.min(axis=1), x.max(axis=1)  # NaN propagates: finite bounds mean finite values
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            self._add_views_with_nonfinite(first, x, sizes)
            return
        s = self.summary[first:first + k]
        s[:, _F["count"]] += total
        s[:, _F["min"]] = np.minimum(s[:, _F["min"]], low)
        s[:, _F["max"]] = np.maximum(s[:, _F["max"]], high)
        s[:, _F["max_abs"]] = np.maximum(s[:, _F["max_abs"]], np.abs(np.maximum(high, -low)))  # max |x|, as +0.0
        self._add_sums(s, x, x * x, sizes)
        for row in range(k):
            self.hist[first + row] += _hist_row(x[row])

    def _add_views_with_nonfinite(self, first: int, x: np.ndarray, sizes: np.ndarray) -> None:
        k = x.shape[0]
        finite = np.isfinite(x)
        s = self.summary[first:first + k]
        s[:, _F["count"]] += finite.sum(axis=1)
        a = np.abs(x)
        # non-finite values lower no minimum, raise no maximum
        low, high, high_abs = np.where(finite, x, np.inf), np.where(finite, x, -np.inf), np.where(finite, a, -np.inf)
        s[:, _F["min"]] = np.minimum(s[:, _F["min"]], low.min(axis=1))
        s[:, _F["max"]] = np.maximum(s[:, _F["max"]], high.max(axis=1))
        s[:, _F["max_abs"]] = np.maximum(s[:, _F["max_abs"]], high_abs.max(axis=1))
        z = np.where(finite, x, 0.0)  # adding 0.0 leaves a running sum as it was
        self._add_sums(s, z, z * z, sizes)
        bins = hist_bins(a) + (np.arange(k) * schema.SCALE_N_BINS)[:, None]
        self.hist[first:first + k] += np.bincount(bins[finite], minlength=k * schema.SCALE_N_BINS).reshape(k, -1)

    @staticmethod
    def _add_sums(s: np.ndarray, z: np.ndarray, squares: np.ndarray, sizes: np.ndarray) -> None:
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        # reduceat over the examples with values only: it gives an empty segment its next value, and one that starts
        # at the end (a last example without values) is out of bounds; the empty ones add 0.0
        full = sizes > 0
        for field, term in (("sum", z), ("sum_sq", squares)):
            per_example = np.zeros((term.shape[0], sizes.size))
            per_example[:, full] = np.add.reduceat(term, starts[full], axis=1)
            # a sequential scan from the running total: the same additions in the same order however batched
            s[:, _F[field]] = np.cumsum(np.concatenate([s[:, _F[field]][:, None], per_example], axis=1), axis=1)[:, -1]

    def add_example(self, layout: dict, result: dict) -> None:
        """One example's arrays as the writer stores them (scores [n], layer_scores [V, n], matrices [L, r, n])."""
        self.add_batch(layout, {key: [value] for key, value in result.items() if value is not None})

    def add_batch(self, layout: dict, results: dict[str, list[np.ndarray]], dtypes: dict | None = None) -> None:
        """Several examples' arrays at once, per key a list with one array per example, as ``add_example`` takes
        them: each view's values of all of them in one vectorised pass. ``dtypes``: per key the dtype the values are
        stored in (they are counted as readers will read them, e.g. matrices rounded to float16)."""
        views = {}
        for key, rows in view_keys(layout):
            arrays = results[key]
            sizes = np.fromiter(map(np.size, arrays), dtype=np.int64, count=len(arrays)) // rows
            if key == "matrices" and layout["matrices"] == "all":  # [L, n, n]: each example's n * n per layer
                x = np.concatenate([np.reshape(a, (rows, -1)) for a in arrays], axis=1)
            elif key in (schema.STEP_SCORES, schema.STEP_LAYER_SCORES):  # [T, n], [T, V, n]: each example's T * n
                x = np.concatenate([np.moveaxis(np.reshape(a, (-1, rows, np.shape(a)[-1])), 1, 0).reshape(rows, -1)
                                    for a in arrays], axis=1)
            else:  # [n], [V, n], [L, 1, n]: side by side along the last axis at once
                x = np.concatenate(arrays, axis=-1).reshape(rows, -1)
            if dtypes and key in dtypes:
                x = x.astype(dtypes[key], copy=False)
            views[key] = (x, sizes)
        self.add_joined(layout, views)

    def add_joined(self, layout: dict, views: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """Per key of ``view_keys(layout)`` the examples' values joined per view, [rows, total], with each example's
        count per row (the writer has them so already)."""
        first = 0
        for key, rows in view_keys(layout):
            self.add_views(first, *views[key])
            first += rows

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
