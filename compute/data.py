"""Load the examples to attribute: local .jsonl/.csv/.tsv/.parquet files or a Hugging Face hub split.

Every source is reduced to the same thing, a list of ``Record``s (text, optional pair, label index, id, and per
task the target and foil words, the regression value or the QA answer), so the rest of attr-compute never looks at
file formats. Problems with the data are raised as one-line ``AttrscopeError``s that name the file, the row and the
fix. The columns each task reads are documented in docs/tasks.md ("Data formats").
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import numbers
import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from compute.errors import AttrscopeError, UsageError

SUPPORTED = (".jsonl", ".csv", ".tsv", ".parquet")
SUPPORTED_TEXT = "a local .jsonl/.csv/.tsv/.parquet file"

# Column names tried, in this order, when the matching --*-column flag is not given (case-insensitive).
TEXT_CANDIDATES = ("text", "sentence", "sentence1", "premise", "question1", "question", "review", "content", "document")
# A pair is auto-detected only from these text columns; question+context is extractive QA, not a pair task.
PAIR_FOR_TEXT = {"sentence1": "sentence2", "premise": "hypothesis", "question1": "question2"}
LABEL_CANDIDATES = ("label", "labels", "gold_label", "target", "class")
ID_CANDIDATES = ("id", "idx", "guid", "example_id", "uid")

TASKS = ("classification", "regression", "masked-token", "next-token", "qa")
# Per task, the candidates tried when no flag names the column (case-insensitive, in order).
REGRESSION_LABEL_CANDIDATES = ("label", "labels", "score", "similarity_score")
LM_TEXT_CANDIDATES = ("text", "sentence")  # masked-token
PREFIX_CANDIDATES = ("text", "prefix", "sentence")  # next-token
TARGET_CANDIDATES = ("target", "correct")  # "correct"/"wrong": the simple agreement form
FOIL_CANDIDATES = ("foil", "wrong")
WORD_INDEX_CANDIDATES = ("word_index", "verb_index")
QUESTION_CANDIDATES = ("question",)
CONTEXT_CANDIDATES = ("context",)
ANSWERS_CANDIDATES = ("answers",)
# BLiMP (Warstadt et al. 2020) minimal pairs; the one-prefix fields are the next-token form of the same pair.
BLIMP_COLUMNS = ("sentence_good", "sentence_bad")
BLIMP_PREFIX_COLUMNS = ("one_prefix_prefix", "one_prefix_word_good", "one_prefix_word_bad")
# The agreement file of Linzen et al. (2016), agr_50_mostcommon_10K.tsv: these of its 18 columns are read.
# Its `sentence` column replaces rare words by their POS tag, so the real words come from `orig_sentence`;
# verb_index and subj_index count words from 1.
LINZEN_COLUMNS = ("orig_sentence", "verb_index", "verb", "subj_index", "subj")
# Mask tokens of common tokenizers, named in the error when a text holds one that is not the model's.
KNOWN_MASK_TOKENS = ("[MASK]", "<mask>")

# Suffixes that mean "this was meant to be a file", so a missing one is reported as a missing file
# rather than being looked up on the hub.
_FILE_LIKE = SUPPORTED + (".json", ".txt", ".gz", ".zip", ".xlsx", ".xls", ".arrow")
# name[/config][:split]; a third segment allows namespaced ids (owner/name/config).
_HUB_SPEC = re.compile(r"[A-Za-z0-9][\w.\-]*(/[\w.\-]+){0,2}(:[\w.\-\[\]%:+]+)?")
_DEFAULT_LABEL = re.compile(r"label_(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class Record:
    row: int  # 0-based row number in the source (after header), before --limit
    id: str  # from the id column if there is one, else str(row)
    text: str
    pair: str | None  # second segment for sentence-pair tasks
    label: int  # class index, -1 when the dataset has no label (or the cell is empty)
    # Evidence / answer character spans (segment, start, end), segment 0 = text, 1 = pair (--evidence-column).
    evidence: tuple[tuple[int, int, int], ...] | None = None
    # masked-token / next-token: the word whose logit is explained (None: the model's own prediction) and the
    # contrasting foil word (None: no contrast); kept as written, the task tokenises them.
    target: str | None = None
    foil: str | None = None
    value: float | None = None  # regression: the gold value (None: unlabelled)
    answer: str | None = None  # qa: the first gold answer's text; its span in the context is evidence[0]


@dataclass
class Dataset:
    records: list[Record]
    source: str  # the spec as given
    kind: str  # "jsonl" | "csv" | "tsv" | "parquet" | "hub"
    columns: dict  # {"text": ..., "pair": ... or None, "label": ... or None, "id": ... or None}
    n_rows: int  # rows in the source before --limit
    sha256: str | None  # of the local file bytes; None for hub datasets
    label_names: dict | None  # how string labels were mapped, e.g. {"positive": 1, "negative": 0}, else None
    task: str = "classification"
    # Rows left out on purpose (BLiMP pairs that do not differ in one word, or have no one-word prefix for
    # next-token): how many, and notes for the user saying which and why (the runner prints them).
    skipped: int = 0
    notes: tuple[str, ...] = ()


@dataclass
class _Table:
    """Raw rows of any source: column names, (where, row dict) pairs, and the total row count."""

    kind: str
    columns: list[str]
    rows: Iterable[tuple[str, dict]]  # "where" is for error messages, e.g. "row 3 of 'x.tsv' (line 5)"
    n_rows: int
    sha256: str | None


def load_dataset(
    spec: str,
    *,
    task: str = "classification",
    mask_token: str | None = None,
    text_column=None,
    pair_column=None,
    label_column=None,
    id_column=None,
    target_column=None,
    foil_column=None,
    answers_column=None,
    word_index_column=None,
    evidence_column=None,
    split=None,
    limit=None,
    label2id: dict[str, int] | None = None,
    num_labels: int | None = None,
) -> Dataset:
    """Read ``spec`` (a local file, or ``name[/config]:split`` on the hub) into records for ``task``.

    ``mask_token`` is the model's mask token; masked-token data needs it (texts must hold it, or it replaces the
    word a word index, a BLiMP pair or the Linzen verb index points at). ``label2id``/``num_labels`` map class
    labels (classification only). ``limit`` counts source rows, so skipped BLiMP pairs count towards it.
    """
    if task not in TASKS:
        raise UsageError(f"unknown task {task!r}: use one of {', '.join(TASKS)}")
    _check_task_flags(task, mask_token, label_column=label_column, target_column=target_column,
                      foil_column=foil_column, answers_column=answers_column, word_index_column=word_index_column,
                      evidence_column=evidence_column)
    if limit is not None and limit <= 0:
        raise UsageError(f"--limit must be a positive number of examples, got {limit}")

    path = Path(spec).expanduser()
    if path.exists():
        if split is not None:
            raise UsageError(f"--split applies only to Hugging Face datasets, not to the local file '{spec}': drop it")
        table = _read_local(path, spec)
    elif _looks_like_hub(spec):
        table = _read_hub(spec, split, limit)
    else:
        raise AttrscopeError(f"dataset file '{spec}' not found: check the path")

    if table.n_rows == 0:
        raise AttrscopeError(f"dataset '{spec}' has no rows: add at least one example")

    if task == "classification":
        cols = _resolve_columns(table.columns, spec, text_column, pair_column, label_column, id_column)
    else:
        cols = _resolve_task_columns(task, table.columns, spec, text_column=text_column, pair_column=pair_column,
                                     label_column=label_column, id_column=id_column, target_column=target_column,
                                     foil_column=foil_column, answers_column=answers_column,
                                     word_index_column=word_index_column)
    if evidence_column is not None:
        cols["evidence"] = _find_column(table.columns, evidence_column)
        if cols["evidence"] is None:
            raise AttrscopeError(f"column {evidence_column!r} (from --evidence-column) is not in '{spec}' (columns: "
                                 f"{', '.join(repr(c) for c in table.columns)}): pass one of those")
    labels = _LabelMapper(label2id, num_labels)
    if task == "classification":
        make = _classification_row(cols, labels)
    else:
        make = _TaskRows(task, cols, mask_token)
    records, skipped_rows = _to_records(table.rows, make, cols, limit, spec)
    notes = (make.skipped_note(skipped_rows, len(records) + len(skipped_rows), spec),) if skipped_rows else ()
    return Dataset(
        records=records,
        source=spec,
        kind=table.kind,
        columns=cols,
        n_rows=table.n_rows,
        sha256=table.sha256,
        label_names=labels.mapped or None,
        task=task,
        skipped=len(skipped_rows),
        notes=notes,
    )


def gives_evidence(spec: str, task: str) -> bool:
    """Whether a local file carries evidence tokens without --evidence-column, read off its header alone (a cheap
    look before the model loads): Linzen's agreement file (the subject) under the word tasks, SQuAD answers under
    qa. Anything unreadable here is False: the reader proper reports it later."""
    if task not in ("masked-token", "next-token", "qa", "auto"):
        return False
    path = Path(spec)
    try:
        if path.suffix in (".tsv", ".csv"):
            with open(path, encoding="utf-8-sig") as f:
                header = f.readline()
            columns = [c.strip().strip('"') for c in header.rstrip("\r\n").split("\t" if path.suffix == ".tsv" else ",")]
        elif path.suffix == ".jsonl":
            with open(path, encoding="utf-8-sig") as f:
                first = next((line for line in f if line.strip()), "{}")
            columns = list(json.loads(first))
        else:
            return False
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    has = all(_find_column(columns, c) is not None for c in LINZEN_COLUMNS) and task != "qa"
    return has or (task in ("qa", "auto") and _find_column(columns, "answers") is not None)


def _check_task_flags(task: str, mask_token, **flags) -> None:
    """Column flags another task reads are usage errors, not silently ignored."""
    applies = {
        "label_column": ("classification", "regression"),
        "target_column": ("masked-token", "next-token"),
        "foil_column": ("masked-token", "next-token"),
        "word_index_column": ("masked-token",),
        "answers_column": ("qa",),
        "evidence_column": ("classification", "regression", "masked-token", "next-token"),
    }
    for name, value in flags.items():
        if value is not None and task not in applies[name]:
            flag = "--" + name.replace("_", "-")
            extra = " (qa reads the evidence span from the answers)" if name == "evidence_column" else ""
            raise UsageError(f"{flag} applies to --task {' / '.join(applies[name])}, not {task}{extra}: drop it")
    if task == "masked-token" and not mask_token:
        raise UsageError("--task masked-token needs a model with a mask token (a masked-LM tokenizer): "
                         "use a masked language model")


# --- local files -------------------------------------------------------------------------------------


def _read_local(path: Path, spec: str) -> _Table:
    if path.is_dir():
        raise AttrscopeError(f"dataset '{spec}' is a directory: pass {SUPPORTED_TEXT}")
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED:
        raise AttrscopeError(
            f"dataset file '{spec}' has an unsupported extension '{path.suffix}': use one of {', '.join(SUPPORTED)}"
        )
    data = path.read_bytes()
    # Hash the exact bytes so a --resume run can check it is reading the same data.
    sha = hashlib.sha256(data).hexdigest()
    empty = AttrscopeError(f"dataset file '{spec}' is empty: add a header row and at least one example")
    if not data:
        raise empty

    if suffix == ".parquet":
        columns, rows = _parse_parquet(data, spec)
    else:
        text = _decode(data, spec)
        if not text.strip():
            raise empty
        if suffix == ".jsonl":
            columns, rows = _parse_jsonl(text, spec)
        else:
            columns, rows = _parse_delimited(text, spec, tsv=suffix == ".tsv")
    return _Table(kind=suffix[1:], columns=columns, rows=rows, n_rows=len(rows), sha256=sha)


def _decode(data: bytes, spec: str) -> str:
    try:
        return data.decode("utf-8-sig")  # tolerates the BOM that Excel and some editors write
    except UnicodeDecodeError as e:
        raise AttrscopeError(
            f"dataset file '{spec}' is not UTF-8 text (bad byte at offset {e.start}): re-save it as UTF-8"
        ) from None


def _parse_jsonl(text: str, spec: str) -> tuple[list[str], list[tuple[str, dict]]]:
    columns: dict[str, None] = {}  # ordered union of keys: rows may omit optional fields
    rows = []
    # Split on "\n" only: str.splitlines would also break on U+2028 etc., which JSON strings may hold raw.
    for line_no, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise AttrscopeError(
                f"line {line_no} of '{spec}' is not valid JSON ({e.msg} at column {e.colno}): "
                "write one JSON object per line"
            ) from None
        if not isinstance(obj, dict):
            raise AttrscopeError(
                f"line {line_no} of '{spec}' is a JSON {type(obj).__name__}, not an object: "
                "write one JSON object per line"
            )
        columns.update(dict.fromkeys(obj))
        rows.append((f"row {len(rows)} of '{spec}' (line {line_no})", obj))
    return list(columns), rows


def _parse_delimited(text: str, spec: str, *, tsv: bool) -> tuple[list[str], list[tuple[str, dict]]]:
    # TSV (GLUE/SST-2 style) has quotes inside sentences that are plain characters, so no quoting there.
    if tsv:
        reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(io.StringIO(text, newline=""))
    header = None
    rows = []
    try:
        for cells in reader:
            if not any(c.strip() for c in cells):
                continue  # blank line: not an example
            if header is None:
                header = cells
                continue
            if len(cells) != len(header):
                raise AttrscopeError(
                    f"line {reader.line_num} of '{spec}' has {len(cells)} fields but the header has {len(header)}: "
                    "fix that line (a stray delimiter or a missing field)"
                )
            rows.append((f"row {len(rows)} of '{spec}' (line {reader.line_num})", dict(zip(header, cells))))
    except csv.Error as e:
        raise AttrscopeError(f"line {reader.line_num} of '{spec}' cannot be parsed ({e}): fix that line") from None
    return header or [], rows


def _parse_parquet(data: bytes, spec: str) -> tuple[list[str], list[tuple[str, dict]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise AttrscopeError("reading .parquet needs pyarrow: pip install 'attrscope[parquet]'") from None
    try:
        table = pq.read_table(io.BytesIO(data))
    except Exception as e:  # pyarrow raises ArrowInvalid/OSError subclasses for corrupt files
        raise AttrscopeError(
            f"dataset file '{spec}' is not a readable Parquet file ({_first_line(e)}): check the file"
        ) from None
    rows = [(f"row {i} of '{spec}'", row) for i, row in enumerate(table.to_pylist())]
    return list(table.column_names), rows


# --- Hugging Face hub ------------------------------------------------------------------------------------


def _looks_like_hub(spec: str) -> bool:
    name = spec.partition(":")[0]
    return _HUB_SPEC.fullmatch(spec) is not None and Path(name).suffix.lower() not in _FILE_LIKE


def _read_hub(spec: str, split: str | None, limit: int | None) -> _Table:
    name_part, _, spec_split = spec.partition(":")
    if spec_split and split is not None and spec_split != split:
        raise UsageError(f"'{spec}' names split '{spec_split}' but --split is '{split}': give the split once")
    split = spec_split or split
    if not split:
        raise AttrscopeError(
            f"'{spec}' is not a local file, and loading it from the Hugging Face hub needs a split: "
            f"use '{spec}:validation' (or --split), or pass {SUPPORTED_TEXT}"
        )
    parts = name_part.split("/")
    if len(parts) == 1:
        name, config = parts[0], None
    elif len(parts) == 2:
        name, config = parts  # "glue/sst2": dataset glue, config sst2
    else:
        name, config = "/".join(parts[:2]), parts[2]  # "owner/name/config"

    try:
        import datasets
    except ImportError:
        raise AttrscopeError(
            f"loading '{spec}' from the Hugging Face hub needs the datasets package: "
            f"pip install 'attrscope[hub]', or pass {SUPPORTED_TEXT}"
        ) from None
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as e:  # datasets raises many kinds; all become one line
        if _is_offline(e):
            raise AttrscopeError(
                f"could not reach the Hugging Face hub to load '{spec}' (offline or no network): "
                f"connect to the network, or pass {SUPPORTED_TEXT}"
            ) from None
        raise AttrscopeError(
            f"could not load '{spec}' from the Hugging Face hub ({_first_line(e)}): "
            f"check the name, config and split, or pass {SUPPORTED_TEXT}"
        ) from None

    def rows() -> Iterator[tuple[str, dict]]:
        # Lazily, so --limit 10 on a large split does not convert every row.
        for i, row in enumerate(ds):
            if limit is not None and i >= limit:
                return
            yield f"row {i} of '{spec}'", row

    return _Table(kind="hub", columns=list(ds.column_names), rows=rows(), n_rows=len(ds), sha256=None)


def _is_offline(exc: BaseException) -> bool:
    """Whether a load failure (or anything in its cause chain) is a network/offline problem."""
    names = ("connection", "offline", "timeout", "localentrynotfound", "maxretry", "nameresolution")
    phrases = ("offline", "couldn't reach", "could not reach", "connection", "network", "name resolution")
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return True
        if any(n in cls.__name__.lower() for cls in type(exc).__mro__ for n in names):
            return True
        if any(p in str(exc).lower() for p in phrases):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


# --- columns ----------------------------------------------------------------------------------------------


def _find_column(columns: list[str], name: str) -> str | None:
    """The column called ``name``: an exact match first, else the first case-insensitive one."""
    if name in columns:
        return name
    key = name.strip().lower()
    return next((c for c in columns if str(c).strip().lower() == key), None)


class _ColumnFinder:
    """Finds columns of one source by flag (must exist) or by candidates (first present), for its messages."""

    def __init__(self, columns: list[str], spec: str):
        self.columns, self.spec = columns, spec
        self.available = ", ".join(repr(c) for c in columns) or "none"

    def explicit(self, name: str, flag: str) -> str:
        found = _find_column(self.columns, name)
        if found is None:
            raise AttrscopeError(
                f"column {name!r} (from {flag}) is not in '{self.spec}' (columns: {self.available}): pass one of those"
            )
        return found

    def auto(self, candidates) -> str | None:
        return next((c for c in (_find_column(self.columns, n) for n in candidates) if c is not None), None)

    def pick(self, given, flag: str, candidates) -> str | None:
        return self.explicit(given, flag) if given is not None else self.auto(candidates)

    def required(self, given, flag: str, candidates, what: str) -> str:
        found = self.pick(given, flag, candidates)
        if found is None:
            raise AttrscopeError(f"no {what} column found in '{self.spec}' (columns: {self.available}): pass {flag}")
        return found

    def has_all(self, names) -> bool:
        return all(_find_column(self.columns, n) is not None for n in names)


def _resolve_columns(columns, spec, text_column, pair_column, label_column, id_column,
                     label_candidates=LABEL_CANDIDATES) -> dict:
    find = _ColumnFinder(columns, spec)
    text = find.required(text_column, "--text-column", TEXT_CANDIDATES, "text")
    context = find.auto(CONTEXT_CANDIDATES)
    if text_column is None and str(text).strip().lower() in QUESTION_CANDIDATES and context is not None:
        # an extractive QA layout: the question alone is not what the user meant to classify
        raise UsageError(f"'{spec}' has {text!r} and {context!r} columns (extractive QA): pass --task qa, or name "
                         f"the text with --text-column (and --pair-column {context} to classify the pair)")
    if pair_column is not None:
        pair = find.explicit(pair_column, "--pair-column")
    elif text_column is None and str(text).strip().lower() in PAIR_FOR_TEXT:
        pair = _find_column(columns, PAIR_FOR_TEXT[str(text).strip().lower()])
    else:
        pair = None
    label = find.pick(label_column, "--label-column", label_candidates)
    id_ = find.pick(id_column, "--id-column", ID_CANDIDATES)
    return {"text": text, "pair": pair, "label": label, "id": id_}


def _resolve_task_columns(task, columns, spec, *, text_column, pair_column, label_column, id_column, target_column,
                          foil_column, answers_column, word_index_column) -> dict:
    """The columns a non-classification task reads, and the layout ("format") they were found in."""
    find = _ColumnFinder(columns, spec)
    if task == "regression":
        cols = _resolve_columns(columns, spec, text_column, pair_column, label_column, id_column,
                                label_candidates=REGRESSION_LABEL_CANDIDATES)
        return {**cols, "format": "plain"}
    if task == "qa":
        return {"text": find.required(text_column, "--text-column", QUESTION_CANDIDATES, "question"),
                "pair": find.required(pair_column, "--pair-column", CONTEXT_CANDIDATES, "context"),
                "label": None, "id": find.pick(id_column, "--id-column", ID_CANDIDATES),
                "answers": find.pick(answers_column, "--answers-column", ANSWERS_CANDIDATES), "format": "squad"}

    pair = find.explicit(pair_column, "--pair-column") if pair_column is not None else None
    id_ = find.pick(id_column, "--id-column", ID_CANDIDATES)
    blimp_columns = BLIMP_COLUMNS if task == "masked-token" else BLIMP_PREFIX_COLUMNS
    if find.has_all(blimp_columns):
        given = [flag for flag, v in (("--text-column", text_column), ("--pair-column", pair_column),
                                      ("--target-column", target_column), ("--foil-column", foil_column),
                                      ("--word-index-column", word_index_column)) if v is not None]
        if given:
            raise UsageError(f"'{spec}' holds BLiMP minimal pairs ({', '.join(blimp_columns)}), which give the text, "
                             f"target and foil: drop {', '.join(given)}")
        # pairID in the BLiMP jsonl files, pair_id in the Hugging Face copy (nyu-mll/blimp).
        uid, pair_id = _find_column(columns, "UID"), find.auto(("pairID", "pair_id"))
        named = [find.auto((c,)) for c in blimp_columns]
        # Ids: UID_pairID (pairID counts within a paradigm, UID names it) unless --id-column says otherwise.
        cols = {"text": named[0], "pair": None, "label": None, "id": id_ if id_column is not None else None,
                "format": "blimp"}
        if task == "masked-token":
            cols.update(good=named[0], bad=named[1])
        else:
            cols.update(target=named[1], foil=named[2])
        if id_column is None:
            cols.update(blimp_uid=uid, blimp_pair_id=pair_id)
        return cols

    target = find.pick(target_column, "--target-column", TARGET_CANDIDATES)
    foil = find.pick(foil_column, "--foil-column", FOIL_CANDIDATES)
    if word_index_column is None and find.has_all(LINZEN_COLUMNS):
        # masked-token masks the verb; next-token reads the words before it as the prefix.
        return {"text": find.pick(text_column, "--text-column", ("orig_sentence",)), "pair": pair, "label": None,
                "id": id_, "target": find.pick(target_column, "--target-column", ("verb",)), "foil": foil,
                "word_index": find.auto(("verb_index",)),
                "subject_index": find.auto(("subj_index",)), "subject": find.auto(("subj",)), "format": "linzen"}
    if task == "next-token":
        text = find.required(text_column, "--text-column", PREFIX_CANDIDATES, "prefix text")
        return {"text": text, "pair": pair, "label": None, "id": id_, "target": target, "foil": foil,
                "format": "plain"}
    text = find.required(text_column, "--text-column", LM_TEXT_CANDIDATES, "text")
    word_index = find.pick(word_index_column, "--word-index-column", WORD_INDEX_CANDIDATES)
    cols = {"text": text, "pair": pair, "label": None, "id": id_, "target": target, "foil": foil,
            "format": "plain"}
    if word_index is not None:
        cols["word_index"] = word_index
    return cols


# --- labels -----------------------------------------------------------------------------------------------


class _LabelMapper:
    """Turns a label cell into a class index of the model, remembering how strings were mapped."""

    def __init__(self, label2id: dict[str, int] | None, num_labels: int | None):
        label2id = label2id or {}
        self.by_name = {str(k).strip().lower(): int(v) for k, v in label2id.items()}
        # transformers gives unnamed heads {"LABEL_0": 0, ...}; then any "LABEL_k" means index k.
        self.default_names = all(
            (m := _DEFAULT_LABEL.fullmatch(str(k).strip())) and int(m.group(1)) == int(v) for k, v in label2id.items()
        )
        if num_labels is None and label2id:
            num_labels = max(self.by_name.values()) + 1
        self.num_labels = num_labels
        self.known = sorted(label2id, key=lambda k: label2id[k])
        self.mapped: dict[str, int] = {}

    def __call__(self, value, where: str) -> int:
        index = self._index(value, where)
        if index == -1:
            return -1  # GLUE test splits and the like mark "no label" with -1
        if index < 0 or (self.num_labels is not None and index >= self.num_labels):
            bound = f"0..{self.num_labels - 1}" if self.num_labels is not None else "0 or more"
            raise AttrscopeError(
                f"label {index} in {where} is out of range {bound} for this model: "
                "check --label-column, or use a model with that many labels"
            )
        return index

    def _index(self, value, where: str) -> int:
        if value is None:
            return -1
        if isinstance(value, numbers.Integral):  # also bool and numpy integers
            return int(value)
        if isinstance(value, numbers.Real):
            value = float(value)
            if math.isnan(value):
                return -1  # pandas writes missing integer labels as NaN
            if value.is_integer():
                return int(value)
            raise self._unknown(value, where)
        if not isinstance(value, str):
            raise AttrscopeError(
                f"label in {where} is of type {type(value).__name__}, not a single class: pass a --label-column of "
                "class indices or names"
            )
        s = value.strip()
        if not s:
            return -1
        try:
            return int(s)
        except ValueError:
            pass
        try:
            f = float(s)
            if f.is_integer():
                return int(f)  # "1.0" from spreadsheets
        except ValueError:
            pass
        index = self.by_name.get(s.lower())
        if index is None and self.default_names and (m := _DEFAULT_LABEL.fullmatch(s)):
            index = int(m.group(1))
        if index is None:
            raise self._unknown(value, where)
        self.mapped[s] = index
        return index

    def _unknown(self, value, where: str) -> AttrscopeError:
        if self.known:
            known = ", ".join(repr(k) for k in self.known)
            fix = "use one of those or a class index"
        else:
            known = "none, the model has no label names"
            fix = "use class indices 0, 1, ..."
        return AttrscopeError(f"label {_show(value)} in {where} is not a known label (known: {known}): {fix}")


# --- records ----------------------------------------------------------------------------------------------


def _to_records(rows, make, cols: dict, limit: int | None, spec: str) -> tuple[list[Record], list[int]]:
    """Records from ``make(row_no, where, row, id)`` (None: the row is skipped), and the skipped row numbers."""
    records: list[Record] = []
    skipped: list[int] = []
    first_row_of_id: dict[str, int] = {}
    for row_no, (where, row) in enumerate(rows):
        if limit is not None and row_no >= limit:
            break
        id_ = _row_id(row, cols, row_no)
        record = make(row_no, where, row, id_)
        if record is None:
            skipped.append(row_no)
            continue
        # Results are keyed by id (and --resume skips done ids), so two rows must not share one.
        if id_ in first_row_of_id:
            raise AttrscopeError(
                f"id {_show(id_)} appears in rows {first_row_of_id[id_]} and {row_no} of '{spec}': "
                "make the id column unique, or pass --id-column with a unique column"
            )
        first_row_of_id[id_] = row_no
        records.append(record)
    return records, skipped


def _row_id(row: dict, cols: dict, row_no: int) -> str:
    if cols.get("blimp_pair_id") is not None:  # BLiMP: pairID counts within a paradigm, UID names the paradigm
        pair_id = _record_id(row, cols["blimp_pair_id"], row_no)
        uid = row.get(cols["blimp_uid"]) if cols.get("blimp_uid") is not None else None
        return f"{uid}_{pair_id}" if isinstance(uid, str) and uid.strip() else pair_id
    return _record_id(row, cols["id"], row_no)


def _classification_row(cols: dict, labels: _LabelMapper):
    def make(row_no: int, where: str, row: dict, id_: str) -> Record:
        text = _text(row, cols["text"], where)
        pair = _text(row, cols["pair"], where) if cols["pair"] is not None else None
        label = labels(row.get(cols["label"]), where) if cols["label"] is not None else -1
        evidence = _evidence(row.get(cols["evidence"]), where, text, pair) if cols.get("evidence") else None
        return Record(row=row_no, id=id_, text=text, pair=pair, label=label, evidence=evidence)

    return make


class _TaskRows:
    """Turns one row into the Record of a regression, masked-token, next-token or qa task (see docs/tasks.md)."""

    def __init__(self, task: str, cols: dict, mask_token: str | None):
        self.task, self.cols, self.mask_token = task, cols, mask_token
        self.format = cols["format"]

    def __call__(self, row_no: int, where: str, row: dict, id_: str) -> Record | None:
        base = {"row": row_no, "id": id_, "label": -1}
        if self.task == "regression":
            return self._regression(base, where, row)
        if self.task == "qa":
            return self._qa(base, where, row)
        if self.format == "blimp" and self.task == "masked-token":
            return self._blimp_pair(base, where, row)
        if self.format == "blimp" and _is_blank(row.get(self.cols["text"])):
            return None  # a BLiMP paradigm without the one-word-prefix form (one_prefix_method false)
        if self.task == "next-token" and self.format != "linzen":
            return self._next_token(base, where, row)
        if self.cols.get("word_index") is not None:
            return self._masked_word(base, where, row)
        return self._masked_text(base, where, row)

    def _regression(self, base: dict, where: str, row: dict) -> Record:
        text, pair = self._text_and_pair(where, row)
        column = self.cols["label"]
        value = _value(row.get(column), where) if column is not None else None
        return Record(**base, text=text, pair=pair, value=value, evidence=self._evidence(row, where, text, pair))

    def _qa(self, base: dict, where: str, row: dict) -> Record:
        question, context = self._text_and_pair(where, row)
        if self.cols["answers"] is None:
            return Record(**base, text=question, pair=context)
        answer, evidence = _answer(row.get(self.cols["answers"]), where, context)
        return Record(**base, text=question, pair=context, answer=answer, evidence=evidence)

    def _next_token(self, base: dict, where: str, row: dict) -> Record:
        text, pair = self._text_and_pair(where, row)
        if not text.strip():
            raise AttrscopeError(f"{where} has an empty prefix in column {self.cols['text']!r}: next-token explains "
                                 "the word after the prefix, so write at least one word")
        target, foil = self._target_and_foil(where, row)
        return self._lm(base, where, text, pair, target, foil, self._evidence(row, where, text, pair))

    def _masked_text(self, base: dict, where: str, row: dict) -> Record:
        text, pair = self._text_and_pair(where, row)
        self._check_one_mask(text, where)
        target, foil = self._target_and_foil(where, row)
        return self._lm(base, where, text, pair, target, foil, self._evidence(row, where, text, pair))

    def _masked_word(self, base: dict, where: str, row: dict) -> Record:
        """A word index (or the Linzen verb index): that word, without attached punctuation, becomes the mask (for
        next-token, the Linzen file only: the words before it become the prefix)."""
        cols = self.cols
        text, pair = self._text_and_pair(where, row)
        target, foil = self._target_and_foil(where, row)
        words = _word_spans(text)
        first = 1 if self.format == "linzen" else 0  # the Linzen file counts words from 1 (CoNLL indices)
        index = _word_index(row.get(cols["word_index"]), where, cols["word_index"], first, len(words))
        if self.task == "masked-token" and self.mask_token in text:
            raise AttrscopeError(f"{where} already holds the mask token {self.mask_token!r} and a word index in "
                                 f"{cols['word_index']!r}: keep one of the two")
        start, end = _word_core(text, *words[index])
        word = text[start:end]
        if target is None:
            target = word
        elif word.lower() not in {target.lower(), (foil or target).lower()}:
            # Most often an index counted from the other end (1 instead of 0): say which counting was used.
            raise AttrscopeError(f"{where}: word {index + first} ({cols['word_index']!r}, counting from {first}) is "
                                 f"{word!r}, neither the target {target!r} nor the foil {foil!r}: check the index "
                                 f"counts whitespace-separated words from {first}")
        evidence = self._evidence(row, where, text, pair)
        if self.format == "linzen" and evidence is None:
            evidence = (self._linzen_subject(row, where, text, words),)
        if self.task == "next-token":  # the Linzen file for a causal LM: the words before the verb
            prefix = text[:words[index][0]].rstrip()
            if not prefix:
                raise AttrscopeError(f"{where}: the verb is the first word, so there is no prefix before it: "
                                     "next-token needs at least one word before the verb (remove the row)")
            if evidence and any(seg == 0 and b > len(prefix) for seg, a, b in evidence):
                raise AttrscopeError(f"{where}: an evidence span ends after the prefix (the words before the verb): "
                                     "evidence must point at words of the prefix")
            return self._lm(base, where, prefix, pair, target, foil, evidence)
        if evidence:
            evidence = _shift_spans(evidence, start, end, len(self.mask_token) - (end - start), where)
        masked = text[:start] + self.mask_token + text[end:]
        return self._lm(base, where, masked, pair, target, foil, evidence)

    def _text_and_pair(self, where: str, row: dict) -> tuple[str, str | None]:
        pair = _text(row, self.cols["pair"], where) if self.cols["pair"] is not None else None
        return _text(row, self.cols["text"], where), pair

    def _target_and_foil(self, where: str, row: dict) -> tuple[str | None, str | None]:
        return (_word(row, self.cols.get("target"), where, "target"),
                _word(row, self.cols.get("foil"), where, "foil"))

    def _lm(self, base, where, text, pair, target, foil, evidence) -> Record:
        if target is not None and foil is not None and target == foil:
            raise AttrscopeError(f"{where}: the target and the foil are both {target!r}: a foil must differ from "
                                 "the target (or leave the foil empty)")
        return Record(**base, text=text, pair=pair, evidence=evidence, target=target, foil=foil)

    def _evidence(self, row, where, text, pair):
        column = self.cols.get("evidence")
        return _evidence(row.get(column), where, text, pair) if column else None

    def _check_one_mask(self, text: str, where: str) -> None:
        count = text.count(self.mask_token)
        if count == 1:
            return
        column = self.cols["text"]
        if count > 1:
            raise AttrscopeError(f"{where} holds the mask token {self.mask_token!r} {count} times in column "
                                 f"{column!r}: masked-token explains one masked word, so keep one")
        others = [t for t in KNOWN_MASK_TOKENS if t != self.mask_token and t in text]
        hint = (f"it holds {others[0]!r}, but this model's mask token is {self.mask_token!r}: write "
                f"{self.mask_token!r} instead" if others else
                f"write {self.mask_token!r} where the word to predict is, or pass --word-index-column")
        raise AttrscopeError(f"{where} has no mask token {self.mask_token!r} in column {column!r}: {hint}")

    def _blimp_pair(self, base: dict, where: str, row: dict) -> Record | None:
        """The one word in which sentence_good and sentence_bad differ becomes the mask; None if there is not one."""
        good = _text(row, self.cols["good"], where)
        bad = _text(row, self.cols["bad"], where)
        good_words, bad_words = _word_spans(good), _word_spans(bad)
        if len(good_words) != len(bad_words):
            return None
        differ = [i for i, (g, b) in enumerate(zip(good_words, bad_words)) if good[slice(*g)] != bad[slice(*b)]]
        if len(differ) != 1:
            return None
        (gs, ge), (bs, be) = _word_core(good, *good_words[differ[0]]), _word_core(bad, *bad_words[differ[0]])
        word_start, word_end = good_words[differ[0]]
        bad_start, bad_end = bad_words[differ[0]]
        # Punctuation around the word ("is." / "are.") stays outside the mask; if it differs, so does more than a word.
        if good[word_start:gs] != bad[bad_start:bs] or good[ge:word_end] != bad[be:bad_end]:
            return None
        evidence = self._evidence(row, where, good, None)
        if evidence:
            evidence = _shift_spans(evidence, gs, ge, len(self.mask_token) - (ge - gs), where)
        return self._lm(base, where, good[:gs] + self.mask_token + good[ge:], None, good[gs:ge], bad[bs:be], evidence)

    def _linzen_subject(self, row: dict, where: str, text: str, words) -> tuple[int, int, int]:
        """The subject noun's character span: the evidence an agreement explanation should point at."""
        index = _word_index(row.get(self.cols["subject_index"]), where, self.cols["subject_index"], 1, len(words))
        start, end = _word_core(text, *words[index])
        subject = row.get(self.cols["subject"])
        if not isinstance(subject, str) or text[start:end].lower() != subject.strip().lower():
            raise AttrscopeError(f"{where}: word {index + 1} ({self.cols['subject_index']!r}) is "
                                 f"{text[start:end]!r}, not the subject {_show(subject)}: check the row")
        return (0, start, end)

    def skipped_note(self, rows: list[int], n_read: int, spec: str) -> str:
        shown = ", ".join(map(str, rows[:5])) + (", ..." if len(rows) > 5 else "")
        why = ("do not differ in exactly one word (with the same punctuation around it)" if self.task == "masked-token"
               else "have no one-word prefix (one_prefix_method false)")
        return f"skipped {len(rows)} of {n_read} BLiMP pairs in '{spec}' that {why}: rows {shown}"


