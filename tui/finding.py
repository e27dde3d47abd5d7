"""Finding examples in a store of any size: sort keys, filters and text search (numpy and the store API only).

Every pass over the store reads it in chunks of CHUNK examples (bounded memory), reports ``progress(done, total)``
and checks ``cancel`` (a threading.Event) between chunks, raising :class:`Cancelled`; the app runs them on workers.
Results are arrays over store rows, so a sort or filter is an ``order`` array the example list shows
(:meth:`tui.widgets.example_list.ExampleList.set_order`). Sorts are stable and put undefined values (NaN) last.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

CHUNK = 8192


class Cancelled(Exception):
    """The user cancelled a pass over the store."""


def _chunks(n: int, progress, cancel):
    for lo in range(0, n, CHUNK):
        if cancel is not None and cancel.is_set():
            raise Cancelled
        yield lo, min(lo + CHUNK, n)
        if progress is not None:
            progress(min(lo + CHUNK, n), n)


# ---------------------------------------------------------------- columns of the index
COLUMNS = ("label", "pred", "correct", "length", "truncated")


def index_columns(store, progress=None, cancel: threading.Event | None = None) -> dict[str, np.ndarray]:
    """label, pred, correct (1 right, 0 wrong, NaN unlabelled), length (tokens) and truncated of every example."""
    n = len(store)
    label = np.empty(n, np.int64)
    pred = np.empty(n, np.int64)
    length = np.empty(n, np.int64)
    flags = np.empty(n, np.int64)
    for lo, hi in _chunks(n, progress, cancel):
        rows = store.index_rows(lo, hi)
        label[lo:hi], pred[lo:hi] = rows["label"], rows["pred"]
        length[lo:hi], flags[lo:hi] = rows["n_tokens"], rows["flags"]
    correct = np.where(label < 0, np.nan, (label == pred).astype(np.float64))
    return {"label": label, "pred": pred, "correct": correct, "length": length, "truncated": (flags & 1) > 0}


# ---------------------------------------------------------------- disagreement of two methods
def grouped_spearman(a: np.ndarray, b: np.ndarray, n: np.ndarray, skip: np.ndarray | None = None) -> np.ndarray:
    """Spearman's rho of a and b within each group of consecutive lengths ``n`` (ties averaged), vectorised over the
    groups; ``skip[g]`` leaves one position of group g out (the explained token). NaN for groups with fewer than two
    values or a constant side."""
    n = np.asarray(n, np.int64)
    g = np.repeat(np.arange(len(n)), n)
    pos = np.arange(len(g)) - np.repeat(np.cumsum(n) - n, n)
    keep = np.ones(len(g), bool) if skip is None else pos != np.repeat(np.asarray(skip), n)
    a = np.nan_to_num(np.asarray(a, np.float64)[keep])
    b = np.nan_to_num(np.asarray(b, np.float64)[keep])
    g = g[keep]
    m = np.bincount(g, minlength=len(n)).astype(np.float64)
    ra, rb = _grouped_ranks(a, g), _grouped_ranks(b, g)
    mean = (m + 1) / 2  # the mean rank of every group
    da, db = ra - mean[g], rb - mean[g]
    cov = np.bincount(g, da * db, minlength=len(n))
    va = np.bincount(g, da * da, minlength=len(n))
    vb = np.bincount(g, db * db, minlength=len(n))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = cov / np.sqrt(va * vb)
    rho[(m < 2) | (va <= 0) | (vb <= 0)] = np.nan
    return rho


def _grouped_ranks(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Ranks 1..m of x within each group (ties get their mean rank)."""
    order = np.lexsort((x, g))
    xs, gs = x[order], g[order]
    new_run = np.r_[True, (xs[1:] != xs[:-1]) | (gs[1:] != gs[:-1])]
    new_group = np.r_[True, gs[1:] != gs[:-1]]
    idx = np.arange(len(x))
    group_start = np.maximum.accumulate(np.where(new_group, idx, 0))
    run_id = np.cumsum(new_run) - 1
    run_first = idx[new_run]
    run_last = np.r_[run_first[1:], len(x)] - 1
    rank_sorted = (run_first + run_last)[run_id] / 2.0 - group_start + 1
    out = np.empty(len(x))
    out[order] = rank_sorted
    return out


