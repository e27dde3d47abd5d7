"""Reading an attrscope store: ``open_store(path)`` -> :class:`Store`, ``store[i]`` -> :class:`Example`.

The reader opens the file in SWMR read mode, so it works while ``attr-compute`` is still writing and after a writer
was killed. It only trusts the rows of /examples/index: data past the last committed row is never read.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from functools import cached_property

import h5py
import numpy as np

from . import schema
from .errors import StoreError

_MAJOR, _MINOR, _ = (int(x) for x in schema.ENCODING_VERSION.split("."))


def open_store(path: str | os.PathLike) -> "Store":
    """Open a store read-only. Raises :class:`StoreError` with a one-line message when that is not possible."""
    return Store(path)


class Store:
    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise StoreError(f"store '{self.path}' not found: check the path or create it with attr-compute")
        # Reads from several threads (the TUI's workers) and refresh()'s handle swap are serialised by this lock.
        self._lock = threading.RLock()
        self._f = self._open_file()
        try:
            self._check_version()
        except BaseException:
            self._f.close()
            raise
        a = self._f.attrs
        self.n_layers = int(a["n_layers"])
        self.n_heads = int(a["n_heads"])
        self.labels: dict[int, str] = {int(k): v for k, v in json.loads(a["labels"]).items()}
        self.num_labels = int(a["num_labels"])
        self._method_layouts = {m["name"]: m for m in json.loads(a["methods"])}
        self.methods: list[str] = list(self._method_layouts)
        self._index = None
        self._ids = None
        self.refresh()

    def _open_file(self) -> h5py.File:
        if os.path.isdir(self.path):
            raise StoreError(f"'{self.path}' is a directory: pass the .h5 file written by attr-compute")
        # No file lock: a reader must never stop attr-compute from stamping its store complete.
        try:
            return h5py.File(self.path, "r", swmr=True, locking=False)
        except OSError:
            try:  # a file written without SWMR support (e.g. by another tool) still opens the ordinary way
                return h5py.File(self.path, "r", locking=False)
            except OSError as err:
                msg = " ".join(str(err).split())
                raise StoreError(f"'{self.path}' is not a readable HDF5 file ({msg}): pass a store written by attr-compute") from None

    # ------------------------------------------------------------------ header
    def _check_version(self) -> None:
        a = self._f.attrs
        if a.get("encoding-type") != schema.ENCODING_TYPE:
            raise StoreError(f"'{self.path}' is not an attrscope store (no encoding-type '{schema.ENCODING_TYPE}'): pass a file written by attr-compute")
        version = str(a.get("encoding-version", "0.0.0"))
        try:
            major, minor = (int(x) for x in version.split(".")[:2])
        except ValueError:
            raise StoreError(f"'{self.path}' has an unreadable store version '{version}'") from None
        if major != _MAJOR:
            raise StoreError(
                f"'{self.path}' is store format {version}; this attrscope reads format {_MAJOR}.x: "
                f"use an attrscope release that reads format {major}.x")
        if minor > _MINOR:
            warnings.warn(
                f"'{self.path}' is store format {version}, newer than {schema.ENCODING_VERSION}: "
                "unknown parts are ignored; upgrade attrscope to read them", stacklevel=3)

    @property
    def model_info(self) -> dict:
        """Model and library provenance (root attributes)."""
        out = {}
        for key, value in self._attrs().items():
            if key in ("labels", "methods", "summary"):
                continue
            out[key] = value.item() if isinstance(value, np.generic) else value
        return out

    def _attrs(self) -> dict:
        """The root attributes, read under the lock (refresh() may swap the file handle from another thread)."""
        with self._lock:
            return dict(self._f.attrs.items())

    @cached_property
    def config(self) -> dict:
        """The full run configuration that produced the store."""
        return json.loads(bytes(self._read("provenance", slice(None))).decode("utf-8"))

    @property
    def complete(self) -> bool:
        return bool(self._attrs().get("complete", False))

    @property
    def summary(self) -> dict | None:
        s = self._attrs().get("summary")
        return json.loads(s) if s else None

    def method_info(self, name: str) -> dict:
        """Layout and parameters of a method: signed, n_layer_views, matrices, class_scores, description, params."""
        self._need_method(name)
        info = dict(self._method_layouts[name])
        with self._lock:
            info["seconds"] = self._f["methods"][name].attrs.get("seconds")
        return info

    def is_signed(self, name: str) -> bool:
        return bool(self.method_info(name)["signed"])

    # ------------------------------------------------------------------ examples
    def refresh(self) -> int:
        """Pick up examples committed since the store was opened (or last refreshed). Returns the new length.

        The file is reopened rather than refreshed dataset by dataset: h5py's Dataset.refresh() on several
        datasets of one file made later reads of the index return stale chunks (seen with h5py 3.16 / HDF5 1.14),
        and a fresh SWMR open is cheap and always sees the last flushed state."""
        with self._lock:
            if self._index is not None and not self.complete:
                # Close first: a handle opened while another is still open shares its cached (stale) view.
                self._f.close()
                self._f = self._open_file()
            idx = self._f["examples/index"]
            n = idx.shape[0]
            if self._index is None or n != len(self._index):
                self._index = idx[:n]
                self._ids = None
            return n

    @property
    def index(self) -> np.ndarray:
        """The committed index rows (structured array; fields in ``store.schema.index_dtype``)."""
        return self._index

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i: int) -> "Example":
        n = len(self._index)
        if not isinstance(i, (int, np.integer)):
            raise TypeError("store indices must be integers; use by_id() for ids")
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"example {i} out of range: the store holds {n} examples")
        return Example(self, int(i), self._index[i])

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def _read(self, name: str, sel) -> np.ndarray:
        """Read ``self._f[name][sel]`` under the store's lock (the only way examples touch the file)."""
        with self._lock:
            return self._f[name][sel]

    def _string(self, off: int, length: int) -> str | None:
        if length < 0:
            return None
        return bytes(self._read("examples/strings", slice(off, off + length))).decode("utf-8")

    def ids(self) -> list[str]:
        if self._ids is None:
            if len(self._index) == 0:
                self._ids = []
            else:
                ends = self._index["id_off"] + self._index["id_len"]
                lo, hi = int(self._index["id_off"].min()), int(ends.max())
                blob = bytes(self._read("examples/strings", slice(lo, hi)))
                self._ids = [blob[o - lo:o - lo + n].decode("utf-8")
                             for o, n in zip(self._index["id_off"].tolist(), self._index["id_len"].tolist())]
        return self._ids

    def by_id(self, example_id: str) -> "Example":
        try:
            return self[self.ids().index(str(example_id))]
        except ValueError:
            raise KeyError(f"no example with id '{example_id}' in the store") from None

    def _need_method(self, name: str) -> None:
        if name not in self._method_layouts:
            raise KeyError(f"method '{name}' is not in the store; it holds: {', '.join(self.methods) or 'none'}")

    # ------------------------------------------------------------------ head masks
    @property
    def head_masks(self) -> list[str]:
        """Names of the stored head masks (Mask-LRP: "positional", "syntactic", "mask_lrp")."""
        with self._lock:
            return list(self._f["head_masks"]) if "head_masks" in self._f else []

    def head_mask(self, name: str) -> "HeadMask":
        """The [L, H] head mask ``name``; ``.attrs`` holds its settings and provenance, ``.stats`` the statistics
        it came from (counts, rates, thresholds)."""
        names = self.head_masks
        if name not in names:
            raise KeyError(f"head mask '{name}' is not in the store; it holds: {', '.join(names) or 'none'}")
        with self._lock:
            g = self._f["head_masks"][name]
            mask = g["mask"][()]
            stats = {k: g[k][()] for k in g if k != "mask"}
            attrs = json.loads(g.attrs.get("settings", "{}"))
        out = np.asarray(mask).view(HeadMask)
        out.attrs, out.stats = attrs, stats
        return out

    # ------------------------------------------------------------------ metrics
    @property
    def metric_methods(self) -> list[str]:
        """Methods that have faithfulness metrics in the store."""
        with self._lock:
            return list(self._f["metrics"]) if "metrics" in self._f else []

    def _metric_group(self, method: str):
        if method not in self.metric_methods:
            raise KeyError(f"no metrics for method '{method}' in the store; it has metrics for: "
                           f"{', '.join(self.metric_methods) or 'none'} (attr-compute eval STORE --metrics ...)")
        return self._f["metrics"][method]

    def metrics(self, method: str) -> dict[str, np.ndarray]:
        """{metric name: per-example values [N]} of ``method`` (NaN where a metric is undefined for an example);
        row i belongs to store[i]. Summaries and settings: :meth:`metric_summaries`, :meth:`metric_info`."""
        with self._lock:
            g = self._metric_group(method)
            return {name: g[name]["values"][()] for name in g}

    def metric_info(self, method: str, name: str) -> dict:
        """settings, summary, higher_is_better, description, and the per-level curves and levels [N, K] (or None)."""
        with self._lock:
            g = self._metric_group(method)
            if name not in g:
                raise KeyError(f"metric '{name}' of '{method}' is not in the store; it has: {', '.join(g) or 'none'}")
            mg = g[name]
            return {"settings": json.loads(mg.attrs.get("settings", "{}")),
                    "summary": json.loads(mg.attrs.get("summary", "{}")),
                    "higher_is_better": bool(mg.attrs.get("higher_is_better", True)),
                    "description": str(mg.attrs.get("description", "")),
                    "curves": mg["curves"][()] if "curves" in mg else None,
                    "levels": mg["levels"][()] if "levels" in mg else None}

    def metric_summaries(self, method: str) -> dict[str, dict]:
        """{metric name: {"summary": ..., "settings": ..., "higher_is_better": ...}} of ``method``."""
        with self._lock:
            g = self._metric_group(method)
            return {name: {"summary": json.loads(g[name].attrs.get("summary", "{}")),
                           "settings": json.loads(g[name].attrs.get("settings", "{}")),
                           "higher_is_better": bool(g[name].attrs.get("higher_is_better", True))} for name in g}

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"<Store {self.path!r}: {len(self)} examples, methods {self.methods}>"


