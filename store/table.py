"""Tabular views of a store for the tools researchers analyse with (pandas, Arrow, CSV), as plain numpy columns.

``token_columns``: one row per example x token x method (long format), ordered example -> method -> position (a
generation store: one per example x step x method x position before the step's token, ordered example -> step ->
method -> position, with the step and its target token beside the position), read a range of examples at a time
with one contiguous slice per dataset, so a whole store streams through in bounded
memory and the rows of consecutive ranges concatenate to the rows of their union. ``metric_columns``: one row per
example x method with a column per metric, ordered example -> method (a generation store: per example its mean and
then each step, with the step and its target, ordered example -> step -> method), by ranges too. pandas is only
imported by ``Store.to_pandas``; ``compute/export.py`` writes these chunks to Parquet / CSV.
"""

from __future__ import annotations

import numpy as np

from . import schema

# The token table's fixed columns, in order; with layers, layer_1..layer_V follow.
TOKEN_COLUMNS = ("example", "id", "position", "token", "label", "pred", "method", "score")
STEP_TOKEN_COLUMNS = ("example", "id", "step", "target", "position", "token", "label", "pred", "method", "score")
# The metric table's fixed columns; one column per metric follows.
METRIC_COLUMNS = ("example", "id", "method")
STEP_METRIC_COLUMNS = ("example", "id", "step", "target", "method")  # a generation store's: step -1 is the mean


def _token_strings(store, t0: int, t1: int) -> np.ndarray:
    off = store._read(schema.TOKEN_STR_OFF, slice(t0, t1), t1 - t0)
    lens = store._read(schema.TOKEN_STR_LEN, slice(t0, t1), t1 - t0)
    if t1 == t0:
        return np.zeros(0, dtype=object)
    lo, hi = int(off[0]), int(off[-1]) + int(lens[-1])
    blob = bytes(store._read(schema.TOKEN_STRINGS, slice(lo, hi), hi - lo))
    return np.array([blob[o - lo:o - lo + n].decode("utf-8") for o, n in zip(off.tolist(), lens.tolist())],
                    dtype=object)


def n_layer_columns(store, methods: list[str]) -> int:
    """V of the layer_1..layer_V columns: the most layer views any of ``methods`` has."""
    return max((int(store._method_layouts[m]["n_layer_views"]) for m in methods), default=0)


def token_columns(store, methods: list[str], layers: bool, lo: int, hi: int) -> dict[str, np.ndarray]:
    """Columns example, id, position, token, label (-1 none), pred, method, score, and with ``layers`` layer_1..
    layer_V (NaN for methods without that view) for the examples [lo, hi), ordered example -> method -> position.
    Column dtypes do not depend on the range (an empty range gives empty columns of the same dtypes)."""
    for m in methods:
        store._need_method(m)
    if store.generation:
        return step_token_columns(store, methods, layers, lo, hi)
    rows = store.index_rows(lo, hi)
    n = rows["n_tokens"].astype(np.int64)
    E, M = len(rows), len(methods)
    start = np.cumsum(n) - n  # each example's first token within the range (the index rows are contiguous)
    t0 = int(rows["tok_off"][0]) if E else 0
    T = int(n.sum())
    t1 = t0 + T
    # Row r of example e (rows M * start[e] ... M * (start[e] + n[e]) - 1) is method r // n[e], position r % n[e].
    ex = np.repeat(np.arange(E), M * n)
    within = np.arange(M * T) - np.repeat(M * start, M * n)
    method_of, position = np.divmod(within, n[ex])
    tok = start[ex] + position  # the row's token within the range
    scores = np.zeros((M, T), dtype=np.float32)
    for j, m in enumerate(methods):
        scores[j] = store._read(schema.method_path(m, "scores"), slice(t0, t1), T)
    cols = {
        "example": (lo + ex).astype(np.int64),
        "id": np.array(store.ids_range(lo, lo + E), dtype=object)[ex],
        "position": position.astype(np.int64),
        "token": _token_strings(store, t0, t1)[tok],
        "label": rows["label"][ex].astype(np.int32),
        "pred": rows["pred"][ex].astype(np.int32),
        "method": np.array(methods, dtype=object)[method_of],
        "score": scores[method_of, tok],
    }
    V = n_layer_columns(store, methods) if layers else 0
    if V:
        views = np.full((M, V, T), np.nan, dtype=np.float32)
        token_position = np.arange(T) - np.repeat(start, n)
        for j, m in enumerate(methods):
            v_m = int(store._method_layouts[m]["n_layer_views"])
            if not v_m:
                continue
            flat = store._read(schema.method_path(m, "layer_scores"), slice(t0 * v_m, t1 * v_m), T * v_m)
            # per example a [v_m, n] block: view v of the token at p is at block start + v * n + p
            block = np.repeat(start * v_m, n) + token_position
            n_tok = np.repeat(n, n)
            for v in range(v_m):
                views[j, v] = flat[block + v * n_tok]
        for v in range(V):
            cols[f"layer_{v + 1}"] = views[method_of, v, tok]
    return cols


