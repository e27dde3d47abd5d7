"""Regression: a text (and a pair) with a numeric gold value."""

from __future__ import annotations

import math
import numbers

from compute.errors import AttrscopeError

from .cells import evidence_cell, is_blank, show, text_cell
from .columns import ColumnFinder, resolve_columns
from .records import Record

REGRESSION_LABEL_CANDIDATES = ("label", "labels", "score", "similarity_score")


def columns(find: ColumnFinder, flags: dict) -> dict:
    return {**resolve_columns(find, flags, label_candidates=REGRESSION_LABEL_CANDIDATES), "format": "plain"}


def rows(cols: dict, labels, mask_token: str | None):
    """``make(row_no, where, row, id)`` -> the row's Record."""
    def make(row_no: int, where: str, row: dict, id_: str) -> Record:
        # The pair is read first: its error is the one reported when both cells are bad.
        pair = text_cell(row, cols["pair"], where) if cols["pair"] is not None else None
        text = text_cell(row, cols["text"], where)
        value = value_cell(row.get(cols["label"]), where) if cols["label"] is not None else None
        evidence = evidence_cell(row.get(cols["evidence"]), where, text, pair) if cols.get("evidence") else None
        return Record(row=row_no, id=id_, text=text, pair=pair, label=-1, value=value, evidence=evidence)

    return make


def value_cell(value, where: str) -> float | None:
    """A regression gold value: a finite number; empty or NaN means unlabelled."""
    number = None
    if is_blank(value):
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
        raise AttrscopeError(f"label {show(value)} in {where} is not a number: regression needs a numeric label "
                             "(e.g. 3.8), or pass --label-column with the numeric column")
    return number
