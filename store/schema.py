"""The one place that knows the on-disk layout of an attrscope store (HDF5): paths, dtypes, chunking, filters, and
how long every flat dataset is after a given committed example. The writer, its resume copy and the reader all
derive their datasets from here. docs/store.md documents it for users.

Layout (format 2.1; 1.1 added /head_masks, 1.2 /metrics, 1.3 checksums, /examples/ids and /methods/<m>/scale, 1.4
the task: root attr task, the index's task fields and /examples/task, 1.5 the per-head attention: root attr heads,
/heads/attention, 1.6 /examples/digests, 2.0 generation: the index's step fields, /steps, step_scores, 2.1 a
generation store's metric values per step):

    /                      attrs: encoding-type, encoding-version, model and library provenance, n_layers, n_heads,
                           labels (JSON), methods (JSON list), complete (bool), summary (JSON, once complete),
                           task (JSON {"name", "options"}, 1.4; absent: classification), heads ("cls" | "all",
                           1.5; absent: no per-head attention)
    /provenance            uint8   full run configuration as UTF-8 JSON (attributes are limited to 64 KiB)
    /examples/index        compound rows, one per committed example (index_dtype); appending them is the commit
    /examples/digests      uint32  [N, K] per example, the CRC-32 of its bytes in each of the K per-example datasets
                                   named by the attr ``datasets`` (JSON list, in column order) (1.6)
    /examples/ids          uint8   example ids, UTF-8, addressed by (id_off, id_len) of the index row (1.3; before
                                   1.3 the ids lived in /examples/strings beside the texts)
    /examples/strings      uint8   texts and pair texts, UTF-8, addressed by (text_off, text_len), (pair_off, pair_len)
    /examples/task         uint8   per-example task words as UTF-8 JSON ({"target": .., "foil": ..} for the language
                                   model tasks, {"answer": ..} for qa; {} is stored as nothing), addressed by
                                   (task_off, task_len) of the index row (1.4)
    /tokens/ids            int32   [T]     token ids of all committed examples, concatenated
    /tokens/spans          int32   [T, 2]  character span of each token in its segment's text, (-1, -1) for specials
    /tokens/segment        int8    [T]     0 = text, 1 = pair, -1 = special token
    /tokens/str_off        int64   [T]     offset of each token string in /tokens/strings
    /tokens/str_len        int32   [T]
    /tokens/strings        uint8           token strings (tokenizer's convert_ids_to_tokens), UTF-8
    /tokens/evidence       uint8   [T]     1 on evidence / answer tokens (only in stores made with --evidence-column)
    /methods/<name>               attrs: encoding-type, layout-version (METHOD_LAYOUT_VERSION), signed, ...
    /methods/<name>/scores        float32 [T]            final attribution, aligned with the tokens
    /methods/<name>/layer_scores  float32 [T * V]        per example a [V, n] block (V = n_layer_views)
    /methods/<name>/matrices      --store-dtype          per example [L, n, n] ("all") or [L, 1, n] ("cls")
    /methods/<name>/class_scores  float32 [T * C]        per example a [C, n] block (--target all)
    /methods/<name>/example_values/<key>  float32 [N]   one scalar per example (integrated gradients: "ig_delta"),
                                                          in a generation store one per step [S]
    /methods/<name>/step_scores   float32 [G]            generation (2.0): per example a [T, n] block at grid_off, row t
                                                          the attribution of the token generated at step t (position
                                                          prompt_len + t) over the tokens before it, NaN from there on
    /methods/<name>/step_layer_scores float32 [G * V]    generation: per example a [T, V, n] block (NaN as above)
    /steps/probs, output, foil_ids, foil_probs   [S]     generation: per step p(token), the explained output, the
                                                          foil (-1: none) and p(foil) (NaN: none), at step_off
    /methods/<name>/scale/summary float64 [K, 6]         per view (final, layer 1..V, matrix layer 1..L): count, min,
    /methods/<name>/scale/hist    int64   [K, B]         max, max |x|, sum, sum of squares; histogram of |x| (1.3,
                                                          written when the store is complete)
    /heads/attention       --store-dtype  per-head attention probabilities of the model (attr-compute --heads, 1.5):
                                          per example [L, H, n, n] (heads "all", at sq_off * L * H) or the explained
                                          row [L, H, n] (heads "cls", at tok_off * L * H)
    /head_masks/<name>/mask       [L, H]                 Mask-LRP head masks ("positional", "syntactic", "mask_lrp");
    /head_masks/<name>/<stat>                            the statistics they came from; settings JSON in attrs
    /metric_records/rows      compound, one per metric record (method, metric, N, K, offsets into numbers and
                                 text); appending the row commits the record, a later record of the same (method,
                                 metric) replaces an earlier one (format 1.3)
    /metric_records/numbers   float32  each record's values [N], curves [N, K] and levels [N, K] (exact up to 2**24),
                                 and in a generation store its values per step [S] (2.1), at step_off per example
    /metric_records/text      uint8    each record's settings, summary, direction and description as UTF-8 JSON
    /metrics/<method>/<name>/values   float32 [N]        format 1.2's metric groups (still read; curves, levels
                                                          [N, K]; settings and summary JSON in attrs)

Every ragged array is flat with offsets derived from the index row (tok_off, n_tokens, sq_off), so every dataset has a
fixed dtype and only grows by appends, which is what HDF5's single-writer/multiple-reader (SWMR) mode allows.

Integrity (1.3): every dataset carries HDF5's fletcher32 checksum (chunked datasets) or lives inside a checksummed
object header (compact layout, for scalars and tiny arrays), and every chunked dataset is gzip-compressed, so a
flipped byte or a zeroed block is reported as damage instead of being read as numbers. With libver "latest" all of
HDF5's own metadata is checksummed as well.

Place (1.6): a chunk's checksum travels with it, so two chunks of one dataset swapped in the file read without a
complaint. /examples/digests binds each example's bytes in every per-example dataset (every ``Flat`` of
``store_datasets``: texts, ids, task words, tokens, method arrays, per-head attention) to its index row: the writer
appends them in the commit, before the index rows; the reader checks an example's arrays as it reads them and
store/verify.py all of them. A metric record keeps the CRC-32 of its numbers (values, curves, levels: one run in
/metric_records/numbers) as "digest" in its text, checked by verify (its per-step values, 2.1, a run of their own:
"steps" {"off", "n", "digest"}, so that a 2.0 reader's digest still covers what it reads). Not covered: the index
itself (its rows are checked against each other and against the data's extent), provenance, head masks and scale
statistics (written once, small: most in checksummed object headers), format 1.2's metric groups. A store before 1.6
has no digests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ENCODING_TYPE = "attrscope-store"
ENCODING_VERSION = "2.1.0"  # 1.1: /head_masks, 1.2: /metrics, 1.3: checksums, /examples/ids, /methods/<m>/scale,
# 1.4: the task (root attr, index fields target_token .. task_len, /examples/task), 1.5: /heads/attention,
# 1.6: /examples/digests, 2.0: generation (task "generate", the index's step fields, /steps, per-step method arrays),
# 2.1: a generation store's metric records keep a value per step (their text's "steps": where in the numbers).
# A major version: a 1.x reader would take a generation store's missing /methods/<m>/scores for damage, so it refuses
# every 2.x store in one line instead; this reader reads every major from OLDEST_MAJOR on.
OLDEST_MAJOR = 1
METHOD_ENCODING_TYPE = "attrscope-method"
# What one method group holds (scores, layer_scores, matrices, class_scores, example_values, scale), versioned per
# group: a change to one method's layout bumps it there, and a reader that does not know the new version leaves that
# method out (with a warning) and reads the rest. Groups written before this attribute existed are version 1.
METHOD_LAYOUT_VERSION = 1
HEAD_MASK_ENCODING_TYPE = "attrscope-head-mask"
METRIC_ENCODING_TYPE = "attrscope-metric"

FLAG_TRUNCATED = 1

# What the model is explained for (root attr ``task``; a store without it is a classification store).
TASKS = ("classification", "regression", "masked-token", "next-token", "qa", "generate")
GENERATE = "generate"  # a prompt and its continuation, explained token by token (2.0): the tokens are prompt +
# continuation, the method arrays one row per generated token (step)
LM_TASKS = ("masked-token", "next-token")  # a word at one position: target token, optional foil
DEFAULT_TASK = {"name": "classification", "options": {}}

# Chunk sizes (elements) of the flat datasets: large enough for gzip to work well (its window is 32 KB), small
# enough that reading one example decompresses little, and that a commit, which compresses every dataset's last
# partial chunk again, redoes little. SST-2 dev (872 real examples, 5 methods, --matrices cls) committed in 256-row
# windows, against 4x these sizes: the writer's append 0.336 -> 0.236 ms per example, the data +2% (3.05 MB), the
# file before compaction (store/compact.py) 5.5 -> 3.7 MB.
CHUNK_FLAT = 1 << 13
CHUNK_MATRIX = 1 << 15
CHUNK_ROWS = 256
GZIP_LEVEL = 1  # gzip is self-describing: stores written at another level read the same. Level 1 against the
# earlier 4 (SST-2 dev, 872 examples, 5 methods, --matrices cls): the writer's append 40-90 ms faster of ~245 ms,
# the store 1.97 -> 2.08 MB (+5%); level 0 would triple it.
COMPACT_MAX_BYTES = 32 * 1024  # arrays up to this size live in the (checksummed) object header
MAX_COMPACT_ATTRIBUTES = 64  # the root group keeps its attributes in its object header up to this many

# Paths.
METRIC_RECORDS = "metric_records"
METRIC_ROWS = "metric_records/rows"
METRIC_NUMBERS = "metric_records/numbers"
METRIC_TEXT = "metric_records/text"
PROVENANCE = "provenance"
INDEX = "examples/index"
DIGESTS = "examples/digests"
DIGEST_DTYPE = "<u4"
IDS = "examples/ids"
STRINGS = "examples/strings"
TASK_WORDS = "examples/task"
TOKEN_IDS = "tokens/ids"
TOKEN_SPANS = "tokens/spans"
TOKEN_SEGMENT = "tokens/segment"
TOKEN_STR_OFF = "tokens/str_off"
TOKEN_STR_LEN = "tokens/str_len"
TOKEN_STRINGS = "tokens/strings"
TOKEN_EVIDENCE = "tokens/evidence"
# 2.0, generation stores only: one value per generated token (step), example i's at [step_off, step_off + n_steps)
STEP_PROBS = "steps/probs"  # p(the generated token) at its step
STEP_OUTPUT = "steps/output"  # the explained output of the step (target logit, or target minus foil logit)
STEP_FOIL_IDS = "steps/foil_ids"  # the step's foil (--contrast): its token id, -1 without one
STEP_FOIL_PROBS = "steps/foil_probs"  # p(foil) at the step, NaN without one
HEAD_MASKS = "head_masks"
HEADS = "heads/attention"
METRICS = "metrics"
METHODS = "methods"


def method_group(method: str) -> str:
    return f"{METHODS}/{method}"


STEP_SCORES = "step_scores"  # a generation store's method arrays (2.0): per example [T, n], row t the attribution of
STEP_LAYER_SCORES = "step_layer_scores"  # step t over the tokens before it ([T, V, n] per layer view); NaN after it


def step_valid(prompt_len: int, n_steps: int, n: int) -> np.ndarray:
    """[T, n] bool: the cells of a [T, n] step array that hold attributions: row t's first prompt_len + t (every
    token before the generated token t, which sits at position prompt_len + t)."""
    return np.arange(n)[None, :] < (prompt_len + np.arange(n_steps))[:, None]


def method_path(method: str, part: str) -> str:
    return f"{method_group(method)}/{part}"


def metric_path(method: str, metric: str) -> str:
    return f"{METRICS}/{method}/{metric}"


def index_dtype(num_labels: int) -> np.dtype:
    """Row of /examples/index. Offsets are int64 so stores may exceed 2**31 tokens or matrix entries."""
    return np.dtype(
        [
            ("row", "<i8"),  # row number in the source dataset
            ("id_off", "<i8"),  # into /examples/ids (1.3) or /examples/strings (before)
            ("id_len", "<i4"),
            ("text_off", "<i8"),
            ("text_len", "<i4"),
            ("pair_off", "<i8"),
            ("pair_len", "<i4"),  # -1: no pair text
            ("tok_off", "<i8"),  # first token in /tokens/*
            ("n_tokens", "<i4"),
            ("sq_off", "<i8"),  # sum of n_tokens**2 over earlier examples: offset of full matrices / L
            ("label", "<i4"),  # -1: unlabelled
            ("pred", "<i4"),
            ("target", "<i4"),  # class explained by the class-specific methods
            ("explain_pos", "<i4"),  # token position whose row the methods explain ([CLS] for classifiers)
            ("n_orig_tokens", "<i4"),  # tokens before truncation at --max-length
            ("flags", "u1"),
            # 1.4: the task (readers give older rows the defaults of FIELD_DEFAULTS)
            ("target_token", "<i4"),  # language model tasks: token id of the explained target word; -1 otherwise
            ("foil_token", "<i4"),  # language model tasks: token id of the foil word; -1: no foil
            ("span_end", "<i4"),  # qa: end position of the explained answer span (explain_pos is its start); -1
            ("pred_end", "<i4"),  # qa: the model's predicted end position (pred: its start); -1 otherwise
            ("output", "<f4"),  # the explained output of the unperturbed model (NaN: not recorded, before 1.4)
            ("gold_value", "<f4"),  # regression: the gold value (NaN: none)
            ("task_off", "<i8"),  # into /examples/task
            ("task_len", "<i4"),  # 0: no task words
            ("probs", "<f4", (num_labels,)),  # classification: softmax over the labels; other tasks: see docs/store.md
            # 2.0: generation (other tasks: the defaults of FIELD_DEFAULTS)
            ("prompt_len", "<i4"),  # generate: tokens of the prompt (the rest, n_tokens - prompt_len, generated); -1
            ("n_steps", "<i4"),  # generate: generated tokens T = n_tokens - prompt_len (0: EOS first); 0 otherwise
            ("step_off", "<i8"),  # sum of n_steps over earlier examples: offset into /steps/* (and per-step values)
            ("grid_off", "<i8"),  # sum of n_steps * n_tokens over earlier examples: offset of [T, n] arrays / rows
        ]
    )


# The index fields added in 1.4 and 2.0 and the value a row written before them reads as.
FIELD_DEFAULTS = {"target_token": -1, "foil_token": -1, "span_end": -1, "pred_end": -1, "output": np.nan,
                  "gold_value": np.nan, "task_off": 0, "task_len": 0,
                  "prompt_len": -1, "n_steps": 0, "step_off": 0, "grid_off": 0}


def current_rows(rows: np.ndarray, num_labels: int) -> np.ndarray:
    """Index rows as ``index_dtype(num_labels)``: rows of an older format get the defaults of the fields they lack
    (fields of a newer format that this reader does not know are dropped)."""
    dtype = index_dtype(num_labels)
    if rows.dtype == dtype:
        return rows
    out = np.zeros(len(rows), dtype=dtype)
    for name in dtype.names:
        if name in rows.dtype.names:
            out[name] = rows[name]
        else:
            out[name] = FIELD_DEFAULTS[name]
    return out


NAME_BYTES = 64  # method and metric names in a metric record


def metric_record_dtype() -> np.dtype:
    """Row of /metric_records/rows: one committed metric of one method."""
    return np.dtype([
        ("method", f"S{NAME_BYTES}"),
        ("metric", f"S{NAME_BYTES}"),  # as stored, e.g. "aopc@attcat"
        ("n", "<i8"),  # examples
        ("k", "<i4"),  # curve points per example (0: no curves)
        ("values_off", "<i8"),  # into /metric_records/numbers
        ("curves_off", "<i8"),  # -1: none
        ("levels_off", "<i8"),  # -1: none
        ("text_off", "<i8"),  # into /metric_records/text
        ("text_len", "<i4"),
    ])


MATRIX_MODES = ("none", "cls", "all")
HEAD_MODES = ("none", "cls", "all")  # root attr heads (absent: "none"): what /heads/attention keeps per example
STORE_DTYPES = ("float16", "float32")


def task_row_problem(rows: np.ndarray, task: str, num_labels: int) -> tuple[int, str] | None:
    """The first index row (its position in ``rows``) whose task fields contradict ``task``, and how; None when all
    agree. A classifier's prediction is a class and its probabilities are finite; a qa example's explained span and
    predicted positions lie inside it; a language model example has a target token and a probability for its foil
    (NaN only without one); a regression's value is finite. A task of a newer format is only checked for positions
    in range. The writer refuses such rows, the reader reports them as damage."""
    n = rows["n_tokens"].astype(np.int64)
    probs = rows["probs"].reshape(len(rows), -1)
    checks = [("a token id below -1", (rows["target_token"] >= -1) & (rows["foil_token"] >= -1)),
              ("span_end or pred_end outside the tokens",
               (rows["span_end"] >= -1) & (rows["span_end"] < n) & (rows["pred_end"] >= -1) & (rows["pred_end"] < n))]
    if task == "classification":
        checks += [(f"label or pred not one of the {num_labels} classes",
                    (rows["label"] < num_labels) & (rows["pred"] >= 0) & (rows["pred"] < num_labels)),
                   ("probabilities not finite", np.isfinite(probs).all(axis=1))]
    elif task == "qa":
        checks += [("the predicted span outside the tokens",
                    (rows["pred"] >= 0) & (rows["pred"] < n) & (rows["pred_end"] >= 0)),
                   ("the explained span ends before its start", rows["span_end"] >= rows["explain_pos"]),
                   ("probabilities not finite", np.isfinite(probs).all(axis=1))]
    elif task in LM_TASKS:
        checks += [("no target token", rows["target_token"] >= 0),
                   ("p(target) not finite", np.isfinite(probs[:, 0]))]
        if probs.shape[1] > 1:  # p(foil): a probability wherever there is a foil (NaN without one)
            checks.append(("a foil without a finite p(foil)", np.isfinite(probs[:, 1]) | (rows["foil_token"] < 0)))
    elif task == "regression":
        checks.append(("the value not finite", np.isfinite(probs).all(axis=1)))
    if task == GENERATE:  # the tokens are the prompt, then the steps' tokens
        P, T = rows["prompt_len"], rows["n_steps"]
        checks.append(("prompt_len + n_steps not n_tokens (prompt_len >= 1, n_steps >= 0)",
                       (P >= 1) & (T >= 0) & (P + T == n)))
    elif task in TASKS:
        checks.append(("step fields outside a generation store", (rows["prompt_len"] == -1) & (rows["n_steps"] == 0)))
    for what, ok in checks:
        if not ok.all():
            return int(np.flatnonzero(~ok)[0]), what
    return None


# --------------------------------------------------------------------------------------------------------- geometry
@dataclass(frozen=True)
class Extent:
    """How far the committed examples reach into the flat datasets (the end offsets after the last index row)."""

    examples: int = 0
    tokens: int = 0
    squares: int = 0  # sum of n_tokens**2
    ids_bytes: int = 0
    string_bytes: int = 0
    token_string_bytes: int = 0
    task_bytes: int = 0  # /examples/task (1.4)
    steps: int = 0  # sum of n_steps (2.0)
    grid: int = 0  # sum of n_steps * n_tokens (2.0)


@dataclass(frozen=True)
class Flat:
    """One appendable flat dataset: its path, dtype, optional row width, chunk, and its committed length as
    ``per`` units of the Extent times ``times`` (e.g. layer_scores: tokens x V)."""

    path: str
    dtype: str
    per: str  # an Extent field
    times: int = 1
    width: int | None = None
    chunk: int = CHUNK_FLAT

    def length(self, extent: Extent) -> int:
        return getattr(extent, self.per) * self.times

    def example_rows(self, rows: np.ndarray, first: int,
                     token_strings: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Where the examples of index ``rows`` (current dtype; the first is example ``first``) lie in this dataset:
        (start, count) of each one's contiguous run of its rows. ``token_strings``: the examples' (start, count) in
        /tokens/strings, read by the caller from /tokens/str_off and str_len (needed for that dataset only)."""
        n = rows["n_tokens"].astype(np.int64)
        if self.per == "tokens":
            start, count = rows["tok_off"], n
        elif self.per == "squares":
            start, count = rows["sq_off"], n * n
        elif self.per == "examples":
            start, count = first + np.arange(len(rows), dtype=np.int64), np.ones(len(rows), dtype=np.int64)
        elif self.per == "ids_bytes":
            start, count = rows["id_off"], rows["id_len"]
        elif self.per == "string_bytes":  # the text, then the pair text (the writer lays them so)
            start, count = rows["text_off"], np.maximum(rows["text_len"], 0) + np.maximum(rows["pair_len"], 0)
        elif self.per == "task_bytes":
            start, count = rows["task_off"], rows["task_len"]
        elif self.per == "steps":
            start, count = rows["step_off"], rows["n_steps"]
        elif self.per == "grid":
            start, count = rows["grid_off"], rows["n_steps"].astype(np.int64) * n
        else:
            start, count = token_strings
        return np.asarray(start, np.int64) * self.times, np.asarray(count, np.int64) * self.times


