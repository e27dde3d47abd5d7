"""What the TUI reads from a store, as plain Python/numpy objects, and a small LRU of loaded examples.

Every function here touches HDF5 and must run on a worker thread, under the app's store lock.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import numpy as np

from store import Store
from store.palette import content_tokens, cut_after

from .render.heatmap import block_mean


def read_for_screen(screen, reader, loaded, failed) -> None:
    """A screen's one read of the store, as its worker's body: ``reader(store)`` under the app's lock, then
    ``loaded(*result)`` posted to the screen, or ``failed(error)`` for a damaged group (the UI stays alive)."""
    app = screen.app
    try:
        with app.store_lock:
            result = reader(app.store)
    except Exception as err:
        screen.post_message(failed(str(err)))
        return
    screen.post_message(loaded(*result))


@dataclass(frozen=True)
class MethodInfo:
    name: str
    signed: bool
    n_layer_views: int
    description: str = ""
    matrices: str = "none"  # "all" ([L, n, n]), "cls" (the explained token's row, [L, 1, n]) or "none"


@dataclass(frozen=True)
class StoreMeta:
    """The header of a store and its number of committed examples (the list reads its rows block by block)."""

    name: str  # file name only: never an absolute path on screen
    methods: tuple[MethodInfo, ...]
    labels: dict[int, str]
    n_layers: int
    model: str
    complete: bool
    n: int
    head_masks: tuple[str, ...] = ()  # names only: the heads screen reads the masks when it opens
    task: str = "classification"  # what the model is explained for (store.schema.TASKS)
    heads: str = "none"  # per-head attention kept per example (attr-compute --heads): none, cls or all

    @property
    def generation(self) -> bool:
        """A generation store (format 2.0): every example's attributions are per generated token (step)."""
        return self.task == "generate"


@dataclass(frozen=True, eq=False)
class Steps:
    """A generation example's per-step arrays (store format 2.0): step t explains the token at position
    ``prompt_len + t`` by the tokens before it (its row's later cells are NaN)."""

    prompt_len: int
    scores: dict[str, np.ndarray]  # [T, n] per method
    layer_scores: dict[str, np.ndarray | None]  # [T, V, n] per method, None without layer views
    values: dict[str, dict[str, np.ndarray]]  # per method {key: [T]}
    probs: np.ndarray  # [T] p(generated token)
    outputs: np.ndarray  # [T] the explained output of each step
    foil_tokens: np.ndarray  # [T] -1: no foil
    foil_probs: np.ndarray  # [T]
    foil_words: list  # [T] str | None
    explain_pos: int = -1  # the index row's (the row --matrices cls keeps), whatever step is shown
    # (method, metric) -> [T] the metric's value at each step (format 2.1: Example.step_metric); a metric whose
    # record keeps no per-step values is absent
    metrics: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.probs)


