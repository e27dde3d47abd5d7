"""Low-level HDF5 for writers: new files, the layout of a new store, and datasets with their checksums.

Every dataset carries a checksum: chunked ones fletcher32 (and gzip + shuffle), small fixed ones the compact layout
inside their checksummed object header (store/schema.py, "Integrity").
"""

from __future__ import annotations

import errno
import json
import os
import re
import sys
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timezone

import h5py
import numpy as np

from . import schema
from .attrs import attr_value, write_attr
from .digests import crcs
from .errors import StoreError, StoreWriteError
from .records import HeadMaskData, MetricData


# What h5py raises when HDF5 cannot write (OSError with the errno; RuntimeError from some flush and close paths).
WRITE_ERRORS = (OSError, RuntimeError)


def write_reason(err: BaseException) -> str:
    """The system's reason for a failed write (No space left on device), not HDF5's long message around it."""
    code = getattr(err, "errno", None)
    if code not in errno.errorcode:
        found = re.search(r"errno = (\d+)", str(err))
        code = int(found.group(1)) if found else None
    if code in errno.errorcode:
        return os.strerror(code)
    return " ".join(str(err).split())[:160]


def abandon(f: h5py.File) -> None:
    """Close a file whose write failed without writing to it again. HDF5 flushes its dirty cache on close, into the
    failure again (tracebacks from h5py's garbage collection, a segfault in HDF5 2.0's error path), so the file's
    descriptor is first pointed at /dev/null, which takes whatever HDF5 still writes. The file on disk stays as the
    failure left it: what a killed writer leaves, its committed prefix readable (SWMR)."""
    path = f.filename
    try:
        fd = f.id.get_vfd_handle()
        null = os.open(os.devnull, os.O_RDWR)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
    except (OSError, RuntimeError, ValueError, AttributeError):
        pass  # no descriptor to redirect (another driver): the close below may still write, and its errors are kept quiet
    hook, sys.unraisablehook = sys.unraisablehook, lambda _unraisable: None  # h5py's close-time errors: said once, above
    try:
        f.close()
    except Exception:  # noqa: BLE001 - the failure was reported; the handle is gone either way
        pass
    finally:
        sys.unraisablehook = hook
    _reach_recorded_end(path)


def _reach_recorded_end(path: str) -> None:
    """The superblock may already record space whose write failed (its end of file past the file's size): grow the
    file to it with a hole, as a killed writer's file would be, so readers do not take it for a partial copy."""
    from .integrity import recorded_end

    end = recorded_end(path)
    if end is None or os.path.getsize(path) >= end:
        return
    try:
        import resource  # a file-size limit (ulimit -f) stopped the writes: a hole needs no more than the hard limit

        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    except (ImportError, OSError, ValueError):
        soft = None
    try:
        os.truncate(path, end)  # a hole: no space needed
    except OSError:
        pass  # readers will call it incomplete, resume too; nothing else to do
    finally:
        if soft is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@contextmanager
def written(f: h5py.File, path: str, kept: str = ""):
    """``f`` while it is written, flushed and closed at the end. A failed write (HDF5's error carrying the system's
    errno) abandons it and raises StoreWriteError; any other error closes it as it is and passes on."""
    try:
        yield f
        f.flush()
    except WRITE_ERRORS as err:
        if f.id.valid:
            abandon(f)
        if getattr(err, "errno", None) is None and "errno =" not in str(err):  # no system error: HDF5 could not
            from .integrity import damaged  # read back what it appends to (a damaged copy)

            raise damaged(path, "the HDF5 file", err) from None
        raise StoreWriteError(path, write_reason(err), kept) from None
    except BaseException:
        if f.id.valid:
            try:
                f.close()
            except WRITE_ERRORS:
                abandon(f)
        raise
    f.close()


def json_bytes(obj) -> np.ndarray:
    return np.frombuffer(json.dumps(obj, sort_keys=True, default=str).encode("utf-8"), dtype=np.uint8)


