"""Masked-token: the word at the model's mask token (in the text, at a word index, the word in which a BLiMP pair
differs, or the Linzen verb) and its target and foil."""

from __future__ import annotations

from compute.errors import AttrscopeError

from .cells import shift_spans, text_cell, word_core, word_spans
from .columns import ColumnFinder
from .records import Record
from .words import WORD_INDEX_CANDIDATES, WordRows, word_columns

LM_TEXT_CANDIDATES = ("text", "sentence")
# Mask tokens of common tokenizers, named in the error when a text holds one that is not the model's.
KNOWN_MASK_TOKENS = ("[MASK]", "<mask>")


def columns(find: ColumnFinder, flags: dict) -> dict:
    return word_columns("masked-token", find, flags, _plain)


def _plain(find: ColumnFinder, flags: dict, base: dict) -> dict:
    text = find.required(flags["text"], "--text-column", LM_TEXT_CANDIDATES, "text")
    word_index = find.pick(flags["word_index"], "--word-index-column", WORD_INDEX_CANDIDATES)
    cols = {"text": text, **base, "format": "plain"}
    if word_index is not None:
        cols["word_index"] = word_index
    return cols


class MaskedTokenRows(WordRows):
    task = "masked-token"

    def __call__(self, row_no: int, where: str, row: dict, id_: str) -> Record | None:
        base = {"row": row_no, "id": id_, "label": -1}
        if self.format == "blimp":
            return self._blimp_pair(base, where, row)
        if self.cols.get("word_index") is not None:
            return self._masked_word(base, where, row)
        return self._masked_text(base, where, row)

    def _masked_text(self, base: dict, where: str, row: dict) -> Record:
        text, pair = self._text_and_pair(where, row)
        self._check_one_mask(text, where)
        target, foil = self._target_and_foil(where, row)
        return self._lm(base, where, text, pair, target, foil, self._evidence(row, where, text, pair))

    def _check_one_mask(self, text: str, where: str) -> None:
        count = text.count(self.mask_token)
        if count == 1:
            return
        column = self.cols["text"]
        if count > 1:
            raise AttrscopeError(f"{where} holds the mask token {self.mask_token!r} {count} times in column "
                                 f"{column!r}: masked-token explains one masked word, so keep one")
        others = [t for t in KNOWN_MASK_TOKENS if t != self.mask_token and t in text]
        hint = (f"it holds {others[0]!r}, but this model's mask token is {self.mask_token!r}: write "
                f"{self.mask_token!r} instead" if others else
                f"write {self.mask_token!r} where the word to predict is, or pass --word-index-column")
        raise AttrscopeError(f"{where} has no mask token {self.mask_token!r} in column {column!r}: {hint}")

    def _blimp_pair(self, base: dict, where: str, row: dict) -> Record | None:
        """The one word in which sentence_good and sentence_bad differ becomes the mask; None if there is not one."""
        good = text_cell(row, self.cols["good"], where)
        bad = text_cell(row, self.cols["bad"], where)
        good_words, bad_words = word_spans(good), word_spans(bad)
        if len(good_words) != len(bad_words):
            return None
        differ = [i for i, (g, b) in enumerate(zip(good_words, bad_words)) if good[slice(*g)] != bad[slice(*b)]]
        if len(differ) != 1:
            return None
        (gs, ge), (bs, be) = word_core(good, *good_words[differ[0]]), word_core(bad, *bad_words[differ[0]])
        word_start, word_end = good_words[differ[0]]
        bad_start, bad_end = bad_words[differ[0]]
        # Punctuation around the word ("is." / "are.") stays outside the mask; if it differs, so does more than a word.
        if good[word_start:gs] != bad[bad_start:bs] or good[ge:word_end] != bad[be:bad_end]:
            return None
        evidence = self._evidence(row, where, good, None)
        if evidence:
            evidence = shift_spans(evidence, gs, ge, len(self.mask_token) - (ge - gs), where)
        return self._lm(base, where, good[:gs] + self.mask_token + good[ge:], None, good[gs:ge], bad[bs:be], evidence)


rows = MaskedTokenRows