def _is_blank(value) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _word(row: dict, column: str | None, where: str, what: str) -> str | None:
    """A target or foil word: None when there is no such column or the cell is empty; kept as written otherwise."""
    if column is None:
        return None
    value = row.get(column)
    if _is_blank(value):
        return None
    if not isinstance(value, str):
        raise AttrscopeError(f"{where} has {_show(value)} in the {what} column {column!r}, not a word: write the "
                             f"{what} word as text")
    return value


def _word_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the whitespace-separated words (the words that text.split() gives)."""
    return [m.span() for m in re.finditer(r"\S+", text)]


def _word_core(text: str, start: int, end: int) -> tuple[int, int]:
    """The word between start and end without the punctuation attached to either side ("is." -> "is")."""
    def punct(ch):
        return unicodedata.category(ch).startswith("P")

    a, b = start, end
    while a < b and punct(text[a]):
        a += 1
    while b > a and punct(text[b - 1]):
        b -= 1
    return (a, b) if a < b else (start, end)  # a word of punctuation only is masked whole


def _word_index(value, where: str, column: str, base: int, n_words: int) -> int:
    """A word index cell counting from ``base``, as a 0-based index into the text's words."""
    index = None
    if isinstance(value, bool):
        pass  # True is not word 1
    elif isinstance(value, numbers.Real) and float(value).is_integer():  # 3.0: pandas writes indices as floats
        index = int(value)
    elif isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        index = int(value)
    if index is None:
        raise AttrscopeError(f"{where} has {_show(value)} in the word index column {column!r}, not a whole number: "
                             f"write the index of a word counting from {base}")
    if not base <= index < n_words + base:
        raise AttrscopeError(f"word index {index} in {where} (column {column!r}) is out of range: the text has "
                             f"{n_words} words, {base}..{n_words - 1 + base} counting from {base}")
    return index - base