def flat(group: h5py.Group, name: str, dtype, chunk: int, width: int | None = None) -> h5py.Dataset:
    """An empty appendable dataset: chunked, gzip + shuffle, fletcher32 checksum on every chunk."""
    shape, maxshape, chunks = (0,), (None,), (chunk,)
    if width is not None:
        shape, maxshape, chunks = (0, width), (None, width), (chunk // width, width)
    return group.create_dataset(
        name, shape=shape, maxshape=maxshape, chunks=chunks, dtype=dtype, compression="gzip",
        compression_opts=schema.GZIP_LEVEL, shuffle=True, fletcher32=True,
    )


def fixed(group: h5py.Group, name: str, data) -> h5py.Dataset:
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


def append(ds: h5py.Dataset, values: np.ndarray) -> None:
    if len(values) == 0:
        return
    start = ds.shape[0]
    ds.resize((start + len(values),) + ds.shape[1:])
    ds[start:] = values


def new_file(path: str) -> h5py.File:
    """A new HDF5 file: latest format (checksummed metadata), no file locks, and root attributes kept in the
    (checksummed) object header rather than a fractal heap: a zeroed block in the heap of a dense root-attribute
    store sent HDF5 into an endless loop (seen on a format 1.2 store)."""
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_LATEST, h5py.h5f.LIBVER_LATEST)
    fapl.set_file_locking(False, True)
    fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
    fcpl.set_attr_phase_change(schema.MAX_COMPACT_ATTRIBUTES, schema.MAX_COMPACT_ATTRIBUTES - 1)
    return h5py.File(h5py.h5f.create(os.fsencode(path), h5py.h5f.ACC_EXCL, fapl=fapl, fcpl=fcpl))


def write_head_masks(f: h5py.File, masks: list[HeadMaskData]) -> None:
    """``/head_masks/<name>``: dataset ``mask`` [L, H], the statistics beside it, settings as attributes."""
    if not masks:
        return
    root = f.require_group(schema.HEAD_MASKS)
    for hm in masks:
        g = root.create_group(hm.name)
        write_attr(g, "encoding-type", schema.HEAD_MASK_ENCODING_TYPE)
        fixed(g, "mask", np.asarray(hm.mask))
        for key, value in hm.arrays.items():
            fixed(g, key, np.asarray(value))
        write_attr(g, "settings", json.dumps(hm.attrs, sort_keys=True, default=str))


def checked_task(task: dict | None) -> dict:
    """The task as the root attribute ``task`` keeps it: {"name": one of schema.TASKS, "options": {...}}."""
    if task is None:
        return dict(schema.DEFAULT_TASK)
    name, options = task.get("name"), task.get("options") or {}
    if name not in schema.TASKS:
        raise StoreError(f"unknown task '{name}': one of {', '.join(schema.TASKS)}")
    if not isinstance(options, dict):
        raise StoreError(f"the options of task '{name}' are not a mapping: {options!r}")
    return {"name": name, "options": dict(options)}


