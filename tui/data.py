"""What the TUI reads from a store, as plain Python/numpy objects, and a small LRU of loaded examples.

Every function here touches HDF5 and must run on a worker thread, under the app's store lock.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from store import Store


@dataclass(frozen=True)
class MethodInfo:
    name: str
    signed: bool
    n_layer_views: int
    description: str = ""


@dataclass(frozen=True)
class StoreMeta:
    """The header of a store plus its committed index rows (the example list is built from ``index`` alone)."""

    name: str  # file name only: never an absolute path on screen
    methods: tuple[MethodInfo, ...]
    labels: dict[int, str]
    n_layers: int
    model: str
    complete: bool
    index: np.ndarray
    head_masks: tuple[str, ...] = ()  # names only: the heads screen reads the masks when it opens


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
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    layer_scores: dict[str, np.ndarray | None] = field(default_factory=dict)
    values: dict[str, dict[str, float]] = field(default_factory=dict)  # per-example scalars (IG's ig_delta)

    @property
    def correct(self) -> bool | None:
        return None if self.label is None else self.label == self.pred

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


def read_meta(store: Store) -> StoreMeta:
    methods = []
    for m in store.methods:
        info = store.method_info(m)
        methods.append(MethodInfo(m, bool(info.get("signed")), int(info.get("n_layer_views") or 0),
                                  str(info.get("description") or "")))
    model_info = store.model_info
    model = str(model_info.get("model_id") or model_info.get("model") or "")
    head_masks = tuple(str(n) for n in (getattr(store, "head_masks", None) or ()))
    return StoreMeta(os.path.basename(store.path), tuple(methods), dict(store.labels), int(store.n_layers), model,
                     store.complete, store.index, head_masks)


def read_example(store: Store, i: int, methods: tuple[str, ...]) -> LoadedExample:
    ex = store[i]
    scores, layers, values = {}, {}, {}
    for m in methods:
        scores[m] = np.asarray(ex.scores(m), dtype=np.float32)
        ls = ex.layer_scores(m)
        layers[m] = None if ls is None else np.asarray(ls, dtype=np.float32)
        values[m] = ex.example_values(m)
    return LoadedExample(index=i, id=ex.id, text=ex.text, pair=ex.pair, tokens=list(ex.tokens), label=ex.label,
                         pred=ex.pred, probs=ex.probs, truncated=ex.truncated, n_orig_tokens=ex.n_orig_tokens,
                         scores=scores, layer_scores=layers, values=values)


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
