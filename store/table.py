"""Tabular views of a store for the tools researchers analyse with (pandas, Arrow, CSV), as plain numpy columns.

``token_columns``: one row per example x token x method (long format), read a range of examples at a time with
one contiguous slice per dataset, so a whole store streams through in bounded memory. ``metric_columns``: one row
per example x method with a column per metric. pandas is only imported by ``Store.to_pandas``.
"""

from __future__ import annotations

import numpy as np

from . import schema


def _token_strings(store, t0: int, t1: int) -> np.ndarray:
    off = store._read("tokens/str_off", slice(t0, t1), t1 - t0)
    lens = store._read("tokens/str_len", slice(t0, t1), t1 - t0)
    if t1 == t0:
        return np.zeros(0, dtype=object)
    lo, hi = int(off[0]), int(off[-1]) + int(lens[-1])
    blob = bytes(store._read(schema.TOKEN_STRINGS, slice(lo, hi), hi - lo))
    return np.array([blob[o - lo:o - lo + n].decode("utf-8") for o, n in zip(off.tolist(), lens.tolist())],
                    dtype=object)


def token_columns(store, methods: list[str], layers: bool, lo: int, hi: int) -> dict[str, np.ndarray]:
    """Columns example, id, position, token, label (-1 none), pred, method, score, and with ``layers`` layer_1..
    layer_V (NaN for methods without that view) for the examples [lo, hi)."""
    rows = store.index_rows(lo, hi)
    if not len(rows):
        return {k: np.zeros(0) for k in ("example", "id", "position", "token", "label", "pred", "method", "score")}
    n = rows["n_tokens"].astype(np.int64)
    t0 = int(rows["tok_off"][0])
    t1 = int(rows["tok_off"][-1]) + int(n[-1])
    T = t1 - t0
    example = np.repeat(np.arange(lo, lo + len(rows)), n)
    position = np.arange(T) - np.repeat(rows["tok_off"] - t0, n)
    ids = np.repeat(np.array(store.ids_range(lo, lo + len(rows)), dtype=object), n)
    tokens = _token_strings(store, t0, t1)
    label, pred = np.repeat(rows["label"], n), np.repeat(rows["pred"], n)
    V = max((int(store._method_layouts[m]["n_layer_views"]) for m in methods), default=0) if layers else 0
    cols: dict[str, list] = {k: [] for k in ("example", "id", "position", "token", "label", "pred", "method", "score")}
    cols.update({f"layer_{v + 1}": [] for v in range(V)})
    for m in methods:
        store._need_method(m)
        cols["example"].append(example)
        cols["id"].append(ids)
        cols["position"].append(position)
        cols["token"].append(tokens)
        cols["label"].append(label)
        cols["pred"].append(pred)
        cols["method"].append(np.full(T, m, dtype=object))
        cols["score"].append(store._read(schema.method_path(m, "scores"), slice(t0, t1), T))
        if V:
            v_m = int(store._method_layouts[m]["n_layer_views"])
            views = np.full((V, T), np.nan, dtype=np.float32)
            if v_m:
                flat = store._read(schema.method_path(m, "layer_scores"), slice(t0 * v_m, t1 * v_m), T * v_m)
                # per example a [V, n] block: put every block's rows under layer_1..layer_V
                starts = np.repeat((rows["tok_off"] - t0) * v_m, n)
                within = position
                for v in range(v_m):
                    views[v] = flat[starts + v * np.repeat(n, n) + within]
            for v in range(V):
                cols[f"layer_{v + 1}"].append(views[v])
    return {k: np.concatenate(v) for k, v in cols.items()}


def metric_columns(store, methods: list[str] | None = None) -> dict[str, np.ndarray]:
    """Columns example, id, method and one per metric (NaN where a method lacks it): one row per example x method."""
    methods = [m for m in (methods or store.metric_methods) if m in store.metric_methods]
    names = list(dict.fromkeys(n for m in methods for n in store.metric_names(m)))
    N = len(store)
    ids = np.array(store.ids(), dtype=object)
    cols = {"example": [], "id": [], "method": [], **{n: [] for n in names}}
    for m in methods:
        cols["example"].append(np.arange(N))
        cols["id"].append(ids)
        cols["method"].append(np.full(N, m, dtype=object))
        have = set(store.metric_names(m))
        for n in names:
            cols[n].append(store.metric_values(m, n).astype(np.float64) if n in have else np.full(N, np.nan))
    if not methods:
        return {k: np.zeros(0) for k in cols}
    return {k: np.concatenate(v) for k, v in cols.items()}
