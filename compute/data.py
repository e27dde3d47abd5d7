"""Load the examples to attribute: local .jsonl/.csv/.tsv/.parquet files or a Hugging Face hub split.

Every source is reduced to the same thing, a list of ``Record``s (text, optional pair, label index, id),
so the rest of attr-compute never looks at file formats. Problems with the data are raised as
one-line ``AttrscopeError``s that name the file, the row and the fix.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import numbers
import re
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


@dataclass
class Dataset:
    records: list[Record]
    source: str  # the spec as given
    kind: str  # "jsonl" | "csv" | "tsv" | "parquet" | "hub"
    columns: dict  # {"text": ..., "pair": ... or None, "label": ... or None, "id": ... or None}
    n_rows: int  # rows in the source before --limit
    sha256: str | None  # of the local file bytes; None for hub datasets
    label_names: dict | None  # how string labels were mapped, e.g. {"positive": 1, "negative": 0}, else None


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
    text_column=None,
    pair_column=None,
    label_column=None,
    id_column=None,
    evidence_column=None,
    split=None,
    limit=None,
    label2id: dict[str, int] | None = None,
    num_labels: int | None = None,
) -> Dataset:
    """Read ``spec`` (a local file, or ``name[/config]:split`` on the hub) into records."""
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

    cols = _resolve_columns(table.columns, spec, text_column, pair_column, label_column, id_column)
    if evidence_column is not None:
        cols["evidence"] = _find_column(table.columns, evidence_column)
        if cols["evidence"] is None:
            raise AttrscopeError(f"column {evidence_column!r} (from --evidence-column) is not in '{spec}' (columns: "
                                 f"{', '.join(repr(c) for c in table.columns)}): pass one of those")
    labels = _LabelMapper(label2id, num_labels)
    records = _to_records(table.rows, cols, labels, limit, spec)
    return Dataset(
        records=records,
        source=spec,
        kind=table.kind,
        columns=cols,
        n_rows=table.n_rows,
        sha256=table.sha256,
        label_names=labels.mapped or None,
    )


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


def _resolve_columns(columns, spec, text_column, pair_column, label_column, id_column) -> dict:
    available = ", ".join(repr(c) for c in columns) or "none"

    def explicit(name, flag):
        found = _find_column(columns, name)
        if found is None:
            raise AttrscopeError(
                f"column {name!r} (from {flag}) is not in '{spec}' (columns: {available}): pass one of those"
            )
        return found

    def auto(candidates):
        return next((c for c in (_find_column(columns, n) for n in candidates) if c is not None), None)

    if text_column is not None:
        text = explicit(text_column, "--text-column")
    else:
        text = auto(TEXT_CANDIDATES)
        if text is None:
            raise AttrscopeError(
                f"no text column found in '{spec}' (columns: {available}): pass --text-column"
            )

    if pair_column is not None:
        pair = explicit(pair_column, "--pair-column")
    elif text_column is None and str(text).strip().lower() in PAIR_FOR_TEXT:
        pair = _find_column(columns, PAIR_FOR_TEXT[str(text).strip().lower()])
    else:
        pair = None

    label = explicit(label_column, "--label-column") if label_column is not None else auto(LABEL_CANDIDATES)
    id_ = explicit(id_column, "--id-column") if id_column is not None else auto(ID_CANDIDATES)
    return {"text": text, "pair": pair, "label": label, "id": id_}


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


def _to_records(rows, cols: dict, labels: _LabelMapper, limit: int | None, spec: str) -> list[Record]:
    records: list[Record] = []
    first_row_of_id: dict[str, int] = {}
    for row_no, (where, row) in enumerate(rows):
        if limit is not None and row_no >= limit:
            break
        text = _text(row, cols["text"], where)
        pair = _text(row, cols["pair"], where) if cols["pair"] is not None else None
        label = labels(row.get(cols["label"]), where) if cols["label"] is not None else -1
        id_ = _record_id(row, cols["id"], row_no)
        # Results are keyed by id (and --resume skips done ids), so two rows must not share one.
        if id_ in first_row_of_id:
            raise AttrscopeError(
                f"id {_show(id_)} appears in rows {first_row_of_id[id_]} and {row_no} of '{spec}': "
                "make the id column unique, or pass --id-column with a unique column"
            )
        first_row_of_id[id_] = row_no
        evidence = _evidence(row.get(cols["evidence"]), where, text, pair) if cols.get("evidence") else None
        records.append(Record(row=row_no, id=id_, text=text, pair=pair, label=label, evidence=evidence))
    return records


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
