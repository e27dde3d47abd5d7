"""Whether a store is still being written: a process of this machine holds it open for writing (Linux /proc).

A live attr-compute run may spend minutes on one window without touching its store, and a killed one leaves the
store exactly as a live one between windows (the HDF5 superblock stays marked open for write): only the writer's
open file tells them apart. Pure os; the app asks on a worker, and only once the store has stopped growing.
"""

from __future__ import annotations

import os

_WRITE = os.O_WRONLY | os.O_RDWR


def file_state(path: str) -> tuple[int, int, int, int] | None:
    """(device, inode, size, mtime ns) of ``path``: it changes when anything writes the file or replaces it; None when
    it cannot be read. One stat, whatever the store's size."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def writer_alive(path: str, proc: str = "/proc") -> bool | None:
    """True when a process of this machine has ``path`` open for writing, False when none has, None when this cannot
    be told (no /proc, or processes whose open files this user may not see and none found writing)."""
    try:
        target = os.stat(path)
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return None
    hidden = False
    for pid in pids:
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except PermissionError:
            hidden = True
            continue
        except OSError:  # the process ended meanwhile
            continue
        for fd in fds:
            try:
                st = os.stat(os.path.join(fd_dir, fd))
                if (st.st_ino, st.st_dev) != (target.st_ino, target.st_dev):
                    continue
                with open(os.path.join(proc, pid, "fdinfo", fd)) as info:
                    flags = next((int(line.split()[1], 8) for line in info if line.startswith("flags:")), 0)
            except (OSError, ValueError, IndexError):
                continue
            if flags & _WRITE:
                return True
    return None if hidden else False