def _shift_spans(spans, start: int, end: int, delta: int, where: str):
    """Evidence spans of the source text moved to the masked text (the word start:end became the mask token)."""
    moved = []
    for seg, a, b in spans:
        if seg == 1 or b <= start:
            moved.append((seg, a, b))
        elif a >= end:
            moved.append((seg, a + delta, b + delta))
        else:
            raise AttrscopeError(f"{where}: the evidence span [{a}, {b}) overlaps the masked word: evidence must "
                                 "point at other words")
    return tuple(moved)


def _value(value, where: str) -> float | None:
    """A regression gold value: a finite number; empty or NaN means unlabelled."""
    number = None
    if _is_blank(value):
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            pass
    if number is not None and math.isnan(number):
        return None
    if number is None or math.isinf(number):
        raise AttrscopeError(f"label {_show(value)} in {where} is not a number: regression needs a numeric label "
                             "(e.g. 3.8), or pass --label-column with the numeric column")
    return number


def _answer(value, where: str, context: str) -> tuple[str | None, tuple[tuple[int, int, int], ...]]:
    """SQuAD answers ({"text": [...], "answer_start": [...]}, a list of {"text", "answer_start"}, or either as a
    JSON string) -> the first answer's text and its character span in the context (segment 1); no answer: None, ()."""
    shape = ('write answers like {"text": ["Denver Broncos"], "answer_start": [177]} (answer_start: 0-based '
             'character offset in the context)')
    if _is_blank(value):
        return None, ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise AttrscopeError(f"{where}: the answers cell {_show(value)} is not JSON: {shape}") from None
    try:
        if isinstance(value, dict):
            texts, starts = list(value["text"]), list(value["answer_start"])
        else:
            items = list(value)
            texts, starts = [a["text"] for a in items], [a["answer_start"] for a in items]
        if len(texts) != len(starts):
            raise ValueError
    except (KeyError, TypeError, ValueError):
        raise AttrscopeError(f"{where}: the answers cell {_show(value)} is not SQuAD answers: {shape}") from None
    if not texts:
        return None, ()  # unanswerable (SQuAD 2.0)
    text, start = texts[0], starts[0]
    if not isinstance(text, str) or not text or isinstance(start, bool) or not isinstance(start, numbers.Integral):
        raise AttrscopeError(f"{where}: the first answer {_show(text)} at {_show(start)} is not an answer text and "
                             f"a whole number: {shape}")
    start = int(start)
    found = context[start:start + len(text)] if start >= 0 else ""
    if found != text:
        raise AttrscopeError(f"{where}: the answer {_show(text)} is not at character {start} of the context (found "
                             f"{_show(found)}): fix answer_start, the 0-based character offset in the context")
    return text, ((1, start, start + len(text)),)


