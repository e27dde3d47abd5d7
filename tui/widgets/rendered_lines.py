"""A panel drawn from a rich Text made for its width (the layer strip, the colour bar), by the line API.

rich renders the Text once per content and width into segments; each line's Strip is made once per style. As a
Static the Text went through Textual's Content (a style per cell, one per token and layer) or a rich renderable
rendered again at every paint: the strip's and the bar's paints were the largest of "next example" (5.4 and 1.9 of
43 ms of CPU on the 100k benchmark store, issue 38)."""

from __future__ import annotations

from typing import Callable

from rich.segment import Segment
from rich.text import Text
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from .laid_out_once import PlacedOnce
from .paint_style import PaintStyle


class RenderedLines(PaintStyle, PlacedOnce, Widget):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._make: Callable[[int], Text] | None = None  # the content: its Text for a width
        self._width: int | None = None  # the width it was rendered at
        self._lines: list[list[Segment]] = []  # as rich rendered them
        self._strips: dict[int, Strip] = {}  # those drawn, for the current lines and style
        self._strip_style = None

    def show_text(self, make: Callable[[int], Text]) -> None:
        """Show ``make(width)``; the screen is laid out only when the number of lines changes."""
        before = len(self._lines)
        self._make = make
        self._render(self.content_region.width)
        self.refresh(layout=len(self._lines) != before)

    def _render(self, width: int) -> None:
        text = self._make(width)
        self._lines = list(Segment.split_and_crop_lines(text.render(self.app.console), width,
                                                        include_new_lines=False, pad=False))
        self._width = width
        self._strips.clear()

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lines)

    def render_line(self, y: int) -> Strip:
        width = self.content_region.width
        if self._make is not None and width != self._width:  # resized since shown: the content made for the width
            self._render(width)
        style = self.paint_style
        if style != self._strip_style:  # another theme: drawn again
            self._strips.clear()
            self._strip_style = style
        strip = self._strips.get(y)
        if strip is None:
            if y >= len(self._lines):
                return Strip.blank(width, style)
            strip = self._strips[y] = Strip(self._lines[y]).apply_style(style).crop_extend(0, width, style)
        return strip
