"""Opening a store file safely: fail fast, in one line, on a missing, truncated or damaged file.

HDF5 alone is not enough here. A reader opened in SWMR mode (needed while attr-compute writes, and for a store whose
writer was killed) skips HDF5's own truncation check and retries every failed metadata read up to 100 times with
growing sleeps, so a truncated copy or a flipped byte made every consumer wait for minutes. So, before HDF5 sees the
file, its superblock (version 2/3: flags, end-of-file address, checksum) is read here:

* a file whose size is below the end-of-file address the superblock records is an incomplete copy (a writer only
  ever grows its file past the last flushed superblock);
* a file that is not marked open-for-write is opened the ordinary way (one read attempt, HDF5's own checks);
* only a file still marked open-for-write (a live or killed writer) is opened in SWMR mode, with the metadata read
  attempts capped (16: sub-millisecond backoff, enough for a read that races the writer; 32 already waits seconds).

Every HDF5 error while opening becomes a :class:`StoreError` naming the file.
"""

from __future__ import annotations

import ctypes
import os
import struct

import h5py

from .errors import StoreError

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
SWMR_READ_ATTEMPTS = 16
_FLAG_WRITE = 0x01  # superblock file-consistency flags: open for write
_FLAG_SWMR_WRITE = 0x04  # open for SWMR write


