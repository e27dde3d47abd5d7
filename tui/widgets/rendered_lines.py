"""A panel drawn by the line API from rich content made for its width: the layer strip and the colour bar (a Text
fitted to the width), the example's text and the method bar (renderables rich wraps to the width).

rich renders the content once per content and width into segments; each line's Strip is made once per style. As a
Static a Text went through Textual's Content (a style per cell, one per token and layer) or a rich renderable
rendered again at every paint, and a Static whose height follows its content was rendered once more to measure it:
the strip's and the bar's paints were the largest of "next example" (5.4 and 1.9 of 43 ms of CPU on the 100k
benchmark store, issue 38), the text and the method bar were rendered two to four times per example."""

from __future__ import annotations

from typing import Callable

from rich.console import RenderableType
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from .laid_out_once import PlacedOnce
from .paint_style import PaintStyle


class RenderedLines(PaintStyle, PlacedOnce, Widget):
    #: True: the content is a Text its maker fitted to the width, drawn as it is. False: a rich renderable, rendered
    #: at the width as a Static renders it (wrapped, cut as it asks) and padded as a Static pads (the background).
    FITTED = True

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._make: Callable[[int], RenderableType] | None = None  # the content for a width
        self._width: int | None = None  # the width it was rendered at
        self._lines: list[list[Segment]] = []  # as rich rendered them
        self._strips: dict[int, Strip] = {}  # those drawn, for the current lines and style
        self._strip_style = None

    def show_content(self, make: Callable[[int], RenderableType]) -> None:
        """Show ``make(width)`` (see FITTED); the screen is laid out only when the number of lines changes."""
        before = len(self._lines)
        self._make = make
        width = self.content_region.width
        if not width:  # not placed yet: rendered at the width the layout gives it (get_content_height)
            self._width, self._lines = None, []
            self._strips.clear()
            self.refresh(layout=True)
            return
        self._render(width)
        self.refresh(layout=len(self._lines) != before)

    def _render(self, width: int) -> None:
        content, console = self._make(width), self.app.console
        if self.FITTED:
            segments = content.render(console)
        else:  # as Textual renders a Static's rich renderable
            segments = console.render(content, self.app.console_options.update(highlight=False).update_width(width))
        self._lines = list(Segment.split_and_crop_lines(segments, width, include_new_lines=False, pad=False))
        self._width = width
        self._strips.clear()

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if self._make is not None and width != self._width:  # wrapped content: as many lines as at this width
            self._render(width)
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
            pad = style if self.FITTED else Style.from_color(bgcolor=style.bgcolor)
            strip = self._strips[y] = Strip(self._lines[y]).apply_style(style).crop_extend(0, width, pad)
        return strip
