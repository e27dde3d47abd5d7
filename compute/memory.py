"""The peak memory of a piece of work on the CPU, for --batch-size auto with --batch-memory-mb.

Linux keeps a process's peak resident size (VmHWM in /proc/self/status) and resets it to the current size when "5"
is written to /proc/self/clear_refs; the peak during the work minus the size before it is what the work needed on
top of what the process already held (torch's CPU allocations are not visible to tracemalloc). Elsewhere the
measurement is unavailable and None is returned.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable

_STATUS, _CLEAR = "/proc/self/status", "/proc/self/clear_refs"


def _kib(field: str) -> int:
    with open(_STATUS) as fh:
        return int(re.search(rf"^{field}:\s+(\d+) kB", fh.read(), re.M).group(1))


def can_measure() -> bool:
    try:
        with open(_CLEAR, "w") as fh:
            fh.write("5")
        _kib("VmHWM")
        return True
    except (OSError, AttributeError):
        return False


def peak_bytes(work: Callable[[], object]) -> int:
    """Run ``work()``; the most memory it held at once above the process's resident size before it, in bytes."""
    # garbage of earlier work freed during this one would lower the resident size under the work's own peak
    gc.collect()
    with open(_CLEAR, "w") as fh:
        fh.write("5")  # the peak is now the current resident size
    before = _kib("VmRSS")
    work()
    return max(_kib("VmHWM") - before, 0) << 10
