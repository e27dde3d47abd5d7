"""Copying committed examples between stores: resuming an interrupted store, rewriting an old or damaged-flagged
one in the current format, and merging shard stores. Every example is read back through the reader (checked)."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np

from . import schema
from .attrs import read_attrs, write_attr
from .h5 import append_metric_records, create_layout, fixed, new_file, write_reason, written
from .reader import Store, open_store
from .integrity import open_for_writing
from .replace import copy_beside, discard, replace_with
from .errors import StoreError, StoreWriteError, committed_kept
from .records import ExampleData, MethodLayout, MetricData, layout_from_dict
from .scale import ScaleAccumulator
from .writer import StoreWriter


_SKIP_ATTRS = {"encoding-type", "encoding-version", "created", "n_layers", "n_heads", "num_labels", "labels", "methods",
               "complete", "finished", "summary", "task", "heads"}


def _example_data(e, methods: list[MethodLayout]) -> ExampleData:
    """A stored example as the writer takes it (every array read back through the checked reader)."""
    results = {}
    for m in methods:
        if m.steps:  # a generation store's (2.0)
            r = {schema.STEP_SCORES: e.step_scores(m.name), "example_values": e.step_values(m.name)}
            if m.n_layer_views:
                r[schema.STEP_LAYER_SCORES] = e.step_layer_scores(m.name)
        else:
            r = {"scores": e.scores(m.name), "example_values": e.example_values(m.name)}
            if m.n_layer_views:
                r["layer_scores"] = e.layer_scores(m.name)
        if m.matrices != "none":
            r["matrices"] = e.matrices(m.name).astype(m.params.get("store_dtype", "float16"))
        if m.class_scores:
            r["class_scores"] = e.class_scores(m.name)
        results[m.name] = r
    heads = e.heads()
    if heads is not None:
        heads = heads.astype(e._s.heads_dtype)  # back to the stored dtype: the copy is bit for bit
    steps = {}
    if e._s.generation:
        steps = dict(prompt_len=e.prompt_len, step_probs=e.step_probs, step_outputs=e.step_outputs,
                     step_foil_tokens=e.step_foil_tokens, step_foil_probs=e.step_foil_probs)
    return ExampleData(row=e.row, id=e.id, text=e.text, pair=e.pair, token_ids=e.token_ids, tokens=e.tokens,
                       spans=e.spans, segment=e.segment, label=-1 if e.label is None else e.label, pred=e.pred,
                       probs=e.probs, target=e.target, explain_pos=e.explain_pos, n_orig_tokens=e.n_orig_tokens,
                       truncated=e.truncated, evidence=e.evidence, target_token=e.target_token,
                       foil_token=e.foil_token, span_end=e.span_end, pred_end=e.pred_end, output=e.output,
                       gold_value=np.nan if e.gold_value is None else e.gold_value, task_info=e.task_words,
                       heads=heads, results=results, **steps)


def _copy_examples(src: Store, w: StoreWriter, step: int = 512, copied=None) -> None:
    """Every example of ``src`` appended to ``w``, ``step`` at a time; ``copied(n)`` is told each step's count."""
    methods = list(w.methods.values())
    with src.sequential():  # every example in order: large reads ahead instead of one per example and array
        for lo in range(0, len(src), step):
            w.append([_example_data(src[i], methods) for i in range(lo, min(lo + step, len(src)))])
            if copied is not None:
                copied(min(step, len(src) - lo))


def _new_store_like(src: Store, path: str, provenance: dict, attrs: dict | None = None) -> tuple[h5py.File, StoreWriter]:
    """A new file at ``path`` with the layout of ``src`` (methods, labels, shape, evidence, task, heads) and its model
    attributes, and a writer appending to it (no SWMR: nobody reads a file that is still being made)."""
    methods = [layout_from_dict(m) for m in src._method_layouts.values()]
    keep = {k: v for k, v in src.model_info.items() if k not in _SKIP_ATTRS}
    try:
        f = new_file(path)
    except OSError as err:  # a full disk already at the file's first bytes
        raise StoreWriteError(path, write_reason(err)) from None
    try:
        create_layout(f, n_layers=src.n_layers, n_heads=src.n_heads, labels=dict(src.labels), methods=methods,
                      provenance=provenance, attrs={**keep, **(attrs or {})}, evidence=src.has_evidence, task=src.task,
                      heads=src.heads, heads_dtype=src.heads_dtype or "float16")
    except BaseException:
        with written(f, path):  # closed, or abandoned on a failed write (StoreWriteError)
            raise
    return f, StoreWriter(path, f)


def _copy_head_masks(src: Store, f: h5py.File) -> None:
    with src._reading("/head_masks") as g:
        if schema.HEAD_MASKS in g:
            for name in g[schema.HEAD_MASKS]:
                copy_group(g[schema.HEAD_MASKS][name], f.require_group(schema.HEAD_MASKS), name)


def copy_committed(old: Store, tmp: str, metrics: bool = True) -> dict[str, ScaleAccumulator]:
    """Write the committed prefix of the open store ``old`` (a reader: every read checked) into a new file ``tmp``
    in the current format, with its metrics unless ``metrics`` is False (a resumed run adds examples, which the
    metrics would not cover). Returns the scale statistics of the copied examples."""
    f, w = _new_store_like(old, tmp, old.config)
    with written(f, tmp):
        write_attr(f, "created", old.model_info["created"])
        _copy_examples(old, w)
        _copy_head_masks(old, f)
        records = []
        for method in old.metric_methods if metrics else ():  # only complete stores have metrics: all rows were copied
            for name in old.metric_names(method):
                info = old.metric_info(method, name)
                records.append(MetricData(method, name, old.metric_values(method, name), info["settings"],
                                          info["summary"], info["higher_is_better"], info["description"],
                                          info["curves"], info["levels"], info["steps"]))
        if records:
            append_metric_records(f, records)
        return w._scales