def step_token_columns(store, methods: list[str], layers: bool, lo: int, hi: int) -> dict[str, np.ndarray]:
    """A generation store's token table (STEP_TOKEN_COLUMNS, and with ``layers`` layer_1..layer_V) for the examples
    [lo, hi): per example and step t each method's attribution over the positions 0 .. prompt_len + t - 1, ordered
    example -> step -> method -> position; ``target`` is the step's generated token."""
    rows = store.index_rows(lo, hi)
    n, P, T = (rows[k].astype(np.int64) for k in ("n_tokens", "prompt_len", "n_steps"))
    E, M = len(rows), len(methods)
    tok_start = np.cumsum(n) - n  # each example's first token, cell and step within the range
    grid_start = np.cumsum(T * n) - T * n
    t0 = int(rows["tok_off"][0]) if E else 0
    t1 = t0 + int(n.sum())
    g0 = int(rows["grid_off"][0]) if E else 0
    G = int((T * n).sum())
    # One unit per example and step: its sources are the first P + t tokens, M of them (one per method) in a row.
    ex_of = np.repeat(np.arange(E), T)  # the unit's example
    step = np.arange(len(ex_of)) - np.repeat(np.cumsum(T) - T, T)
    width = P[ex_of] + step
    unit = np.repeat(np.arange(len(ex_of)), M * width)
    within = np.arange(int(M * width.sum())) - np.repeat(M * (np.cumsum(width) - width), M * width)
    method_of, position = np.divmod(within, width[unit])
    ex, t = ex_of[unit], step[unit]
    cell = grid_start[ex] + t * n[ex] + position  # the row's cell in its example's [T, n] block, within the range
    strings = _token_strings(store, t0, t1)
    cols = {
        "example": (lo + ex).astype(np.int64),
        "id": np.array(store.ids_range(lo, lo + E), dtype=object)[ex],
        "step": t.astype(np.int64),
        "target": strings[tok_start[ex] + P[ex] + t],
        "position": position.astype(np.int64),
        "token": strings[tok_start[ex] + position],
        "label": rows["label"][ex].astype(np.int32),
        "pred": rows["pred"][ex].astype(np.int32),
        "method": np.array(methods, dtype=object)[method_of],
    }
    scores = np.zeros((M, G), dtype=np.float32)
    for j, m in enumerate(methods):
        scores[j] = _grid_run(store, m, schema.STEP_SCORES, 1, g0, G, lo, T * n)
    cols["score"] = scores[method_of, cell]
    V = n_layer_columns(store, methods) if layers else 0
    if V:
        views = np.full((M, V, G), np.nan, dtype=np.float32)
        for j, m in enumerate(methods):
            v_m = int(store._method_layouts[m]["n_layer_views"])
            if v_m:  # per example a [T, v_m, n] block: to [v_m, cells]
                flat = _grid_run(store, m, schema.STEP_LAYER_SCORES, v_m, g0, G, lo, T * n)
                block = np.repeat(grid_start * v_m, T * n)
                cell_t, cell_p = np.divmod(np.arange(G) - np.repeat(grid_start, T * n), np.repeat(n, T * n))
                for v in range(v_m):
                    views[j, v] = flat[block + (cell_t * v_m + v) * np.repeat(n, T * n) + cell_p]
        for v in range(V):
            cols[f"layer_{v + 1}"] = views[method_of, v, cell]
    return cols


