"""Classification: a text (and a pair) with a class label, read through the model's label names."""

from __future__ import annotations

import math
import numbers
import re

from compute.errors import AttrscopeError

from .cells import evidence_cell, show, text_cell
from .columns import ColumnFinder, resolve_columns
from .records import Record

_DEFAULT_LABEL = re.compile(r"label_(\d+)", re.IGNORECASE)


def columns(find: ColumnFinder, flags: dict) -> dict:
    return resolve_columns(find, flags)


def rows(cols: dict, labels: LabelMapper, mask_token: str | None):
    """``make(row_no, where, row, id)`` -> the row's Record."""
    def make(row_no: int, where: str, row: dict, id_: str) -> Record:
        text = text_cell(row, cols["text"], where)
        pair = text_cell(row, cols["pair"], where) if cols["pair"] is not None else None
        label = labels(row.get(cols["label"]), where) if cols["label"] is not None else -1
        evidence = evidence_cell(row.get(cols["evidence"]), where, text, pair) if cols.get("evidence") else None
        return Record(row=row_no, id=id_, text=text, pair=pair, label=label, evidence=evidence)

    return make


class LabelMapper:
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
        return AttrscopeError(f"label {show(value)} in {where} is not a known label (known: {known}): {fix}")
