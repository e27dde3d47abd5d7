"""``load_dataset``: a source read into raw rows, the task's columns found, each row made a ``Record``."""

from __future__ import annotations

import json
from pathlib import Path

from compute.errors import AttrscopeError, UsageError

from . import classification, generate, masked_token, next_token, qa, regression
from .cells import record_id, show
from .classification import LabelMapper
from .columns import ColumnFinder, find_column
from .hub import looks_like_hub, read_hub
from .records import Dataset, Record
from .sources import read_local
from .words import LINZEN_COLUMNS

# Each task's reader: ``columns(find, flags)`` -> its columns, ``rows(cols, labels, mask_token)`` -> the maker of a
# row's Record (None: the row is skipped; a maker that skips rows has ``skipped_note``).
READERS = {"classification": classification, "regression": regression, "masked-token": masked_token,
           "next-token": next_token, "qa": qa, "generate": generate}
TASKS = tuple(READERS)


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
    continuation_column=None,
    contrast_column=None,
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
                      evidence_column=evidence_column, continuation_column=continuation_column,
                      contrast_column=contrast_column)
    if limit is not None and limit <= 0:
        raise UsageError(f"--limit must be a positive number of examples, got {limit}")

    path = Path(spec).expanduser()
    if path.exists():
        if split is not None:
            raise UsageError(f"--split applies only to Hugging Face datasets, not to the local file '{spec}': drop it")
        table = read_local(path, spec)
    elif looks_like_hub(spec):
        table = read_hub(spec, split, limit)
    else:
        raise AttrscopeError(f"dataset file '{spec}' not found: check the path")

    if table.n_rows == 0:
        raise AttrscopeError(f"dataset '{spec}' has no rows: add at least one example")

    flags = {"text": text_column, "pair": pair_column, "label": label_column, "id": id_column,
             "target": target_column, "foil": foil_column, "answers": answers_column,
             "word_index": word_index_column, "continuation": continuation_column, "contrast": contrast_column}
    reader = READERS[task]
    cols = reader.columns(ColumnFinder(table.columns, spec), flags)
    if evidence_column is not None:
        cols["evidence"] = find_column(table.columns, evidence_column)
        if cols["evidence"] is None:
            raise AttrscopeError(f"column {evidence_column!r} (from --evidence-column) is not in '{spec}' (columns: "
                                 f"{', '.join(repr(c) for c in table.columns)}): pass one of those")
    labels = LabelMapper(label2id, num_labels)
    make = reader.rows(cols, labels, mask_token)
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
    has = all(find_column(columns, c) is not None for c in LINZEN_COLUMNS) and task != "qa"
    return has or (task in ("qa", "auto") and find_column(columns, "answers") is not None)


def _check_task_flags(task: str, mask_token, **flags) -> None:
    """Column flags another task reads are usage errors, not silently ignored."""
    applies = {
        "label_column": ("classification", "regression"),
        "target_column": ("masked-token", "next-token"),
        "foil_column": ("masked-token", "next-token"),
        "word_index_column": ("masked-token",),
        "answers_column": ("qa",),
        "evidence_column": ("classification", "regression", "masked-token", "next-token"),
        "continuation_column": ("generate",),
        "contrast_column": ("generate",),
    }
    for name, value in flags.items():
        if value is not None and task not in applies[name]:
            flag = "--" + name.replace("_", "-")
            extra = " (qa reads the evidence span from the answers)" if name == "evidence_column" else ""
            raise UsageError(f"{flag} applies to --task {' / '.join(applies[name])}, not {task}{extra}: drop it")
    if task == "masked-token" and not mask_token:
        raise UsageError("--task masked-token needs a model with a mask token (a masked-LM tokenizer): "
                         "use a masked language model")


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
                f"id {show(id_)} appears in rows {first_row_of_id[id_]} and {row_no} of '{spec}': "
                "make the id column unique, or pass --id-column with a unique column"
            )
        first_row_of_id[id_] = row_no
        records.append(record)
    return records, skipped


def _row_id(row: dict, cols: dict, row_no: int) -> str:
    if cols.get("blimp_pair_id") is not None:  # BLiMP: pairID counts within a paradigm, UID names the paradigm
        pair_id = record_id(row, cols["blimp_pair_id"], row_no)
        uid = row.get(cols["blimp_uid"]) if cols.get("blimp_uid") is not None else None
        return f"{uid}_{pair_id}" if isinstance(uid, str) and uid.strip() else pair_id
    return record_id(row, cols["id"], row_no)
