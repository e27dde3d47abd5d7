"""What a long job reports while it works (a run, eval, merge, export). The CLI renders it with rich (compute.ui);
tests use this silent default. ``Pace`` is the rate and the time left, from the work done."""

from __future__ import annotations

import time
from contextlib import contextmanager


class Progress:
    def start(self, total: int, completed: int = 0, label: str = "computing", unit: str = "ex") -> None: ...

    def advance(self, n: int) -> None: ...

    def stage(self, text: str) -> None:
        """What runs now (a batch, a method, a metric): shown beside the bar."""

    def message(self, text: str) -> None: ...

    def stop(self, keep: bool = True) -> None:
        """End the bar; ``keep``: leave its last state on the terminal (not when the job failed: its error is the
        one line it prints)."""


@contextmanager
def bar(progress: Progress, total: int, label: str, completed: int = 0):
    """``progress`` started for the block, kept at its end, taken away when the block raises."""
    progress.start(total=total, completed=completed, label=label)
    try:
        yield progress
    except BaseException:
        progress.stop(keep=False)
        raise
    progress.stop()


class Pace:
    """The rate and the time left of a job from the work done since it started: units done / seconds elapsed, and
    the units left at that rate. A burst of units read at once (a CPU run finishes a batch at a time) or a long
    first batch changes neither into a made-up speed; before the first unit is done both are unknown (None)."""

    def __init__(self, total: int, completed: int = 0, clock=time.monotonic):
        self.total, self.completed, self._clock = total, completed, clock
        self._done = 0  # units done since start (a resumed run's earlier ones are not this run's pace)
        self._t0 = clock()

    def advance(self, n: int) -> None:
        self.completed += n
        self._done += n

    @property
    def elapsed(self) -> float:
        return self._clock() - self._t0

    def rate(self) -> float | None:
        """Units per second so far."""
        elapsed = self.elapsed
        return self._done / elapsed if self._done and elapsed > 0 else None

    def eta(self) -> float | None:
        """Seconds left at the rate so far."""
        rate = self.rate()
        return None if rate is None else max(self.total - self.completed, 0) / rate
