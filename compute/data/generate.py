"""generate: a prompt per row (``prompt`` or ``text``), and where given the continuation to force instead of
decoding (--continuation-column) and the foils to contrast each step with (--contrast-column: a text whose tokens
are the steps' foils, one per generated token)."""

from __future__ import annotations

from compute.errors import AttrscopeError

from .cells import is_blank, text_cell
from .columns import ID_CANDIDATES, ColumnFinder
from .records import Record

PROMPT_CANDIDATES = ("prompt", "text")


def columns(find: ColumnFinder, flags: dict) -> dict:
    prompt = find.required(flags["text"], "--text-column", PROMPT_CANDIDATES, "prompt")
    continuation = find.explicit(flags["continuation"], "--continuation-column") if flags["continuation"] else None
    contrast = find.explicit(flags["contrast"], "--contrast-column") if flags["contrast"] else None
    return {"text": prompt, "pair": None, "label": None, "id": find.pick(flags["id"], "--id-column", ID_CANDIDATES),
            "continuation": continuation, "contrast": contrast, "format": "plain"}


def rows(cols: dict, labels, mask_token: str | None):
    """``make(row_no, where, row, id)`` -> the row's Record: the prompt as ``text``, a forced continuation as
    ``target`` and the contrast text as ``foil`` (both kept as written: the task tokenises them after the prompt)."""
    def make(row_no: int, where: str, row: dict, id_: str) -> Record:
        text = text_cell(row, cols["text"], where)
        if not text.strip():
            raise AttrscopeError(f"{where} has an empty prompt in column {cols['text']!r}: generate continues the "
                                 "prompt, so write at least one word, or remove the row")
        continuation = _given(row, cols["continuation"], where, "continuation")
        foils = _given(row, cols["contrast"], where, "contrast")
        return Record(row=row_no, id=id_, text=text, pair=None, label=-1, target=continuation, foil=foils)

    return make


def _given(row: dict, column: str | None, where: str, what: str) -> str | None:
    if column is None:
        return None
    if is_blank(row.get(column)):
        raise AttrscopeError(f"{where} has no {what} in column {column!r}: fill it in, or remove the row")
    return text_cell(row, column, where)
