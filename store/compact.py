"""Compacting a finished store. HDF5 never reuses file space while a file is open for SWMR writing (a reader may still
be reading it), so the last, partial chunk of every dataset, compressed again at each commit, leaves its earlier
copies behind as dead space: a store of SST-2 dev committed in 256-row windows was 1.8 times its data, in 64-row
windows 4.6 times (chunks of 32,768 elements then). Once a store is complete its objects are copied as they are
(H5Ocopy: chunks, filters and checksums unchanged, nothing decompressed) into a fresh file that atomically replaces
it."""

from __future__ import annotations

import os
import shutil

import h5py
import numpy as np

from .h5 import WRITE_ERRORS, new_file
from .replace import copy_beside, discard, replace_with

# Compact only when the dead space is worth a copy: at least this many bytes (more than a store's own metadata,
# object headers and chunk indices, which the estimate counts as dead: 27 KB for SST-2 dev), and this share of the file.
MIN_DEAD_BYTES = 1 << 19
MIN_DEAD_SHARE = 0.1
TMP_SUFFIX = ".compact-tmp"  # the copy's name beside the store until it replaces it


def live_bytes(f: h5py.File) -> int:
    """Bytes the datasets' data take in the file (their metadata aside)."""
    total = 0

    def add(_name, obj) -> None:
        nonlocal total
        if isinstance(obj, h5py.Dataset):
            total += obj.id.get_storage_size()

    f.visititems(add)
    return total


def free_bytes(path: str) -> int:
    """Bytes free on the file system of ``path``."""
    return shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free


def compact(path: str | os.PathLike) -> bool:
    """Copy the closed store at ``path`` into a compact file that replaces it (with its permissions), if its dead
    space is worth it and the disk has room for the copy. Returns whether it did. A copy that cannot be made (a
    read-only directory) or fails (a full disk) is removed and the store is left as it was: whole, only larger."""
    path, tmp = copy_beside(path, TMP_SUFFIX)
    size = os.path.getsize(path)
    with h5py.File(path, "r", locking=False) as src:
        live = live_bytes(src)
        dead = size - live
        if dead < MIN_DEAD_BYTES or dead < MIN_DEAD_SHARE * size:
            return False
        if free_bytes(path) < live + MIN_DEAD_BYTES:
            return False
        try:
            dst = new_file(tmp)
            try:
                _copy_attrs(src, dst)
                for name in src:
                    src.copy(src[name], dst, name=name)  # H5Ocopy: the chunks as stored, their attributes too
                dst.flush()
            finally:
                dst.close()
        except BaseException as err:
            discard(tmp)  # not there when the directory refused it
            if isinstance(err, WRITE_ERRORS):
                return False
            raise
    replace_with(tmp, path)
    return True


def _copy_attrs(src: h5py.Group, dst: h5py.Group) -> None:
    """The root group's attributes with their HDF5 types as they are (fixed-length UTF-8 stays so)."""
    for name in src.attrs:
        key = name.encode("utf-8")
        attr = h5py.h5a.open(src.id, key)
        htype = attr.get_type()
        value = np.empty(attr.shape, dtype=attr.dtype)
        attr.read(value, mtype=htype)
        h5py.h5a.create(dst.id, key, htype, attr.get_space()).write(value, mtype=htype)
