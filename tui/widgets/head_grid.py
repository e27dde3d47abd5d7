"""The layers × heads grid of the heads screen: a line-API widget (it renders only the visible lines).

Row 0 (head numbers) and the row-label column (L1..Ln) stay put while the cells scroll. The widget takes the richest
cell layout that fits its width (:func:`tui.headmasks.choose_format`); with ``width: auto`` it asks for that width,
leaving :attr:`HeadGrid.SIDE_MIN` cells to the detail panel beside it. It only draws what the screen hands it.
"""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from ..colors import Mode
from ..data import HeadMaskInfo
from ..render.head_grid import (
    MARK_ONLY,
    CellFormat,
    GridGeometry,
    cell_formats,
    choose_format,
    geometry,
    header_cells,
    row_cells,
    row_label,
)


class HeadGrid(ScrollView, can_focus=False):
    """Grid of one mask: rows are layers, columns heads; the cursor cell is reversed."""

    SIDE_MIN = 35  # cells the grid leaves to the panel beside it when choosing its width

    DEFAULT_CSS = """
    HeadGrid {
        width: auto; height: 1fr; padding: 0 1;
        scrollbar-size-vertical: 1; scrollbar-size-horizontal: 1;
    }
    """

    class Clicked(Message):
        """A cell was clicked: the screen moves its cursor there."""

        def __init__(self, layer: int, head: int):
            super().__init__()
            self.layer, self.head = layer, head

    class FormatChanged(Message):
        """The grid switched to another cell layout (another mask, another width): the legend follows."""

        def __init__(self, fmt: CellFormat, formats: list[CellFormat]):
            super().__init__()
            self.fmt, self.formats = fmt, formats

    def __init__(self, mode: Mode, *, id: str | None = None):
        super().__init__(id=id)
        self.mode = mode
        self.masks: tuple[HeadMaskInfo, ...] = ()
        self.current = 0
        self.cursor_layer = 0
        self.cursor_head = 0
        self.formats: list[CellFormat] = [MARK_ONLY]
        self.fmt: CellFormat | None = None

    # ---------------------------------------------------------------- data from the screen
    @property
    def info(self) -> HeadMaskInfo | None:
        return self.masks[self.current] if self.masks else None

    def show(self, masks: tuple[HeadMaskInfo, ...], current: int, layer: int, head: int) -> None:
        """Draw mask ``current`` of ``masks`` with the cursor on (layer, head) (0-based)."""
        changed = masks is not self.masks or current != self.current
        self.masks, self.current = masks, current
        self.cursor_layer, self.cursor_head = layer, head
        if changed:
            info = self.info
            self.formats = cell_formats(info, masks) if info is not None else [MARK_ONLY]
            self.refresh(layout=True)  # the width this mask asks for may differ
        self._update_layout()
        self._scroll_to_cursor()
        self.refresh()

    # ---------------------------------------------------------------- geometry
    def _layout_for(self, width: int) -> tuple[CellFormat, GridGeometry]:
        info = self.info
        n_layers, n_heads = info.shape if info is not None else (1, 1)
        fmt = choose_format(self.formats, n_layers, n_heads, width)
        return fmt, geometry(fmt, n_layers, n_heads)

    def get_content_width(self, container: Size, viewport: Size) -> int:
        info = self.info
        if info is None:
            return 1
        n_layers, _ = info.shape
        budget = max(12, container.width - self.SIDE_MIN)
        _, geo = self._layout_for(budget)
        scrollbar = 1 if n_layers + 1 > container.height else 0
        return min(geo.width, budget - scrollbar) + scrollbar

    def _update_layout(self) -> None:
        info = self.info
        if info is None:
            self.virtual_size = Size(0, 0)
            return
        fmt, geo = self._layout_for(self.scrollable_content_region.width)
        self.virtual_size = Size(geo.width, info.shape[0] + 1)
        if fmt is not self.fmt:
            self.fmt = fmt
            self.post_message(self.FormatChanged(fmt, self.formats))

    def on_resize(self, event: events.Resize) -> None:
        self._update_layout()
        self._scroll_to_cursor()

    def _scroll_to_cursor(self) -> None:
        if self.info is None:
            return
        region = self.scrollable_content_region
        _, geo = self._layout_for(region.width)
        x, y = int(self.scroll_offset.x), int(self.scroll_offset.y)
        rows = max(1, region.height - 1)
        if self.cursor_layer < y:
            y = self.cursor_layer
        elif self.cursor_layer >= y + rows:
            y = self.cursor_layer - rows + 1
        cells = max(1, region.width - geo.label)
        x0, x1 = self.cursor_head * geo.col, (self.cursor_head + 1) * geo.col
        if x0 < x:
            x = x0
        elif x1 > x + cells:
            x = -(-(x1 - cells) // geo.col) * geo.col  # whole columns: the first one shown keeps its gap
        self.scroll_to(x=x, y=y, animate=False, force=True)

    # ---------------------------------------------------------------- drawing
    def _strip(self, text: Text) -> Strip:
        return Strip(list(text.render(self.app.console, end="")))

    def render_line(self, y: int) -> Strip:
        region = self.scrollable_content_region
        width = region.width
        base = self.rich_style
        info = self.info
        if info is None:
            return Strip.blank(width, base)
        fmt, geo = self._layout_for(width)
        sx, sy = int(self.scroll_offset.x), int(self.scroll_offset.y)
        if y == 0:
            label, cells = Text(" " * geo.label), header_cells(geo, self.cursor_head)
        else:
            layer = sy + y - 1
            if layer >= info.shape[0]:
                return Strip.blank(width, base)
            label = row_label(layer, geo, layer == self.cursor_layer)
            cursor = self.cursor_head if layer == self.cursor_layer else None
            cells = row_cells(info, fmt, geo, layer, self.mode, cursor)
        shown = max(0, width - geo.label)
        strip = Strip.join([self._strip(label), self._strip(cells).crop(sx, sx + shown)])
        return strip.extend_cell_length(width).crop(0, width).apply_style(base)

    def on_click(self, event: events.Click) -> None:
        info = self.info
        offset = event.get_content_offset(self)
        if info is None or offset is None or offset.y < 1:
            return
        _, geo = self._layout_for(self.scrollable_content_region.width)
        if offset.x < geo.label:
            return
        layer = int(self.scroll_offset.y) + offset.y - 1
        head = (int(self.scroll_offset.x) + offset.x - geo.label) // geo.col
        if 0 <= layer < info.shape[0] and 0 <= head < info.shape[1]:
            self.post_message(self.Clicked(layer, head))

