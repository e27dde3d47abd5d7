"""Writing an attrscope store: create the layout, append committed examples, resume an interrupted store.

Files are opened without HDF5's file locks (``locking=False``) everywhere in this package: SWMR readers need no
lock, a reader holding one (attr-tui) would make the writer's final stamp fail, and HDF5 refuses to open one file
twice in a process with different locking flags. attr-compute itself refuses to run two writers on one store.

Commit protocol: for every batch of examples the writer appends all data (strings, tokens, method arrays) and
flushes, then appends the index rows and flushes. A reader trusts only index rows, so it always sees a consistent
prefix, also while the writer runs (SWMR) and after the writer was killed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone

import h5py
import numpy as np

from . import schema
from .errors import StoreError


@dataclass(frozen=True)
class MethodLayout:
    """What the store keeps for one method (numpy-level description; compute fills it from its method classes)."""

    name: str
    signed: bool
    n_layer_views: int = 0  # V: rows of layer_scores per example (0: none)
    matrices: str = "none"  # "none" | "cls" | "all"
    n_matrix_layers: int = 0  # L of the per-layer matrices
    class_scores: bool = False
    example_values: tuple[str, ...] = ()  # per-example scalars (e.g. the completeness delta of integrated gradients)
    description: str = ""
    params: dict = field(default_factory=dict)


@dataclass
class HeadMaskData:
    """One [L, H] head mask with the statistics it came from (Mask-LRP, METHODS.md 6.1).

    ``arrays`` are stored as datasets beside the mask (counts, rates, thresholds, ...); ``attrs`` are JSON-able
    settings and provenance (thresholds, parser, dataset, number of examples)."""

    name: str
    mask: np.ndarray  # [L, H]
    arrays: dict = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)


@dataclass
class MetricData:
    """One metric of one method over every example of a store (rows aligned with /examples/index)."""

    method: str
    name: str
    values: np.ndarray  # [N] per-example values (NaN: undefined for that example)
    settings: dict  # the metric's exact settings (JSON-able)
    summary: dict  # dataset-level numbers (mean, std, n, ...)
    higher_is_better: bool
    description: str = ""
    curves: np.ndarray | None = None  # [N, K] per-level values (probabilities, log-odds ...), NaN-padded
    levels: np.ndarray | None = None  # [N, K] the level of each curve point (perturbed tokens), -1 padded


@dataclass
class ExampleData:
    """One example ready to commit. Arrays are unpadded and aligned with ``token_ids``."""

    row: int
    id: str
    text: str
    pair: str | None
    token_ids: np.ndarray  # [n] int
    tokens: list[str]
    spans: np.ndarray  # [n, 2] int
    segment: np.ndarray  # [n] int
    label: int
    pred: int
    probs: np.ndarray  # [C]
    target: int
    explain_pos: int
    n_orig_tokens: int
    truncated: bool
    evidence: np.ndarray | None = None  # [n] bool: evidence / answer tokens (stores made with --evidence-column)
    results: dict = field(default_factory=dict)  # method name -> {"scores": [n], "layer_scores": [V, n], "matrices": [L, n|1, n], "class_scores": [C, n],
    #                                "example_values": {key: float}}


def _json_bytes(obj) -> np.ndarray:
    return np.frombuffer(json.dumps(obj, sort_keys=True, default=str).encode("utf-8"), dtype=np.uint8)


def _flat(group: h5py.Group, name: str, dtype, chunk: int, width: int | None = None) -> h5py.Dataset:
    shape, maxshape, chunks = (0,), (None,), (chunk,)
    if width is not None:
        shape, maxshape, chunks = (0, width), (None, width), (chunk // width, width)
    return group.create_dataset(
        name, shape=shape, maxshape=maxshape, chunks=chunks, dtype=dtype, compression="gzip",
        compression_opts=4, shuffle=True,
    )


def _append(ds: h5py.Dataset, values: np.ndarray) -> None:
    if len(values) == 0:
        return
    start = ds.shape[0]
    ds.resize((start + len(values),) + ds.shape[1:])
    ds[start:] = values


class StoreWriter:
    """Single writer of a store. Use :meth:`create` or :meth:`resume`, then :meth:`append` batches, then :meth:`close`."""

    def __init__(self, path: str, f: h5py.File):
        self.path = path
        self._f = f
        self.num_labels = int(f.attrs["num_labels"])
        self.methods: dict[str, MethodLayout] = {
            m["name"]: MethodLayout(**m) for m in json.loads(f.attrs["methods"])
        }
        self.n_committed = int(f["examples/index"].shape[0])
        self._tok_end = int(f["tokens/ids"].shape[0])
        self._str_end = int(f["examples/strings"].shape[0])
        self._tokstr_end = int(f["tokens/strings"].shape[0])
        self._sq_end = self._committed_sq_end()

    # ------------------------------------------------------------------ creation
    @classmethod
    def create(
        cls,
        path: str,
        *,
        n_layers: int,
        n_heads: int,
        labels: dict[int, str],
        methods: list[MethodLayout],
        provenance: dict,
        attrs: dict | None = None,
        head_masks: list[HeadMaskData] | None = None,
        evidence: bool = False,
    ) -> "StoreWriter":
        """Create a new store at ``path`` (which must not exist) and switch it to SWMR mode. Head masks are written
        here, before SWMR mode, which allows no new groups afterwards."""
        if os.path.exists(path):
            raise StoreError(f"store '{path}' already exists")
        f = h5py.File(path, "w", libver="latest", locking=False)
        try:
            _create_layout(f, n_layers=n_layers, n_heads=n_heads, labels=labels, methods=methods,
                           provenance=provenance, attrs=attrs or {}, evidence=evidence)
            write_head_masks(f, head_masks or [])
            f.flush()
            f.swmr_mode = True
        except BaseException:
            f.close()
            os.remove(path)
            raise
        return cls(path, f)

    @classmethod
    def resume(cls, path: str) -> "StoreWriter":
        """Reopen an interrupted store for appending.

        A writer killed in SWMR mode leaves HDF5's "open for write" flag set, so the file cannot be reopened for
        writing in place. The committed prefix is copied into a fresh file that atomically replaces the old one;
        uncommitted data past the last index row is dropped.
        """
        tmp = path + ".resume-tmp"
        if os.path.exists(tmp):
            os.remove(tmp)
        try:
            old = h5py.File(path, "r", swmr=True, locking=False)
        except OSError as err:
            raise StoreError(f"cannot open store '{path}' to resume it ({err}): start again with --overwrite") from None
        with old:
            try:
                _copy_committed(old, tmp)
            except BaseException:
                if os.path.exists(tmp):
                    os.remove(tmp)
                raise
        os.replace(tmp, path)
        f = h5py.File(path, "a", libver="latest", locking=False)
        f.attrs["complete"] = False
        f.flush()
        f.swmr_mode = True
        return cls(path, f)

    # ------------------------------------------------------------------ appending
    def _committed_sq_end(self) -> int:
        idx = self._f["examples/index"]
        if idx.shape[0] == 0:
            return 0
        last = idx[idx.shape[0] - 1]
        return int(last["sq_off"]) + int(last["n_tokens"]) ** 2

    def append(self, examples: list[ExampleData]) -> None:
        """Write the data of ``examples``, flush, then commit their index rows and flush."""
        if not examples:
            return
        f = self._f
        rows = np.zeros(len(examples), dtype=schema.index_dtype(self.num_labels))
        strings, tok_strings = [], []
        str_end, tok_end, tokstr_end, sq_end = self._str_end, self._tok_end, self._tokstr_end, self._sq_end
        tok_cols = {"ids": [], "spans": [], "segment": [], "str_off": [], "str_len": []}
        for k, ex in enumerate(examples):
            n = len(ex.token_ids)
            if len(ex.tokens) != n:
                raise ValueError(f"example {ex.id}: {len(ex.tokens)} token strings for {n} token ids")
            r = rows[k]
            for key, value in (("id", ex.id), ("text", ex.text), ("pair", ex.pair)):
                if value is None:
                    r[f"{key}_off"], r[f"{key}_len"] = str_end, -1
                    continue
                b = value.encode("utf-8")
                r[f"{key}_off"], r[f"{key}_len"] = str_end, len(b)
                strings.append(b)
                str_end += len(b)
            enc = [t.encode("utf-8") for t in ex.tokens]
            lens = np.array([len(b) for b in enc], dtype=np.int64)
            tok_cols["str_off"].append(tokstr_end + np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64))
            tok_cols["str_len"].append(lens.astype(np.int32))
            tok_strings.extend(enc)
            tokstr_end += int(lens.sum())
            tok_cols["ids"].append(np.asarray(ex.token_ids, dtype=np.int32))
            tok_cols["spans"].append(np.asarray(ex.spans, dtype=np.int32).reshape(n, 2))
            tok_cols["segment"].append(np.asarray(ex.segment, dtype=np.int8))
            if "tokens/evidence" in f:
                ev = np.zeros(n, dtype=np.uint8) if ex.evidence is None else np.asarray(ex.evidence, dtype=np.uint8)
                tok_cols.setdefault("evidence", []).append(ev.reshape(n))
            r["row"], r["tok_off"], r["n_tokens"], r["sq_off"] = ex.row, tok_end, n, sq_end
            r["label"], r["pred"], r["target"], r["explain_pos"] = ex.label, ex.pred, ex.target, ex.explain_pos
            r["n_orig_tokens"] = ex.n_orig_tokens
            r["flags"] = schema.FLAG_TRUNCATED if ex.truncated else 0
            r["probs"] = np.asarray(ex.probs, dtype=np.float32)
            tok_end += n
            sq_end += n * n

        _append(f["examples/strings"], np.frombuffer(b"".join(strings), dtype=np.uint8))
        _append(f["tokens/strings"], np.frombuffer(b"".join(tok_strings), dtype=np.uint8))
        for key, parts in tok_cols.items():
            _append(f[f"tokens/{key}"], np.concatenate(parts))
        for name, layout in self.methods.items():
            self._append_method(name, layout, examples)

        # Data first, then the rows that make it visible: a reader never sees a row whose data is missing.
        f.flush()
        _append(f["examples/index"], rows)
        f["examples/index"].flush()
        self.n_committed += len(examples)
        self._str_end, self._tok_end, self._tokstr_end, self._sq_end = str_end, tok_end, tokstr_end, sq_end

    def _append_method(self, name: str, layout: MethodLayout, examples: list[ExampleData]) -> None:
        g = self._f["methods"][name]
        parts: dict[str, list[np.ndarray]] = {"scores": [], "layer_scores": [], "matrices": [], "class_scores": []}
        for ex in examples:
            n = len(ex.token_ids)
            res = ex.results.get(name)
            if res is None:
                raise ValueError(f"example {ex.id}: no result for method '{name}'")
            parts["scores"].append(_checked(res["scores"], (n,), name, "scores", ex.id))
            if layout.n_layer_views:
                parts["layer_scores"].append(
                    _checked(res["layer_scores"], (layout.n_layer_views, n), name, "layer_scores", ex.id).ravel())
            if layout.matrices != "none":
                rows = n if layout.matrices == "all" else 1
                parts["matrices"].append(
                    _checked(res["matrices"], (layout.n_matrix_layers, rows, n), name, "matrices", ex.id).ravel())
            if layout.class_scores:
                parts["class_scores"].append(
                    _checked(res["class_scores"], (self.num_labels, n), name, "class_scores", ex.id).ravel())
            for key in layout.example_values:
                value = res.get("example_values", {}).get(key)
                if value is None:
                    raise ValueError(f"example {ex.id}: method '{name}' gave no value '{key}'")
                parts.setdefault(f"example_values/{key}", []).append(np.asarray([value], dtype=np.float32))
        for key, arrays in parts.items():
            if arrays:
                ds = g[key]
                _append(ds, np.concatenate(arrays).astype(ds.dtype, copy=False))

    # ------------------------------------------------------------------ closing
    def close(self, *, complete: bool = False, summary: dict | None = None) -> None:
        """Close the file. With ``complete`` (or a summary) reopen it outside SWMR to stamp the final attributes."""
        if self._f is None:
            return
        self._f.flush()
        self._f.close()
        self._f = None
        if complete or summary:
            # Attributes cannot change in SWMR mode; a normal reopen is cheap and clears the open-for-write flag.
            with h5py.File(self.path, "r+", libver="latest", locking=False) as f:
                f.attrs["complete"] = bool(complete)
                f.attrs["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
                if summary:
                    f.attrs["summary"] = json.dumps(summary, sort_keys=True, default=str)
                    for name, secs in (summary.get("method_seconds") or {}).items():
                        if name in f["methods"]:
                            f["methods"][name].attrs["seconds"] = float(secs)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _checked(arr, shape, method, what, ex_id) -> np.ndarray:
    a = np.asarray(arr)
    if a.shape != shape:
        raise ValueError(f"method '{method}', example {ex_id}: {what} has shape {a.shape}, expected {shape}")
    return a


def _attr_value(value):
    """Plain Python scalars as they are (numpy str_ has no HDF5 conversion), anything else as JSON."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return json.dumps(value, default=str)


