"""The directory a command writes its new file into: checked before any work, one line when it cannot be used."""

from __future__ import annotations

import os

from .errors import AttrscopeError


def check_output_dir(path: str, option: str) -> None:
    """``path``'s directory exists and is writable; ``option`` names what to change (-o, OUT) in the message."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise AttrscopeError(f"output directory '{parent}' does not exist: create it or choose another {option}")
    if not os.access(parent, os.W_OK):
        raise AttrscopeError(f"output directory '{parent}' is not writable: choose another {option}")
