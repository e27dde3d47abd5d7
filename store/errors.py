"""Errors raised by the store (numpy + h5py only, so no dependency on compute)."""


class StoreError(Exception):
    """The file is not a readable attrscope store, or an operation on it is not possible. One line, exit code 1."""

    exit_code = 1
