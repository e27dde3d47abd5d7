"""What every source is reduced to: a ``Record`` per example and the ``Dataset`` that holds them."""

from __future__ import annotations

from dataclasses import dataclass


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