def create_layout(f: h5py.File, *, n_layers, n_heads, labels, methods, provenance, attrs, evidence=False,
                  task: dict | None = None, heads: str = "none", heads_dtype: str = "float16") -> None:
    if heads not in schema.HEAD_MODES:
        raise StoreError(f"unknown heads mode '{heads}': one of {', '.join(schema.HEAD_MODES)}")
    task = checked_task(task)
    generation = task["name"] == schema.GENERATE
    methods = [replace(m, steps=generation) for m in methods]  # a generation store's methods keep a row per step
    if generation and any(m.class_scores for m in methods):
        raise StoreError("a generation store keeps no class_scores (--target all): leave them out")
    write_attr(f, "encoding-type", schema.ENCODING_TYPE)
    write_attr(f, "encoding-version", schema.ENCODING_VERSION)
    write_attr(f, "created", datetime.now(timezone.utc).isoformat(timespec="seconds"))
    write_attr(f, "n_layers", int(n_layers))
    write_attr(f, "n_heads", int(n_heads))
    write_attr(f, "num_labels", len(labels))
    write_attr(f, "labels", json.dumps({str(int(k)): v for k, v in labels.items()}))
    write_attr(f, "methods", json.dumps([m.__dict__ for m in methods], sort_keys=True))
    write_attr(f, "task", json.dumps(task, sort_keys=True, default=str))
    write_attr(f, "complete", False)
    if heads != "none":  # absent: no per-head attention (what a store before 1.5 reads as)
        write_attr(f, "heads", heads)
    for key, value in attrs.items():
        write_attr(f, key, value)
    fixed(f, schema.PROVENANCE, json_bytes(provenance))

    ex = f.create_group("examples")
    ex.create_dataset("index", shape=(0,), maxshape=(None,), chunks=(schema.CHUNK_ROWS,),
                      dtype=schema.index_dtype(len(labels)), compression="gzip", compression_opts=schema.GZIP_LEVEL,
                      shuffle=True, fletcher32=True)
    f.create_group("tokens")
    mg = f.create_group(schema.METHODS)
    for m in methods:
        g = mg.create_group(m.name)
        write_attr(g, "encoding-type", schema.METHOD_ENCODING_TYPE)
        write_attr(g, "layout-version", schema.METHOD_LAYOUT_VERSION)
        write_attr(g, "signed", bool(m.signed))
        write_attr(g, "n_layer_views", int(m.n_layer_views))
        write_attr(g, "matrices", m.matrices)
        write_attr(g, "description", m.description)
        write_attr(g, "params", json.dumps(m.params, sort_keys=True, default=str))
    rec = f.create_group(schema.METRIC_RECORDS)
    rec.create_dataset("rows", shape=(0,), maxshape=(None,), chunks=(64,), dtype=schema.metric_record_dtype(),
                       compression="gzip", compression_opts=schema.GZIP_LEVEL, shuffle=True, fletcher32=True)
    flat(f, schema.METRIC_NUMBERS, np.float32, schema.CHUNK_FLAT)
    flat(f, schema.METRIC_TEXT, np.uint8, schema.CHUNK_FLAT)
    flats = schema.store_datasets(separate_ids=True, task_words=True, evidence=evidence,
                                  layouts=[m.__dict__ for m in methods], num_labels=len(labels), heads=heads,
                                  n_layers=n_layers, n_heads=n_heads, heads_dtype=heads_dtype, generation=generation)
    for d in flats:
        flat(f, d.path, np.dtype(d.dtype), d.chunk, d.width)
    digests = flat(f, schema.DIGESTS, np.dtype(schema.DIGEST_DTYPE), schema.CHUNK_ROWS * len(flats), len(flats))
    write_attr(digests, "datasets", json.dumps([d.path for d in flats]))  # the columns' order


def committed_steps(f: h5py.File) -> int | None:
    """S, the generated tokens of a generation store's committed examples (from its last index row); None for a
    store of another task."""
    raw = attr_value(f.attrs["task"]) if "task" in f.attrs else None
    task = json.loads(raw) if raw is not None else schema.DEFAULT_TASK
    if task.get("name") != schema.GENERATE:
        return None
    index = f[schema.INDEX]
    if not index.shape[0]:
        return 0
    last = index[index.shape[0] - 1]
    return int(last["step_off"]) + int(last["n_steps"])


def append_metric_records(f: h5py.File, metrics: list[MetricData]) -> None:
    """Append the metrics' numbers and texts, flush, then their record rows (the commit), flush."""
    n = int(f[schema.INDEX].shape[0])
    steps_total = committed_steps(f)
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
        digest = int(crcs(np.concatenate(parts), [off - num_end])[0])  # the record's numbers, one run (1.6)
        extra = {}
        if m.steps is not None:  # a run of their own after the levels, with its own digest (2.1)
            steps = np.asarray(m.steps, dtype=np.float32)
            if steps_total is None:
                raise StoreError(f"metric '{m.name}' of '{m.method}' has per-step values, but the store is not a "
                                 "generation store: pass them for a --task generate store only")
            if steps.shape != (steps_total,):
                raise StoreError(f"metric '{m.name}' of '{m.method}' has {steps.size} per-step values for the "
                                 f"{steps_total} generated tokens of the store")
            extra["steps"] = {"off": off, "n": steps_total, "digest": int(crcs(steps, [steps_total])[0])}
            parts.append(steps)
            off += steps_total
        text = json.dumps({"settings": m.settings, "summary": m.summary, "higher_is_better": bool(m.higher_is_better),
                           "description": m.description, "digest": digest, **extra}, sort_keys=True,
                          default=str).encode("utf-8")
        r["text_off"], r["text_len"] = text_end, len(text)
        chunks += parts
        blobs.append(text)
        num_end, text_end = off, text_end + len(text)
    append(numbers, np.concatenate(chunks))
    append(texts, np.frombuffer(b"".join(blobs), dtype=np.uint8))
    f.flush()  # the numbers first ...
    append(f[schema.METRIC_ROWS], rows)  # ... then the rows that make them visible
    f.flush()
