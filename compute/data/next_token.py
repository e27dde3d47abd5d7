"""Next-token: the word after a prefix (the text, a BLiMP one-word prefix, or the Linzen words before the verb) and
its target and foil."""

from __future__ import annotations

from compute.errors import AttrscopeError

from .cells import is_blank
from .columns import ColumnFinder
from .records import Record
from .words import WordRows, word_columns

PREFIX_CANDIDATES = ("text", "prefix", "sentence")


def columns(find: ColumnFinder, flags: dict) -> dict:
    return word_columns("next-token", find, flags, _plain)


def _plain(find: ColumnFinder, flags: dict, base: dict) -> dict:
    text = find.required(flags["text"], "--text-column", PREFIX_CANDIDATES, "prefix text")
    return {"text": text, **base, "format": "plain"}


class NextTokenRows(WordRows):
    task = "next-token"

    def __call__(self, row_no: int, where: str, row: dict, id_: str) -> Record | None:
        base = {"row": row_no, "id": id_, "label": -1}
        if self.format == "blimp" and is_blank(row.get(self.cols["text"])):
            return None  # a BLiMP paradigm without the one-word-prefix form (one_prefix_method false)
        if self.format == "linzen":
            return self._masked_word(base, where, row)  # the words before the Linzen verb
        return self._next_token(base, where, row)

    def _next_token(self, base: dict, where: str, row: dict) -> Record:
        text, pair = self._text_and_pair(where, row)
        if not text.strip():
            raise AttrscopeError(f"{where} has an empty prefix in column {self.cols['text']!r}: next-token explains "
                                 "the word after the prefix, so write at least one word")
        target, foil = self._target_and_foil(where, row)
        return self._lm(base, where, text, pair, target, foil, self._evidence(row, where, text, pair))


rows = NextTokenRows
