"""What masked-token and next-token share: the target and foil words, the BLiMP minimal pairs and the Linzen
agreement file (their columns), a word index turned into the explained word, and the record of a word task."""

from __future__ import annotations

from compute.errors import AttrscopeError, UsageError

from .cells import evidence_cell, shift_spans, show, text_cell, word_cell, word_core, word_index_cell, word_spans
from .columns import ID_CANDIDATES, ColumnFinder, find_column
from .records import Record

TARGET_CANDIDATES = ("target", "correct")  # "correct"/"wrong": the simple agreement form
FOIL_CANDIDATES = ("foil", "wrong")
WORD_INDEX_CANDIDATES = ("word_index", "verb_index")
# BLiMP (Warstadt et al. 2020) minimal pairs; the one-prefix fields are the next-token form of the same pair.
BLIMP_COLUMNS = ("sentence_good", "sentence_bad")
BLIMP_PREFIX_COLUMNS = ("one_prefix_prefix", "one_prefix_word_good", "one_prefix_word_bad")
# The agreement file of Linzen et al. (2016), agr_50_mostcommon_10K.tsv: these of its 18 columns are read.
# Its `sentence` column replaces rare words by their POS tag, so the real words come from `orig_sentence`;
# verb_index and subj_index count words from 1.
LINZEN_COLUMNS = ("orig_sentence", "verb_index", "verb", "subj_index", "subj")


def word_columns(task: str, find: ColumnFinder, flags: dict, plain) -> dict:
    """The columns of a word task: a BLiMP file, the Linzen file, else ``plain(find, flags, base)`` (the task's own
    layout; ``base`` holds the pair, id, target and foil columns)."""
    text_column, pair_column, id_column = flags["text"], flags["pair"], flags["id"]
    target_column, foil_column, word_index_column = flags["target"], flags["foil"], flags["word_index"]
    pair = find.explicit(pair_column, "--pair-column") if pair_column is not None else None
    id_ = find.pick(id_column, "--id-column", ID_CANDIDATES)
    blimp_columns = BLIMP_COLUMNS if task == "masked-token" else BLIMP_PREFIX_COLUMNS
    if find.has_all(blimp_columns):
        given = [flag for flag, v in (("--text-column", text_column), ("--pair-column", pair_column),
                                      ("--target-column", target_column), ("--foil-column", foil_column),
                                      ("--word-index-column", word_index_column)) if v is not None]
        if given:
            raise UsageError(f"'{find.spec}' holds BLiMP minimal pairs ({', '.join(blimp_columns)}), which give the "
                             f"text, target and foil: drop {', '.join(given)}")
        # pairID in the BLiMP jsonl files, pair_id in the Hugging Face copy (nyu-mll/blimp).
        uid, pair_id = find_column(find.columns, "UID"), find.auto(("pairID", "pair_id"))
        named = [find.auto((c,)) for c in blimp_columns]
        # Ids: UID_pairID (pairID counts within a paradigm, UID names it) unless --id-column says otherwise.
        cols = {"text": named[0], "pair": None, "label": None, "id": id_ if id_column is not None else None,
                "format": "blimp"}
        if task == "masked-token":
            cols.update(good=named[0], bad=named[1])
        else:
            cols.update(target=named[1], foil=named[2])
        if id_column is None:
            cols.update(blimp_uid=uid, blimp_pair_id=pair_id)
        return cols

    target = find.pick(target_column, "--target-column", TARGET_CANDIDATES)
    foil = find.pick(foil_column, "--foil-column", FOIL_CANDIDATES)
    if word_index_column is None and find.has_all(LINZEN_COLUMNS):
        # masked-token masks the verb; next-token reads the words before it as the prefix.
        return {"text": find.pick(text_column, "--text-column", ("orig_sentence",)), "pair": pair, "label": None,
                "id": id_, "target": find.pick(target_column, "--target-column", ("verb",)), "foil": foil,
                "word_index": find.auto(("verb_index",)),
                "subject_index": find.auto(("subj_index",)), "subject": find.auto(("subj",)), "format": "linzen"}
    return plain(find, flags, {"pair": pair, "label": None, "id": id_, "target": target, "foil": foil})