def one_line(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def damaged(path: str, what: str, err: BaseException | str | None = None) -> StoreError:
    """The one message for a store that cannot be read: which file, what part, why, and what to do."""
    why = f" ({one_line(err)})" if err else ""
    return StoreError(f"store '{path}' is damaged: {what} cannot be read{why}: copy the file again, or recompute it "
                      "with attr-compute --overwrite")


# ----------------------------------------------------------------------------------------------------- superblock
def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & 0xFFFFFFFF


def lookup3(data: bytes, initval: int = 0) -> int:
    """Bob Jenkins' lookup3 ``hashlittle``, the checksum HDF5 puts on its metadata (H5_checksum_lookup3)."""
    M = 0xFFFFFFFF
    length = len(data)
    a = b = c = (0xDEADBEEF + length + initval) & M
    i = 0
    while length > 12:
        a = (a + int.from_bytes(data[i:i + 4], "little")) & M
        b = (b + int.from_bytes(data[i + 4:i + 8], "little")) & M
        c = (c + int.from_bytes(data[i + 8:i + 12], "little")) & M
        a = (a - c) & M; a ^= _rot(c, 4); c = (c + b) & M  # noqa: E702 - the mix, as published
        b = (b - a) & M; b ^= _rot(a, 6); a = (a + c) & M  # noqa: E702
        c = (c - b) & M; c ^= _rot(b, 8); b = (b + a) & M  # noqa: E702
        a = (a - c) & M; a ^= _rot(c, 16); c = (c + b) & M  # noqa: E702
        b = (b - a) & M; b ^= _rot(a, 19); a = (a + c) & M  # noqa: E702
        c = (c - b) & M; c ^= _rot(b, 4); b = (b + a) & M  # noqa: E702
        length -= 12
        i += 12
    if length == 0:
        return c
    tail = data[i:] + b"\0" * (12 - length)
    a = (a + int.from_bytes(tail[0:4], "little")) & M
    b = (b + int.from_bytes(tail[4:8], "little")) & M
    c = (c + int.from_bytes(tail[8:12], "little")) & M
    c ^= b; c = (c - _rot(b, 14)) & M  # noqa: E702 - the final mix
    a ^= c; a = (a - _rot(c, 11)) & M  # noqa: E702
    b ^= a; b = (b - _rot(a, 25)) & M  # noqa: E702
    c ^= b; c = (c - _rot(b, 16)) & M  # noqa: E702
    a ^= c; a = (a - _rot(c, 4)) & M  # noqa: E702
    b ^= a; b = (b - _rot(a, 14)) & M  # noqa: E702
    c ^= b; c = (c - _rot(b, 24)) & M  # noqa: E702
    return c


class Superblock:
    """The fields of an HDF5 superblock of version 2 or 3 that decide how to open the file (None for older ones)."""

    def __init__(self, version: int, flags: int, eof: int):
        self.version, self.flags, self.eof = version, flags, eof

    @property
    def open_for_write(self) -> bool:
        return bool(self.flags & (_FLAG_WRITE | _FLAG_SWMR_WRITE))


def read_superblock(path: str) -> Superblock | None:
    """Check the start of the file; StoreError for an empty, foreign, damaged or truncated file."""
    size = os.path.getsize(path)
    if size == 0:
        raise StoreError(f"store '{path}' is empty (0 bytes): copy it again, or recompute it with attr-compute")
    try:
        with open(path, "rb") as fh:
            head = fh.read(48)
    except OSError as err:
        raise StoreError(f"cannot read store '{path}': {one_line(err.strerror or err)}") from None
    if not head.startswith(HDF5_SIGNATURE):
        if HDF5_SIGNATURE.startswith(head[:8]) and len(head) < 8:
            raise StoreError(f"store '{path}' is incomplete: {size:,} bytes, not even an HDF5 header: copy it again")
        raise StoreError(f"'{path}' is not a readable HDF5 file: pass a store written by attr-compute")
    version = head[8] if len(head) > 8 else -1
    if version not in (2, 3):
        return None  # an older superblock (not written by attrscope): HDF5's own checks apply
    if len(head) < 48:
        raise StoreError(f"store '{path}' is incomplete: {size:,} bytes, not even a whole HDF5 superblock: copy it again")
    if head[9] != 8:  # size of offsets: attrscope stores always use 8-byte addresses
        return None
    if lookup3(head[:44]) != struct.unpack("<I", head[44:48])[0]:
        raise damaged(path, "its HDF5 superblock", "checksum mismatch")
    base, _ext, eof, _root = struct.unpack("<4Q", head[12:44])
    if size < base + eof:
        raise StoreError(f"store '{path}' is incomplete: {size:,} bytes of the {base + eof:,} it should have (a partial "
                         "copy?): copy it again")
    return Superblock(version, head[11], base + eof)


def recorded_end(path: str) -> int | None:
    """The end of file a version 2/3 superblock records (None for another or an unreadable one)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(48)
    except OSError:
        return None
    if len(head) < 48 or not head.startswith(HDF5_SIGNATURE) or head[8] not in (2, 3) or head[9] != 8:
        return None
    if lookup3(head[:44]) != struct.unpack("<I", head[44:48])[0]:
        return None
    base, _ext, eof, _root = struct.unpack("<4Q", head[12:44])
    return base + eof


# ------------------------------------------------------------------------------------------------------- opening
def _libhdf5():
    """The HDF5 library h5py runs on (to cap SWMR read attempts, which h5py does not expose), or None."""
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                name = line.rsplit("/", 1)[-1]
                if name.startswith("libhdf5") and not name.startswith("libhdf5_hl") and ".so" in name:
                    lib = ctypes.CDLL(line.split(None, 5)[-1].strip())
                    lib.H5Pset_metadata_read_attempts.argtypes = [ctypes.c_int64, ctypes.c_uint]
                    return lib
    except (OSError, AttributeError):
        pass
    return None


_LIB = None
_LIB_LOOKED_UP = False


def _capped_swmr_fapl() -> h5py.h5p.PropFAID:
    global _LIB, _LIB_LOOKED_UP
    if not _LIB_LOOKED_UP:
        _LIB, _LIB_LOOKED_UP = _libhdf5(), True
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_file_locking(False, True)
    if _LIB is not None:
        _LIB.H5Pset_metadata_read_attempts(fapl.id, SWMR_READ_ATTEMPTS)
    return fapl


def open_for_writing(path: str, swmr: bool = False) -> h5py.File:
    """Open an existing store read-write (latest format, no file locks) with the metadata read attempts capped as for
    reading: in SWMR writing, HDF5 retries every failed metadata read up to 100 times with growing sleeps, so an
    append to a damaged copy hung for half an hour, deaf to SIGTERM (inside HDF5). ``swmr``: opened for SWMR writing
    (the cap applies only to a file opened so, not to one switched later). OSError as h5py raises it."""
    fapl = _capped_swmr_fapl()
    fapl.set_libver_bounds(h5py.h5f.LIBVER_LATEST, h5py.h5f.LIBVER_LATEST)
    flags = h5py.h5f.ACC_RDWR | (h5py.h5f.ACC_SWMR_WRITE if swmr else 0)
    return h5py.File(h5py.h5f.open(os.fsencode(path), flags, fapl=fapl))


def open_for_reading(path: str) -> h5py.File:
    """Open ``path`` read-only: the ordinary way for a closed file, SWMR (capped retries) while it is open for write.
    No file locks: a reader must never stop attr-compute from stamping its store complete."""
    if not os.path.exists(path):
        raise StoreError(f"store '{path}' not found: check the path or create it with attr-compute")
    if os.path.isdir(path):
        raise StoreError(f"'{path}' is a directory: pass the .h5 file written by attr-compute")
    if not os.access(path, os.R_OK):
        raise StoreError(f"cannot read store '{path}': permission denied")
    sb = read_superblock(path)
    try:
        if sb is not None and sb.open_for_write:
            fid = h5py.h5f.open(os.fsencode(path), h5py.h5f.ACC_RDONLY | h5py.h5f.ACC_SWMR_READ,
                                fapl=_capped_swmr_fapl())
            return h5py.File(fid)
        return h5py.File(path, "r", locking=False)
    except (OSError, RuntimeError, ValueError) as err:
        msg = one_line(err)
        if "truncated file" in msg:
            raise StoreError(f"store '{path}' is incomplete ({msg}): copy it again") from None
        raise damaged(path, "the HDF5 file", msg) from None
