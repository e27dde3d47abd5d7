"""Terminal output of attr-compute: a rich progress bar on stderr and the end summary."""

from __future__ import annotations

import os

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TaskProgressColumn, TextColumn
from rich.table import Column, Table
from rich.text import Text

from store.text import printable_text

from .run.progress import Pace
from .run.progress import Progress as ProgressBase


def clock(seconds: float | None) -> str:
    """H:MM:SS, or -:--:-- while unknown."""
    if seconds is None:
        return "-:--:--"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def rate_text(rate: float | None, unit: str) -> str:
    """The rate with the digits a slow job needs (0.15 ex/s, not 0.1)."""
    if rate is None:
        return f"- {unit}/s"
    return f"{rate:.{2 if rate < 10 else 1}f} {unit}/s"


class _PaceColumn(ProgressColumn):
    """Rate, elapsed time and time left from the work done (Pace), redrawn while a long batch runs."""

    def __init__(self, owner: "RichProgress"):
        super().__init__()
        self.owner = owner

    def render(self, task) -> Text:
        pace = self.owner.pace
        if pace is None:
            return Text("")
        return Text(f"{rate_text(pace.rate(), self.owner.unit)} {clock(pace.elapsed)} ETA {clock(pace.eta())}",
                    no_wrap=True)


class RichProgress(ProgressBase):
    """The bar of attr-compute run, eval, merge and export on stderr: done/total, the rate and ETA from the work done
    (Pace), and what runs now (a batch and its method, a metric)."""

    def __init__(self, quiet: bool = False):
        self.console = Console(stderr=True)
        self.quiet = quiet
        self._p = None
        self._task = None
        self.pace: Pace | None = None
        self.unit = "ex"

    def start(self, total, completed=0, label="computing", unit="ex"):
        if self.quiet:
            return
        self.stop()
        self.pace, self.unit = Pace(total, completed), unit
        # 80 columns hold every column but the stage, which is cut short rather than wrapped to a second line
        self._p = Progress(
            TextColumn(f"[bold]{label}"), BarColumn(bar_width=16), MofNCompleteColumn(), TaskProgressColumn(),
            _PaceColumn(self), TextColumn("{task.fields[stage]}", table_column=Column(no_wrap=True, overflow="ellipsis")),
            console=self.console, transient=False, refresh_per_second=4)
        self._p.start()
        self._task = self._p.add_task(label, total=total, completed=completed, stage="")

    def advance(self, n):
        if self._p is None:
            return
        self.pace.advance(n)
        self._p.update(self._task, completed=self.pace.completed)

    def stage(self, text):
        if self._p is not None:
            self._p.update(self._task, stage=printable_text(text))

    def message(self, text):
        if not self.quiet:
            self.console.print(printable_text(text), markup=False, highlight=False)

    def stop(self, keep=True):
        if self._p is not None:
            self._p.update(self._task, stage="")
            self._p.live.transient = not keep  # a failed job's error is its one line: the bar goes
            self._p.stop()
            self._p = None


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


def print_summary(summary: dict) -> None:
    console = Console(stderr=True)
    t = Table(title="attr-compute summary", show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("examples", f"{summary['examples']} ({summary['examples_this_run']} this run)")
    t.add_row("tokens", str(summary["tokens"]))
    t.add_row("device", Text(printable_text(summary["device"])))
    t.add_row("wall time", f"{summary['wall_seconds']:.1f} s")
    t.add_row("forward pass", f"{summary['forward_seconds']:.2f} s")
    for name, secs in summary["method_seconds"].items():
        t.add_row(Text(f"  {name}"), f"{secs:.2f} s")
    # the path as data: '-o a[/b].h5' is no markup, and its control characters are escaped
    t.add_row("store", Text(f"{printable_text(summary['store'])} ({_size(summary['store_bytes'])})"))
    console.print(t)
    rel = os.path.relpath(summary["store"])
    console.print(f"open it with:  attr-tui {printable_text(rel)}", markup=False, highlight=False)