def token_datasets(evidence: bool) -> list[Flat]:
    out = [Flat(TOKEN_IDS, "int32", "tokens"), Flat(TOKEN_SPANS, "int32", "tokens", width=2),
           Flat(TOKEN_SEGMENT, "int8", "tokens"), Flat(TOKEN_STR_OFF, "int64", "tokens"),
           Flat(TOKEN_STR_LEN, "int32", "tokens"), Flat(TOKEN_STRINGS, "uint8", "token_string_bytes")]
    if evidence:
        out.append(Flat(TOKEN_EVIDENCE, "uint8", "tokens"))
    return out


def example_datasets(separate_ids: bool, task_words: bool) -> list[Flat]:
    out = [Flat(STRINGS, "uint8", "string_bytes")]
    if separate_ids:
        out.append(Flat(IDS, "uint8", "ids_bytes"))
    if task_words:
        out.append(Flat(TASK_WORDS, "uint8", "task_bytes"))
    return out


def method_datasets(layout: dict, num_labels: int) -> list[Flat]:
    """The flat datasets of one method layout (a MethodLayout's fields as a dict). A layout with ``steps`` (every
    method of a generation store, 2.0) keeps one row per step instead of one per example: step_scores and
    step_layer_scores in place of scores and layer_scores, its example values one per step."""
    name = layout["name"]
    steps = bool(layout.get("steps"))
    views = int(layout.get("n_layer_views") or 0)
    if steps:
        out = [Flat(method_path(name, STEP_SCORES), "float32", "grid")]
        if views:
            out.append(Flat(method_path(name, STEP_LAYER_SCORES), "float32", "grid", views))
    else:
        out = [Flat(method_path(name, "scores"), "float32", "tokens")]
        if views:
            out.append(Flat(method_path(name, "layer_scores"), "float32", "tokens", views))
    mode = layout.get("matrices", "none")
    if mode != "none":
        dtype = (layout.get("params") or {}).get("store_dtype", "float16")
        per = "squares" if mode == "all" else "tokens"
        out.append(Flat(method_path(name, "matrices"), dtype, per, int(layout["n_matrix_layers"]), chunk=CHUNK_MATRIX))
    if layout.get("class_scores"):
        out.append(Flat(method_path(name, "class_scores"), "float32", "tokens", num_labels))
    for key in layout.get("example_values") or ():
        out.append(Flat(method_path(name, f"example_values/{key}"), "float32", "steps" if steps else "examples",
                        chunk=CHUNK_ROWS))
    return out