class WordRows:
    """Turns one row into the Record of a word task; a subclass per task says which form a row takes (``__call__``)."""

    task: str  # "masked-token" | "next-token"

    def __init__(self, cols: dict, labels, mask_token: str | None):
        self.cols, self.mask_token = cols, mask_token
        self.format = cols["format"]

    def _masked_word(self, base: dict, where: str, row: dict) -> Record:
        """A word index (or the Linzen verb index): that word, without attached punctuation, becomes the mask (for
        next-token, the Linzen file only: the words before it become the prefix)."""
        cols = self.cols
        text, pair = self._text_and_pair(where, row)
        target, foil = self._target_and_foil(where, row)
        words = word_spans(text)
        first = 1 if self.format == "linzen" else 0  # the Linzen file counts words from 1 (CoNLL indices)
        index = word_index_cell(row.get(cols["word_index"]), where, cols["word_index"], first, len(words))
        if self.task == "masked-token" and self.mask_token in text:
            raise AttrscopeError(f"{where} already holds the mask token {self.mask_token!r} and a word index in "
                                 f"{cols['word_index']!r}: keep one of the two")
        start, end = word_core(text, *words[index])
        word = text[start:end]
        if target is None:
            target = word
        elif word.lower() not in {target.lower(), (foil or target).lower()}:
            # Most often an index counted from the other end (1 instead of 0): say which counting was used.
            raise AttrscopeError(f"{where}: word {index + first} ({cols['word_index']!r}, counting from {first}) is "
                                 f"{word!r}, neither the target {target!r} nor the foil {foil!r}: check the index "
                                 f"counts whitespace-separated words from {first}")
        evidence = self._evidence(row, where, text, pair)
        if self.format == "linzen" and evidence is None:
            evidence = (self._linzen_subject(row, where, text, words),)
        if self.task == "next-token":  # the Linzen file for a causal LM: the words before the verb
            prefix = text[:words[index][0]].rstrip()
            if not prefix:
                raise AttrscopeError(f"{where}: the verb is the first word, so there is no prefix before it: "
                                     "next-token needs at least one word before the verb (remove the row)")
            if evidence and any(seg == 0 and b > len(prefix) for seg, a, b in evidence):
                raise AttrscopeError(f"{where}: an evidence span ends after the prefix (the words before the verb): "
                                     "evidence must point at words of the prefix")
            return self._lm(base, where, prefix, pair, target, foil, evidence)
        if evidence:
            evidence = shift_spans(evidence, start, end, len(self.mask_token) - (end - start), where)
        masked = text[:start] + self.mask_token + text[end:]
        return self._lm(base, where, masked, pair, target, foil, evidence)

    def _text_and_pair(self, where: str, row: dict) -> tuple[str, str | None]:
        pair = text_cell(row, self.cols["pair"], where) if self.cols["pair"] is not None else None
        return text_cell(row, self.cols["text"], where), pair

    def _target_and_foil(self, where: str, row: dict) -> tuple[str | None, str | None]:
        return (word_cell(row, self.cols.get("target"), where, "target"),
                word_cell(row, self.cols.get("foil"), where, "foil"))

    def _lm(self, base, where, text, pair, target, foil, evidence) -> Record:
        if target is not None and foil is not None and target == foil:
            raise AttrscopeError(f"{where}: the target and the foil are both {target!r}: a foil must differ from "
                                 "the target (or leave the foil empty)")
        return Record(**base, text=text, pair=pair, evidence=evidence, target=target, foil=foil)

    def _evidence(self, row, where, text, pair):
        column = self.cols.get("evidence")
        return evidence_cell(row.get(column), where, text, pair) if column else None

    def _linzen_subject(self, row: dict, where: str, text: str, words) -> tuple[int, int, int]:
        """The subject noun's character span: the evidence an agreement explanation should point at."""
        index = word_index_cell(row.get(self.cols["subject_index"]), where, self.cols["subject_index"], 1, len(words))
        start, end = word_core(text, *words[index])
        subject = row.get(self.cols["subject"])
        if not isinstance(subject, str) or text[start:end].lower() != subject.strip().lower():
            raise AttrscopeError(f"{where}: word {index + 1} ({self.cols['subject_index']!r}) is "
                                 f"{text[start:end]!r}, not the subject {show(subject)}: check the row")
        return (0, start, end)

    def skipped_note(self, rows: list[int], n_read: int, spec: str) -> str:
        shown = ", ".join(map(str, rows[:5])) + (", ..." if len(rows) > 5 else "")
        why = ("do not differ in exactly one word (with the same punctuation around it)" if self.task == "masked-token"
               else "have no one-word prefix (one_prefix_method false)")
        return f"skipped {len(rows)} of {n_read} BLiMP pairs in '{spec}' that {why}: rows {shown}"
