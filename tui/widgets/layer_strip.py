"""The browse screen's layer strip widget (drawn by :mod:`tui.render.layer_strip`).

A line-API widget: the strip's Text is rendered by rich once per show into one Strip per line. As a Static its Text
went through Textual's Content at every paint, a style per cell (one per token and layer): the strip's paint was the
largest of "next example" (5.4 of 43 ms of CPU on the 100k benchmark store, issue 38)."""

from __future__ import annotations

import numpy as np
from rich.segment import Segment
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from ..render.layer_strip import strip_text
from .laid_out_once import PlacedOnce
from .paint_style import PaintStyle


class LayerStrip(PaintStyle, PlacedOnce, Widget):
    """Layers x tokens of the current method (:func:`tui.render.layer_strip.strip_text`): a line per layer view and
    one for the final scores, the current one marked; hidden for methods without layer views."""

    DEFAULT_CSS = "LayerStrip { height: auto; }"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._lines: list[list[Segment]] = []  # the strip's lines as rich rendered them
        self._strips: dict[int, Strip] = {}  # those drawn, for the current lines and style
        self._strip_style = None

    def show(self, views: np.ndarray | None, final: np.ndarray, layer: int | None, signed: bool, mode, *,
             rows: int, cmap: str = "dark") -> None:
        if views is None or not len(views):
            self.display = False
            return
        self.display = True
        lines = np.vstack([np.asarray(views, np.float64), np.asarray(final, np.float64)[None, :]])
        labels = [f"L{i + 1}" for i in range(len(views))] + ["final"]
        current = len(views) if layer is None else layer
        width = max(self.size.width, 20)
        text = strip_text(lines, labels, current, signed, mode, width=width, rows=rows, label_w=7, cmap=cmap)
        before = len(self._lines)
        self._lines = list(Segment.split_and_crop_lines(text.render(self.app.console), width,
                                                        include_new_lines=False, pad=False))
        self._strips.clear()
        # a layout only when the strip's height changes (another example's strip of as many lines moves nothing)
        self.refresh(layout=len(self._lines) != before)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lines)

    def render_line(self, y: int) -> Strip:
        style = self.paint_style
        if style != self._strip_style:  # another theme: drawn again
            self._strips.clear()
            self._strip_style = style
        strip = self._strips.get(y)
        if strip is None:
            width = self.content_region.width
            if y >= len(self._lines):
                return Strip.blank(width, style)
            strip = self._strips[y] = Strip(self._lines[y]).apply_style(style).crop_extend(0, width, style)
        return strip
