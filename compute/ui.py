"""Terminal output of attr-compute: a rich progress bar on stderr and the end summary."""

from __future__ import annotations

import os

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from store.text import printable_text

from .run.progress import Progress as ProgressBase


class RichProgress(ProgressBase):
    def __init__(self, quiet: bool = False):
        self.console = Console(stderr=True)
        self.quiet = quiet
        self._p = None
        self._task = None

    def start(self, total, completed):
        if self.quiet:
            return
        self._p = Progress(
            TextColumn("[bold]computing"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
            TextColumn("{task.fields[rate]}"), TextColumn("ETA"), TimeRemainingColumn(),
            console=self.console, transient=False)
        self._p.start()
        self._task = self._p.add_task("examples", total=total, completed=completed, rate="")

    def advance(self, n):
        if self._p is None:
            return
        self._p.advance(self._task, n)
        speed = self._p.tasks[0].speed
        self._p.update(self._task, rate=f"{speed:6.1f} ex/s" if speed else "")

    def message(self, text):
        if not self.quiet:
            self.console.print(printable_text(text), markup=False, highlight=False)

    def stop(self):
        if self._p is not None:
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
