"""The example list: a line-API widget that renders only the visible rows, straight from the store's index array.

Rows come from numpy columns (label, pred, n_tokens) so 100k examples cost nothing to "build"; ids arrive later from
a worker (until then a row shows its position). Line 0 is a fixed column header.
"""

from __future__ import annotations

import numpy as np
from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from ..render import printable

_EXAMPLES = Binding.Group("example")
_MARKS = {True: ("✓", Style(color="green")), False: ("✗", Style(color="red", bold=True)), None: ("·", Style(dim=True))}
# Without colour a red mark turns dark grey: the glyph shapes alone tell right from wrong.
_MONO_MARKS = {True: ("✓", Style()), False: ("✗", Style(bold=True)), None: ("·", Style())}


def _fit(text: str, width: int) -> str:
    """Pad or cut ``text`` to exactly ``width`` cells, marking a cut with '…'."""
    if cell_len(text) <= width:
        return set_cell_size(text, width)
    return set_cell_size(text, width - 1) + "…"


class ExampleList(ScrollView, can_focus=True):
    """Virtual list of examples. Posts :class:`ExampleList.Highlighted` when the cursor moves."""

    BINDINGS = [
        Binding("j", "cursor_down", "next", id="example.next", group=_EXAMPLES),
        Binding("k", "cursor_up", "previous", id="example.previous", group=_EXAMPLES),
        Binding("down", "cursor_down", "next", show=False),
        Binding("up", "cursor_up", "previous", show=False),
        Binding("pagedown", "page_down", "page down", id="example.page_down", show=False),
        Binding("pageup", "page_up", "page up", id="example.page_up", show=False),
        Binding("home", "first", "first", id="example.first", show=False),
        Binding("end", "last", "last", id="example.last", show=False),
    ]

    COMPONENT_CLASSES = {"example-list--header", "example-list--cursor"}

    DEFAULT_CSS = """
    ExampleList { height: 1fr; overflow-x: hidden; scrollbar-size-vertical: 1; }
    ExampleList > .example-list--header { text-style: bold; color: $text-muted; }
    ExampleList > .example-list--cursor { background: $surface-lighten-2; }
    ExampleList:focus > .example-list--cursor { background: $block-cursor-background; color: $block-cursor-foreground; }
    """

    cursor: reactive[int] = reactive(0, always_update=False, init=False)

    class Highlighted(Message):
        def __init__(self, index: int):
            super().__init__()
            self.index = index

    def __init__(self, *, id: str | None = None, monochrome: bool = False):
        super().__init__(id=id)
        self.monochrome = monochrome
        self._index: np.ndarray | None = None
        self._ids: list[str] | None = None
        self._labels: dict[int, str] = {}
        self._label_w = 5
        self._id_w = 4  # widest id seen (cells)

    # ---------------------------------------------------------------- data
    @property
    def ids(self) -> list[str] | None:
        return self._ids

    @property
    def row_count(self) -> int:
        return 0 if self._index is None else len(self._index)

    def set_rows(self, index: np.ndarray, labels: dict[int, str], ids: list[str] | None = None) -> None:
        """(Re)build from the index array; keeps the cursor. New rows of a growing store simply appear."""
        first = self._index is None or len(self._index) == 0
        self._index = index
        self._labels = labels
        if ids is not None:
            self.set_ids(ids)
        names = [self._label_name(k) for k in labels] or ["label"]
        self._label_w = max(4, min(8, max(cell_len(n) for n in names)))
        self.virtual_size = Size(self.size.width, len(index) + 1)
        self.refresh()
        if first and len(index):
            self.cursor = 0
            self.post_message(self.Highlighted(0))

    def set_ids(self, ids: list[str]) -> None:
        self._ids = ids
        widest = max(map(len, ids), default=0)  # characters (fast for 100k ids); wide characters from a sample
        self._id_w = max(4, widest, max((cell_len(printable(i)) for i in ids[:5000]), default=0))
        self.refresh()

    def _label_name(self, k: int) -> str:
        if k < 0:
            return "—"
        return printable(self._labels.get(int(k), str(int(k))))

    # ---------------------------------------------------------------- rendering
    def _columns(self, width: int) -> tuple[int, int]:
        """Widths of the id and label columns for a row of ``width`` cells: ids first (up to 16 cells), labels
        share the rest (3 to 8 cells each, cut with '…')."""
        avail = width - 2 - 5 - 2  # mark and space, " len", two separators
        want_id = min(self._id_w, 16)
        lw = min(self._label_w, max(3, (avail - want_id) // 2))
        id_w = max(3, min(want_id if self._ids is not None else avail - 2 * lw, avail - 2 * lw))
        return id_w, lw

    def _row_text(self, i: int, width: int) -> tuple[str, tuple[str, Style]]:
        row = self._index[i]
        id_w, lw = self._columns(width)
        ex_id = printable(self._ids[i]) if self._ids is not None and i < len(self._ids) else f"#{i}"
        label, pred = int(row["label"]), int(row["pred"])
        mark = (_MONO_MARKS if self.monochrome else _MARKS)[None if label < 0 else label == pred]
        text = " ".join([
            _fit(ex_id, id_w),
            _fit(self._label_name(label), lw),
            _fit(self._label_name(pred), lw),
            f"{int(row['n_tokens']):>4}",
        ])
        return text, mark

    def header_text(self, width: int) -> str:
        id_w, lw = self._columns(width)
        return "  " + " ".join([set_cell_size("id", id_w), set_cell_size("label", lw),
                                set_cell_size("pred", lw), " len"])

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        base = self.rich_style
        if y == 0:
            style = base + self.get_component_rich_style("example-list--header")
            return Strip([Segment(set_cell_size(self.header_text(width), width), style)], width)
        i = int(self.scroll_offset.y) + y - 1
        if i >= self.row_count:
            return Strip.blank(width, base)
        text, (mark, mark_style) = self._row_text(i, width)
        style = base
        if i == self.cursor:
            style = base + self.get_component_rich_style("example-list--cursor")
        line = set_cell_size(f"{mark} {text}", width)
        segments = [Segment(line[0], style + mark_style), Segment(line[1:], style)]
        return Strip(segments, width)

    def on_resize(self, event: events.Resize) -> None:
        self.virtual_size = Size(event.size.width, self.row_count + 1)

    # ---------------------------------------------------------------- cursor
    def watch_cursor(self, old: int, new: int) -> None:
        self._scroll_to_cursor()
        self.refresh()
        self.post_message(self.Highlighted(new))

    def _scroll_to_cursor(self) -> None:
        visible = max(1, self.scrollable_content_region.height - 1)
        top = int(self.scroll_offset.y)
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + visible:
            self.scroll_to(y=self.cursor - visible + 1, animate=False)

    def move_to(self, i: int) -> None:
        if self.row_count:
            self.cursor = max(0, min(self.row_count - 1, i))

    def action_cursor_down(self) -> None:
        self.move_to(self.cursor + 1)

    def action_cursor_up(self) -> None:
        self.move_to(self.cursor - 1)

    def action_page_down(self) -> None:
        self.move_to(self.cursor + max(1, self.scrollable_content_region.height - 2))

    def action_page_up(self) -> None:
        self.move_to(self.cursor - max(1, self.scrollable_content_region.height - 2))

    def action_first(self) -> None:
        self.move_to(0)

    def action_last(self) -> None:
        self.move_to(self.row_count - 1)

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is not None and offset.y >= 1:
            self.move_to(int(self.scroll_offset.y) + offset.y - 1)