def _evidence(value, where: str, text: str, pair: str | None) -> tuple[tuple[int, int, int], ...]:
    """An evidence cell: a list of character spans [start, end) in the text, or [segment, start, end] with segment 1
    for the pair text; in CSV/TSV the list is written as JSON. Empty or missing: no evidence."""
    import json

    if value is None or (isinstance(value, str) and not value.strip()):
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise AttrscopeError(f"{where}: the evidence cell {_show(value)} is not JSON: write character spans "
                                 "like [[0, 5], [10, 14]]") from None
    spans = []
    try:
        for item in list(value):
            item = [int(v) for v in item]
            seg, a, b = (0, *item) if len(item) == 2 else item
            seg_text = text if seg == 0 else pair
            if seg not in (0, 1) or seg_text is None or not 0 <= a < b <= len(seg_text):
                raise ValueError
            spans.append((seg, a, b))
    except (TypeError, ValueError):
        raise AttrscopeError(f"{where}: evidence {_show(value)} is not a list of character spans [start, end) "
                             "(or [segment, start, end]) inside the text: fix the cell") from None
    return tuple(spans)


def _text(row: dict, column: str, where: str) -> str:
    value = row.get(column)
    if value is None:
        raise AttrscopeError(f"{where} has no text in column {column!r}: fill it in or remove the row")
    if not isinstance(value, str):
        raise AttrscopeError(
            f"{where} has a value of type {type(value).__name__} in text column {column!r}, not text: "
            "pass --text-column with a text column"
        )
    return value  # exactly as in the source: tokenizers and offsets depend on it


def _record_id(row: dict, column: str | None, row_no: int) -> str:
    if column is None:
        return str(row_no)
    value = row.get(column)
    if value is None or (isinstance(value, str) and not value.strip()):
        return str(row_no)
    return str(value)


def _show(value) -> str:
    """A value for a one-line message: repr escapes newlines; long values are cut."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."