def _grid_run(store, method: str, key: str, views: int, g0: int, G: int, lo: int, cells: np.ndarray) -> np.ndarray:
    """The [T, (V,) n] blocks of method ``method``'s ``key`` of the examples from ``lo`` (``cells`` = T * n each),
    one read, checked against their digests."""
    path = schema.method_path(method, key)
    out = store._read(path, slice(g0 * views, (g0 + G) * views), G * views)
    store.check_digests(path, lo, cells * views, out)
    return out


def metric_names(store, methods: list[str]) -> list[str]:
    """The metric columns of ``methods``: every metric any of them has, in the order they first appear."""
    return list(dict.fromkeys(n for m in methods for n in store.metric_names(m)))


def metric_columns(store, methods: list[str] | None = None, lo: int = 0, hi: int | None = None
                   ) -> dict[str, np.ndarray]:
    """Columns example, id, method and one per metric (float32, NaN where a method lacks it) for the examples
    [lo, hi): one row per example x method, ordered example -> method. ``methods`` without metrics are left out."""
    methods = [m for m in (methods or store.metric_methods) if m in store.metric_methods]
    names = metric_names(store, methods)
    hi = len(store) if hi is None else min(hi, len(store))
    lo = max(0, min(lo, hi))
    E, M = hi - lo, len(methods)
    values = np.full((len(names), E, M), np.nan, dtype=np.float32)
    for j, m in enumerate(methods):
        for name in store.metric_names(m):
            values[names.index(name), :, j] = store.metric_values(m, name, lo, hi)
    if store.generation:
        return step_metric_columns(store, methods, names, values, lo, hi)
    cols = {"example": np.repeat(np.arange(lo, hi, dtype=np.int64), M),
            "id": np.repeat(np.array(store.ids_range(lo, hi), dtype=object), M),
            "method": np.tile(np.array(methods, dtype=object), E)}
    cols.update({name: values[k].reshape(-1) for k, name in enumerate(names)})
    return cols


def step_metric_columns(store, methods: list[str], names: list[str], means: np.ndarray, lo: int, hi: int
                        ) -> dict[str, np.ndarray]:
    """A generation store's metric table (STEP_METRIC_COLUMNS, then a column per metric) for the examples [lo, hi):
    per example its mean row (step -1, target "") and then a row per step t (its generated token as target), each
    with a row per method, ordered example -> step -> method. ``means`` [metrics, E, M] are the per-example values;
    a step row's value is the record's value at that step (NaN where the record keeps none: before format 2.1)."""
    rows = store.index_rows(lo, hi)
    T = rows["n_steps"].astype(np.int64)
    E, M = len(rows), len(methods)
    U = E + int(T.sum())  # units: each example's mean, then its steps
    ex_of = np.repeat(np.arange(E), T + 1)
    step = np.arange(U) - np.repeat(np.cumsum(T + 1) - (T + 1), T + 1) - 1
    at = np.flatnonzero(step >= 0)  # the step units, in step order: the records' step runs of the range
    values = np.full((len(names), U, M), np.nan, dtype=np.float32)
    values[:, step < 0] = means
    for j, m in enumerate(methods):
        for name in store.metric_names(m):
            steps = store.metric_steps(m, name, lo, hi)
            if steps is not None:
                values[names.index(name), at, j] = steps
    targets = np.full(U, "", dtype=object)
    if len(at):
        n, P = rows["n_tokens"].astype(np.int64), rows["prompt_len"].astype(np.int64)
        t0 = int(rows["tok_off"][0])
        strings = _token_strings(store, t0, t0 + int(n.sum()))
        targets[at] = strings[(np.cumsum(n) - n + P)[ex_of[at]] + step[at]]
    cols = dict(zip(STEP_METRIC_COLUMNS, (np.repeat(lo + ex_of, M).astype(np.int64),
                                          np.repeat(np.array(store.ids_range(lo, hi), dtype=object)[ex_of], M),
                                          np.repeat(step, M).astype(np.int64), np.repeat(targets, M),
                                          np.tile(np.array(methods, dtype=object), U))))
    cols.update({name: values[k].reshape(-1) for k, name in enumerate(names)})
    return cols