@dataclass(frozen=True)
class LoadedExample:
    """Everything the browse screen shows of one example: all methods' final and per-layer scores."""

    index: int
    id: str
    text: str
    pair: str | None
    tokens: list[str]
    label: int | None
    pred: int
    probs: np.ndarray
    truncated: bool
    n_orig_tokens: int
    explain_pos: int = -1  # the token whose prediction is explained ([CLS], or a decoder's last token)
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    layer_scores: dict[str, np.ndarray | None] = field(default_factory=dict)
    values: dict[str, dict[str, float]] = field(default_factory=dict)  # per-example scalars (IG's ig_delta)
    metric_values: dict[tuple[str, str], float] = field(default_factory=dict)  # (method, metric) -> this example's
    # (in a generation store its mean over its steps; step_metric_values: the shown step's, where the store keeps it)
    step_metric_values: dict[tuple[str, str], float] | None = None
    # Tasks other than classification: the store's Example.task_info (target and foil words, output, gold value,
    # qa spans), and for qa the gold answer span (first and last evidence token); None for a classifier.
    task: dict | None = None
    gold_span: tuple[int, int] | None = None
    special: np.ndarray | None = None  # [n] bool: the tokenizer's special tokens ([CLS], [SEP], <s>, ...)
    # A generation store's example: its steps, the step whose attributions scores / layer_scores / values hold (-1:
    # none, T = 0) and the first position without attributions (-1: every token has them). at_step() picks a step.
    steps: Steps | None = None
    step: int = -1
    upto: int = -1

    def at_step(self, t: int) -> "LoadedExample":
        """This example at generated token ``t`` (clamped to its steps): the views are that step's row, the explained
        token its target; an example of another store as it is."""
        s = self.steps
        if s is None:
            return self
        n = len(self.tokens)
        if not s.n:  # EOS first: the prompt without attributions
            blank = np.full(n, np.nan, np.float32)
            return replace(self, scores={m: blank for m in s.scores}, values={m: {} for m in s.scores},
                           layer_scores={m: None if v is None else np.full((v.shape[1], n), np.nan, np.float32)
                                         for m, v in s.layer_scores.items()},
                           explain_pos=-1, step=-1, upto=0, task={**(self.task or {}), "step": -1},
                           step_metric_values={k: math.nan for k in s.metrics})
        t = min(max(int(t), 0), s.n - 1)
        pos = s.prompt_len + t
        task = {"task": "generate", "step": t, "n_steps": s.n, "prompt_len": s.prompt_len,
                "target_word": self.tokens[pos], "prob": float(s.probs[t]), "output": float(s.outputs[t]),
                "foil_token": int(s.foil_tokens[t]), "foil_word": s.foil_words[t], "foil_prob": float(s.foil_probs[t])}
        return replace(self, scores={m: a[t] for m, a in s.scores.items()},
                       layer_scores={m: None if a is None else a[t] for m, a in s.layer_scores.items()},
                       values={m: {k: float(v[t]) for k, v in vals.items()} for m, vals in s.values.items()},
                       explain_pos=pos, step=t, upto=pos, task=task,
                       step_metric_values={k: float(v[t]) for k, v in s.metrics.items()})

    def cut(self, scale):
        """``scale`` (of this example's tokens) without colour where the shown step has no attribution."""
        return cut_after(scale, self.upto)

    @property
    def content(self) -> np.ndarray:
        """[n] bool: the tokens that are neither special nor the explained one (palette.SCALE_TOKENS)."""
        return content_tokens(self.special, self.explain_pos, len(self.tokens))

    @property
    def correct(self) -> bool | None:
        return None if self.label is None else self.label == self.pred

    @property
    def explained_end(self) -> int:
        """The last token of an explained qa answer span (explain_pos is its first); -1 for other tasks."""
        span = self.task.get("span") if self.task else None
        return int(span[1]) if span else -1

    def view(self, method: str, layer: int | None) -> np.ndarray:
        """Scores of one view: the method's final scores (``layer`` None) or its layer view ``layer`` (0-based)."""
        if layer is None:
            return self.scores[method]
        views = self.layer_scores.get(method)
        if views is None or not 0 <= layer < len(views):
            return self.scores[method]
        return views[layer]


@dataclass(frozen=True)
class HeadMaskInfo:
    """One head mask as the heads screen uses it: the [L, H] mask (0/1, or 0..k when combined by "sum"), its
    settings (``attrs``) and the statistics it came from (``stats``; every one optional)."""

    name: str
    mask: np.ndarray  # [L, H] int
    attrs: dict
    stats: dict[str, np.ndarray]

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.mask.shape[0]), int(self.mask.shape[1])

    @property
    def n_selected(self) -> int:
        return int((self.mask > 0).sum())

    @property
    def combined(self) -> bool:
        """A mask made from the others (Mask-LRP's union or sum of the positional and syntactic masks)."""
        return "how" in self.attrs or self.name == "mask_lrp"


#: Head masks come in this order (others after them, in store order): the sources first, then their combination.
HEAD_MASK_ORDER = ("positional", "syntactic", "mask_lrp")