def add_metrics(path: str, metrics: list[MetricData]) -> None:
    """Write metrics into a store that no writer holds (after attr-compute closed it): ``/metrics/<method>/<name>``
    with ``values`` [N], optional ``curves`` / ``levels`` [N, K], and the settings and summary as JSON attributes.
    A metric of the same name is replaced. The file is written to a copy that atomically replaces the store, so a
    failure leaves the store as it was."""
    if not metrics:
        return
    tmp = path + ".metrics-tmp"
    if os.path.exists(tmp):
        os.remove(tmp)
    import shutil

    shutil.copyfile(path, tmp)
    try:
        with h5py.File(tmp, "a", locking=False) as f:
            n = int(f["examples/index"].shape[0])
            root = f.require_group("metrics")
            for m in metrics:
                if np.asarray(m.values).shape != (n,):
                    raise StoreError(f"metric '{m.name}' of '{m.method}' has {np.asarray(m.values).shape[0]} values "
                                     f"for {n} examples")
                g = root.require_group(m.method)
                if m.name in g:
                    del g[m.name]
                mg = g.create_group(m.name)
                mg.attrs["encoding-type"] = schema.METRIC_ENCODING_TYPE
                mg.create_dataset("values", data=np.asarray(m.values, dtype=np.float32))
                if m.curves is not None:
                    mg.create_dataset("curves", data=np.asarray(m.curves, dtype=np.float32), compression="gzip")
                if m.levels is not None:
                    mg.create_dataset("levels", data=np.asarray(m.levels, dtype=np.int32), compression="gzip")
                mg.attrs["settings"] = json.dumps(m.settings, sort_keys=True, default=str)
                mg.attrs["summary"] = json.dumps(m.summary, sort_keys=True, default=str)
                mg.attrs["higher_is_better"] = bool(m.higher_is_better)
                mg.attrs["description"] = m.description
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_head_masks(f: h5py.File, masks: list[HeadMaskData]) -> None:
    """``/head_masks/<name>``: dataset ``mask`` [L, H], the statistics beside it, settings as attributes."""
    if not masks:
        return
    root = f.require_group("head_masks")
    for hm in masks:
        g = root.create_group(hm.name)
        g.attrs["encoding-type"] = schema.HEAD_MASK_ENCODING_TYPE
        g.create_dataset("mask", data=np.asarray(hm.mask))
        for key, value in hm.arrays.items():
            g.create_dataset(key, data=np.asarray(value))
        g.attrs["settings"] = json.dumps(hm.attrs, sort_keys=True, default=str)


