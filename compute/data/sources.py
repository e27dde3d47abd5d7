"""Local files (.jsonl, .csv, .tsv, .parquet) read into a ``Table`` of raw rows."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from compute.errors import AttrscopeError

SUPPORTED = (".jsonl", ".csv", ".tsv", ".parquet")
SUPPORTED_TEXT = "a local .jsonl/.csv/.tsv/.parquet file"


@dataclass
class Table:
    """Raw rows of any source: column names, (where, row dict) pairs, and the total row count."""

    kind: str
    columns: list[str]
    rows: Iterable[tuple[str, dict]]  # "where" is for error messages, e.g. "row 3 of 'x.tsv' (line 5)"
    n_rows: int
    sha256: str | None


def read_local(path: Path, spec: str) -> Table:
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
    return Table(kind=suffix[1:], columns=columns, rows=rows, n_rows=len(rows), sha256=sha)


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
            f"dataset file '{spec}' is not a readable Parquet file ({first_line(e)}): check the file"
        ) from None
    rows = [(f"row {i} of '{spec}'", row) for i, row in enumerate(table.to_pylist())]
    return list(table.column_names), rows


def first_line(exc: BaseException) -> str:
    """An exception's first line, cut for a one-line message."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."