def read_head_masks(store: Store) -> tuple[tuple[HeadMaskInfo, ...], list[str]]:
    """All head masks of a store, and a note for every one that could not be used (not an [L, H] array)."""
    names = list(getattr(store, "head_masks", None) or [])
    names.sort(key=lambda n: HEAD_MASK_ORDER.index(n) if n in HEAD_MASK_ORDER else len(HEAD_MASK_ORDER))
    masks, problems = [], []
    for name in names:
        hm = store.head_mask(name)
        mask = np.array(hm).view(np.ndarray)
        if mask.ndim != 2 or not mask.size:
            problems.append(f"head mask '{name}' has shape {tuple(mask.shape)}, not [layers, heads]")
            continue
        if not np.issubdtype(mask.dtype, np.integer):
            mask = np.rint(np.nan_to_num(mask.astype(np.float64))).astype(np.int64)
        stats = {str(k): np.asarray(v) for k, v in dict(getattr(hm, "stats", None) or {}).items()}
        attrs = dict(getattr(hm, "attrs", None) or {})
        masks.append(HeadMaskInfo(str(name), mask.astype(np.int64), attrs, stats))
    return tuple(masks), problems


@dataclass(frozen=True, eq=False)
class HeadAttention:
    """One example's per-head attention as the attention screen draws it: the explained token's row of every head,
    ``rows`` [L, H, n] (from either stored mode), with the tokens it runs over."""

    index: int
    id: str
    tokens: list[str]
    explain_pos: int
    rows: np.ndarray  # [L, H, n] float32


def read_head_attention(store: Store, i: int) -> HeadAttention:
    """Example ``i``'s per-head attention rows (one example's data: the work does not grow with the store)."""
    ex = store[i]
    rows = ex.head_rows()
    if rows is None:
        raise ValueError("this store keeps no per-head attention")
    return HeadAttention(i, ex.id, list(ex.tokens), ex.explain_pos, np.asarray(rows, np.float32))


@dataclass(frozen=True, eq=False)
class HeadMatrix:
    """One head's full attention matrix of one example as the head matrix screen draws it (stores made with
    ``attr-compute --heads --matrices all``): ``matrix`` [n, n] of head (``layer``, ``head``), and ``heads``
    [L, H, n, n] when every head was read (the grid of thumbnails), else None."""

    index: int
    id: str
    tokens: list[str]
    explain_pos: int
    layer: int
    head: int
    matrix: np.ndarray  # [n, n] float32
    heads: np.ndarray | None = None  # [L, H, n, n] float32


def read_head_matrix(store: Store, i: int, layer: int, head: int, every: bool = False) -> HeadMatrix:
    """Example ``i``'s matrix of head (``layer``, ``head``): that head's n x n alone, or with ``every`` all the
    example's heads (checked against its digest) for the thumbnails. One example's data either way."""
    ex = store[i]
    heads = None
    if every:
        heads = ex.heads()
        if heads is None or heads.ndim != 4:
            raise ValueError("this store keeps no full matrix per head")
        matrix = heads[layer, head]
    else:
        matrix = ex.head_matrix(layer, head)
        if matrix is None:
            raise ValueError("this store keeps no full matrix per head")
    return HeadMatrix(i, ex.id, list(ex.tokens), int(ex.explain_pos), layer, head, np.asarray(matrix, np.float32),
                      None if heads is None else np.asarray(heads, np.float32))


#: Metrics come in this order (by base name, the name before "@preset"), others after them alphabetically: the
#: ERASER pair first, then the perturbation curves, then agreement and evidence metrics.
METRIC_ORDER = ("comprehensiveness", "sufficiency", "aopc", "lodds", "accuracy", "kendall", "spearman",
                "precision_at_k", "dot_product", "average_precision", "jaccard_25", "seed_spearman")


def metric_sort_key(name: str) -> tuple:
    """Column order of a metric name: known metrics in :data:`METRIC_ORDER`, each without preset before its presets."""
    base, _, preset = name.partition("@")
    known = METRIC_ORDER.index(base) if base in METRIC_ORDER else len(METRIC_ORDER)
    return known, base, preset