def step_datasets(generation: bool) -> list[Flat]:
    """/steps/*: one value per generated token (2.0; only in a generation store)."""
    if not generation:
        return []
    return [Flat(STEP_PROBS, "float32", "steps"), Flat(STEP_OUTPUT, "float32", "steps"),
            Flat(STEP_FOIL_IDS, "int32", "steps"), Flat(STEP_FOIL_PROBS, "float32", "steps")]


def head_datasets(mode: str, n_layers: int, n_heads: int, dtype: str) -> list[Flat]:
    """/heads/attention for heads ``mode`` (none: no dataset): L x H rows of n (cls) or L x H n x n blocks (all)."""
    if mode == "none":
        return []
    return [Flat(HEADS, dtype, "squares" if mode == "all" else "tokens", n_layers * n_heads, chunk=CHUNK_MATRIX)]


def store_datasets(*, separate_ids: bool, task_words: bool, evidence: bool, layouts: list[dict], num_labels: int,
                   heads: str, n_layers: int, n_heads: int, heads_dtype: str, generation: bool = False) -> list[Flat]:
    """Every per-example flat dataset of a store, in one order: the columns of /examples/digests (1.6)."""
    return (example_datasets(separate_ids, task_words) + token_datasets(evidence) + step_datasets(generation)
            + [d for m in layouts for d in method_datasets(m, num_labels)]
            + head_datasets(heads, n_layers, n_heads, heads_dtype))


