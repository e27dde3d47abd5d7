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
from datetime import datetime, timezone

import h5py
import numpy as np

from . import schema
from .attrs import read_attrs, write_attr
from .errors import StoreError
from .h5 import append, checked_task, create_layout, fixed, new_file, write_head_masks
from .integrity import one_line
from .records import ExampleData, HeadMaskData, MethodLayout, layout_from_dict
from .scale import ScaleAccumulator


class StoreWriter:
    """Single writer of a store. Use :meth:`create` or :meth:`resume`, then :meth:`append` batches, then :meth:`close`."""

    def __init__(self, path: str, f: h5py.File, scales: dict[str, ScaleAccumulator] | None = None):
        self.path = path
        self._f = f
        self.num_labels = int(read_attrs(f)["num_labels"])
        self.methods: dict[str, MethodLayout] = {m["name"]: layout_from_dict(m) for m in json.loads(read_attrs(f)["methods"])}
        self._evidence = schema.TOKEN_EVIDENCE in f
        self.task: dict = json.loads(read_attrs(f).get("task") or json.dumps(schema.DEFAULT_TASK))
        idx = f[schema.INDEX]
        self.n_committed = int(idx.shape[0])
        last = idx[self.n_committed - 1] if self.n_committed else None
        tok_end = int(last["tok_off"]) + int(last["n_tokens"]) if last is not None else 0
        tokstr_end = (int(f[schema.TOKEN_STR_OFF][tok_end - 1]) + int(f[schema.TOKEN_STR_LEN][tok_end - 1])) if tok_end else 0
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
        task: dict | None = None,
    ) -> "StoreWriter":
        """Create a new store at ``path`` (which must not exist) and switch it to SWMR mode. Head masks are written
        here, before SWMR mode, which allows no new groups afterwards. ``task``: {"name": one of schema.TASKS,
        "options": {...}} (None: classification)."""
        task = checked_task(task)
        if os.path.exists(path):
            raise StoreError(f"store '{path}' already exists")
        try:
            f = new_file(path)
        except OSError as err:
            raise StoreError(f"cannot create store '{path}': {one_line(err)}: choose another -o") from None
        try:
            create_layout(f, n_layers=n_layers, n_heads=n_heads, labels=labels, methods=methods,
                           provenance=provenance, attrs=attrs or {}, evidence=evidence, task=task)
            write_head_masks(f, head_masks or [])
            f.flush()
            f.swmr_mode = True
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
        rows = np.zeros(len(examples), dtype=schema.index_dtype(self.num_labels))
        ids, strings, tok_strings, task_words = [], [], [], []
        e = self._extent
        id_end, str_end, tok_end, tokstr_end, sq_end = (e.ids_bytes, e.string_bytes, e.tokens, e.token_string_bytes,
                                                         e.squares)
        task_end = e.task_bytes
        tok_cols = {schema.TOKEN_IDS: [], schema.TOKEN_SPANS: [], schema.TOKEN_SEGMENT: [], schema.TOKEN_STR_OFF: [],
                    schema.TOKEN_STR_LEN: []}  # dataset path -> the batch's parts
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
            tok_cols[schema.TOKEN_STR_OFF].append(tokstr_end + np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64))
            tok_cols[schema.TOKEN_STR_LEN].append(lens.astype(np.int32))
            tok_strings.extend(enc)
            tokstr_end += int(lens.sum())
            tok_cols[schema.TOKEN_IDS].append(np.asarray(ex.token_ids, dtype=np.int32))
            tok_cols[schema.TOKEN_SPANS].append(np.asarray(ex.spans, dtype=np.int32).reshape(n, 2))
            tok_cols[schema.TOKEN_SEGMENT].append(np.asarray(ex.segment, dtype=np.int8))
            if self._evidence:
                ev = np.zeros(n, dtype=np.uint8) if ex.evidence is None else np.asarray(ex.evidence, dtype=np.uint8)
                tok_cols.setdefault(schema.TOKEN_EVIDENCE, []).append(ev.reshape(n))
            r["row"], r["tok_off"], r["n_tokens"], r["sq_off"] = ex.row, tok_end, n, sq_end
            r["label"], r["pred"], r["target"], r["explain_pos"] = ex.label, ex.pred, ex.target, ex.explain_pos
            r["n_orig_tokens"] = ex.n_orig_tokens
            r["flags"] = schema.FLAG_TRUNCATED if ex.truncated else 0
            r["probs"] = np.asarray(ex.probs, dtype=np.float32)
            r["target_token"], r["foil_token"] = ex.target_token, ex.foil_token
            r["span_end"], r["pred_end"] = ex.span_end, ex.pred_end
            r["output"], r["gold_value"] = ex.output, ex.gold_value
            b = task_json(ex.task_info)
            r["task_off"], r["task_len"] = task_end, len(b)
            task_words.append(b)
            task_end += len(b)
            tok_end += n
            sq_end += n * n

        problem = schema.task_row_problem(rows, self.task["name"], self.num_labels)
        if problem is not None:  # readers would take the store for damaged
            raise ValueError(f"example {examples[problem[0]].id}: {problem[1]} (task {self.task['name']})")
        append(f[schema.IDS], np.frombuffer(b"".join(ids), dtype=np.uint8))
        append(f[schema.STRINGS], np.frombuffer(b"".join(strings), dtype=np.uint8))
        append(f[schema.TOKEN_STRINGS], np.frombuffer(b"".join(tok_strings), dtype=np.uint8))
        append(f[schema.TASK_WORDS], np.frombuffer(b"".join(task_words), dtype=np.uint8))
        for path, parts in tok_cols.items():
            append(f[path], np.concatenate(parts))
        for name, layout in self.methods.items():
            self._append_method(name, layout, examples)

        # Data first, then the rows that make it visible: a reader never sees a row whose data is missing.
        f.flush()
        append(f[schema.INDEX], rows)
        f[schema.INDEX].flush()
        self.n_committed += len(examples)
        self._extent = schema.Extent(examples=self.n_committed, tokens=tok_end, squares=sq_end, ids_bytes=id_end,
                                     string_bytes=str_end, token_string_bytes=tokstr_end, task_bytes=task_end)

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
                append(ds, np.concatenate(arrays).astype(ds.dtype, copy=False))

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
            self.stamp(complete=complete, summary=summary)

    def stamp(self, *, complete: bool, summary: dict | None = None) -> None:
        """Write the final attributes into the closed file (attributes cannot change in SWMR mode; a normal reopen
        is cheap and clears the open-for-write flag)."""
        with h5py.File(self.path, "r+", libver="latest", locking=False) as f:
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


def _checked(arr, shape, method, what, ex_id) -> np.ndarray:
    a = np.asarray(arr)
    if a.shape != shape:
        raise ValueError(f"method '{method}', example {ex_id}: {what} has shape {a.shape}, expected {shape}")
    return a


