"""Replacing a store by a copy written beside it (resume, the format rewrite, compaction): the copy is made next to
the file itself (through a symlink, next to the file it points to, so the link stays a link) and takes the file's
permissions before it atomically replaces it."""

from __future__ import annotations

import os
import shutil


def copy_beside(path: str | os.PathLike, suffix: str) -> tuple[str, str]:
    """The file ``path`` names (symlinks followed) and the path of a copy beside it, a copy left there by a process
    killed while making it removed."""
    real = os.path.realpath(path)
    tmp = real + suffix
    discard(tmp)
    return real, tmp


def discard(tmp: str) -> None:
    """Remove the copy, if it was made."""
    if os.path.exists(tmp):
        os.remove(tmp)


def replace_with(tmp: str, real: str) -> None:
    """The copy ``tmp``, with the permissions of the file ``real`` where there is one, atomically in its place."""
    if os.path.exists(real):
        shutil.copymode(real, tmp)
    os.replace(tmp, real)
