"""Text from users and files as it may reach a terminal (no numpy, no HDF5): compute/ and tui/ share it."""

from __future__ import annotations

import unicodedata


def printable_text(text: str) -> str:
    """Free text (an example's text, a label name, a path) with line breaks and tabs kept and every other control
    or invisible formatting character escaped, so that no data can send escape sequences to the terminal."""
    return "".join(ch if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf") else f"\\u{ord(ch):04x}"
                   for ch in str(text))
