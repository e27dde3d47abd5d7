"""One writer per store: a lock file beside it (``STORE.h5.lock``, beside the file a symlink points to), made with O_EXCL and holding the holder's pid
and host, removed when the holder ends by any path but SIGKILL. A lock whose holder is gone (its pid dead on this
host) is stale and taken over; a lock of another host cannot be checked and is named in the refusal.

HDF5's own file locks are off in this package (store/writer.py says why), and they would not say who holds a store.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from contextlib import contextmanager

from .errors import StoreError

SUFFIX = ".lock"
UNWRITTEN_STALE_SECONDS = 30.0  # a lock file still empty after this long: its maker died between open and write

_held: dict[str, int] = {}  # the locks this process holds (resolved store path -> depth): a run's own eval nests


def lock_path(path: str) -> str:
    """The lock of the file ``path`` names: beside the file a symlink points to, so that every path to one store
    (a link, the target, a relative spelling) takes the same lock."""
    return os.path.realpath(path) + SUFFIX


@contextmanager
def writer_lock(path: str):
    """Hold the lock of the store ``path`` for the duration (re-entrant in one process); StoreError naming the holder
    when another process writes it."""
    key = os.path.realpath(path)
    if key in _held:
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return
    lock = lock_path(path)
    me = {"pid": os.getpid(), "host": socket.gethostname()}
    _take(lock, path, me)
    _held[key] = 1
    try:
        yield
    finally:
        del _held[key]
        if _read(lock) == me:  # ours still (never another's that took over a lock we lost)
            try:
                os.remove(lock)
            except OSError:
                pass


def _take(lock: str, path: str, me: dict) -> None:
    for _ in range(3):  # a stale lock removed, then taken again (another process may win the race: it is named)
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read(lock)
            if _stale(lock, holder):
                try:
                    os.remove(lock)
                except FileNotFoundError:
                    pass
                continue
            raise StoreError(f"store '{path}' is being written by {_who(holder)} (lock file '{lock}'): wait for it "
                             "to finish, or remove the lock file if that process is gone") from None
        except OSError as err:
            raise _unmade(path, lock, err) from None
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(me))
        except OSError as err:  # a full disk: the file was made, its holder not written
            os.remove(lock)
            raise _unmade(path, lock, err) from None
        return
    raise StoreError(f"store '{path}': its lock file '{lock}' keeps changing hands: try again")


def _unmade(path: str, lock: str, err: OSError) -> StoreError:
    doing = "write" if os.path.exists(path) else "create"
    fix = "free space" if err.errno in (errno.ENOSPC, errno.EDQUOT) else "check the directory and its permissions"
    return StoreError(f"cannot {doing} store '{path}': its lock file '{lock}' cannot be made ({err.strerror or err}): "
                      f"{fix}, or choose another output (-o, OUT)")


def _read(lock: str) -> dict | None:
    try:
        with open(lock) as fh:
            holder = json.loads(fh.read())
        return holder if isinstance(holder, dict) else None
    except (OSError, ValueError):
        return None


def _stale(lock: str, holder: dict | None) -> bool:
    if holder is None:  # unreadable or not yet written
        try:
            return time.time() - os.path.getmtime(lock) > UNWRITTEN_STALE_SECONDS
        except OSError:
            return True  # gone meanwhile: try again
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False  # another machine's process: nothing here can tell whether it lives
    if holder["pid"] == os.getpid():
        return True  # not held here (_held): a dead process's, whose pid this one got
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return False


def _who(holder: dict | None) -> str:
    if holder is None:
        return "another process"
    return f"process {holder.get('pid')} on {holder.get('host')}"
