"""Finding a source's columns: by a --*-column flag (it must exist) or by candidate names (the first present),
case-insensitively; and the text, pair, label and id columns of the sequence tasks (classification, regression)."""

from __future__ import annotations

from compute.errors import AttrscopeError, UsageError

# Column names tried, in this order, when the matching --*-column flag is not given (case-insensitive).
TEXT_CANDIDATES = ("text", "sentence", "sentence1", "premise", "question1", "question", "review", "content", "document")
# A pair is auto-detected only from these text columns; question+context is extractive QA, not a pair task.
PAIR_FOR_TEXT = {"sentence1": "sentence2", "premise": "hypothesis", "question1": "question2"}
LABEL_CANDIDATES = ("label", "labels", "gold_label", "target", "class")
ID_CANDIDATES = ("id", "idx", "guid", "example_id", "uid")
# Extractive QA's columns (compute/data/qa.py); a classifier found only the question among them
QUESTION_CANDIDATES = ("question",)
CONTEXT_CANDIDATES = ("context",)


def find_column(columns: list[str], name: str) -> str | None:
    """The column called ``name``: an exact match first, else the first case-insensitive one."""
    if name in columns:
        return name
    key = name.strip().lower()
    return next((c for c in columns if str(c).strip().lower() == key), None)


class ColumnFinder:
    """Finds columns of one source by flag (must exist) or by candidates (first present), for its messages."""

    def __init__(self, columns: list[str], spec: str):
        self.columns, self.spec = columns, spec
        self.available = ", ".join(repr(c) for c in columns) or "none"

    def explicit(self, name: str, flag: str) -> str:
        found = find_column(self.columns, name)
        if found is None:
            raise AttrscopeError(
                f"column {name!r} (from {flag}) is not in '{self.spec}' (columns: {self.available}): pass one of those"
            )
        return found

    def auto(self, candidates) -> str | None:
        return next((c for c in (find_column(self.columns, n) for n in candidates) if c is not None), None)

    def pick(self, given, flag: str, candidates) -> str | None:
        return self.explicit(given, flag) if given is not None else self.auto(candidates)

    def required(self, given, flag: str, candidates, what: str) -> str:
        found = self.pick(given, flag, candidates)
        if found is None:
            raise AttrscopeError(f"no {what} column found in '{self.spec}' (columns: {self.available}): pass {flag}")
        return found

    def has_all(self, names) -> bool:
        return all(find_column(self.columns, n) is not None for n in names)


def resolve_columns(find: ColumnFinder, flags: dict, label_candidates=LABEL_CANDIDATES) -> dict:
    """The text, pair, label and id columns; ``flags`` holds the --*-column values by column kind."""
    text_column = flags["text"]
    text = find.required(text_column, "--text-column", TEXT_CANDIDATES, "text")
    context = find.auto(CONTEXT_CANDIDATES)
    if text_column is None and str(text).strip().lower() in QUESTION_CANDIDATES and context is not None:
        # an extractive QA layout: the question alone is not what the user meant to classify
        raise UsageError(f"'{find.spec}' has {text!r} and {context!r} columns (extractive QA): pass --task qa, or "
                         f"name the text with --text-column (and --pair-column {context} to classify the pair)")
    if flags["pair"] is not None:
        pair = find.explicit(flags["pair"], "--pair-column")
    elif text_column is None and str(text).strip().lower() in PAIR_FOR_TEXT:
        pair = find_column(find.columns, PAIR_FOR_TEXT[str(text).strip().lower()])
    else:
        pair = None
    label = find.pick(flags["label"], "--label-column", label_candidates)
    id_ = find.pick(flags["id"], "--id-column", ID_CANDIDATES)
    return {"text": text, "pair": pair, "label": label, "id": id_}
