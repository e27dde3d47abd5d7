"""Extractive question answering: a question, its context and SQuAD answers (the first answer's span is the
evidence)."""

from __future__ import annotations

import json
import numbers

from compute.errors import AttrscopeError

from .cells import clean_text, is_blank, show, text_cell
from .columns import CONTEXT_CANDIDATES, ID_CANDIDATES, QUESTION_CANDIDATES, ColumnFinder
from .records import Record

ANSWERS_CANDIDATES = ("answers",)


def columns(find: ColumnFinder, flags: dict) -> dict:
    return {"text": find.required(flags["text"], "--text-column", QUESTION_CANDIDATES, "question"),
            "pair": find.required(flags["pair"], "--pair-column", CONTEXT_CANDIDATES, "context"),
            "label": None, "id": find.pick(flags["id"], "--id-column", ID_CANDIDATES),
            "answers": find.pick(flags["answers"], "--answers-column", ANSWERS_CANDIDATES), "format": "squad"}


def rows(cols: dict, labels, mask_token: str | None):
    """``make(row_no, where, row, id)`` -> the row's Record."""
    def make(row_no: int, where: str, row: dict, id_: str) -> Record:
        context = text_cell(row, cols["pair"], where)  # read first: its error is reported when both are bad
        question = text_cell(row, cols["text"], where)
        if cols["answers"] is None:
            return Record(row=row_no, id=id_, text=question, pair=context, label=-1)
        answer, evidence = answer_cell(row.get(cols["answers"]), where, context)
        return Record(row=row_no, id=id_, text=question, pair=context, label=-1, answer=answer, evidence=evidence)

    return make


def answer_cell(value, where: str, context: str) -> tuple[str | None, tuple[tuple[int, int, int], ...]]:
    """SQuAD answers ({"text": [...], "answer_start": [...]}, a list of {"text", "answer_start"}, or either as a
    JSON string) -> the first answer's text and its character span in the context (segment 1); no answer: None, ()."""
    shape = ('write answers like {"text": ["Denver Broncos"], "answer_start": [177]} (answer_start: 0-based '
             'character offset in the context)')
    if is_blank(value):
        return None, ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise AttrscopeError(f"{where}: the answers cell {show(value)} is not JSON: {shape}") from None
    try:
        if isinstance(value, dict):
            texts, starts = list(value["text"]), list(value["answer_start"])
        else:
            items = list(value)
            texts, starts = [a["text"] for a in items], [a["answer_start"] for a in items]
        if len(texts) != len(starts):
            raise ValueError
    except (KeyError, TypeError, ValueError):
        raise AttrscopeError(f"{where}: the answers cell {show(value)} is not SQuAD answers: {shape}") from None
    if not texts:
        return None, ()  # unanswerable (SQuAD 2.0)
    text, start = texts[0], starts[0]
    if not isinstance(text, str) or not text or isinstance(start, bool) or not isinstance(start, numbers.Integral):
        raise AttrscopeError(f"{where}: the first answer {show(text)} at {show(start)} is not an answer text and "
                             f"a whole number: {shape}")
    text = clean_text(text)  # as its context was
    start = int(start)
    found = context[start:start + len(text)] if start >= 0 else ""
    if found != text:
        raise AttrscopeError(f"{where}: the answer {show(text)} is not at character {start} of the context (found "
                             f"{show(found)}): fix answer_start, the 0-based character offset in the context")
    return text, ((1, start, start + len(text)),)
