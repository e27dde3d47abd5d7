"""A Rich Text handed to Textual as a Rich renderable, for the screens that draw many small spans (head grids and
matrices)."""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.text import Text


class Drawn:
    """Drawn by Rich's renderer instead of converted span by span into Textual's Content (a 12 x 12 grid has over
    700 spans: the conversion was most of a key's time)."""

    def __init__(self, text: Text):
        self.text = text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.text

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.text)
