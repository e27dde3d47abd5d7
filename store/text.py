"""Stored strings as they are shown: tokens and texts are data, so control and invisible characters are escaped
before any display (a terminal, an HTML page, a figure) sees them. Shared by the TUI, store/render_html.py and compute/'s messages (names from users and files)."""

from __future__ import annotations

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


def printable_text(text: str) -> str:
    """Free text (an example's text, a label name, a path) with line breaks and tabs kept and every other control or
    invisible formatting character escaped, so that no data can send escape sequences to the terminal."""
    return "".join(ch if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf") else f"\\u{ord(ch):04x}"
                   for ch in str(text))