def extent_of_last_row(row: np.void | None, n_examples: int, separate_ids: bool, token_string_end: int) -> Extent:
    """The Extent after committed row ``row`` (the last one, in the current dtype: current_rows; None for an empty
    store). ``token_string_end``: end of that example's last token string (str_off + str_len of the last token),
    read by the caller."""
    if row is None:
        return Extent()
    n = int(row["n_tokens"])
    text_end = max(int(row[f"{k}_off"]) + max(int(row[f"{k}_len"]), 0) for k in ("text", "pair"))
    id_end = int(row["id_off"]) + max(int(row["id_len"]), 0)
    return Extent(examples=n_examples, tokens=int(row["tok_off"]) + n, squares=int(row["sq_off"]) + n * n,
                  ids_bytes=id_end if separate_ids else 0,
                  string_bytes=text_end if separate_ids else max(text_end, id_end),
                  token_string_bytes=token_string_end,
                  task_bytes=int(row["task_off"]) + max(int(row["task_len"]), 0),
                  steps=int(row["step_off"]) + int(row["n_steps"]), grid=int(row["grid_off"]) + int(row["n_steps"]) * n)


# ------------------------------------------------------------------------------------------------- view statistics
# Log-spaced histogram of |x| for the scale statistics: bin 0 holds |x| < 1e-12 (zeros included), then 8 bins per
# decade up to 1e6, the last bin everything above.
SCALE_BINS_PER_DECADE = 8
SCALE_LOG10_MIN, SCALE_LOG10_MAX = -12, 6
SCALE_N_BINS = 2 + (SCALE_LOG10_MAX - SCALE_LOG10_MIN) * SCALE_BINS_PER_DECADE
SCALE_SUMMARY_FIELDS = ("count", "min", "max", "max_abs", "sum", "sum_sq")


def scale_views(layout: dict) -> list[str]:
    """The views whose scale the store keeps: "final", "layer 1".."layer V", "matrix 1".."matrix L"."""
    views = ["final"] + [f"layer {v + 1}" for v in range(int(layout.get("n_layer_views") or 0))]
    if layout.get("matrices", "none") != "none":
        views += [f"matrix {l + 1}" for l in range(int(layout.get("n_matrix_layers") or 0))]
    return views