def disagreement(store, a: str, b: str, progress=None, cancel: threading.Event | None = None,
                 step: int | None = None) -> np.ndarray:
    """1 - Spearman's rho of two methods' final scores, per example (the explained token left out); NaN where the
    correlation is undefined. A generation store's at generated token ``step`` (an example's last one where it has
    fewer; NaN without any), over the tokens before it."""
    n = len(store)
    out = np.empty(n)
    if getattr(store, "generation", False):
        for lo, hi in _chunks(n, progress, cancel):
            rows = []
            for i in range(lo, hi):
                ex = store[i]
                t = min(step or 0, ex.n_steps - 1)
                rows.append((ex.step_scores(a)[t], ex.step_scores(b)[t], ex.step_position(t)) if t >= 0 else None)
            width = np.array([r[2] if r else 0 for r in rows], np.int64)
            cut = [(r[0][:r[2]], r[1][:r[2]]) if r else (np.zeros(0), np.zeros(0)) for r in rows]
            a_rows, b_rows = np.concatenate([x for x, _ in cut]), np.concatenate([y for _, y in cut])
            out[lo:hi] = 1.0 - grouped_spearman(a_rows, b_rows, width, np.full(len(rows), -1))
        return out
    for lo, hi in _chunks(n, progress, cancel):
        rows = store.index_rows(lo, hi)
        out[lo:hi] = 1.0 - grouped_spearman(store.scores_range(a, lo, hi), store.scores_range(b, lo, hi),
                                            rows["n_tokens"], rows["explain_pos"])
    return out


# ---------------------------------------------------------------- text search
def text_matches(store, query: str, progress=None, cancel: threading.Event | None = None) -> np.ndarray:
    """Store rows whose text (or pair text) contains ``query``, case-insensitively, in store order. A generation
    store's text is its prompt followed by its continuation (drawn as one text)."""
    q = query.casefold()
    hits = []
    generation = getattr(store, "generation", False)
    for lo, hi in _chunks(len(store), progress, cancel):
        texts = store.texts_range(lo, hi)
        if generation:
            texts = [t + c for t, c in zip(texts, store.continuations_range(lo, hi))]
        found = [q in t.casefold() for t in texts]
        if bool((store.index_rows(lo, hi)["pair_len"] > 0).any()):
            found = [f or q in (p or "").casefold() for f, p in zip(found, store.pairs_range(lo, hi))]
        hits.extend(lo + k for k, f in enumerate(found) if f)
    return np.asarray(hits, dtype=np.int64)


# ---------------------------------------------------------------- sort and filter
@dataclass(frozen=True)
class Filter:
    """Which examples a view keeps (None: no condition)."""

    label: int | None = None
    pred: int | None = None
    correct: bool | None = None
    length: tuple[int, int] | None = None  # inclusive token counts
    truncated: bool | None = None

    def describe(self, labels: dict[int, str]) -> str:
        parts = []
        if self.label is not None:
            parts.append(f"label {labels.get(self.label, self.label)}")
        if self.pred is not None:
            parts.append(f"pred {labels.get(self.pred, self.pred)}")
        if self.correct is not None:
            parts.append("correct" if self.correct else "wrong")
        if self.length is not None:
            parts.append(f"length {self.length[0]}-{self.length[1]}")
        if self.truncated is not None:
            parts.append("truncated" if self.truncated else "not truncated")
        return ", ".join(parts)

    def mask(self, cols: dict[str, np.ndarray]) -> np.ndarray:
        keep = np.ones(len(cols["label"]), bool)
        if self.label is not None:
            keep &= cols["label"] == self.label
        if self.pred is not None:
            keep &= cols["pred"] == self.pred
        if self.correct is not None:
            keep &= cols["correct"] == (1.0 if self.correct else 0.0)
        if self.length is not None:
            keep &= (cols["length"] >= self.length[0]) & (cols["length"] <= self.length[1])
        if self.truncated is not None:
            keep &= cols["truncated"] == self.truncated
        return keep


def order(key: np.ndarray | None, keep: np.ndarray | None, descending: bool = False) -> np.ndarray:
    """Store rows sorted by ``key`` (stable; NaN last either way) among those ``keep`` selects."""
    n = len(key) if key is not None else len(keep)
    rows = np.arange(n) if keep is None else np.flatnonzero(keep)
    if key is None:
        return rows
    k = np.asarray(key, np.float64)[rows]
    nan = np.isnan(k)
    k = np.where(nan, 0.0, -k if descending else k)
    return rows[np.lexsort((k, nan))]


def parse_length(text: str) -> tuple[int, int]:
    """'10-40', '10-', '-40' or '25' as an inclusive (low, high) token range; ValueError with a reason otherwise."""
    t = text.strip().replace(" ", "")
    if not t:
        raise ValueError("give a length range such as 10-40")
    if "-" in t:
        lo_s, hi_s = t.split("-", 1)
        lo = int(lo_s) if lo_s else 0
        hi = int(hi_s) if hi_s else 1 << 30
    else:
        lo = hi = int(t)
    if lo < 0 or hi < lo:
        raise ValueError(f"'{text}' is not a range of lengths (low-high, low <= high)")
    return lo, hi


class Cache:
    """Results of passes over one store, kept per (store size, question): asking again is instant."""

    def __init__(self):
        self._d: dict = {}

    def get(self, n: int, key):
        return self._d.get((n, key))

    def put(self, n: int, key, value) -> None:
        self._d = {k: v for k, v in self._d.items() if k[0] == n}  # a grown store invalidates the rest
        self._d[(n, key)] = value