@dataclass(frozen=True, eq=False)
class MetricInfo:
    """One faithfulness metric of one method: per-example values (row i = example i of the store; NaN where the
    metric is undefined), its dataset summary and settings, and (read for the metrics screen only) the mean curve
    over the examples with the mean level of each point."""

    method: str
    name: str  # as stored: may carry a preset suffix ("aopc@attcat")
    values: np.ndarray | None  # [N] float64, or None when only the summary was read (the browse screen)
    summary: dict
    settings: dict
    higher_is_better: bool
    description: str = ""
    curve: np.ndarray | None = None  # [K] mean over examples of the per-level curves (NaN: no example has it)
    curve_levels: np.ndarray | None = None  # [K] mean level (perturbed tokens) of each curve point

    @property
    def base(self) -> str:
        return self.name.partition("@")[0]

    @property
    def preset(self) -> str | None:
        return self.name.partition("@")[2] or None

    def _stat(self, key: str) -> float | None:
        v = self.summary.get(key) if isinstance(self.summary, dict) else None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        return float(v) if math.isfinite(float(v)) else None

    @property
    def mean(self) -> float | None:
        """Mean over the examples: the stored summary's, else computed from the finite values (None: no value)."""
        v = self._stat("mean")
        if v is None and self.values is not None:
            finite = self.values[np.isfinite(self.values)]
            v = float(finite.mean()) if finite.size else None
        return v

    @property
    def std(self) -> float | None:
        v = self._stat("std")
        if v is None and self.values is not None:
            finite = self.values[np.isfinite(self.values)]
            v = float(finite.std()) if finite.size else None
        return v

    @property
    def n(self) -> int:
        v = self._stat("n")
        if v is not None:
            return int(v)
        return int(np.isfinite(self.values).sum()) if self.values is not None else 0

    def value(self, index: int | None) -> float | None:
        """The metric of example ``index`` (None: no such row, or undefined for that example)."""
        if index is None or self.values is None or not 0 <= index < len(self.values):
            return None
        v = float(self.values[index])
        return v if math.isfinite(v) else None


@dataclass(frozen=True, eq=False)
class MetricsData:
    """Every metric of every method: ``methods`` (rows, store order) and ``names`` (columns, :func:`metric_sort_key`
    order, the union over the methods); ``table[method][name]``."""

    methods: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    table: dict[str, dict[str, MetricInfo]] = field(default_factory=dict)

    def get(self, method: str | None, name: str) -> MetricInfo | None:
        return self.table.get(method, {}).get(name) if method is not None else None

    def keys(self) -> tuple[tuple[str, str], ...]:
        """Every (method, metric) pair."""
        return tuple((m, n) for m in self.methods for n in self.table.get(m, {}))

    def of(self, method: str | None) -> list[MetricInfo]:
        """The metrics of one method, in column order ([] when it has none)."""
        row = self.table.get(method, {}) if method is not None else {}
        return [row[n] for n in self.names if n in row]


def _value_summary(values) -> dict:
    v = np.asarray(values, dtype=np.float64)
    finite = v[np.isfinite(v)]
    return {"mean": float(finite.mean()), "std": float(finite.std()), "n": int(finite.size)} if finite.size else {}


def read_metrics(store: Store, *, curves: bool = True) -> tuple[MetricsData, list[str]]:
    """Every method's metrics, and a note for every metric that could not be used. ``curves``: also read the
    mean per-level curves and descriptions (the metrics screen, which reads them once: the app keeps the result);
    without, only names and summaries. Per-example values are never kept for the whole store: each example's are
    read with it (:func:`read_example`)."""
    found = list(getattr(store, "metric_methods", None) or [])
    if not found:
        return MetricsData(), []
    order = {m: i for i, m in enumerate(getattr(store, "methods", None) or [])}
    found.sort(key=lambda m: (order.get(m, len(order)), m))
    table: dict[str, dict[str, MetricInfo]] = {}
    problems: list[str] = []
    for method in found:
        row = {}
        if not curves:  # the browse screen: names and summaries only, values per example as they are shown
            for name, info in store.metric_summaries(method).items():
                row[str(name)] = MetricInfo(str(method), str(name), None, dict(info.get("summary") or {}),
                                            dict(info.get("settings") or {}),
                                            bool(info.get("higher_is_better", True)))
            if row:
                table[str(method)] = row
            continue
        summaries = store.metric_summaries(method)
        for name in store.metric_names(method):
            info = summaries[name]
            curve, lv = store.metric_mean_curve(method, name)  # in chunks: memory does not grow with the store
            summary = dict(info.get("summary") or {})
            if not all(k in summary for k in ("mean", "std", "n")):  # an old record without them: from the values
                summary = {**_value_summary(store.metric_values(method, name)), **summary}
            row[str(name)] = MetricInfo(str(method), str(name), None, summary, dict(info.get("settings") or {}),
                                        bool(info.get("higher_is_better", True)), str(info.get("description") or ""),
                                        curve, lv)
        if row:
            table[str(method)] = row
    names = sorted({n for row in table.values() for n in row}, key=metric_sort_key)
    return MetricsData(tuple(table), tuple(names), table), problems