def merge(out: str, shards: list[str], provenance: dict, *, attrs: dict | None = None,
          summary: dict | None = None, copied=None) -> None:
    """Merge complete shard stores, given in dataset order, into a new complete store ``out`` in one pass over their
    data. The shards must share one layout (methods and their parameters, labels, model shape, evidence flags, task,
    per-head attention) and
    head masks, and hold increasing, disjoint source rows. Metrics are not merged (their summaries span the
    shards: the caller recomputes them and adds them with add_metrics). Nothing is left at ``out`` on failure.
    ``copied(n)``: told as examples are copied (a progress bar)."""
    if os.path.exists(out):
        raise StoreError(f"store '{out}' already exists")
    stores = []
    try:
        for p in shards:
            stores.append(open_store(p))
        first = stores[0]
        last_row = -1
        for path, s in zip(shards, stores):
            if not s.complete:
                raise StoreError(f"shard '{path}' is not complete: finish it with attr-compute --resume first")
            for what, mine, theirs in (("methods and their parameters", s._method_layouts, first._method_layouts),
                                       ("labels", s.labels, first.labels),
                                       ("model shape", (s.n_layers, s.n_heads), (first.n_layers, first.n_heads)),
                                       ("evidence flags", s.has_evidence, first.has_evidence),
                                       ("task", s.task, first.task),
                                       ("per-head attention", (s.heads, s.heads_dtype),
                                        (first.heads, first.heads_dtype))):
                if mine != theirs:
                    raise StoreError(f"shard '{path}' differs from '{shards[0]}' in its {what}: they come from "
                                     "different runs")
            for name in s.head_masks:
                if name not in first.head_masks or not np.array_equal(s.head_mask(name), first.head_mask(name)):
                    raise StoreError(f"shard '{path}' has another head mask '{name}' than '{shards[0]}'")
            if len(s):
                rows = s.index_column("row")
                if rows[0] <= last_row:
                    raise StoreError(f"shard '{path}' starts at source row {int(rows[0])}, not after {last_row}: "
                                     "shards overlap or are out of order")
                last_row = int(rows[-1])
        tmp = out + ".merge-tmp"  # a new store: nothing to follow or keep the permissions of
        discard(tmp)
        try:
            f, w = _new_store_like(first, tmp, provenance, attrs)
            with written(f, out):
                for s in stores:
                    _copy_examples(s, w, copied=copied)
                _copy_head_masks(first, f)
            w.stamp(complete=True, summary=summary)
        except BaseException as err:
            discard(tmp)
            if isinstance(err, StoreWriteError):  # the merged copy found the disk full: nothing is left at out
                raise StoreWriteError(out, err.reason, "nothing was written there") from None
            raise
        os.replace(tmp, out)
    finally:
        for s in stores:
            s.close()


def copy_group(src: h5py.Group, parent: h5py.Group, name: str) -> None:
    """Copy a group of small fixed datasets and attributes, rewriting each dataset with checksums."""
    g = parent.create_group(name)
    for key, value in read_attrs(src).items():
        write_attr(g, key, value)
    for key, obj in src.items():
        if isinstance(obj, h5py.Group):
            copy_group(obj, g, key)
        else:
            fixed(g, key, obj[()])


def resume(path: str, keep_metrics: bool = False) -> StoreWriter:
    """Reopen an interrupted store for appending.

    A writer killed in SWMR mode leaves HDF5's "open for write" flag set, so the file cannot be reopened for writing
    in place. The committed prefix is copied (and checked, chunk checksums included) into a fresh file that
    atomically replaces the old one; uncommitted data past the last index row is dropped, and so are the metrics
    (they would not cover the examples appended) unless ``keep_metrics`` and the store is complete (attr-compute
    --resume of a complete store: it adds no example). A store written before format 1.3 is rewritten in the current
    format. Through a symlink, the file it points to is replaced and the link stays."""
    real, tmp = copy_beside(path, ".resume-tmp")
    with open_store(path) as old:
        try:
            scales = copy_committed(old, tmp, metrics=keep_metrics and old.complete)
        except BaseException as err:
            discard(tmp)
            if isinstance(err, StoreWriteError):  # the copy found the disk full: the store itself is untouched
                raise StoreWriteError(path, err.reason, committed_kept(len(old))) from None
            raise
    replace_with(tmp, real)
    with open_for_writing(path) as f:
        write_attr(f, "complete", False)
    f = open_for_writing(path, swmr=True)  # opened so, not switched: the metadata read retries stay capped
    return StoreWriter(path, f, scales)


def rewrite(path: str) -> None:
    """Copy the store's committed content (checked) into the current format; the copy replaces it atomically (through
    a symlink: the file it points to)."""
    from .reader import open_store

    real, tmp = copy_beside(path, ".rewrite-tmp")
    complete = False
    try:
        with open_store(path) as old:
            complete, summary = old.complete, old.summary
            copy_committed(old, tmp)
        with open_for_writing(tmp) as f:
            write_attr(f, "complete", bool(complete))
            if summary:
                write_attr(f, "summary", json.dumps(summary, sort_keys=True, default=str))
    except BaseException:
        discard(tmp)
        raise
    replace_with(tmp, real)
