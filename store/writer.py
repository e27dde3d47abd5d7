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
from .attrs import read_attrs, write_attr
from .integrity import one_line
from .scale import ScaleAccumulator


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
    """An empty appendable dataset: chunked, gzip + shuffle, fletcher32 checksum on every chunk."""
    shape, maxshape, chunks = (0,), (None,), (chunk,)
    if width is not None:
        shape, maxshape, chunks = (0, width), (None, width), (chunk // width, width)
    return group.create_dataset(
        name, shape=shape, maxshape=maxshape, chunks=chunks, dtype=dtype, compression="gzip",
        compression_opts=schema.GZIP_LEVEL, shuffle=True, fletcher32=True,
    )


def _fixed(group: h5py.Group, name: str, data) -> h5py.Dataset:
    """A dataset written once: small ones live in the checksummed object header (compact layout), larger ones are
    chunked with gzip and fletcher32, so damage is detected either way."""
    data = np.asarray(data)
    if data.nbytes <= schema.COMPACT_MAX_BYTES:
        space = h5py.h5s.create_simple(data.shape) if data.ndim else h5py.h5s.create(h5py.h5s.SCALAR)
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        dsid = h5py.h5d.create(group.id, name.encode(), h5py.h5t.py_create(data.dtype, logical=True), space, dcpl=dcpl)
        ds = h5py.Dataset(dsid)
        if data.size:
            ds[()] = data
        return ds
    return group.create_dataset(name, data=data, chunks=True, compression="gzip",
                                compression_opts=schema.GZIP_LEVEL, shuffle=True, fletcher32=True)


def _append(ds: h5py.Dataset, values: np.ndarray) -> None:
    if len(values) == 0:
        return
    start = ds.shape[0]
    ds.resize((start + len(values),) + ds.shape[1:])
    ds[start:] = values


class StoreWriter:
    """Single writer of a store. Use :meth:`create` or :meth:`resume`, then :meth:`append` batches, then :meth:`close`."""

    def __init__(self, path: str, f: h5py.File, scales: dict[str, ScaleAccumulator] | None = None):
        self.path = path
        self._f = f
        self.num_labels = int(read_attrs(f)["num_labels"])
        self.methods: dict[str, MethodLayout] = {m["name"]: _layout(m) for m in json.loads(read_attrs(f)["methods"])}
        self._evidence = schema.TOKEN_EVIDENCE in f
        idx = f[schema.INDEX]
        self.n_committed = int(idx.shape[0])
        last = idx[self.n_committed - 1] if self.n_committed else None
        tok_end = int(last["tok_off"]) + int(last["n_tokens"]) if last is not None else 0
        tokstr_end = (int(f["tokens/str_off"][tok_end - 1]) + int(f["tokens/str_len"][tok_end - 1])) if tok_end else 0
        self._extent = schema.extent_of_last_row(last, self.n_committed, True, tokstr_end)
        # Scale statistics of every method view, stored when the run completes (a resumed store's are rebuilt).
        self._scales = scales or {name: ScaleAccumulator(schema.scale_views(m.__dict__))
                                  for name, m in self.methods.items()}

    @property
    def n_tokens(self) -> int:
        """Tokens of all committed examples."""
        return self._extent.tokens

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
        try:
            f = _new_file(path)
        except OSError as err:
            raise StoreError(f"cannot create store '{path}': {one_line(err)}: choose another -o") from None
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
        writing in place. The committed prefix is copied (and checked, chunk checksums included) into a fresh file
        that atomically replaces the old one; uncommitted data past the last index row is dropped. A store written
        before format 1.3 is rewritten in the current format.
        """
        from .reader import open_store

        tmp = path + ".resume-tmp"
        if os.path.exists(tmp):
            os.remove(tmp)
        with open_store(path) as old:
            try:
                scales = _copy_committed(old, tmp, metrics=False)
            except BaseException:
                if os.path.exists(tmp):
                    os.remove(tmp)
                raise
        os.replace(tmp, path)
        f = h5py.File(path, "a", libver="latest", locking=False)
        write_attr(f, "complete", False)
        f.flush()
        f.swmr_mode = True
        return cls(path, f, scales)

    # ------------------------------------------------------------------ appending
    def append(self, examples: list[ExampleData]) -> None:
        """Write the data of ``examples``, flush, then commit their index rows and flush."""
        if not examples:
            return
        f = self._f
        rows = np.zeros(len(examples), dtype=schema.index_dtype(self.num_labels))
        ids, strings, tok_strings = [], [], []
        e = self._extent
        id_end, str_end, tok_end, tokstr_end, sq_end = (e.ids_bytes, e.string_bytes, e.tokens, e.token_string_bytes,
                                                         e.squares)
        tok_cols = {"ids": [], "spans": [], "segment": [], "str_off": [], "str_len": []}
        for k, ex in enumerate(examples):
            n = len(ex.token_ids)
            if len(ex.tokens) != n:
                raise ValueError(f"example {ex.id}: {len(ex.tokens)} token strings for {n} token ids")
            if n < 1:
                raise ValueError(f"example {ex.id}: no tokens")
            r = rows[k]
            b = ex.id.encode("utf-8")
            r["id_off"], r["id_len"] = id_end, len(b)
            ids.append(b)
            id_end += len(b)
            for key, value in (("text", ex.text), ("pair", ex.pair)):
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
            if self._evidence:
                ev = np.zeros(n, dtype=np.uint8) if ex.evidence is None else np.asarray(ex.evidence, dtype=np.uint8)
                tok_cols.setdefault("evidence", []).append(ev.reshape(n))
            r["row"], r["tok_off"], r["n_tokens"], r["sq_off"] = ex.row, tok_end, n, sq_end
            r["label"], r["pred"], r["target"], r["explain_pos"] = ex.label, ex.pred, ex.target, ex.explain_pos
            r["n_orig_tokens"] = ex.n_orig_tokens
            r["flags"] = schema.FLAG_TRUNCATED if ex.truncated else 0
            r["probs"] = np.asarray(ex.probs, dtype=np.float32)
            tok_end += n
            sq_end += n * n

        _append(f[schema.IDS], np.frombuffer(b"".join(ids), dtype=np.uint8))
        _append(f[schema.STRINGS], np.frombuffer(b"".join(strings), dtype=np.uint8))
        _append(f[schema.TOKEN_STRINGS], np.frombuffer(b"".join(tok_strings), dtype=np.uint8))
        for key, parts in tok_cols.items():
            _append(f[f"tokens/{key}"], np.concatenate(parts))
        for name, layout in self.methods.items():
            self._append_method(name, layout, examples)

        # Data first, then the rows that make it visible: a reader never sees a row whose data is missing.
        f.flush()
        _append(f[schema.INDEX], rows)
        f[schema.INDEX].flush()
        self.n_committed += len(examples)
        self._extent = schema.Extent(examples=self.n_committed, tokens=tok_end, squares=sq_end, ids_bytes=id_end,
                                     string_bytes=str_end, token_string_bytes=tokstr_end)

    def _append_method(self, name: str, layout: MethodLayout, examples: list[ExampleData]) -> None:
        g = self._f[schema.METHODS][name]
        parts: dict[str, list[np.ndarray]] = {"scores": [], "layer_scores": [], "matrices": [], "class_scores": []}
        stored_dtype = np.dtype(layout.params.get("store_dtype", "float16")) if layout.matrices != "none" else None
        for ex in examples:
            n = len(ex.token_ids)
            res = ex.results.get(name)
            if res is None:
                raise ValueError(f"example {ex.id}: no result for method '{name}'")
            kept = {"scores": _checked(res["scores"], (n,), name, "scores", ex.id).astype(np.float32)}
            if layout.n_layer_views:
                kept["layer_scores"] = _checked(res["layer_scores"], (layout.n_layer_views, n), name, "layer_scores",
                                                ex.id).astype(np.float32)
            if layout.matrices != "none":
                rows = n if layout.matrices == "all" else 1
                kept["matrices"] = _checked(res["matrices"], (layout.n_matrix_layers, rows, n), name, "matrices",
                                            ex.id).astype(stored_dtype)
            if layout.class_scores:
                kept["class_scores"] = _checked(res["class_scores"], (self.num_labels, n), name, "class_scores",
                                                ex.id).astype(np.float32)
            for key, value in kept.items():
                parts[key].append(value.ravel())
            self._scales[name].add_example(layout.__dict__, kept)  # the values as readers will read them
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
        """Close the file. With ``complete`` (or a summary) reopen it outside SWMR to stamp the final attributes
        (and, when complete, the scale statistics of every method)."""
        if self._f is None:
            return
        self._f.flush()
        self._f.close()
        self._f = None
        if complete or summary:
            # Attributes cannot change in SWMR mode; a normal reopen is cheap and clears the open-for-write flag.
            with h5py.File(self.path, "r+", libver="latest", locking=False) as f:
                if complete:
                    for name, acc in self._scales.items():
                        g = f[schema.METHODS][name]
                        if "scale" in g:
                            del g["scale"]
                        sg = g.create_group("scale")
                        _fixed(sg, "summary", acc.summary)
                        _fixed(sg, "hist", acc.hist)
                        write_attr(sg, "views", json.dumps(acc.views))
                write_attr(f, "complete", bool(complete))
                write_attr(f, "finished", datetime.now(timezone.utc).isoformat(timespec="seconds"))
                if summary:
                    write_attr(f, "summary", json.dumps(summary, sort_keys=True, default=str))
                    for name, secs in (summary.get("method_seconds") or {}).items():
                        if name in f[schema.METHODS]:
                            write_attr(f[schema.METHODS][name], "seconds", float(secs))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _new_file(path: str) -> h5py.File:
    """A new HDF5 file: latest format (checksummed metadata), no file locks, and root attributes kept in the
    (checksummed) object header rather than a fractal heap: a zeroed block in the heap of a dense root-attribute
    store sent HDF5 into an endless loop (seen on a format 1.2 store)."""
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_LATEST, h5py.h5f.LIBVER_LATEST)
    fapl.set_file_locking(False, True)
    fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
    fcpl.set_attr_phase_change(schema.MAX_COMPACT_ATTRIBUTES, schema.MAX_COMPACT_ATTRIBUTES - 1)
    return h5py.File(h5py.h5f.create(os.fsencode(path), h5py.h5f.ACC_EXCL, fapl=fapl, fcpl=fcpl))


def _layout(d: dict) -> MethodLayout:
    return MethodLayout(**{**d, "example_values": tuple(d.get("example_values", ()))})


def _checked(arr, shape, method, what, ex_id) -> np.ndarray:
    a = np.asarray(arr)
    if a.shape != shape:
        raise ValueError(f"method '{method}', example {ex_id}: {what} has shape {a.shape}, expected {shape}")
    return a


def add_metrics(path: str, metrics: list[MetricData]) -> None:
    """Add metrics to a store that no writer holds (after attr-compute closed it), in place: each becomes a record
    in /metric_records (values [N], optional curves / levels [N, K], settings and summary), and a later record of
    the same method and metric replaces an earlier one for readers.

    Crash-safe without a copy: the file is switched to SWMR writing, which only appends and keeps the file readable
    at every moment; the numbers are appended and flushed first, the record rows last, so a run killed at any point
    leaves every earlier metric readable and either all or none of a new one. (A store without /metric_records, made
    before format 1.3, or one left open for write by a killed run, is first rewritten once through a checked copy.)"""
    if not metrics:
        return
    for m in metrics:
        for name in (m.method, m.name):
            if len(name.encode("utf-8")) > schema.NAME_BYTES:
                raise StoreError(f"metric name '{name}' is longer than {schema.NAME_BYTES} bytes")
    try:
        f = h5py.File(path, "r+", libver="latest", locking=False)
    except OSError:
        f = None  # still marked open for write by a killed writer: rewrite it below
    if f is None or schema.METRIC_ROWS not in f:
        if f is not None:
            f.close()
        _rewrite(path)
        f = h5py.File(path, "r+", libver="latest", locking=False)
    try:
        f.swmr_mode = True
        _append_metric_records(f, metrics)
    finally:
        f.close()


def _rewrite(path: str) -> None:
    """Copy the store's committed content (checked) into the current format; the copy replaces it atomically."""
    from .reader import open_store

    tmp = path + ".rewrite-tmp"
    if os.path.exists(tmp):
        os.remove(tmp)
    complete = False
    try:
        with open_store(path) as old:
            complete, summary = old.complete, old.summary
            _copy_committed(old, tmp)
        with h5py.File(tmp, "r+", libver="latest", locking=False) as f:
            write_attr(f, "complete", bool(complete))
            if summary:
                write_attr(f, "summary", json.dumps(summary, sort_keys=True, default=str))
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    os.replace(tmp, path)


def _append_metric_records(f: h5py.File, metrics: list[MetricData]) -> None:
    """Append the metrics' numbers and texts, flush, then their record rows (the commit), flush."""
    n = int(f[schema.INDEX].shape[0])
    numbers, texts = f[schema.METRIC_NUMBERS], f[schema.METRIC_TEXT]
    num_end, text_end = int(numbers.shape[0]), int(texts.shape[0])
    rows = np.zeros(len(metrics), dtype=schema.metric_record_dtype())
    chunks, blobs = [], []
    for r, m in zip(rows, metrics):
        values = np.asarray(m.values, dtype=np.float32)
        if values.shape != (n,):
            raise StoreError(f"metric '{m.name}' of '{m.method}' has {values.shape[0] if values.ndim else 1} values "
                             f"for {n} examples")
        parts = [values]
        r["method"], r["metric"], r["n"] = m.method.encode("utf-8"), m.name.encode("utf-8"), n
        r["values_off"], r["curves_off"], r["levels_off"] = num_end, -1, -1
        off = num_end + n
        k = 0
        for key, arr in (("curves", m.curves), ("levels", m.levels)):
            if arr is None:
                continue
            a = np.asarray(arr)
            if a.ndim != 2 or a.shape[0] != n or (k and a.shape[1] != k):
                raise StoreError(f"metric '{m.name}' of '{m.method}': {key} have shape {a.shape}, not [{n}, K]")
            if key == "levels" and a.size and np.abs(a).max() >= 2 ** 24:
                raise StoreError(f"metric '{m.name}' of '{m.method}': levels beyond 2**24 do not fit float32")
            k = a.shape[1]
            r[f"{key}_off"] = off
            parts.append(a.astype(np.float32).ravel())
            off += a.size
        r["k"] = k
        text = json.dumps({"settings": m.settings, "summary": m.summary, "higher_is_better": bool(m.higher_is_better),
                           "description": m.description}, sort_keys=True, default=str).encode("utf-8")
        r["text_off"], r["text_len"] = text_end, len(text)
        chunks += parts
        blobs.append(text)
        num_end, text_end = off, text_end + len(text)
    _append(numbers, np.concatenate(chunks))
    _append(texts, np.frombuffer(b"".join(blobs), dtype=np.uint8))
    f.flush()  # the numbers first ...
    _append(f[schema.METRIC_ROWS], rows)  # ... then the rows that make them visible
    f.flush()


def write_head_masks(f: h5py.File, masks: list[HeadMaskData]) -> None:
    """``/head_masks/<name>``: dataset ``mask`` [L, H], the statistics beside it, settings as attributes."""
    if not masks:
        return
    root = f.require_group(schema.HEAD_MASKS)
    for hm in masks:
        g = root.create_group(hm.name)
        write_attr(g, "encoding-type", schema.HEAD_MASK_ENCODING_TYPE)
        _fixed(g, "mask", np.asarray(hm.mask))
        for key, value in hm.arrays.items():
            _fixed(g, key, np.asarray(value))
        write_attr(g, "settings", json.dumps(hm.attrs, sort_keys=True, default=str))


def _create_layout(f: h5py.File, *, n_layers, n_heads, labels, methods, provenance, attrs, evidence=False) -> None:
    write_attr(f, "encoding-type", schema.ENCODING_TYPE)
    write_attr(f, "encoding-version", schema.ENCODING_VERSION)
    write_attr(f, "created", datetime.now(timezone.utc).isoformat(timespec="seconds"))
    write_attr(f, "n_layers", int(n_layers))
    write_attr(f, "n_heads", int(n_heads))
    write_attr(f, "num_labels", len(labels))
    write_attr(f, "labels", json.dumps({str(int(k)): v for k, v in labels.items()}))
    write_attr(f, "methods", json.dumps([m.__dict__ for m in methods], sort_keys=True))
    write_attr(f, "complete", False)
    for key, value in attrs.items():
        write_attr(f, key, value)
    _fixed(f, schema.PROVENANCE, _json_bytes(provenance))

    ex = f.create_group("examples")
    ex.create_dataset("index", shape=(0,), maxshape=(None,), chunks=(schema.CHUNK_ROWS,),
                      dtype=schema.index_dtype(len(labels)), compression="gzip", compression_opts=schema.GZIP_LEVEL,
                      shuffle=True, fletcher32=True)
    f.create_group("tokens")
    mg = f.create_group(schema.METHODS)
    for m in methods:
        g = mg.create_group(m.name)
        write_attr(g, "encoding-type", schema.METHOD_ENCODING_TYPE)
        write_attr(g, "signed", bool(m.signed))
        write_attr(g, "n_layer_views", int(m.n_layer_views))
        write_attr(g, "matrices", m.matrices)
        write_attr(g, "description", m.description)
        write_attr(g, "params", json.dumps(m.params, sort_keys=True, default=str))
    rec = f.create_group(schema.METRIC_RECORDS)
    rec.create_dataset("rows", shape=(0,), maxshape=(None,), chunks=(64,), dtype=schema.metric_record_dtype(),
                       compression="gzip", compression_opts=schema.GZIP_LEVEL, shuffle=True, fletcher32=True)
    _flat(f, schema.METRIC_NUMBERS, np.float32, schema.CHUNK_FLAT)
    _flat(f, schema.METRIC_TEXT, np.uint8, schema.CHUNK_FLAT)
    for d in (schema.example_datasets(True) + schema.token_datasets(evidence)
              + [d for m in methods for d in schema.method_datasets(m.__dict__, len(labels))]):
        _flat(f, d.path, np.dtype(d.dtype), d.chunk, d.width)


def _copy_committed(old, tmp: str, metrics: bool = True) -> dict[str, ScaleAccumulator]:
    """Write the committed prefix of the open store ``old`` (a reader: every read checked) into a new file ``tmp``
    in the current format, with its metrics unless ``metrics`` is False (a resumed run adds examples, which the
    metrics would not cover). Returns the scale statistics of the copied examples."""
    f_old = old._f
    n = len(old)
    methods = [_layout(m) for m in json.loads(read_attrs(f_old)["methods"])]
    labels = dict(old.labels)
    skip = {"encoding-type", "encoding-version", "created", "n_layers", "n_heads", "num_labels", "labels",
            "methods", "complete", "finished", "summary"}
    attrs = {k: v for k, v in old.model_info.items() if k not in skip}
    with _new_file(tmp) as f:
        _create_layout(f, n_layers=old.n_layers, n_heads=old.n_heads, labels=labels, methods=methods,
                       provenance=old.config, attrs=attrs, evidence=old.has_evidence)
        write_attr(f, "created", read_attrs(f_old)["created"])
        w = StoreWriter.__new__(StoreWriter)  # appends through the writer's own code, without SWMR or a class init
        w.path, w._f, w.num_labels = tmp, f, len(labels)
        w.methods = {m.name: m for m in methods}
        w._evidence = old.has_evidence
        w.n_committed, w._extent = 0, schema.Extent()
        w._scales = {m.name: ScaleAccumulator(schema.scale_views(m.__dict__)) for m in methods}
        step = 512
        for lo in range(0, n, step):
            batch = []
            for i in range(lo, min(lo + step, n)):
                e = old[i]
                results = {}
                for m in methods:
                    r = {"scores": e.scores(m.name)}
                    if m.n_layer_views:
                        r["layer_scores"] = e.layer_scores(m.name)
                    if m.matrices != "none":
                        r["matrices"] = e.matrices(m.name).astype(m.params.get("store_dtype", "float16"))
                    if m.class_scores:
                        r["class_scores"] = e.class_scores(m.name)
                    r["example_values"] = e.example_values(m.name)
                    results[m.name] = r
                batch.append(ExampleData(
                    row=e.row, id=e.id, text=e.text, pair=e.pair, token_ids=e.token_ids, tokens=e.tokens,
                    spans=e.spans, segment=e.segment, label=-1 if e.label is None else e.label, pred=e.pred,
                    probs=e.probs, target=e.target, explain_pos=e.explain_pos, n_orig_tokens=e.n_orig_tokens,
                    truncated=e.truncated, evidence=e.evidence, results=results))
            w.append(batch)
        if schema.HEAD_MASKS in f_old:
            for name in f_old[schema.HEAD_MASKS]:
                _copy_group(f_old[schema.HEAD_MASKS][name], f.require_group(schema.HEAD_MASKS), name)
        records = []
        for method in old.metric_methods if metrics else ():  # only complete stores have metrics: all rows were copied
            for name in old.metric_names(method):
                info = old.metric_info(method, name)
                records.append(MetricData(method, name, old.metric_values(method, name), info["settings"],
                                          info["summary"], info["higher_is_better"], info["description"],
                                          info["curves"], info["levels"]))
        if records:
            _append_metric_records(f, records)
        return w._scales


def _copy_group(src: h5py.Group, parent: h5py.Group, name: str) -> None:
    """Copy a group of small fixed datasets and attributes, rewriting each dataset with checksums."""
    g = parent.create_group(name)
    for key, value in read_attrs(src).items():
        write_attr(g, key, value)
    for key, obj in src.items():
        if isinstance(obj, h5py.Group):
            _copy_group(obj, g, key)
        else:
            _fixed(g, key, obj[()])
