"""Errors raised by the store (numpy + h5py only, so no dependency on compute)."""


class StoreError(Exception):
    """The file is not a readable attrscope store, or an operation on it is not possible. One line, exit code 1."""

    exit_code = 1


class StoreWriteError(StoreError):
    """Writing a store failed (a full disk, a lost mount): the file keeps what was committed before, readable and
    resumable. ``reason``: the system's words (No space left on device); ``kept``: what the store still holds."""

    def __init__(self, path: str, reason: str, kept: str = ""):
        self.path, self.reason, self.kept = path, reason, kept
        super().__init__(f"cannot write store '{path}': {reason}" + (f": {kept}" if kept else ""))


def committed_kept(n: int) -> str:
    return f"the {n} examples committed before are kept"