def read_meta(store: Store) -> StoreMeta:
    methods = []
    for m in store.methods:
        info = store.method_info(m)
        methods.append(MethodInfo(m, bool(info.get("signed")), int(info.get("n_layer_views") or 0),
                                  str(info.get("description") or ""), str(info.get("matrices") or "none")))
    model_info = store.model_info
    model = str(model_info.get("model_id") or model_info.get("model") or "")
    head_masks = tuple(str(n) for n in (getattr(store, "head_masks", None) or ()))
    return StoreMeta(os.path.basename(store.path), tuple(methods), dict(store.labels), int(store.n_layers), model,
                     store.complete, len(store), head_masks, str(getattr(store, "task_name", "classification")),
                     str(getattr(store, "heads", "none")))


def read_example(store: Store, i: int, methods: tuple[str, ...],
                 metric_keys: tuple[tuple[str, str], ...] = ()) -> LoadedExample:
    """Everything the screens show of example ``i``, and its value of each (method, metric) in ``metric_keys``."""
    ex = store[i]
    scores, layers, values = {}, {}, {}
    metric_values = {}
    for m, name in metric_keys:
        v = float(store.metric_values(m, name, i, i + 1)[0])
        metric_values[(m, name)] = v
    if getattr(store, "generation", False):
        return _read_generation(store, ex, methods, metric_values, metric_keys)
    for m in methods:
        scores[m] = np.asarray(ex.scores(m), dtype=np.float32)
        ls = ex.layer_scores(m)
        layers[m] = None if ls is None else np.asarray(ls, dtype=np.float32)
        values[m] = ex.example_values(m)
    task, gold_span = None, None
    if getattr(store, "task_name", "classification") != "classification":
        task = dict(ex.task_info)
        evidence = ex.evidence if task["task"] == "qa" else None
        if evidence is not None and evidence.any():
            where = np.flatnonzero(evidence)
            gold_span = (int(where[0]), int(where[-1]))
    return LoadedExample(index=i, id=ex.id, text=ex.text, pair=ex.pair, tokens=list(ex.tokens), label=ex.label,
                         pred=ex.pred, probs=ex.probs, truncated=ex.truncated, n_orig_tokens=ex.n_orig_tokens,
                         explain_pos=int(ex.explain_pos), scores=scores, layer_scores=layers, values=values,
                         metric_values=metric_values, task=task, gold_span=gold_span,
                         special=np.asarray(ex.segment) < 0)


def _read_generation(store: Store, ex, methods: tuple[str, ...], metric_values: dict,
                     metric_keys: tuple[tuple[str, str], ...] = ()) -> LoadedExample:
    """A generation example with every step of every method (and of every metric in ``metric_keys`` that the store
    keeps per step), shown at its first step (LoadedExample.at_step)."""
    layers = {m: ex.step_layer_scores(m) for m in methods}
    per_step = {key: ex.step_metric(*key) for key in metric_keys}
    steps = Steps(ex.prompt_len, {m: np.asarray(ex.step_scores(m), np.float32) for m in methods},
                  {m: None if v is None else np.asarray(v, np.float32) for m, v in layers.items()},
                  {m: ex.step_values(m) for m in methods}, ex.step_probs, ex.step_outputs, ex.step_foil_tokens,
                  ex.step_foil_probs, ex.step_foil_words, int(ex.explain_pos),
                  {key: v for key, v in per_step.items() if v is not None})
    base = LoadedExample(index=ex.index, id=ex.id, text=ex.text, pair=ex.pair, tokens=list(ex.tokens), label=ex.label,
                         pred=ex.pred, probs=ex.probs, truncated=ex.truncated, n_orig_tokens=ex.n_orig_tokens,
                         explain_pos=int(ex.explain_pos), metric_values=metric_values, task={"task": "generate"},
                         special=np.asarray(ex.segment) < 0, steps=steps)
    return base.at_step(0)


