"""HDF5 attributes as the store writes and reads them.

Text is written as fixed-length UTF-8, which HDF5 keeps inside the (checksummed) object header. h5py's default for a
Python str is a variable-length string, whose bytes live in HDF5's global heap: that heap has no checksum, so a
flipped byte there changed a JSON attribute silently, and a zeroed one sent HDF5's heap parser into an endless loop.
Readers decode both forms (stores before format 1.3 have variable-length strings).
"""

from __future__ import annotations

import json

import h5py
import numpy as np


def write_attr(obj, key: str, value) -> None:
    """Set attribute ``key``: bools, ints and floats as numbers, str as fixed-length UTF-8, anything else as JSON."""
    if isinstance(value, (bool, np.bool_)):
        obj.attrs[key] = bool(value)
    elif isinstance(value, (int, np.integer)):
        obj.attrs[key] = int(value)
    elif isinstance(value, (float, np.floating)):
        obj.attrs[key] = float(value)
    else:
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        raw = text.encode("utf-8")
        obj.attrs.create(key, np.frombuffer(raw or b"\0", dtype=f"S{max(len(raw), 1)}")[0],
                         dtype=h5py.string_dtype("utf-8", max(len(raw), 1)))


def read_attrs(obj) -> dict:
    """All attributes of ``obj`` as Python values (text decoded from either string form)."""
    return {key: attr_value(value) for key, value in obj.attrs.items()}


def attr_value(value):
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.generic):
        return value.item()
    return value
