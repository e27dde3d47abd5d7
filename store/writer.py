"""Writing an attrscope store: create the layout, append committed examples, resume an interrupted store.

Files are opened without HDF5's file locks (``locking=False``) everywhere in this package: SWMR readers need no
lock, a reader holding one (attr-tui) would make the writer's final stamp fail, and HDF5 refuses to open one file
twice in a process with different locking flags. attr-compute itself refuses to run two writers on one store.

Commit protocol: for every batch of examples the writer appends all data (strings, tokens, method arrays) and
flushes, then appends the index rows and flushes. A reader trusts only index rows, so it always sees a consistent
prefix, also while the writer runs (SWMR) and after the writer was killed.

A failed write (a full disk) ends the writer: the file is abandoned (h5.abandon), never flushed again, so it stays
what a killed writer leaves, its committed prefix readable and resumable; StoreWriteError says so in one line. The
datasets stay open for the writer's life: HDF5 writes a dataset's cached chunks when it closes, and a close inside
h5py's garbage collection would swallow the error (the index committed over data that never reached the disk).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from datetime import datetime, timezone
from itertools import chain
from operator import attrgetter

import h5py
import numpy as np

from . import schema
from .digests import columns, crcs
from .attrs import read_attrs, write_attr
from .compact import compact
from .errors import StoreError, StoreWriteError, committed_kept
from .h5 import WRITE_ERRORS, abandon, append, checked_task, create_layout, fixed, new_file, write_head_masks, write_reason
from .integrity import one_line, open_for_writing
from .records import ExampleData, HeadMaskData, MethodLayout, layout_from_dict
from .scale import ScaleAccumulator

_ROW_FIELDS = ("row", "label", "pred", "target", "explain_pos", "n_orig_tokens", "target_token", "foil_token",
               "span_end", "pred_end", "output", "gold_value", "prompt_len")  # index fields copied from ExampleData as they are
STAMP_ROOM = 1 << 20  # bytes free before a store is marked finished: its attributes and scale statistics, with room


class StoreWriter:
    """Single writer of a store. Use :meth:`create` or :meth:`resume`, then :meth:`append` batches, then :meth:`close`."""

    def __init__(self, path: str, f: h5py.File, scales: dict[str, ScaleAccumulator] | None = None):
        self.path = path
        self._f = f
        self._ds: dict[str, h5py.Dataset] = {}  # every dataset written, open until close (see the module's doc)
        self.num_labels = int(read_attrs(f)["num_labels"])
        self.methods: dict[str, MethodLayout] = {m["name"]: layout_from_dict(m) for m in json.loads(read_attrs(f)["methods"])}
        self._evidence = schema.TOKEN_EVIDENCE in f
        self.task: dict = json.loads(read_attrs(f).get("task") or json.dumps(schema.DEFAULT_TASK))
        self.heads: str = read_attrs(f).get("heads", "none")  # per-head attention kept: none, cls or all
        self.generation = self.task["name"] == schema.GENERATE  # per-step arrays (2.0)
        self._model_shape = (int(read_attrs(f)["n_layers"]), int(read_attrs(f)["n_heads"]))
        # The per-example datasets each commit adds a digest of (format 1.6; a resumed store is rewritten in it).
        flats = {d.path: d for d in schema.store_datasets(
            separate_ids=True, task_words=True, evidence=self._evidence, num_labels=self.num_labels,
            layouts=[m.__dict__ for m in self.methods.values()], heads=self.heads, n_layers=self._model_shape[0],
            n_heads=self._model_shape[1], heads_dtype=str(f[schema.HEADS].dtype) if self.heads != "none" else "",
            generation=self.generation)}
        self._digested = [flats[p] for p in columns(f) or ()]
        idx = f[schema.INDEX]
        self.n_committed = int(idx.shape[0])
        last = idx[self.n_committed - 1] if self.n_committed else None
        tok_end = int(last["tok_off"]) + int(last["n_tokens"]) if last is not None else 0
        tokstr_end = (int(f[schema.TOKEN_STR_OFF][tok_end - 1]) + int(f[schema.TOKEN_STR_LEN][tok_end - 1])) if tok_end else 0
        self._extent = schema.extent_of_last_row(last, self.n_committed, True, tokstr_end)
        # Scale statistics of every method view, stored when the run completes (a resumed store's are rebuilt).
        self._scales = scales or {name: ScaleAccumulator(schema.scale_views(m.__dict__))
                                  for name, m in self.methods.items()}
        self._pending_scales: dict = {}
        self._closed = False

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
        task: dict | None = None,
        heads: str = "none",
        heads_dtype: str = "float16",
    ) -> "StoreWriter":
        """Create a new store at ``path`` (which must not exist) and switch it to SWMR mode. Head masks are written
        here, before SWMR mode, which allows no new groups afterwards. ``task``: {"name": one of schema.TASKS,
        "options": {...}} (None: classification). ``heads``: the per-head attention each example keeps (none, cls:
        the explained row [L, H, n], all: [L, H, n, n]) in ``heads_dtype``."""
        task = checked_task(task)
        if os.path.exists(path):
            raise StoreError(f"store '{path}' already exists")
        try:
            f = new_file(path)
        except OSError as err:
            raise StoreError(f"cannot create store '{path}': {one_line(err)}: choose another -o") from None
        try:
            create_layout(f, n_layers=n_layers, n_heads=n_heads, labels=labels, methods=methods,
                           provenance=provenance, attrs=attrs or {}, evidence=evidence, task=task, heads=heads,
                           heads_dtype=heads_dtype)
            write_head_masks(f, head_masks or [])
            f.close()  # reopened for SWMR writing, not switched to it: only then are metadata read retries capped
            f = open_for_writing(path, swmr=True)
        except WRITE_ERRORS as err:  # a full disk before the first example: nothing to keep
            abandon(f)
            os.remove(path)
            raise StoreWriteError(path, write_reason(err)) from None
        except BaseException:
            f.close()
            os.remove(path)
            raise
        return cls(path, f)

    # ------------------------------------------------------------------ appending
    def append(self, examples: list[ExampleData]) -> None:
        """Write the data of ``examples``, flush, then commit their index rows and flush."""
        if not examples:
            return
        f = self._f
        e = self._extent
        n = np.fromiter((len(ex.token_ids) for ex in examples), dtype=np.int64, count=len(examples))
        for ex, k in zip(examples, n):
            if len(ex.tokens) != k:
                raise ValueError(f"example {ex.id}: {len(ex.tokens)} token strings for {k} token ids")
            if k < 1:
                raise ValueError(f"example {ex.id}: no tokens")
        # Column by column over the batch: each blob's pieces, their lengths, and offsets from the running ends.
        rows = np.zeros(len(examples), dtype=schema.index_dtype(self.num_labels))
        ids = [ex.id.encode("utf-8") for ex in examples]
        rows["id_off"], rows["id_len"], id_end = _offsets(ids, e.ids_bytes)
        # the texts and pair texts, one after the other per example in /examples/strings (no pair: length -1)
        strings, cols, str_end = [], {"text_off": [], "text_len": [], "pair_off": [], "pair_len": []}, e.string_bytes
        for ex in examples:
            for key, value in (("text", ex.text), ("pair", ex.pair)):
                cols[f"{key}_off"].append(str_end)
                if value is None:
                    cols[f"{key}_len"].append(-1)
                    continue
                b = value.encode("utf-8")
                strings.append(b)
                cols[f"{key}_len"].append(len(b))
                str_end += len(b)
        for key, values in cols.items():
            rows[key] = values
        tok_strings, str_len = _token_strings(list(chain.from_iterable(ex.tokens for ex in examples)))
        str_ends = e.token_string_bytes + np.cumsum(str_len)
        str_off, tokstr_end = str_ends - str_len, int(str_ends[-1])
        try:  # each example's [n, 2] (or flat [2n]) spans at once
            spans = np.concatenate([ex.spans for ex in examples]).reshape(-1, 2)
        except ValueError:
            spans = np.concatenate([np.asarray(ex.spans).reshape(-1, 2) for ex in examples])
        tok_cols = {schema.TOKEN_IDS: np.concatenate([ex.token_ids for ex in examples]).astype(np.int32),
                    schema.TOKEN_SPANS: spans.astype(np.int32),
                    schema.TOKEN_SEGMENT: np.concatenate([ex.segment for ex in examples]).astype(np.int8),
                    schema.TOKEN_STR_OFF: str_off, schema.TOKEN_STR_LEN: str_len.astype(np.int32)}
        if self._evidence:
            tok_cols[schema.TOKEN_EVIDENCE] = np.concatenate([
                np.zeros(k, dtype=np.uint8) if ex.evidence is None else np.asarray(ex.evidence, np.uint8).reshape(k)
                for ex, k in zip(examples, n)])
        ends = np.cumsum(n)
        rows["tok_off"], rows["n_tokens"] = e.tokens + ends - n, n
        sq_ends = np.cumsum(n * n)
        rows["sq_off"] = e.squares + sq_ends - n * n
        tok_end, sq_end = e.tokens + int(ends[-1]), e.squares + int(sq_ends[-1])
        for key, values in zip(_ROW_FIELDS, zip(*map(attrgetter(*_ROW_FIELDS), examples))):
            rows[key] = values
        # the steps (a generation store: the tokens after the prompt; none in others)
        T = n - rows["prompt_len"] if self.generation else np.zeros_like(n)  # a bad prompt_len: task_row_problem
        rows["n_steps"] = T
        step_ends, grid_ends = np.cumsum(T), np.cumsum(T * n)
        rows["step_off"], rows["grid_off"] = e.steps + step_ends - T, e.grid + grid_ends - T * n
        step_end, grid_end = e.steps + int(step_ends[-1]), e.grid + int(grid_ends[-1])
        rows["flags"] = [schema.FLAG_TRUNCATED if ex.truncated else 0 for ex in examples]
        rows["probs"] = np.stack([np.asarray(ex.probs, dtype=np.float32) for ex in examples])
        task_words = [task_json(ex.task_info) for ex in examples]
        rows["task_off"], rows["task_len"], task_end = _offsets(task_words, e.task_bytes)

        problem = schema.task_row_problem(rows, self.task["name"], self.num_labels)
        if problem is not None:  # readers would take the store for damaged
            raise ValueError(f"example {examples[problem[0]].id}: {problem[1]} (task {self.task['name']})")
        order: dict = {}  # rows -> _block_order(rows, n), shared by the methods
        methods = {name: self._method_arrays(name, layout, examples, n, T, order)
                   for name, layout in self.methods.items()}
        heads = self._heads_arrays(examples, n) if self.heads != "none" else []
        steps = self._step_arrays(examples, T) if self.generation else {}
        data = {schema.IDS: np.frombuffer(b"".join(ids), dtype=np.uint8),
                schema.STRINGS: np.frombuffer(b"".join(strings), dtype=np.uint8),
                schema.TOKEN_STRINGS: np.frombuffer(tok_strings, dtype=np.uint8),
                schema.TASK_WORDS: np.frombuffer(b"".join(task_words), dtype=np.uint8),
                **tok_cols, **steps, **dict(pair for arrays in methods.values() for pair in arrays), **dict(heads)}
        first = np.cumsum(n) - n  # each example's first token in the batch
        data = {path: np.asarray(values, self._d(path).dtype) for path, values in data.items()}  # digested as stored
        digests = self._digests(data, rows, (str_off[first], np.add.reduceat(str_len, first)))
        try:
            for path, values in data.items():
                append(self._d(path), values)
            if digests is not None:
                append(self._d(schema.DIGESTS), digests)
            # Data first, then the rows that make it visible: a reader never sees a row whose data is missing.
            f.flush()
            append(self._d(schema.INDEX), rows)
            f.flush()
        except WRITE_ERRORS as err:
            self._fail(err)
        for name in self.methods:  # the values as readers will read them
            self._scales[name].add_joined(self.methods[name].__dict__, self._pending_scales.pop(name))
        self.n_committed += len(examples)
        self._extent = schema.Extent(examples=self.n_committed, tokens=tok_end, squares=sq_end, ids_bytes=id_end,
                                     string_bytes=str_end, token_string_bytes=tokstr_end, task_bytes=task_end,
                                     steps=step_end, grid=grid_end)

    def _digests(self, data: dict[str, np.ndarray], rows: np.ndarray,
                 token_strings: tuple[np.ndarray, np.ndarray]) -> np.ndarray | None:
        """The batch's rows of /examples/digests: each example's CRC-32 in each digested dataset (None: a store
        without digests). The batch's values of a dataset are its examples' runs one after the other."""
        if not self._digested:
            return None
        out = np.empty((len(rows), len(self._digested)), dtype=schema.DIGEST_DTYPE)
        for j, d in enumerate(self._digested):
            out[:, j] = crcs(data[d.path], d.example_rows(rows, self.n_committed, token_strings)[1])
        return out

    def _d(self, path: str) -> h5py.Dataset:
        ds = self._ds.get(path)
        if ds is None:
            ds = self._ds[path] = self._f[path]
        return ds

    def _method_arrays(self, name: str, layout: MethodLayout, examples: list[ExampleData], n: np.ndarray,
                       T: np.ndarray, order: dict) -> list[tuple[str, np.ndarray]]:
        """The method's datasets and the batch's values for each, checked (nothing is written here). Each key's
        arrays are joined side by side at once ([rows, tokens], the scale statistics' layout) and laid out per
        example from there (each example's [rows, n] block, the store's layout) by one gather. A generation store's
        (``layout.steps``): each example's [T, n] and [T, V, n] as they come, NaN after each step's position."""
        g = f"{schema.METHODS}/{name}"
        results = [ex.results.get(name) for ex in examples]
        if any(res is None for res in results):
            i = next(i for i, res in enumerate(results) if res is None)
            raise ValueError(f"example {examples[i].id}: no result for method '{name}'")
        out, views = [], {}
        leading = {}  # each example's array: leading + (n,)
        if layout.steps:
            for key, rows in [(schema.STEP_SCORES, 1)] + [(schema.STEP_LAYER_SCORES, layout.n_layer_views)] * bool(
                    layout.n_layer_views):
                inner = () if rows == 1 else (rows,)
                arrays = self._checked(name, key, [res.get(key) for res in results],
                                       [(t,) + inner + (k,) for t, k in zip(T.tolist(), n.tolist())], examples)
                arrays = [_nan_after_steps(a.astype(np.float32), ex.prompt_len) for a, ex in zip(arrays, examples)]
                out.append((f"{g}/{key}", np.concatenate(arrays, axis=None)))
                per_view = [np.moveaxis(a.reshape(a.shape[0], rows, a.shape[-1]), 1, 0).reshape(rows, -1) for a in arrays]
                views[key] = (np.concatenate(per_view, axis=1), T * n)
        else:
            leading["scores"] = ()
            if layout.n_layer_views:
                leading["layer_scores"] = (layout.n_layer_views,)
        if layout.matrices != "none":
            leading["matrices"] = (layout.n_matrix_layers, 1) if layout.matrices == "cls" else None  # None: [L, n, n]
        if layout.class_scores:
            leading["class_scores"] = (self.num_labels,)
        for key, lead in leading.items():
            arrays = [res[key] for res in results]
            dtype = self._d(f"{g}/{key}").dtype
            if lead is None:  # [L, n, n] each: as they come, and per layer for the scale statistics
                rows = layout.n_matrix_layers
                arrays = self._checked(name, key, arrays, [(rows, k, k) for k in n.tolist()], examples)
                flat = np.concatenate(arrays, axis=None).astype(dtype, copy=False)
                joined = np.concatenate([a.reshape(rows, -1) for a in arrays], axis=1).astype(dtype, copy=False)
                sizes = n * n
            else:
                rows = int(np.prod(lead, dtype=np.int64))
                joined = self._joined(name, key, arrays, lead, n, examples).reshape(rows, -1).astype(dtype, copy=False)
                if rows == 1:
                    flat = joined.reshape(-1)
                else:
                    if rows not in order:
                        order[rows] = _block_order(rows, n)
                    flat = joined.reshape(-1)[order[rows]]
                sizes = n
            out.append((f"{g}/{key}", flat))
            views[key] = (joined, sizes)
        self._pending_scales[name] = views  # the values as readers will read them, added once the batch is committed
        for key in layout.example_values:
            values = [res.get("example_values", {}).get(key) for res in results]
            if any(v is None for v in values):
                i = next(i for i, v in enumerate(values) if v is None)
                raise ValueError(f"example {examples[i].id}: method '{name}' gave no value '{key}'")
            if layout.steps:  # one per step
                values = np.concatenate(self._checked(name, f"example value '{key}'", values,
                                                      [(t,) for t in T.tolist()], examples), axis=None)
            out.append((f"{g}/example_values/{key}", np.asarray(values, dtype=np.float32)))
        return out

    def _step_arrays(self, examples: list[ExampleData], T: np.ndarray) -> dict[str, np.ndarray]:
        """/steps/*: each example's per-step values ([T] each; a foil's and the output default to none)."""
        fields = ((schema.STEP_PROBS, "step_probs", None), (schema.STEP_OUTPUT, "step_outputs", np.nan),
                  (schema.STEP_FOIL_IDS, "step_foil_tokens", -1), (schema.STEP_FOIL_PROBS, "step_foil_probs", np.nan))
        out = {}
        for path, attr, default in fields:
            values = []
            for ex, t in zip(examples, T.tolist()):
                v = getattr(ex, attr)
                if v is None and default is None:
                    raise ValueError(f"example {ex.id}: no {attr} for its {t} generated tokens")
                v = np.full(t, default) if v is None else np.asarray(v)
                if v.shape != (t,):
                    raise ValueError(f"example {ex.id}: {attr} has shape {v.shape}, expected ({t},) (the tokens "
                                     f"after its prompt of {ex.prompt_len})")
                values.append(v)
            out[path] = np.concatenate(values) if values else np.zeros(0)
        return out

    def _joined(self, name: str, key: str, arrays: list, lead: tuple, n: np.ndarray,
                examples: list[ExampleData]) -> np.ndarray:
        """The examples' arrays, each of shape lead + (n_i,), side by side: lead + (sum of n_i,)."""
        try:
            x = np.concatenate(arrays, axis=-1)  # every array's leading dims equal, or an error
            lengths = np.fromiter((a.shape[-1] for a in arrays), dtype=np.int64, count=len(arrays))
            if x.shape == lead + (int(n.sum()),) and np.array_equal(lengths, n):
                return x
        except (AttributeError, IndexError, ValueError):
            pass
        return np.concatenate(self._checked(name, key, arrays, [lead + (k,) for k in n.tolist()], examples), axis=-1)

    @staticmethod
    def _checked(name: str, key: str, arrays: list, expected: list[tuple], examples: list[ExampleData]) -> list:
        arrays = [np.asarray(a) for a in arrays]
        if [a.shape for a in arrays] != expected:  # one comparison for the batch; the culprit named
            i = next(i for i, a in enumerate(arrays) if a.shape != expected[i])
            raise ValueError(f"method '{name}', example {examples[i].id}: {key} has shape {arrays[i].shape}, "
                             f"expected {expected[i]}")
        return arrays

    def _fail(self, err: BaseException) -> None:
        """A write failed: abandon the file (its committed prefix stays) and say so in one line."""
        abandon(self._f)  # before the datasets are let go: their garbage collection would write again
        self._f, self._ds = None, {}
        raise StoreWriteError(self.path, write_reason(err), committed_kept(self.n_committed)) from None

    @property
    def failed(self) -> bool:
        """True once a write failed (the file is abandoned: nothing more is written, close does nothing)."""
        return self._f is None and not self._closed

    def _heads_arrays(self, examples: list[ExampleData], n: np.ndarray) -> list[tuple[str, np.ndarray]]:
        L, H = self._model_shape
        arrays = []
        for ex, k in zip(examples, n.tolist()):
            expected = (L, H, k, k) if self.heads == "all" else (L, H, k)
            a = None if ex.heads is None else np.asarray(ex.heads)
            if a is None or a.shape != expected:
                raise ValueError(f"example {ex.id}: per-head attention of shape {None if a is None else a.shape}, "
                                 f"expected {expected} (heads {self.heads})")
            arrays.append(a)
        return [(schema.HEADS, np.concatenate(arrays, axis=None).astype(self._d(schema.HEADS).dtype, copy=False))]

    # ------------------------------------------------------------------ closing
    def close(self, *, complete: bool = False, summary: dict | None = None) -> None:
        """Close the file. With ``complete`` (or a summary) reopen it outside SWMR to stamp the final attributes
        (and, when complete, the scale statistics of every method)."""
        if self._f is None:  # closed, or abandoned after a failed write (said then): nothing more is written
            return
        try:
            self._f.flush()
        except WRITE_ERRORS as err:
            self._fail(err)
        self._ds = {}
        self._f.close()
        self._f, self._closed = None, True
        if complete or summary:
            self.stamp(complete=complete, summary=summary)

    def stamp(self, *, complete: bool, summary: dict | None = None) -> None:
        """Write the final attributes into the closed file (attributes cannot change in SWMR mode; a normal reopen
        is cheap and clears the open-for-write flag). Outside SWMR a write cut by a full disk could leave the file
        unreadable, so the room it needs is checked first; a store refused here is closed, whole and resumable."""
        need = STAMP_ROOM + len(json.dumps(summary or {}, default=str)) + (
            sum(acc.summary.nbytes + acc.hist.nbytes for acc in self._scales.values()) if complete else 0)
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(self.path))).free
        if free < need:
            raise StoreWriteError(self.path, f"{os.strerror(errno.ENOSPC)} ({free:,} bytes free, {need:,} needed to "
                                  "mark it finished)", committed_kept(self.n_committed))
        f = open_for_writing(self.path)
        try:
            self._stamp(f, complete, summary)
            f.flush()
        except WRITE_ERRORS as err:
            abandon(f)
            raise StoreWriteError(self.path, write_reason(err), committed_kept(self.n_committed)) from None
        f.close()
        if complete:  # finished: no writer will append again, so the dead space SWMR writing left can go
            compact(self.path)

    def _stamp(self, f: h5py.File, complete: bool, summary: dict | None) -> None:
        if complete:
            for name, acc in self._scales.items():
                g = f[schema.METHODS][name]
                if "scale" in g:
                    del g["scale"]
                sg = g.create_group("scale")
                fixed(sg, "summary", acc.summary)
                fixed(sg, "hist", acc.hist)
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


def task_json(words: dict | None) -> bytes:
    """An example's task words as stored in /examples/task: compact UTF-8 JSON, nothing for none."""
    if not words:
        return b""
    return json.dumps(words, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _nan_after_steps(a: np.ndarray, prompt_len: int) -> np.ndarray:
    """A [T, n] or [T, V, n] step array with NaN in the cells that are no attributions (schema.step_valid)."""
    valid = schema.step_valid(prompt_len, a.shape[0], a.shape[-1])
    return np.where(valid[:, None, :] if a.ndim == 3 else valid, a, np.float32(np.nan))


def _block_order(rows: int, n: np.ndarray) -> np.ndarray:
    """Where each value of the examples' [rows, n_i] blocks, laid one after the other, sits in the same values joined
    side by side ([rows, sum of n_i], raveled)."""
    total = int(n.sum())
    starts = np.cumsum(n) - n
    example = np.repeat(np.arange(len(n)), rows * n)
    local = np.arange(rows * total) - rows * starts[example]  # position inside the example's block
    k = n[example]
    row = local // k
    return row * total + starts[example] + (local - row * k)


def _token_strings(tokens: list[str]) -> tuple[bytes, np.ndarray]:
    """The tokens' strings in UTF-8 end to end, and each one's length in bytes."""
    text = "".join(tokens)
    blob = text.encode("utf-8")
    lengths = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))  # ASCII: a byte per character
    if len(blob) != len(text):  # the others' lengths in bytes
        wide = np.flatnonzero(~np.fromiter(map(str.isascii, tokens), dtype=bool, count=len(tokens)))
        lengths[wide] = [len(tokens[i].encode("utf-8")) for i in wide.tolist()]
    return blob, lengths


def _offsets(pieces: list[bytes], start: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(offsets, lengths, end) of byte strings laid end to end from ``start``."""
    lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
    ends = start + np.cumsum(lengths)
    return ends - lengths, lengths, int(ends[-1]) if len(pieces) else start