def read_matrices(store: Store, i: int, method: str) -> np.ndarray | None:
    """Example ``i``'s per-layer matrices of ``method``: [L, n, n], [L, 1, n] (--matrices cls) or None."""
    m = store[i].matrices(method)
    return None if m is None else np.asarray(m, dtype=np.float32)


MATRIX_BAND_BYTES = 8 << 20  # a matrix's rows read and averaged at a time (float64 while averaged): its memory bound


@dataclass(frozen=True)
class MatrixLayer:
    """One layer of an example's matrix as the matrix screen draws it."""

    cells: np.ndarray  # [R, C] means of its fr x fc blocks (heatmap.block_mean: non-finite entries as 0)
    lo: float  # its smallest and largest entry (non-finite as 0): the layer's own scale
    hi: float


def matrix_layer(m: np.ndarray, fr: int, fc: int) -> MatrixLayer:
    """A layer (or a band of one) held whole as :class:`MatrixLayer`."""
    x = np.nan_to_num(np.asarray(m, np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    return MatrixLayer(block_mean(x, fr, fc)[0], float(x.min()), float(x.max()))


def matrix_bands(rows: int, n: int, fr: int) -> list[tuple[int, int]]:
    """Row ranges of whole fr-row blocks, each within MATRIX_BAND_BYTES of float64 (at least one block)."""
    per = max(1, MATRIX_BAND_BYTES // max(8 * n * fr, 1)) * fr
    return [(a, min(a + per, rows)) for a in range(0, rows, per)]


def read_matrix_layer(store: Store, i: int, method: str, layer: int, fr: int, fc: int) -> MatrixLayer:
    """Layer ``layer`` of example ``i``'s matrix of ``method`` averaged in fr x fc blocks, read a band of whole
    blocks at a time: the downsampled heatmap takes every entry of the layer, so the layer is read once, but never
    held whole (at 4,096 tokens one layer is 64 MB and all of them L times that); no other layer is read."""
    ex = store[i]
    _, rows, n = ex.matrix_shape(method)
    parts, lo, hi = [], np.inf, -np.inf
    for a, b in matrix_bands(rows, n, fr):
        part = matrix_layer(ex.matrix_rows(method, layer, a, b), fr, fc)
        parts.append(part.cells)
        lo, hi = min(lo, part.lo), max(hi, part.hi)
    return MatrixLayer(np.concatenate(parts), lo, hi)


def read_matrix_bounds(store: Store, i: int, method: str) -> tuple[float, float]:
    """The smallest and largest entry (non-finite as 0) of every layer of example ``i``'s matrix of ``method``,
    read a band at a time (the matrix screen's per-example scale: the one read of the whole [L, n, n])."""
    ex = store[i]
    L, rows, n = ex.matrix_shape(method)
    lo, hi = np.inf, -np.inf
    for layer in range(L):
        for a, b in matrix_bands(rows, n, 1):
            x = np.nan_to_num(ex.matrix_rows(method, layer, a, b), nan=0.0, posinf=0.0, neginf=0.0)
            lo, hi = min(lo, float(x.min())), max(hi, float(x.max()))
    return lo, hi


class LRU:
    """A small least-recently-used cache (used on the UI thread only)."""

    def __init__(self, size: int = 64):
        self.size = size
        self._d: OrderedDict = OrderedDict()

    def get(self, key):
        if key not in self._d:
            return None
        self._d.move_to_end(key)
        return self._d[key]

    def put(self, key, value) -> None:
        self._d[key] = value
        self._d.move_to_end(key)
        while len(self._d) > self.size:
            self._d.popitem(last=False)

    def clear(self) -> None:
        self._d.clear()

    def __contains__(self, key) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)
