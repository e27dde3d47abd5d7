"""Reading an attrscope store: ``open_store(path)`` -> :class:`Store`, ``store[i]`` -> :class:`Example`.

The reader works while ``attr-compute`` is still writing and after a writer was killed (SWMR), and it only trusts the
rows of /examples/index: data past the last committed row is never read. Opening reads the header and the last index
row, nothing that grows with the number of examples; index rows are read in blocks when asked for, and checked.

Every failure to read (a truncated copy, a flipped byte caught by a checksum, an index that contradicts itself)
is raised as :class:`StoreError` with one line that names the file; nothing waits on a damaged file.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from collections import OrderedDict
from contextlib import contextmanager
from functools import cached_property

import h5py
import numpy as np

from . import schema
from .digests import columns, crcs
from .errors import StoreError
from .attrs import read_attrs
from .integrity import damaged, open_for_reading
from .text import tokens_text
from .scale import ScaleAccumulator, ViewScale, view_keys

_MAJOR, _MINOR, _ = (int(x) for x in schema.ENCODING_VERSION.split("."))
_BLOCK = 1024  # index rows read (and checked) together
_BLOCKS_KEPT = 64
# What h5py raises for a file it cannot read; turned into StoreError by Store._reading.
_READ_ERRORS = (OSError, RuntimeError, ValueError, KeyError, TypeError, IndexError, AttributeError, UnicodeDecodeError)


def open_store(path: str | os.PathLike) -> "Store":
    """Open a store read-only. Raises :class:`StoreError` with a one-line message when that is not possible."""
    return Store(path)


class Store:
    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        # Reads from several threads (the TUI's workers) and refresh()'s handle swap are serialised by this lock.
        self._lock = threading.RLock()
        self._f: h5py.File | None = open_for_reading(self.path)
        self._datasets: dict[str, h5py.Dataset] = {}  # of self._f: _dataset()
        self._ahead: dict[str, tuple[int, np.ndarray]] | None = None  # sequential(): dataset -> (start, window)
        self.warnings: list[str] = []  # e.g. a newer minor format (unknown parts are ignored)
        try:
            with self._reading("the store header"):
                self._read_header()
            self._blocks: OrderedDict[int, np.ndarray] = OrderedDict()
            self._digest_blocks: OrderedDict[int, np.ndarray] = OrderedDict()
            self._n = 0
            self._opened = False  # refresh() reopens the file from its second call on
            self._extent = schema.Extent()
            self._ids: list[str] | None = None
            self._catalogue = None
            self._steps_runs: dict[tuple[str, str], tuple[int, int, int] | None] = {}
            self._id_rows: dict[str, int] | None = None
            self._scales: dict[str, ScaleAccumulator] = {}
            self._scale_rows: dict[str, int] = {}
            self.refresh()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ reading safely
    @contextmanager
    def _reading(self, what: str):
        """Hold the lock, and turn any failure of HDF5 (or of a damaged file's contents) into a StoreError."""
        with self._lock:
            if self._f is None:
                raise StoreError(f"store '{self.path}' is closed")
            try:
                yield self._f
            except StoreError:
                raise
            except _READ_ERRORS as err:
                raise damaged(self.path, what, err) from None

    def _read(self, name: str, sel, expect: int | None = None) -> np.ndarray:
        """``self._f[name][sel]``; ``expect``: the number of elements the index promises (a shorter read is damage)."""
        with self._reading(f"/{name}") as f:
            if self._ahead is not None and isinstance(sel, slice) and sel.step is None and sel.stop is not None:
                out = self._read_ahead(f, name, sel.start or 0, sel.stop)
            else:
                out = self._dataset(f, name)[sel]
        if expect is not None and np.size(out) != expect:
            raise damaged(self.path, f"/{name}", f"{np.size(out)} values where the index needs {expect}")
        return out

    def _dataset(self, f: h5py.File, name: str) -> h5py.Dataset:
        """Dataset ``name``, opened once per file handle: its HDF5 chunk cache then lives across reads (an example's
        reads hit the chunks its neighbour's read just decompressed), and the path is not looked up again (both
        were most of a read's time: 26 reads per example on the browse screen)."""
        ds = self._datasets.get(name)
        if ds is None:
            ds = self._datasets[name] = f[name]
        return ds

    def _read_ahead(self, f, name: str, a: int, b: int) -> np.ndarray:
        """Rows [a, b) of ``name`` from its read-ahead window, which is refilled from ``a`` when it does not hold
        them (under ``sequential()``)."""
        start, window = self._ahead.get(name, (0, None))
        if window is None or a < start or b > start + len(window):
            ds = f[name]
            start, window = a, ds[a:min(ds.shape[0], max(b, a + self._ahead_rows))]
            self._ahead[name] = (start, window)
        return window[a - start:b - start]

    @contextmanager
    def sequential(self, rows: int = 1 << 18):
        """Within the block, the examples' arrays are read through a window of ``rows`` rows per dataset, read
        ahead: a pass over every example in order (a merge, a copy) makes a few large reads per dataset instead of
        one small read per example and dataset. Memory: one window per dataset read."""
        with self._lock:
            self._ahead, self._ahead_rows = {}, rows
        try:
            yield self
        finally:
            with self._lock:
                self._ahead = None

    def _json_attr(self, attrs, key: str, what: str, default=None):
        raw = attrs.get(key)
        if raw is None:
            return default
        try:
            return json.loads(raw)
        except (TypeError, ValueError) as err:
            raise damaged(self.path, what, err) from None

    # ------------------------------------------------------------------ header
    def _read_header(self) -> None:
        a = read_attrs(self._f)
        if a.get("encoding-type") != schema.ENCODING_TYPE:
            raise StoreError(f"'{self.path}' is not an attrscope store (no encoding-type '{schema.ENCODING_TYPE}'): "
                             "pass a file written by attr-compute")
        version = str(a.get("encoding-version", "0.0.0"))
        try:
            major, minor = (int(x) for x in version.split(".")[:2])
        except ValueError:
            raise StoreError(f"'{self.path}' has an unreadable store version '{version}'") from None
        if not schema.OLDEST_MAJOR <= major <= _MAJOR:
            raise StoreError(
                f"'{self.path}' is store format {version}; this attrscope reads formats {schema.OLDEST_MAJOR}.x to "
                f"{_MAJOR}.x: use an attrscope release that reads format {major}.x")
        self.format_version = version
        self._minor = minor
        if major == _MAJOR and minor > _MINOR:
            note = (f"'{self.path}' is store format {version}, newer than {schema.ENCODING_VERSION}: unknown parts are "
                    "ignored; upgrade attrscope to read them")
            self.warnings.append(note)
            warnings.warn(note, stacklevel=4)
        self.n_layers = int(a["n_layers"])
        self.n_heads = int(a["n_heads"])
        self.labels: dict[int, str] = {int(k): v for k, v in self._json_attr(a, "labels", "the labels").items()}
        self.num_labels = int(a["num_labels"])
        if self.num_labels != len(self.labels):
            raise damaged(self.path, "the labels", f"{len(self.labels)} names for {self.num_labels} labels")
        layouts = self._json_attr(a, "methods", "the method list")
        if not isinstance(layouts, list) or not all(_layout_ok(m) for m in layouts):
            raise damaged(self.path, "the method list", "a layout lacks its fields")
        self._method_layouts = {m["name"]: m for m in layouts if self._layout_known(m["name"])}
        self.methods: list[str] = list(self._method_layouts)
        task = self._json_attr(a, "task", "the task", schema.DEFAULT_TASK)
        if (not isinstance(task, dict) or not isinstance(task.get("name"), str)
                or not isinstance(task.get("options", {}), dict)):
            raise damaged(self.path, "the task", f"{task!r} is not {{\"name\": ..., \"options\": {{...}}}}")
        self.task: dict = {"name": task["name"], "options": dict(task.get("options") or {})}
        self.generation: bool = self.task["name"] == schema.GENERATE  # per-step arrays (format 2.0)
        if self.generation and not all(m.get("steps") for m in self._method_layouts.values()):
            raise damaged(self.path, "the method list", "a generation store's method without its per-step layout")
        f = self._f
        self._separate_ids = schema.IDS in f
        self._evidence = schema.TOKEN_EVIDENCE in f
        self._task_words = schema.TASK_WORDS in f
        self.heads: str = str(a.get("heads", "none"))  # per-head attention per example: none, cls (row) or all
        if self.heads not in schema.HEAD_MODES or (self.heads != "none") != (schema.HEADS in f):
            raise damaged(self.path, "the per-head attention", f"heads '{self.heads}' with"
                                                               f"{'' if schema.HEADS in f else 'out'} /{schema.HEADS}")
        self.heads_dtype: str | None = str(f[schema.HEADS].dtype) if self.heads != "none" else None
        self._flats = schema.store_datasets(
            separate_ids=self._separate_ids, task_words=self._task_words, evidence=self._evidence,
            layouts=list(self._method_layouts.values()), num_labels=self.num_labels, heads=self.heads,
            n_layers=self.n_layers, n_heads=self.n_heads, heads_dtype=self.heads_dtype or "",
            generation=self.generation)
        try:  # each per-example dataset's column in /examples/digests (1.6; none before)
            self._digest_col: dict[str, int] = {p: j for j, p in enumerate(columns(f) or ())}
        except (KeyError, ValueError, TypeError) as err:
            raise damaged(self.path, f"/{schema.DIGESTS}", err) from None

    def _layout_known(self, method: str) -> bool:
        """Whether this reader knows the layout version of ``method``'s group (a newer one: left out, with a warning)."""
        g = self._f.get(schema.method_group(method))
        version = int(g.attrs.get("layout-version", 1)) if g is not None else 1
        if version <= schema.METHOD_LAYOUT_VERSION:
            return True
        note = (f"'{self.path}': method '{method}' is stored in layout version {version}, newer than this attrscope's "
                f"{schema.METHOD_LAYOUT_VERSION}: it is left out; upgrade attrscope to read it")
        self.warnings.append(note)
        warnings.warn(note, stacklevel=5)
        return False

    @property
    def model_info(self) -> dict:
        """Model and library provenance (root attributes)."""
        out = {}
        for key, value in self._attrs().items():
            if key not in ("labels", "methods", "summary", "task", "heads"):
                out[key] = value
        return out

    def _attrs(self) -> dict:
        """The root attributes, read under the lock (refresh() may swap the file handle from another thread)."""
        with self._reading("the root attributes") as f:
            return read_attrs(f)

    @cached_property
    def config(self) -> dict:
        """The full run configuration that produced the store."""
        raw = self._read(schema.PROVENANCE, slice(None))
        try:
            return json.loads(bytes(raw).decode("utf-8"))
        except ValueError as err:
            raise damaged(self.path, "/provenance", err) from None

    @property
    def complete(self) -> bool:
        return bool(self._attrs().get("complete", False))

    @property
    def summary(self) -> dict | None:
        a = self._attrs()
        return self._json_attr(a, "summary", "the run summary") if a.get("summary") else None

    @property
    def task_name(self) -> str:
        """What the model is explained for: one of store.schema.TASKS ("classification" for stores before 1.4)."""
        return self.task["name"]

    @property
    def has_evidence(self) -> bool:
        """Whether the store has per-token evidence flags (made with --evidence-column)."""
        return self._evidence

    def method_info(self, name: str) -> dict:
        """Layout and parameters of a method: signed, n_layer_views, matrices, class_scores, description, params."""
        self._need_method(name)
        info = dict(self._method_layouts[name])
        with self._reading(f"/methods/{name}") as f:
            info["seconds"] = read_attrs(f[schema.METHODS][name]).get("seconds")
        return info

    def is_signed(self, name: str) -> bool:
        return bool(self.method_info(name)["signed"])

    # ------------------------------------------------------------------ committed rows
    def refresh(self, reopen: bool = False) -> int:
        """Pick up examples committed since the store was opened (or last refreshed). Returns the new length.
        ``reopen``: open the file again even when it is complete (a metric record added to it since, by eval).

        The file is reopened rather than refreshed dataset by dataset: h5py's Dataset.refresh() on several
        datasets of one file made later reads of the index return stale chunks (seen with h5py 3.16 / HDF5 1.14),
        and a fresh open is cheap and always sees the last flushed state."""
        with self._lock:
            if self._opened and (reopen or not self.complete):
                # Close first: a handle opened while another is still open shares its cached (stale) view.
                self._datasets = {}
                self._f.close()
                self._f = None
                self._f = open_for_reading(self.path)
            first, self._opened = not self._opened, True
            with self._reading("/examples/index") as f:
                n = int(f[schema.INDEX].shape[0])
            if n != self._n or first:
                self._check_extent(n)
                for blocks in (self._blocks, self._digest_blocks):  # the old partial block
                    blocks.pop((self._n - 1) // _BLOCK if self._n else 0, None)
                self._n = n
                self._ids = self._id_rows = None
            self._catalogue = None
            self._steps_runs = {}
            return n

    def _check_extent(self, n: int) -> None:
        """Every flat dataset reaches at least as far as the last committed row says, and in a complete store exactly
        that far, as do its metrics' values (a shortened index must not hide examples: O(1), at open and refresh)."""
        complete = self.complete
        extent = self._extent_of(n) if n else schema.Extent()
        with self._reading("the dataset lengths") as f:
            lengths = [(d.path, d.length(extent)) for d in self._flats]
            if self._digest_col:
                lengths.append((schema.DIGESTS, n))
            for path, need in lengths:
                have = f[path].shape[0] if path in f else -1
                if have < need or (complete and have != need):
                    raise damaged(self.path, f"/{path}", f"{max(have, 0)} entries where the {n} committed "
                                                          f"examples of the {'complete ' if complete else ''}store "
                                                          f"need {need}")
        if complete:
            self._check_metric_lengths(n, extent.steps)
        self._extent = extent

    def _check_metric_lengths(self, n: int, steps: int) -> None:
        """Each metric of a complete store has one value per committed example (and, where a generation store's
        record keeps them, one per generated token)."""
        for (method, name), (kind, where) in self._metric_catalogue().items():
            with self._reading(f"metric '{name}' of '{method}'") as f:
                have = int(where["n"]) if kind == "record" else int(f[f"{where}/values"].shape[0])
            if have != n:
                raise damaged(self.path, f"metric '{name}' of '{method}'", f"{have} values for the {n} examples "
                                                                           "of the complete store")
            run = self._metric_steps_run(method, name) if self.generation else None
            if run is not None and run[1] != steps:
                raise damaged(self.path, f"metric '{name}' of '{method}'", f"{run[1]} per-step values for the "
                                                                           f"{steps} generated tokens of the store")

    def _extent_of(self, n: int) -> schema.Extent:
        """The Extent of ``n`` committed rows, from the last of them."""
        last = self._index(slice(n - 1, n), 1)[0]
        t_end = int(last["tok_off"]) + int(last["n_tokens"])
        if int(last["n_tokens"]) < 1 or int(last["tok_off"]) < 0:
            raise damaged(self.path, "/examples/index", f"its last row has {int(last['n_tokens'])} tokens at "
                                                         f"{int(last['tok_off'])}")
        with self._reading("/tokens") as f:
            if f[schema.TOKEN_STR_OFF].shape[0] < t_end:
                raise damaged(self.path, "/tokens/str_off", "shorter than its committed rows")
        off = self._read(schema.TOKEN_STR_OFF, slice(t_end - 1, t_end), 1)
        ln = self._read(schema.TOKEN_STR_LEN, slice(t_end - 1, t_end), 1)
        return schema.extent_of_last_row(last, n, self._separate_ids, int(off[0]) + int(ln[0]))

    def _index(self, sel: slice, expect: int) -> np.ndarray:
        """Index rows in the current dtype (a row written before format 1.4 reads with the task fields' defaults)."""
        rows = self._read(schema.INDEX, sel, expect)
        try:
            return schema.current_rows(rows, self.num_labels)
        except (KeyError, ValueError, TypeError) as err:
            raise damaged(self.path, "/examples/index", f"rows of an unknown layout ({err})") from None

    def _blocked(self, blocks: OrderedDict, load, lo: int, hi: int) -> np.ndarray:
        """Rows [lo, hi) of a per-example dataset read in blocks of _BLOCK rows: ``load(a, z)`` reads rows [a, z),
        ``blocks`` keeps the last _BLOCKS_KEPT blocks read."""
        parts = []
        with self._lock:
            for b in range(lo // _BLOCK, (hi - 1) // _BLOCK + 1):
                rows = blocks.get(b)
                if rows is None:
                    rows = blocks[b] = load(b * _BLOCK, min((b + 1) * _BLOCK, self._n))
                    if len(blocks) > _BLOCKS_KEPT:
                        blocks.popitem(last=False)
                else:
                    blocks.move_to_end(b)
                parts.append(rows)
        out = np.concatenate(parts) if len(parts) > 1 else parts[0]
        first = (lo // _BLOCK) * _BLOCK
        return out[lo - first:hi - first]

    def _index_block(self, lo: int, hi: int) -> np.ndarray:
        """Index rows [lo, hi), checked against each other and against the row before."""
        start = max(lo - 1, 0)
        got = self._index(slice(start, hi), hi - start)
        self._check_rows(got, start)
        return got[lo - start:]

    def digest_rows(self, lo: int, hi: int) -> np.ndarray | None:
        """Rows [lo, hi) of /examples/digests ([hi - lo, K] CRC-32s, the columns of ``self._digest_col``; read in
        blocks), None for a store without digests (before format 1.6)."""
        if not self._digest_col:
            return None
        K = len(self._digest_col)
        return self._blocked(self._digest_blocks,
                             lambda a, z: self._read(schema.DIGESTS, slice(a, z), (z - a) * K).reshape(z - a, K),
                             lo, hi)

    def check_digests(self, path: str, lo: int, counts, values: np.ndarray) -> None:
        """``values`` of dataset ``path``, read as stored, are the runs of examples lo, lo + 1, ... (``counts`` rows
        each): StoreError naming the dataset and the first example whose bytes are not the ones written for it
        (data moved or replaced inside the file: two chunks swapped keep their own checksums). Nothing to check in
        a store without digests."""
        col = self._digest_col.get(path)
        if col is None or not len(counts):
            return
        want = self.digest_rows(lo, lo + len(counts))[:, col]
        bad = np.flatnonzero(crcs(values, counts) != want)
        if len(bad):
            raise damaged(self.path, f"/{path}", f"example {lo + int(bad[0])}'s bytes are not those written for it: "
                                                 "their digest differs (data moved or replaced in the file)")

    def _check_rows(self, r: np.ndarray, start: int) -> None:
        """Index rows [start, start + len(r)) agree with each other, the labels and the datasets' extent."""
        n = r["n_tokens"].astype(np.int64)
        tok, sq = r["tok_off"], r["sq_off"]
        steps, grid, T = r["step_off"], r["grid_off"], r["n_steps"].astype(np.int64)
        ok = (n >= 1).all() and (r["explain_pos"] >= 0).all() and (r["explain_pos"] < n).all()
        ok &= bool((np.diff(tok) == n[:-1]).all() and (np.diff(sq) == n[:-1] ** 2).all())
        ok &= bool((np.diff(steps) == T[:-1]).all() and (np.diff(grid) == (T * n)[:-1]).all())
        if start == 0:
            ok &= bool(tok[0] == 0 and sq[0] == 0 and steps[0] == 0 and grid[0] == 0)
        ok &= bool((steps + T <= self._extent.steps).all() and (grid + T * n <= self._extent.grid).all())
        C = self.num_labels
        ok &= bool(((r["label"] >= -1) & (r["target"] >= 0) & (r["target"] < C) & (r["flags"] <= 1)).all())
        ok &= bool((r["n_orig_tokens"] >= n).all())
        problem = schema.task_row_problem(r, self.task_name, C)
        if problem is not None:
            raise damaged(self.path, "/examples/index", f"row {start + problem[0]}: {problem[1]}")
        for key in ("id", "text", "pair"):
            ln = r[f"{key}_len"]
            ok &= bool((r[f"{key}_off"] >= 0).all() and (ln >= (-1 if key == "pair" else 0)).all())
            blob = "ids_bytes" if key == "id" and self._separate_ids else "string_bytes"
            ok &= bool((r[f"{key}_off"] + np.maximum(ln, 0) <= getattr(self._extent, blob)).all())
        ok &= bool((tok + n <= self._extent.tokens).all())
        ok &= bool(((r["task_off"] >= 0) & (r["task_len"] >= 0)).all())
        ok &= bool((r["task_off"] + r["task_len"] <= self._extent.task_bytes).all())
        if not ok:
            raise damaged(self.path, "/examples/index", f"rows {start}-{start + len(r) - 1} contradict each other")

    def index_rows(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Committed index rows [lo, hi) (structured array, fields in ``store.schema.index_dtype``)."""
        hi = self._n if hi is None else min(hi, self._n)
        lo = max(lo, 0)
        if hi <= lo:
            return np.zeros(0, dtype=schema.index_dtype(self.num_labels))
        return self._blocked(self._blocks, self._index_block, lo, hi)

    def index_column(self, field: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """One field of the index rows [lo, hi), e.g. "n_tokens" or "pred" (read in blocks)."""
        return np.array(self.index_rows(lo, hi)[field])

    @property
    def index(self) -> np.ndarray:
        """All committed index rows (reads the whole index: prefer index_rows / index_column for large stores)."""
        return self.index_rows(0, self._n)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> "Example":
        n = self._n
        if not isinstance(i, (int, np.integer)):
            raise TypeError("store indices must be integers; use by_id() for ids")
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"example {i} out of range: the store holds {n} examples")
        return Example(self, int(i), self.index_rows(int(i), int(i) + 1)[0])

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    # ------------------------------------------------------------------ ids and texts
    def _strings(self, path: str, offs: np.ndarray, lens: np.ndarray, what: str,
                 example: int | None = None) -> list[str | None]:
        """Decode the (offset, length) pieces of a byte dataset, reading the covering range once. ``example``: the
        pieces are all of that example's bytes in ``path``, checked against its digest."""
        if not len(offs):
            return []
        present = lens >= 0
        if not present.any():
            return [None] * len(offs)
        lo = int(offs[present].min())
        hi = int((offs + np.maximum(lens, 0))[present].max())
        raw = self._read(path, slice(lo, hi), hi - lo)
        if example is not None:
            self.check_digests(path, example, [hi - lo], raw)
        blob = bytes(raw)
        try:
            return [blob[o - lo:o - lo + n].decode("utf-8") if n >= 0 else None
                    for o, n in zip(offs.tolist(), lens.tolist())]
        except UnicodeDecodeError as err:
            raise damaged(self.path, what, err) from None

    def continuations_range(self, lo: int, hi: int) -> list[str]:
        """Generation: the continuations of examples [lo, hi), their generated tokens read as text (text.tokens_text;
        the store keeps no text of them); "" for an example without one and in other stores. Reads the examples'
        token strings once."""
        r = self.index_rows(lo, hi)
        if not self.generation or not len(r) or not int(r["n_steps"].sum()):
            return [""] * len(r)
        t0 = int(r["tok_off"][0])
        t1 = int(r["tok_off"][-1]) + int(r["n_tokens"][-1])
        offs = self._read(schema.TOKEN_STR_OFF, slice(t0, t1), t1 - t0)
        lens = self._read(schema.TOKEN_STR_LEN, slice(t0, t1), t1 - t0)
        firsts = r["tok_off"] - t0 + r["prompt_len"]
        ends = r["tok_off"] - t0 + r["n_tokens"]
        gen = np.concatenate([np.arange(a, b) for a, b in zip(firsts.tolist(), ends.tolist())])
        strings = self._strings(schema.TOKEN_STRINGS, offs[gen], lens[gen], "the token strings")
        cuts = np.cumsum(np.r_[0, ends - firsts]).tolist()
        return [tokens_text(strings[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]

    def _id_path(self) -> str:
        return schema.IDS if self._separate_ids else schema.STRINGS

    def scores_range(self, method: str, lo: int, hi: int) -> np.ndarray:
        """The final scores of examples [lo, hi), concatenated (example i's are ``n_tokens`` long; one read)."""
        self._need_method(method)
        rows = self.index_rows(lo, hi)
        if not len(rows):
            return np.zeros(0, dtype=np.float32)
        t0 = int(rows["tok_off"][0])
        t1 = int(rows["tok_off"][-1]) + int(rows["n_tokens"][-1])
        path = schema.method_path(method, "scores")
        out = self._read(path, slice(t0, t1), t1 - t0)
        self.check_digests(path, max(lo, 0), rows["n_tokens"], out)
        return out

    def ids_range(self, lo: int, hi: int) -> list[str]:
        """The ids of examples [lo, hi) (reads only their bytes)."""
        r = self.index_rows(lo, hi)
        return self._strings(self._id_path(), r["id_off"], r["id_len"], "the example ids")

    def texts_range(self, lo: int, hi: int) -> list[str]:
        """The texts of examples [lo, hi)."""
        r = self.index_rows(lo, hi)
        return self._strings(schema.STRINGS, r["text_off"], r["text_len"], "the example texts")

    def pairs_range(self, lo: int, hi: int) -> list[str]:
        """The pair texts of examples [lo, hi) (None for an example without one)."""
        r = self.index_rows(lo, hi)
        return self._strings(schema.STRINGS, r["pair_off"], r["pair_len"], "the pair texts")

    def ids(self) -> list[str]:
        """Every example id, in store order (read once per length; a store written before format 1.3 keeps its ids
        between the texts, so this reads those too)."""
        if self._ids is None:
            out = []
            for lo in range(0, self._n, 8 * _BLOCK):
                out += self.ids_range(lo, min(lo + 8 * _BLOCK, self._n))
            self._ids = out
        return self._ids

    def find_id(self, example_id: str) -> int | None:
        """Row of the example with this id (the first one), or None."""
        if self._id_rows is None:
            rows: dict[str, int] = {}
            for i, x in enumerate(self.ids()):
                rows.setdefault(x, i)
            self._id_rows = rows
        return self._id_rows.get(str(example_id))

    def by_id(self, example_id: str) -> "Example":
        i = self.find_id(example_id)
        if i is None:
            raise KeyError(f"no example with id '{example_id}' in the store")
        return self[i]

    def _need_method(self, name: str) -> None:
        if name not in self._method_layouts:
            raise KeyError(f"method '{name}' is not in the store; it holds: {', '.join(self.methods) or 'none'}")

    # ------------------------------------------------------------------ scale statistics
    def scale_stats(self, method: str, *, compute: bool = False, progress=None) -> dict[str, ViewScale] | None:
        """Scale of each view of ``method`` over the whole store ({"final": ..., "layer 1": ..., "matrix 1": ...}):
        the writer's (complete stores of format 1.3), else computed here when ``compute`` (a pass over the method's
        data, once; later calls only add examples committed since), else None. ``progress(done, total)``."""
        self._need_method(name := method)
        layout = self._method_layouts[name]
        views = schema.scale_views(layout)
        with self._reading(f"/methods/{name}/scale") as f:
            g = f[schema.METHODS][name]
            if "scale" in g and self.complete:
                acc = ScaleAccumulator(views, g["scale/summary"][()], g["scale/hist"][()])
                if acc.summary.shape[0] == len(views):
                    return acc.stats()
        if not compute:
            return None
        acc = self._scales.setdefault(name, ScaleAccumulator(views))
        start = self._scale_rows.get(name, 0)
        step = 256
        for lo in range(start, self._n, step):
            hi = min(lo + step, self._n)
            for i in range(lo, hi):
                ex = self[i]
                acc.add_example(layout, ex.view_arrays(name))
            self._scale_rows[name] = hi
            if progress is not None:
                progress(hi, self._n)
        return acc.stats()

    # ------------------------------------------------------------------ head masks
    @property
    def head_masks(self) -> list[str]:
        """Names of the stored head masks (Mask-LRP: "positional", "syntactic", "mask_lrp")."""
        with self._reading("/head_masks") as f:
            return list(f[schema.HEAD_MASKS]) if schema.HEAD_MASKS in f else []

    def head_mask(self, name: str) -> "HeadMask":
        """The [L, H] head mask ``name``; ``.attrs`` holds its settings and provenance, ``.stats`` the statistics
        it came from (counts, rates, thresholds)."""
        names = self.head_masks
        if name not in names:
            raise KeyError(f"head mask '{name}' is not in the store; it holds: {', '.join(names) or 'none'}")
        with self._reading(f"/head_masks/{name}") as f:
            g = f[schema.HEAD_MASKS][name]
            mask = g["mask"][()]
            stats = {k: g[k][()] for k in g if k != "mask"}
            attrs = self._json_attr(read_attrs(g), "settings", f"/head_masks/{name}", {})
        out = np.asarray(mask).view(HeadMask)
        out.attrs, out.stats = attrs, stats
        return out

    # ------------------------------------------------------------------ metrics
    def _metric_catalogue(self) -> dict[tuple[str, str], tuple]:
        """(method, metric) -> where it is: ("record", row) from /metric_records (a later record of the same pair
        replaces an earlier one) or ("group", path) for format 1.2's /metrics/<method>/<metric> groups. Small: one
        entry per metric, read once per open or refresh."""
        if self._catalogue is None:
            cat: dict[tuple[str, str], tuple] = {}
            with self._reading("/metrics") as f:
                if schema.METRICS in f:
                    for method, g in f[schema.METRICS].items():
                        for name in g:
                            cat[(method, name)] = ("group", schema.metric_path(method, name))
                if schema.METRIC_ROWS in f:
                    for row in f[schema.METRIC_ROWS][()]:
                        key = (row["method"].decode("utf-8"), row["metric"].decode("utf-8"))
                        cat.pop(key, None)  # re-inserted: the order of the latest record
                        cat[key] = ("record", row)
            self._catalogue = cat
        return self._catalogue

    @property
    def metric_methods(self) -> list[str]:
        """Methods that have faithfulness metrics in the store."""
        return list(dict.fromkeys(m for m, _ in self._metric_catalogue()))

    def _metric(self, method: str, name: str | None = None):
        cat = self._metric_catalogue()
        if method not in self.metric_methods:
            raise KeyError(f"no metrics for method '{method}' in the store; it has metrics for: "
                           f"{', '.join(self.metric_methods) or 'none'} (attr-compute eval STORE --metrics ...)")
        if name is not None and (method, name) not in cat:
            raise KeyError(f"metric '{name}' of '{method}' is not in the store; it has: "
                           f"{', '.join(self.metric_names(method))}")
        return cat.get((method, name))

    def metric_names(self, method: str) -> list[str]:
        """The metrics stored for ``method``."""
        self._metric(method)
        return [n for m, n in self._metric_catalogue() if m == method]

    def metric_values(self, method: str, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Per-example values [hi - lo] of one metric (NaN where it is undefined for an example)."""
        kind, where = self._metric(method, name)
        hi = self._n if hi is None else min(hi, self._n)
        lo = max(0, min(lo, hi))
        what = f"metric '{name}' of '{method}'"
        if kind == "group":
            out = self._read(f"{where}/values", slice(lo, hi))
        else:
            if int(where["n"]) != self._n:
                raise damaged(self.path, what, f"{int(where['n'])} values for {self._n} examples")
            off = int(where["values_off"])
            out = self._read(schema.METRIC_NUMBERS, slice(off + lo, off + hi))
        if out.shape != (hi - lo,):
            raise damaged(self.path, what, f"{out.shape[0]} values where {hi - lo} are needed")
        return out

    def _metric_steps_run(self, method: str, name: str) -> tuple[int, int, int] | None:
        """(offset into /metric_records/numbers, count, digest) of a record's values per step (a generation store's,
        format 2.1), from its text; None for a record without them (written before 2.1, or not per step)."""
        key = (method, name)
        if key not in self._steps_runs:
            kind, where = self._metric(method, name)
            what = f"metric '{name}' of '{method}'"
            info = self._metric_json(where, what).get("steps") if kind == "record" else None
            run = None
            if info is not None:
                try:
                    run = (int(info["off"]), int(info["n"]), int(info["digest"]))
                except (KeyError, TypeError, ValueError) as err:
                    raise damaged(self.path, what, f"its per-step values' place is unreadable ({err!r})") from None
            self._steps_runs[key] = run
        return self._steps_runs[key]

    def metric_steps(self, method: str, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray | None:
        """A generation store's values of one metric per generated token of the examples [lo, hi), in the store's
        step order (example i's T at its ``step_off``; NaN where the metric is undefined for a step), float32; None
        for a record without them (computed before format 2.1: attr-compute eval again keeps them).
        :meth:`metric_values` holds each example's mean over its steps. ValueError for a store of another task."""
        if not self.generation:
            raise ValueError(f"'{self.path}' is a {self.task_name} store: it has no generated tokens")
        run = self._metric_steps_run(method, name)
        if run is None:
            return None
        hi = self._n if hi is None else min(hi, self._n)
        lo = max(0, min(lo, hi))
        if lo == hi:
            return np.zeros(0, np.float32)
        first, last = self.index_rows(lo, lo + 1)[0], self.index_rows(hi - 1, hi)[0]
        a, b = int(first["step_off"]), int(last["step_off"]) + int(last["n_steps"])
        if b > run[1]:
            raise damaged(self.path, f"metric '{name}' of '{method}'", f"{run[1]} per-step values where the "
                                                                       f"examples need {b}")
        return self._read(schema.METRIC_NUMBERS, slice(run[0] + a, run[0] + b), b - a)

    def metrics(self, method: str) -> dict[str, np.ndarray]:
        """{metric name: per-example values [N]} of ``method`` (NaN where a metric is undefined for an example);
        row i belongs to store[i]. Summaries and settings: :meth:`metric_summaries`, :meth:`metric_info`."""
        return {name: self.metric_values(method, name) for name in self.metric_names(method)}

    def _metric_text(self, method: str, name: str) -> dict:
        kind, where = self._metric(method, name)
        what = f"metric '{name}' of '{method}'"
        if kind == "group":
            with self._reading(what) as f:
                a = read_attrs(f[where])
            return {"settings": self._json_attr(a, "settings", what, {}),
                    "summary": self._json_attr(a, "summary", what, {}),
                    "higher_is_better": bool(a.get("higher_is_better", True)),
                    "description": str(a.get("description", ""))}
        info = self._metric_json(where, what)
        try:
            return {"settings": dict(info["settings"]), "summary": dict(info["summary"]),
                    "higher_is_better": bool(info["higher_is_better"]), "description": str(info["description"])}
        except (ValueError, KeyError, TypeError) as err:
            raise damaged(self.path, what, err) from None

    def _metric_json(self, row, what: str) -> dict:
        off, ln = int(row["text_off"]), int(row["text_len"])
        raw = self._read(schema.METRIC_TEXT, slice(off, off + ln), ln)
        try:
            info = json.loads(bytes(raw).decode("utf-8"))
        except ValueError as err:
            raise damaged(self.path, what, err) from None
        if not isinstance(info, dict):
            raise damaged(self.path, what, "its text is not a mapping")
        return info

    def check_metric_digest(self, method: str, name: str) -> None:
        """A metric record's numbers (values, curves, levels, one run) are the ones written for it: StoreError
        naming the metric otherwise. Nothing to check for a record without a digest (before 1.6) or format 1.2's
        metric groups."""
        kind, where = self._metric(method, name)
        what = f"metric '{name}' of '{method}'"
        digest = self._metric_json(where, what).get("digest") if kind == "record" else None
        if digest is None:
            return
        n, k = int(where["n"]), int(where["k"])
        size = n + n * k * sum(int(where[f"{key}_off"]) >= 0 for key in ("curves", "levels"))
        off = int(where["values_off"])
        numbers = self._read(schema.METRIC_NUMBERS, slice(off, off + size), size)
        if int(crcs(numbers, [size])[0]) != digest:
            raise damaged(self.path, what, "its numbers are not those written for it: their digest differs (data "
                                           "moved or replaced in the file)")
        run = self._metric_steps_run(method, name) if self.generation else None
        if run is not None:
            steps = self._read(schema.METRIC_NUMBERS, slice(run[0], run[0] + run[1]), run[1])
            if int(crcs(steps, [run[1]])[0]) != run[2]:
                raise damaged(self.path, what, "its per-step values are not those written for it: their digest "
                                               "differs (data moved or replaced in the file)")

    def metric_info(self, method: str, name: str) -> dict:
        """settings, summary, higher_is_better, description, the per-level curves and levels [N, K] (or None), and
        a generation store's values per step [S] (:meth:`metric_steps`; None where not kept or in another store)."""
        out = self._metric_text(method, name)
        out["steps"] = self.metric_steps(method, name) if self.generation else None
        kind, where = self._metric(method, name)
        if kind == "group":
            with self._reading(f"metric '{name}' of '{method}'") as f:
                g = f[where]
                out["curves"] = g["curves"][()] if "curves" in g else None
                out["levels"] = g["levels"][()] if "levels" in g else None
            return out
        n, k = int(where["n"]), int(where["k"])
        for key, dtype in (("curves", np.float32), ("levels", np.int32)):
            off = int(where[f"{key}_off"])
            out[key] = None if off < 0 else self._read(schema.METRIC_NUMBERS, slice(off, off + n * k),
                                                       n * k).reshape(n, k).astype(dtype)
        return out

    def metric_mean_curve(self, method: str, name: str, chunk: int = 8192) -> tuple[np.ndarray | None,
                                                                                     np.ndarray | None]:
        """The mean over the examples of a metric's per-level curves [K] (NaN where no example has a point) and of
        their levels (-1 padding left out), read ``chunk`` examples at a time: memory does not grow with the
        store. (None, None) for a metric without curves."""
        kind, where = self._metric(method, name)
        if kind == "group":
            with self._reading(f"metric '{name}' of '{method}'") as f:
                g = f[where]
                if "curves" not in g:
                    return None, None
                n, k = g["curves"].shape

                def rows(key, r0, r1):
                    return g[key][r0:r1] if key in g else None

                return _chunked_means(n, k, chunk, rows)
        n, k = int(where["n"]), int(where["k"])
        offs = {key: int(where[f"{key}_off"]) for key in ("curves", "levels")}
        if offs["curves"] < 0:
            return None, None

        def rows(key, r0, r1):
            off = offs[key]
            if off < 0:
                return None
            return self._read(schema.METRIC_NUMBERS, slice(off + r0 * k, off + r1 * k), (r1 - r0) * k).reshape(-1, k)

        return _chunked_means(n, k, chunk, rows)

    def metric_summaries(self, method: str) -> dict[str, dict]:
        """{metric name: {"summary": ..., "settings": ..., "higher_is_better": ..., "description": ...}} of
        ``method`` (no per-example arrays)."""
        out = {}
        for name in self.metric_names(method):
            t = self._metric_text(method, name)
            out[name] = {"summary": t["summary"], "settings": t["settings"], "higher_is_better": t["higher_is_better"],
                         "description": t["description"]}
        return out

    # ------------------------------------------------------------------ tables
    def token_table(self, methods: list[str] | None = None, *, layers: bool = False, lo: int = 0,
                    hi: int | None = None) -> dict[str, np.ndarray]:
        """One row per example x token x method of the examples [lo, hi) as numpy columns: example, id, position,
        token, label (-1: none), pred, method, score, and with ``layers`` layer_1..layer_V."""
        from .table import token_columns

        hi = self._n if hi is None else min(hi, self._n)
        return token_columns(self, list(methods or self.methods), layers, max(lo, 0), hi)

    def iter_token_tables(self, methods: list[str] | None = None, *, layers: bool = False, chunk: int = 2048):
        """:meth:`token_table` of ``chunk`` examples at a time (bounded memory for any store size); the chunks
        concatenate to the whole table."""
        for lo in range(0, self._n, max(chunk, 1)):
            yield self.token_table(methods, layers=layers, lo=lo, hi=lo + max(chunk, 1))

    def to_pandas(self, methods: list[str] | None = None, *, layers: bool = False, lo: int = 0, hi: int | None = None):
        """:meth:`token_table` as a pandas DataFrame (``pip install pandas``)."""
        import pandas as pd

        return pd.DataFrame(self.token_table(methods, layers=layers, lo=lo, hi=hi))

    def metric_table(self, methods: list[str] | None = None, *, lo: int = 0, hi: int | None = None
                     ) -> dict[str, np.ndarray]:
        """One row per example x method of the examples [lo, hi), ordered example -> method, a column per metric
        (NaN where a method lacks it): example, id, method, ... Methods without metrics are left out. A generation
        store's: example, id, step, target, method, ...: per example its mean (step -1, target "") and then each
        step's value with its generated token (NaN where a record keeps none), ordered example -> step -> method."""
        from .table import metric_columns

        return metric_columns(self, methods, lo, hi)

    def iter_metric_tables(self, methods: list[str] | None = None, *, chunk: int = 2048):
        """:meth:`metric_table` of ``chunk`` examples at a time; the chunks concatenate to the whole table."""
        for lo in range(0, self._n, max(chunk, 1)):
            yield self.metric_table(methods, lo=lo, hi=lo + max(chunk, 1))

    def metrics_to_pandas(self, methods: list[str] | None = None):
        """:meth:`metric_table` as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.metric_table(methods))

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        with self._lock:
            self._datasets = {}
            if self._f is not None:
                try:
                    self._f.close()
                except _READ_ERRORS:
                    pass  # a damaged file may fail to close cleanly; the handle is gone either way
                self._f = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"<Store {self.path!r}: {len(self)} examples, methods {self.methods}>"

    def _repr_html_(self) -> str:
        """A notebook's view: the store's facts and its first examples (store/render_html.py)."""
        from .render_html import store_html  # a notebook's only: the TUI and compute never import it

        return store_html(self)


def _layout_ok(m) -> bool:
    """A method layout as the writer records it (a damaged JSON attribute may parse but lack or twist a field)."""
    try:
        return (isinstance(m["name"], str) and isinstance(m["signed"], bool) and int(m["n_layer_views"]) >= 0
                and m["matrices"] in schema.MATRIX_MODES and int(m["n_matrix_layers"]) >= 0
                and isinstance(m["class_scores"], bool) and all(isinstance(k, str) for k in m.get("example_values", ()))
                and isinstance(m.get("params", {}), dict) and isinstance(m.get("steps", False), bool))
    except (KeyError, TypeError, ValueError):
        return False


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

    def _repr_html_(self) -> str:
        """A notebook's view: every method's tokens coloured as the TUI and its exported figures colour them."""
        from .render_html import example_html

        return example_html(self)

    # metadata ------------------------------------------------------------------
    def _string(self, path: str, keys: tuple[str, ...], what: str) -> list[str | None]:
        return self._s._strings(path, np.array([self._row[f"{k}_off"] for k in keys]),
                                np.array([self._row[f"{k}_len"] for k in keys]), what, self.index)

    def _read(self, path: str, sel: slice, size: int) -> np.ndarray:
        """This example's run of ``path`` (all of it), read and checked against its digest."""
        out = self._s._read(path, sel, size)
        self._s.check_digests(path, self.index, [len(out)], out)
        return out

    @cached_property
    def id(self) -> str:
        return self._string(self._s._id_path(), ("id",), "the example ids")[0]

    @cached_property
    def _texts(self) -> list[str | None]:
        return self._string(schema.STRINGS, ("text", "pair"), "the example texts")  # one run: checked together

    @property
    def text(self) -> str:
        return self._texts[0]

    @property
    def pair(self) -> str | None:
        return self._texts[1]

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

    # the task (format 1.4; older stores read as classification examples) ----------
    @property
    def target_token(self) -> int:
        """Language model tasks: token id of the explained target word (-1 otherwise)."""
        return int(self._row["target_token"])

    @property
    def foil_token(self) -> int:
        """Language model tasks: token id of the foil word (-1: no foil)."""
        return int(self._row["foil_token"])

    @property
    def span_end(self) -> int:
        """qa: end position of the explained answer span, whose start is explain_pos (-1 otherwise)."""
        return int(self._row["span_end"])

    @property
    def pred_end(self) -> int:
        """qa: end position of the model's predicted span, whose start is pred (-1 otherwise)."""
        return int(self._row["pred_end"])

    @property
    def output(self) -> float:
        """The explained output of the unperturbed model (NaN in stores before format 1.4)."""
        return float(self._row["output"])

    @property
    def gold_value(self) -> float | None:
        """Regression: the gold value (None: unlabelled, or another task)."""
        v = float(self._row["gold_value"])
        return None if np.isnan(v) else v

    @cached_property
    def task_words(self) -> dict:
        """The example's task words as stored: {"target": .., "foil": ..} (language model tasks), {"answer": ..} (qa),
        {} for none."""
        off, ln = int(self._row["task_off"]), int(self._row["task_len"])
        if ln == 0:
            return {}
        raw = self._read(schema.TASK_WORDS, slice(off, off + ln), ln)
        try:
            words = json.loads(bytes(raw).decode("utf-8"))
        except ValueError as err:
            raise damaged(self._s.path, "/examples/task", err) from None
        if not isinstance(words, dict):
            raise damaged(self._s.path, "/examples/task", f"example {self.index}'s words are not a mapping")
        return words

    @property
    def task_info(self) -> dict:
        """What the example explains, for every task: task (its name), target_token, foil_token, target_word,
        foil_word, prefers_target (output > 0 where there is a foil, else None), output, gold_value (None if none),
        span (the explained qa span (start, end), else None), pred_span (the predicted qa span, else None) and
        answer (qa's answer text, else None)."""
        task = self._s.task_name
        words = self.task_words
        output = self.output
        qa = task == "qa"
        return {
            "task": task,
            "target_token": self.target_token,
            "foil_token": self.foil_token,
            "target_word": words.get("target"),
            "foil_word": words.get("foil"),
            "prefers_target": bool(output > 0) if self.foil_token >= 0 and np.isfinite(output) else None,
            "output": output,
            "gold_value": self.gold_value,
            "span": (self.explain_pos, self.span_end) if qa else None,
            "pred_span": (self.pred, self.pred_end) if qa else None,
            "answer": words.get("answer"),
        }

    # tokens --------------------------------------------------------------------
    def _tokens_of(self, name: str) -> np.ndarray:
        return self._read(name, self._tok, self.n_tokens * (2 if name == schema.TOKEN_SPANS else 1))

    @cached_property
    def token_ids(self) -> np.ndarray:
        return self._tokens_of(schema.TOKEN_IDS)

    @cached_property
    def tokens(self) -> list[str]:
        off = self._tokens_of(schema.TOKEN_STR_OFF)
        lens = self._tokens_of(schema.TOKEN_STR_LEN)
        if (lens < 0).any() or (np.diff(off) != lens[:-1]).any():
            raise damaged(self._s.path, "/tokens/str_off", f"token strings of example {self.index} overlap")
        return self._s._strings(schema.TOKEN_STRINGS, off, lens, "the token strings", self.index)

    @cached_property
    def spans(self) -> np.ndarray:
        return self._tokens_of(schema.TOKEN_SPANS)

    @cached_property
    def segment(self) -> np.ndarray:
        return self._tokens_of(schema.TOKEN_SEGMENT)

    # attributions -----------------------------------------------------------------
    @property
    def evidence(self) -> np.ndarray | None:
        """[n] bool: evidence / answer tokens (stores made with --evidence-column), else None."""
        if not self._s.has_evidence:
            return None
        return self._tokens_of(schema.TOKEN_EVIDENCE).astype(bool)

    def _method(self, name: str) -> dict:
        self._s._need_method(name)
        return self._s._method_layouts[name]

    def scores(self, method: str, step: int | None = None) -> np.ndarray:
        """Final attribution [n]; in a generation store that of generated token ``step`` (0-based; required), NaN
        from its position on (the row of :meth:`step_scores`)."""
        if self._step_arg(method, step) is not None:
            return self.step_scores(method)[step]
        return self._read(schema.method_path(method, "scores"), self._tok, self.n_tokens)

    def layer_scores(self, method: str, step: int | None = None) -> np.ndarray | None:
        """Per-layer view [V, n] (e.g. the CLS row of the rollout up to layer l), or None for methods without one;
        in a generation store that of generated token ``step`` (required)."""
        v = int(self._method(method)["n_layer_views"])
        if self._step_arg(method, step) is not None:
            return None if not v else self.step_layer_scores(method)[step]
        if not v:
            return None
        start, size = self._tok.start * v, v * self.n_tokens
        return self._read(schema.method_path(method, "layer_scores"), slice(start, start + size),
                          size).reshape(v, self.n_tokens)

    # generation (format 2.0) ------------------------------------------------------------------
    @property
    def prompt_len(self) -> int:
        """Generation: the prompt's tokens (the first ``prompt_len`` of :attr:`tokens`); -1 in other stores."""
        return int(self._row["prompt_len"])

    @property
    def n_steps(self) -> int:
        """Generation: the generated tokens T (``tokens[prompt_len:]``; 0 when EOS came first); 0 in other stores."""
        return int(self._row["n_steps"])

    def step_position(self, step: int) -> int:
        """The position of generated token ``step`` in :attr:`tokens`; its row's attributions are the cells before."""
        if not 0 <= step < self.n_steps:
            raise IndexError(f"step {step} out of range: example {self.index} has {self.n_steps} generated tokens")
        return self.prompt_len + step

    @property
    def generated_ids(self) -> np.ndarray:
        """[T] the generated token ids."""
        return self.token_ids[self.n_tokens - self.n_steps:]

    @property
    def generated_tokens(self) -> list[str]:
        """The T generated token strings (a step's target)."""
        return self.tokens[self.n_tokens - self.n_steps:]

    def _steps_of(self, path: str) -> np.ndarray:
        if not self._s.generation:
            raise ValueError(f"'{self._s.path}' is a {self._s.task_name} store: it has no generated tokens")
        off = int(self._row["step_off"])
        return self._read(path, slice(off, off + self.n_steps), self.n_steps)

    @property
    def step_probs(self) -> np.ndarray:
        """[T] p(generated token t) at its step."""
        return self._steps_of(schema.STEP_PROBS)

    @property
    def step_outputs(self) -> np.ndarray:
        """[T] the explained output of each step (target logit, or target minus foil logit; NaN: not recorded)."""
        return self._steps_of(schema.STEP_OUTPUT)

    @property
    def step_foil_tokens(self) -> np.ndarray:
        """[T] each step's foil token id (--contrast), -1 without one."""
        return self._steps_of(schema.STEP_FOIL_IDS)

    @property
    def step_foil_probs(self) -> np.ndarray:
        """[T] p(foil) at each step, NaN without one."""
        return self._steps_of(schema.STEP_FOIL_PROBS)

    @property
    def step_foil_words(self) -> list[str | None]:
        """Each step's foil as a string (the task words' "foils"; None without one)."""
        foils = list(self.task_words.get("foils") or [])
        return (foils + [None] * self.n_steps)[:self.n_steps]

    def _grid(self, method: str, key: str, views: int) -> np.ndarray:
        T, n = self.n_steps, self.n_tokens
        start, size = int(self._row["grid_off"]) * views, T * views * n
        out = self._read(schema.method_path(method, key), slice(start, start + size), size)
        return out.reshape((T, n) if key == schema.STEP_SCORES else (T, views, n))

    def step_scores(self, method: str) -> np.ndarray:
        """Generation: [T, n], row t the attribution of generated token t over every token before it (cells from its
        position ``prompt_len + t`` on are NaN)."""
        self._need_steps(method)
        return self._grid(method, schema.STEP_SCORES, 1)

    def step_layer_scores(self, method: str) -> np.ndarray | None:
        """Generation: [T, V, n] the per-layer views of every step (NaN from each step's position on), or None for
        a method without them."""
        self._need_steps(method)
        v = int(self._method(method)["n_layer_views"])
        return self._grid(method, schema.STEP_LAYER_SCORES, v) if v else None

    def _need_steps(self, method: str) -> None:
        if not self._method(method).get("steps"):
            raise ValueError(f"'{self._s.path}' is a {self._s.task_name} store: its methods have no per-step arrays")

    def _step_arg(self, method: str, step: int | None) -> int | None:
        """``step`` checked against the store: required in a generation store (in range), refused in others."""
        steps = bool(self._method(method).get("steps"))
        if steps and step is None:
            raise ValueError(f"'{self._s.path}' is a generation store: its attributions are per generated token, "
                             "pass step=")
        if not steps and step is not None:
            raise ValueError(f"'{self._s.path}' is a {self._s.task_name} store: it has no steps")
        if step is not None:
            self.step_position(step)
        return step

    def view_arrays(self, method: str) -> dict[str, np.ndarray]:
        """The arrays of the method's views as the writer stores them (store.scale.view_keys)."""
        read = {"scores": self.scores, "layer_scores": self.layer_scores, "matrices": self.matrices,
                schema.STEP_SCORES: self.step_scores, schema.STEP_LAYER_SCORES: self.step_layer_scores}
        return {key: read[key](method) for key, _ in view_keys(self._method(method))}

    def matrices(self, method: str) -> np.ndarray | None:
        """Per-layer token-to-token matrices as float32: [L, n, n] (``--matrices all``), [L, 1, n] (only the row
        of the explained position, ``--matrices cls``), or None when the store keeps none for this method."""
        lay = self._method(method)
        mode, L, n = lay["matrices"], int(lay["n_matrix_layers"]), self.n_tokens
        if mode == "none":
            return None
        rows = n if mode == "all" else 1
        start = (int(self._row["sq_off"]) if mode == "all" else self._tok.start) * L
        size = L * rows * n
        m = self._read(schema.method_path(method, "matrices"), slice(start, start + size), size)
        return m.astype(np.float32).reshape(L, rows, n)

    def matrix_shape(self, method: str) -> tuple[int, int, int] | None:
        """(layers, rows, n) of :meth:`matrices` without reading them: rows n (``--matrices all``) or 1; None when
        the store keeps none for this method."""
        lay = self._method(method)
        if lay["matrices"] == "none":
            return None
        n = self.n_tokens
        return int(lay["n_matrix_layers"]), n if lay["matrices"] == "all" else 1, n

    def matrix_rows(self, method: str, layer: int, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of layer ``layer``'s matrix as float32 [stop - start, n], one read: a band of an n x n
        for a reader that never holds a whole one (the TUI's matrix screen at thousands of tokens). A band is not
        checked against the example's digest, which covers its whole run (:meth:`matrices` is; verify() reads
        every run)."""
        shape = self.matrix_shape(method)
        if shape is None:
            raise ValueError(f"'{self._s.path}' keeps no matrices of {method}")
        L, rows, n = shape
        if not (0 <= layer < L and 0 <= start <= stop <= rows):
            raise IndexError(f"rows {start}-{stop} of layer {layer} out of range: the matrices are [{L}, {rows}, {n}]")
        base = (int(self._row["sq_off"]) if self._method(method)["matrices"] == "all" else self._tok.start) * L
        first = base + (layer * rows + start) * n
        size = (stop - start) * n
        m = self._s._read(schema.method_path(method, "matrices"), slice(first, first + size), size)
        return m.astype(np.float32).reshape(stop - start, n)

    def heads(self) -> np.ndarray | None:
        """The model's per-head attention probabilities as float32 (stores made with ``attr-compute --heads``):
        [L, H, n, n] (``--matrices all``) or the explained row [L, H, n] (``--matrices cls``); None, reading
        nothing, when the store keeps none."""
        mode, L, H, n = self._s.heads, self._s.n_layers, self._s.n_heads, self.n_tokens
        if mode == "none":
            return None
        rows = n if mode == "all" else 1
        start = (int(self._row["sq_off"]) if mode == "all" else self._tok.start) * L * H
        size = L * H * rows * n
        a = self._read(schema.HEADS, slice(start, start + size), size).astype(np.float32)
        return a.reshape(L, H, n, n) if mode == "all" else a.reshape(L, H, n)

    def head_matrix(self, layer: int, head: int) -> np.ndarray | None:
        """One head's attention matrix [n, n] as float32 (0-based ``layer`` and ``head``), reading only that head's
        n x n block, not the example's L x H of them; None, reading nothing, unless the store keeps every head's full
        matrix (``--heads --matrices all``). A part of an example's run cannot be checked against its digest (which
        covers all its heads): the block's chunks are checked by their checksums; heads() and verify check the
        digest."""
        mode, L, H, n = self._s.heads, self._s.n_layers, self._s.n_heads, self.n_tokens
        if mode != "all":
            return None
        if not (0 <= layer < L and 0 <= head < H):
            raise IndexError(f"head L{layer + 1} H{head + 1} out of range: the store has {L} layers x {H} heads")
        size = n * n
        start = int(self._row["sq_off"]) * L * H + (layer * H + head) * size
        return self._s._read(schema.HEADS, slice(start, start + size), size).astype(np.float32).reshape(n, n)

    def head_rows(self) -> np.ndarray | None:
        """The explained position's row of every head's attention, [L, H, n] float32, in either mode (all: cut
        from the full matrices); None, reading nothing, when the store keeps no per-head attention."""
        a = self.heads()
        if a is None or a.ndim == 3:
            return a
        return np.ascontiguousarray(a[:, :, self.explain_pos, :])

    def class_scores(self, method: str) -> np.ndarray | None:
        """Per-class attributions [C, n] (``--target all``), or None."""
        if not self._method(method)["class_scores"]:
            return None
        C = self._s.num_labels
        start, size = self._tok.start * C, C * self.n_tokens
        return self._read(schema.method_path(method, "class_scores"), slice(start, start + size),
                          size).reshape(C, self.n_tokens)

    def example_values(self, method: str, step: int | None = None) -> dict[str, float]:
        """The method's per-example scalars, e.g. {"ig_delta": ...} for integrated gradients ({} for most methods);
        in a generation store those of generated token ``step`` (required)."""
        lay = self._method(method)
        if self._step_arg(method, step) is not None:
            return {key: float(values[step]) for key, values in self.step_values(method).items()}
        return {key: float(self._read(schema.method_path(method, f"example_values/{key}"),
                                      slice(self.index, self.index + 1), 1)[0])
                for key in lay.get("example_values", ())}

    def step_metric(self, method: str, name: str) -> np.ndarray | None:
        """Generation: the value of metric ``name`` of ``method`` at each step, [T] float32 (NaN where undefined),
        whose mean is the store's metric value of this example; None where the store keeps no per-step values of it
        (computed before format 2.1). KeyError for a metric the store lacks."""
        return self._s.metric_steps(method, name, self.index, self.index + 1)

    def step_values(self, method: str) -> dict[str, np.ndarray]:
        """Generation: the method's per-step scalars, {key: [T]}."""
        self._need_steps(method)
        return {key: self._steps_of(schema.method_path(method, f"example_values/{key}"))
                for key in self._method(method).get("example_values", ())}

    def __repr__(self) -> str:
        return f"<Example {self.index} id={self.id!r} n_tokens={self.n_tokens} label={self.label} pred={self.pred}>"


def _chunked_means(n: int, k: int, chunk: int, rows) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Column means of the finite curve values and of the non-negative levels of [n, k] arrays read by
    ``rows(key, r0, r1)`` in chunks of rows."""
    if not n or not k:
        return None, None
    c_sum, c_cnt = np.zeros(k), np.zeros(k)
    l_sum, l_cnt = np.zeros(k), np.zeros(k)
    has_levels = False
    for r0 in range(0, n, max(chunk, 1)):
        r1 = min(n, r0 + max(chunk, 1))
        c = np.asarray(rows("curves", r0, r1), dtype=np.float64)
        ok = np.isfinite(c)
        c_sum += np.where(ok, c, 0.0).sum(axis=0)
        c_cnt += ok.sum(axis=0)
        lv = rows("levels", r0, r1)
        if lv is not None:
            has_levels = True
            lv = np.asarray(lv, dtype=np.float64)
            ok = lv >= 0
            l_sum += np.where(ok, lv, 0.0).sum(axis=0)
            l_cnt += ok.sum(axis=0)
    curve = np.where(c_cnt > 0, c_sum / np.maximum(c_cnt, 1), np.nan)
    levels = np.where(l_cnt > 0, l_sum / np.maximum(l_cnt, 1), np.nan) if has_levels else None
    return curve, levels
