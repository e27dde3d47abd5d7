"""Stored strings as they are shown: tokens and texts are data, so control and invisible characters are escaped
before any display (a terminal, an HTML page, a figure) sees them. Shared by the TUI, store/render_html.py and compute/'s messages (names from users and files)."""

from __future__ import annotations

import re
import unicodedata

_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def printable(token: str) -> str:
    """A token as it is shown: control and invisible characters escaped, an all-blank token as '␣'s."""
    if token == "":
        return "∅"
    if token.isspace():
        return "␣" * len(token)
    out = []
    for ch in token:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


# where a tokenizer marks a word's start or a line break in its token strings (byte-level BPE: GPT-2, Llama 3;
# SentencePiece: Llama 2, T5)
_TOKEN_MARKS = str.maketrans({"Ġ": " ", "▁": " ", "Ċ": "\n"})


def tokens_text(tokens: list[str]) -> str:
    """Token strings read as the text they make, without the tokenizer (a generation store keeps its continuation as
    tokens only): byte-level BPE and SentencePiece pieces joined, their word marks as spaces; WordPiece tokens
    after a space, "##" pieces joined to the one before."""
    if any(t[:1] in ("Ġ", "▁", "Ċ") for t in tokens) or not any(t.startswith("##") for t in tokens):
        return "".join(tokens).translate(_TOKEN_MARKS)
    return "".join(t[2:] if k and t.startswith("##") else (" " if k else "") + t for k, t in enumerate(tokens))


def printable_text(text: str) -> str:
    """Free text (an example's text, a label name, a path) with line breaks and tabs kept and every other control or
    invisible formatting character escaped, so that no data can send escape sequences to the terminal."""
    return "".join(ch if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf") else f"\\u{ord(ch):04x}"
                   for ch in str(text))


# A spreadsheet runs a cell that starts with one of these as a formula (OWASP's CSV-injection rule).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# C0 and C1 controls but the tab and line breaks a CSV cell quotes: an ESC would reach the terminal of whoever cats it.
_CONTROLS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def spreadsheet_cell(text: str) -> str:
    """A text cell as CSV writes it: a leading ' before a formula start, control characters escaped as \\uXXXX."""
    if text[:1] in _FORMULA_STARTS:
        text = "'" + text
    if not text.isprintable():  # a fast test first: the bulk of cells are plain
        text = _CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text
