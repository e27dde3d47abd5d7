"""Per-example digests (format 1.6; store/schema.py, "Place"): the CRC-32 of each example's bytes in each per-example
dataset, kept in /examples/digests, so that data moved inside the file (two chunks swapped: each keeps its own
fletcher32) is refused instead of being read as another example's. CRC-32 (zlib): a few GB/s, and a chance of 2**-32
that replaced bytes keep an example's digest."""

from __future__ import annotations

import json
import zlib

import h5py
import numpy as np

from . import schema
from .attrs import read_attrs


def crcs(values: np.ndarray, counts) -> np.ndarray:
    """The CRC-32 of each of the consecutive runs of ``values``' rows, ``counts[i]`` rows each, over the bytes as
    stored (the dataset's dtype, little-endian, C order)."""
    a = np.ascontiguousarray(values)
    a = a.astype(a.dtype.newbyteorder("<"), copy=False)
    raw = memoryview(a.reshape(-1).view(np.uint8))
    row = a.itemsize * (int(np.prod(a.shape[1:])) if a.ndim > 1 else 1)
    ends = (np.cumsum(counts, dtype=np.int64) * row).tolist()
    crc32 = zlib.crc32  # the loop is the cost (a call per example and dataset), not the bytes
    return np.array([crc32(raw[lo:hi]) for lo, hi in zip([0] + ends[:-1], ends)], dtype=np.uint32)


def columns(f: h5py.File) -> list[str] | None:
    """The datasets whose digests /examples/digests keeps, in column order; None in a store without digests
    (before 1.6). KeyError or ValueError when the list cannot be what the writer wrote."""
    if schema.DIGESTS not in f:
        return None
    ds = f[schema.DIGESTS]
    paths = json.loads(read_attrs(ds)["datasets"])
    if (not isinstance(paths, list) or not all(isinstance(p, str) for p in paths) or len(set(paths)) != len(paths)
            or ds.ndim != 2 or ds.shape[1] != len(paths)):
        raise ValueError(f"{ds.shape[1:]} columns for the datasets {paths!r}")
    return paths