class HeadMask(np.ndarray):
    """An [L, H] mask array that carries ``attrs`` (settings, provenance) and ``stats`` (arrays it came from)."""

    attrs: dict
    stats: dict

    def __array_finalize__(self, obj):
        self.attrs = getattr(obj, "attrs", {})
        self.stats = getattr(obj, "stats", {})


class Example:
    """One committed example. Every per-token array is aligned with :attr:`tokens` (special tokens included)."""

    def __init__(self, store: Store, index: int, row: np.void):
        self._s = store
        self.index = index
        self._row = row
        self.n_tokens = int(row["n_tokens"])
        self._tok = slice(int(row["tok_off"]), int(row["tok_off"]) + self.n_tokens)

    # metadata ------------------------------------------------------------------
    @cached_property
    def id(self) -> str:
        return self._s._string(int(self._row["id_off"]), int(self._row["id_len"]))

    @cached_property
    def text(self) -> str:
        return self._s._string(int(self._row["text_off"]), int(self._row["text_len"]))

    @cached_property
    def pair(self) -> str | None:
        return self._s._string(int(self._row["pair_off"]), int(self._row["pair_len"]))

    @property
    def row(self) -> int:
        return int(self._row["row"])

    @property
    def label(self) -> int | None:
        v = int(self._row["label"])
        return None if v < 0 else v

    @property
    def pred(self) -> int:
        return int(self._row["pred"])

    @property
    def target(self) -> int:
        return int(self._row["target"])

    @property
    def explain_pos(self) -> int:
        return int(self._row["explain_pos"])

    @property
    def probs(self) -> np.ndarray:
        return np.array(self._row["probs"], dtype=np.float32)

    @property
    def truncated(self) -> bool:
        return bool(int(self._row["flags"]) & schema.FLAG_TRUNCATED)

    @property
    def n_orig_tokens(self) -> int:
        return int(self._row["n_orig_tokens"])

    @property
    def correct(self) -> bool | None:
        return None if self.label is None else self.label == self.pred

    # tokens --------------------------------------------------------------------
    @cached_property
    def token_ids(self) -> np.ndarray:
        return self._s._read("tokens/ids", self._tok)

    @cached_property
    def tokens(self) -> list[str]:
        off = self._s._read("tokens/str_off", self._tok)
        lens = self._s._read("tokens/str_len", self._tok)
        if self.n_tokens == 0:
            return []
        lo = int(off[0])
        blob = bytes(self._s._read("tokens/strings", slice(lo, int(off[-1]) + int(lens[-1]))))
        return [blob[o - lo:o - lo + n].decode("utf-8") for o, n in zip(off.tolist(), lens.tolist())]

    @cached_property
    def spans(self) -> np.ndarray:
        return self._s._read("tokens/spans", self._tok)

    @cached_property
    def segment(self) -> np.ndarray:
        return self._s._read("tokens/segment", self._tok)

    # attributions -----------------------------------------------------------------
    @property
    def evidence(self) -> np.ndarray | None:
        """[n] bool: evidence / answer tokens (stores made with --evidence-column), else None."""
        if "tokens/evidence" not in self._s._f:
            return None
        return self._s._read("tokens/evidence", self._tok).astype(bool)

    def _method(self, name: str) -> tuple[str, dict]:
        self._s._need_method(name)
        return f"methods/{name}", self._s._method_layouts[name]

    def scores(self, method: str) -> np.ndarray:
        """Final attribution [n]."""
        g, _ = self._method(method)
        return self._s._read(f"{g}/scores", self._tok)

    def layer_scores(self, method: str) -> np.ndarray | None:
        """Per-layer view [V, n] (e.g. the CLS row of the rollout up to layer l), or None for methods without one."""
        g, lay = self._method(method)
        v = int(lay["n_layer_views"])
        if not v:
            return None
        start = self._tok.start * v
        return self._s._read(f"{g}/layer_scores", slice(start, start + v * self.n_tokens)).reshape(v, self.n_tokens)

    def matrices(self, method: str) -> np.ndarray | None:
        """Per-layer token-to-token matrices as float32: [L, n, n] (``--matrices all``), [L, 1, n] (only the row
        of the explained position, ``--matrices cls``), or None when the store keeps none for this method."""
        g, lay = self._method(method)
        mode, L, n = lay["matrices"], int(lay["n_matrix_layers"]), self.n_tokens
        if mode == "all":
            start = int(self._row["sq_off"]) * L
            return self._s._read(f"{g}/matrices", slice(start, start + L * n * n)).astype(np.float32).reshape(L, n, n)
        if mode == "cls":
            start = self._tok.start * L
            return self._s._read(f"{g}/matrices", slice(start, start + L * n)).astype(np.float32).reshape(L, 1, n)
        return None

    def class_scores(self, method: str) -> np.ndarray | None:
        """Per-class attributions [C, n] (``--target all``), or None."""
        g, lay = self._method(method)
        if not lay["class_scores"]:
            return None
        C = self._s.num_labels
        start = self._tok.start * C
        return self._s._read(f"{g}/class_scores", slice(start, start + C * self.n_tokens)).reshape(C, self.n_tokens)

    def example_values(self, method: str) -> dict[str, float]:
        """The method's per-example scalars, e.g. {"ig_delta": ...} for integrated gradients ({} for most methods)."""
        g, lay = self._method(method)
        return {key: float(self._s._read(f"{g}/example_values/{key}", self.index))
                for key in lay.get("example_values", ())}

    def __repr__(self) -> str:
        return f"<Example {self.index} id={self.id!r} n_tokens={self.n_tokens} label={self.label} pred={self.pred}>"
