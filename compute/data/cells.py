"""One cell of a row read as what a record holds: a text, an id, a word, a word index, evidence spans; and the
spans of the words of a text. Every problem is a one-line ``AttrscopeError`` naming the row and the fix."""

from __future__ import annotations

import json
import numbers
import re
import unicodedata

from compute.errors import AttrscopeError


def text_cell(row: dict, column: str, where: str) -> str:
    value = row.get(column)
    if value is None:
        raise AttrscopeError(f"{where} has no text in column {column!r}: fill it in or remove the row")
    if not isinstance(value, str):
        raise AttrscopeError(
            f"{where} has a value of type {type(value).__name__} in text column {column!r}, not text: "
            "pass --text-column with a text column"
        )
    return clean_text(value)


# C0 controls but tab, newline and carriage return (whitespace already), DEL and C1: BERT's tokenizers drop them,
# fusing the words on either side ("nul\x00inside" -> nu ##lins ##ide). One space for one character, so that every
# character offset of the source (evidence, answers, word indices) still points at the same text.
_CONTROLS = {c: " " for c in (*range(0x20), *range(0x7F, 0xA0)) if chr(c) not in "\t\n\r"}


def clean_text(text: str) -> str:
    """``text`` as in the source, its control characters made spaces: what is tokenised and what the store records
    (its tokens' offsets are into it)."""
    return text.translate(_CONTROLS)


def record_id(row: dict, column: str | None, row_no: int) -> str:
    if column is None:
        return str(row_no)
    value = row.get(column)
    if value is None or (isinstance(value, str) and not value.strip()):
        return str(row_no)
    return str(value)


def is_blank(value) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def word_cell(row: dict, column: str | None, where: str, what: str) -> str | None:
    """A target or foil word: None when there is no such column or the cell is empty; kept as written otherwise."""
    if column is None:
        return None
    value = row.get(column)
    if is_blank(value):
        return None
    if not isinstance(value, str):
        raise AttrscopeError(f"{where} has {show(value)} in the {what} column {column!r}, not a word: write the "
                             f"{what} word as text")
    return value


def word_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the whitespace-separated words (the words that text.split() gives)."""
    return [m.span() for m in re.finditer(r"\S+", text)]


def word_core(text: str, start: int, end: int) -> tuple[int, int]:
    """The word between start and end without the punctuation attached to either side ("is." -> "is")."""
    def punct(ch):
        return unicodedata.category(ch).startswith("P")

    a, b = start, end
    while a < b and punct(text[a]):
        a += 1
    while b > a and punct(text[b - 1]):
        b -= 1
    return (a, b) if a < b else (start, end)  # a word of punctuation only is masked whole


def word_index_cell(value, where: str, column: str, base: int, n_words: int) -> int:
    """A word index cell counting from ``base``, as a 0-based index into the text's words."""
    index = None
    if isinstance(value, bool):
        pass  # True is not word 1
    elif isinstance(value, numbers.Real) and float(value).is_integer():  # 3.0: pandas writes indices as floats
        index = int(value)
    elif isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        index = int(value)
    if index is None:
        raise AttrscopeError(f"{where} has {show(value)} in the word index column {column!r}, not a whole number: "
                             f"write the index of a word counting from {base}")
    if not base <= index < n_words + base:
        raise AttrscopeError(f"word index {index} in {where} (column {column!r}) is out of range: the text has "
                             f"{n_words} words, {base}..{n_words - 1 + base} counting from {base}")
    return index - base


def shift_spans(spans, start: int, end: int, delta: int, where: str):
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


def evidence_cell(value, where: str, text: str, pair: str | None) -> tuple[tuple[int, int, int], ...]:
    """An evidence cell: a list of character spans [start, end) in the text, or [segment, start, end] with segment 1
    for the pair text; in CSV/TSV the list is written as JSON. Empty or missing: no evidence."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise AttrscopeError(f"{where}: the evidence cell {show(value)} is not JSON: write character spans "
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
        raise AttrscopeError(f"{where}: evidence {show(value)} is not a list of character spans [start, end) "
                             "(or [segment, start, end]) inside the text: fix the cell") from None
    return tuple(spans)


def show(value) -> str:
    """A value for a one-line message: repr escapes newlines; long values are cut."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