def _create_layout(f: h5py.File, *, n_layers, n_heads, labels, methods, provenance, attrs, evidence=False) -> None:
    f.attrs["encoding-type"] = schema.ENCODING_TYPE
    f.attrs["encoding-version"] = schema.ENCODING_VERSION
    f.attrs["created"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    f.attrs["n_layers"] = int(n_layers)
    f.attrs["n_heads"] = int(n_heads)
    f.attrs["num_labels"] = len(labels)
    f.attrs["labels"] = json.dumps({str(int(k)): v for k, v in labels.items()})
    f.attrs["methods"] = json.dumps([m.__dict__ for m in methods], sort_keys=True)
    f.attrs["complete"] = False
    for key, value in attrs.items():
        f.attrs[key] = _attr_value(value)
    f.create_dataset("provenance", data=_json_bytes(provenance))

    ex = f.create_group("examples")
    ex.create_dataset("index", shape=(0,), maxshape=(None,), chunks=(schema.CHUNK_ROWS,),
                      dtype=schema.index_dtype(len(labels)))
    _flat(ex, "strings", np.uint8, schema.CHUNK_FLAT)
    tok = f.create_group("tokens")
    _flat(tok, "ids", np.int32, schema.CHUNK_FLAT)
    _flat(tok, "spans", np.int32, schema.CHUNK_FLAT, width=2)
    _flat(tok, "segment", np.int8, schema.CHUNK_FLAT)
    _flat(tok, "str_off", np.int64, schema.CHUNK_FLAT)
    _flat(tok, "str_len", np.int32, schema.CHUNK_FLAT)
    _flat(tok, "strings", np.uint8, schema.CHUNK_FLAT)
    if evidence:
        _flat(tok, "evidence", np.uint8, schema.CHUNK_FLAT)

    mg = f.create_group("methods")
    for m in methods:
        g = mg.create_group(m.name)
        g.attrs["encoding-type"] = schema.METHOD_ENCODING_TYPE
        g.attrs["signed"] = bool(m.signed)
        g.attrs["n_layer_views"] = int(m.n_layer_views)
        g.attrs["matrices"] = m.matrices
        g.attrs["description"] = m.description
        g.attrs["params"] = json.dumps(m.params, sort_keys=True, default=str)
        _flat(g, "scores", np.float32, schema.CHUNK_FLAT)
        if m.n_layer_views:
            _flat(g, "layer_scores", np.float32, schema.CHUNK_FLAT)
        if m.matrices != "none":
            dtype = m.params.get("store_dtype", "float16")
            _flat(g, "matrices", np.dtype(dtype), schema.CHUNK_MATRIX)
        if m.class_scores:
            _flat(g, "class_scores", np.float32, schema.CHUNK_FLAT)
        if m.example_values:
            ev = g.create_group("example_values")
            for key in m.example_values:
                _flat(ev, key, np.float32, schema.CHUNK_ROWS)


def _copy_committed(old: h5py.File, tmp: str) -> None:
    """Write the committed prefix of ``old`` into a new file ``tmp`` with the same layout."""
    index = old["examples/index"][:]
    n = len(index)
    if n:
        last = index[-1]
        tok_end = int(last["tok_off"]) + int(last["n_tokens"])
        sq_end = int(last["sq_off"]) + int(last["n_tokens"]) ** 2
        str_end = max(int(last[f"{k}_off"]) + max(int(last[f"{k}_len"]), 0) for k in ("id", "text", "pair"))
        tokstr_end = int(old["tokens/str_off"][tok_end - 1]) + int(old["tokens/str_len"][tok_end - 1]) if tok_end else 0
    else:
        tok_end = sq_end = str_end = tokstr_end = 0
    methods = [MethodLayout(**{**m, "example_values": tuple(m.get("example_values", ()))})
               for m in json.loads(old.attrs["methods"])]
    prov = json.loads(bytes(old["provenance"][:]).decode("utf-8"))
    labels = {int(k): v for k, v in json.loads(old.attrs["labels"]).items()}
    skip = {"encoding-type", "encoding-version", "created", "n_layers", "n_heads", "num_labels", "labels",
            "methods", "complete", "finished", "summary"}
    attrs = {k: v for k, v in old.attrs.items() if k not in skip}
    with h5py.File(tmp, "w", libver="latest", locking=False) as f:
        _create_layout(f, n_layers=int(old.attrs["n_layers"]), n_heads=int(old.attrs["n_heads"]), labels=labels,
                       methods=methods, provenance=prov, attrs=attrs, evidence="tokens/evidence" in old)
        f.attrs["created"] = old.attrs["created"]
        ends = {"examples/strings": str_end, "tokens/strings": tokstr_end}
        for key in ("ids", "spans", "segment", "str_off", "str_len", "evidence"):
            if f"tokens/{key}" in old:
                ends[f"tokens/{key}"] = tok_end
        for m in methods:
            ends[f"methods/{m.name}/scores"] = tok_end
            if m.n_layer_views:
                ends[f"methods/{m.name}/layer_scores"] = tok_end * m.n_layer_views
            if m.matrices == "all":
                ends[f"methods/{m.name}/matrices"] = sq_end * m.n_matrix_layers
            elif m.matrices == "cls":
                ends[f"methods/{m.name}/matrices"] = tok_end * m.n_matrix_layers
            if m.class_scores:
                ends[f"methods/{m.name}/class_scores"] = tok_end * len(labels)
            for key in m.example_values:
                ends[f"methods/{m.name}/example_values/{key}"] = n
        for key, end in ends.items():
            if old[key].shape[0] < end:
                raise StoreError(f"store is damaged: '{key}' is shorter than its committed rows; start again with --overwrite")
            step = 1 << 22
            for s in range(0, end, step):
                _append(f[key], old[key][s:min(end, s + step)])
        _append(f["examples/index"], index)
        for group in ("head_masks", "metrics"):  # metrics only exist in complete stores (nothing is appended)
            if group in old:
                old.copy(old[group], f, name=group)
