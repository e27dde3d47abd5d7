"""The example list: a line-API widget that renders only the visible rows, in store order or in a view's order.

It never holds the whole store: rows (label, prediction, length, id and the per-example metric of the metric column)
come in blocks of BLOCK store rows that it asks the app to read on a worker when a row of the block is drawn
(NeedRows), keeping the MAX_BLOCKS most recent; a row not read yet shows its position. When the metric column
changes (another method), the blocks on screen are read again for it. A sort or filter is an ``order`` array of store rows. Line 0 is the column header,
with the view's note (sort, filter, matches, or the progress of a pass) at its right.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from ..render.task import LIST_HEADS, OTHER_TASK_HEADS
from ..render.tokens import printable
from .laid_out_once import ScrollSizedOnce
from .paint_style import PaintStyle

_EXAMPLES = Binding.Group("example")
BLOCK = 1024  # rows read at a time (the store's own index block)
MAX_BLOCKS = 16  # blocks kept: what a screen shows and its neighbourhood, never the whole store
METRIC_W = 6  # cells of the metric column


@dataclass
class RowBlock:
    """What the list shows of up to BLOCK consecutive store rows (read on a worker)."""

    label: np.ndarray
    pred: np.ndarray
    n_tokens: np.ndarray
    ids: list[str] | None
    metric_key: tuple[str, str] | None = None  # the (method, metric) whose per-example values ``metric`` holds
    metric: np.ndarray | None = None
    # a task other than classification: the two value columns (render/task.py LIST_HEADS) and the marks (True,
    # False, None) shown in place of label, prediction and correctness
    task_cells: tuple[list[str], list[str], list] | None = None
_MARKS = {True: ("✓", Style(color="green")), False: ("✗", Style(color="red", bold=True)), None: ("·", Style(dim=True))}
# Without colour a red mark turns dark grey: the glyph shapes alone tell right from wrong.
_MONO_MARKS = {True: ("✓", Style()), False: ("✗", Style(bold=True)), None: ("·", Style())}


def metric_cell(v) -> str:
    """A per-example metric in METRIC_W cells: '…' while it is read, '—' where it is undefined (NaN)."""
    if v is None:
        return "…".rjust(METRIC_W)
    v = float(v)
    if not np.isfinite(v):
        return "—".rjust(METRIC_W)
    text = f"{v:.3f}" if abs(v) < 10 else f"{v:.3g}" if abs(v) < 1e5 else f"{v:.0e}"
    return text.rjust(METRIC_W)[:METRIC_W]


def _fit(text: str, width: int) -> str:
    """Pad or cut ``text`` to exactly ``width`` cells, marking a cut with '…'."""
    if cell_len(text) <= width:
        return set_cell_size(text, width)
    return set_cell_size(text, width - 1) + "…"


class ExampleList(PaintStyle, ScrollSizedOnce, ScrollView, can_focus=True):
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

    cursor: reactive[int] = reactive(0, always_update=False, init=False, repaint=False)  # watch_cursor repaints

    class Highlighted(Message):
        def __init__(self, index: int):
            super().__init__()
            self.index = index

    class NoteChanged(Message):
        """The view's note (sort, filter, search; a pass's progress) changed: the screen shows it on a line of its
        own where the header has no room for the whole of it (:meth:`note_fits`)."""

    class NeedRows(Message):
        """Rows of block ``block`` (store rows block*BLOCK .. +BLOCK) are on screen but not read yet."""

        def __init__(self, block: int):
            super().__init__()
            self.block = block

    def __init__(self, *, id: str | None = None, monochrome: bool = False):
        super().__init__(id=id)
        self.monochrome = monochrome
        self._n = 0  # store rows
        self._order: np.ndarray | None = None  # view position -> store row (a sort or filter); None: store order
        self._order_note = ""  # what the order is ("sorted by length ↓", "12 of 100 match")
        self._pos = np.zeros(0, dtype=np.int64)  # inverse of _order
        self._blocks: OrderedDict[int, RowBlock] = OrderedDict()
        self._asked: set[int] = set()
        self._labels: dict[int, str] = {}
        self._label_w = 5
        self._heads = ("label", "pred")  # the two value columns (render/task.py LIST_HEADS for other tasks)
        self._id_w = 4  # widest id seen so far (cells)
        self.metric_key: tuple[str, str] | None = None  # the metric column's (method, metric); None: no column
        self._metric_head = ""
        # a sort key the list holds already (two methods' disagreement), shown in the value column instead of a metric
        self._key_values: np.ndarray | None = None

    # ---------------------------------------------------------------- data
    @property
    def row_count(self) -> int:
        """Rows in the current view (all store rows, or those of a filter)."""
        return self._n if self._order is None else len(self._order)

    @property
    def store_rows(self) -> int:
        return self._n

    def row_at(self, position: int) -> int:
        """The store row shown at view ``position``."""
        return int(position if self._order is None else self._order[position])

    def position_of(self, row: int) -> int | None:
        """The view position of store ``row`` (None: filtered out)."""
        if self._order is None:
            return row if 0 <= row < self._n else None
        if not 0 <= row < len(self._pos):
            return None
        pos = int(self._pos[row])
        return pos if pos >= 0 else None

    def id_of(self, row: int) -> str | None:
        """The id of store ``row`` when its block is read (None otherwise: nothing is read here)."""
        blk = self._blocks.get(row // BLOCK)
        k = row - (row // BLOCK) * BLOCK
        return blk.ids[k] if blk is not None and blk.ids is not None and k < len(blk.ids) else None

    def positions_of(self, rows: np.ndarray) -> np.ndarray:
        """View positions of store ``rows`` that the view shows (vectorised; rows filtered out are dropped)."""
        rows = np.asarray(rows, dtype=np.int64)
        if self._order is None:
            return rows[(rows >= 0) & (rows < self._n)]
        rows = rows[(rows >= 0) & (rows < len(self._pos))]
        pos = self._pos[rows]
        return pos[pos >= 0]

    @property
    def current_row(self) -> int | None:
        return self.row_at(self.cursor) if self.row_count else None

    def set_size(self, n: int, labels: dict[int, str], task: str = "classification") -> None:
        """The store has ``n`` committed rows (a growing store calls this again); keeps the cursor. ``task``: other
        tasks than classification show the columns of render/task.py LIST_HEADS."""
        first = self._n == 0
        grew_last = self._n and (self._n - 1) // BLOCK
        self._n = n
        self._labels = labels
        if grew_last in self._blocks:  # the last block was partial: read it again
            del self._blocks[grew_last]
            self._asked.discard(grew_last)
        if task == "classification":
            names = [self._label_name(k) for k in labels] or ["label"]
            self._label_w = max(4, min(8, max(cell_len(nm) for nm in names)))
            self._heads = ("label", "pred")
        else:  # numbers and spans ("+12.34", "10-12")
            self._heads = LIST_HEADS.get(task, OTHER_TASK_HEADS)
            self._label_w = 6
        self.virtual_size = Size(self.size.width, self.row_count + 1)
        self.refresh()
        if first and n:
            self.cursor = 0
            self.post_message(self.Highlighted(self.row_at(0)))

    def put_block(self, block: int, rows: "RowBlock") -> None:
        self._blocks[block] = rows
        self._blocks.move_to_end(block)
        self._asked.discard(block)
        self._asked.discard((block, rows.metric_key))
        while len(self._blocks) > MAX_BLOCKS:
            self._blocks.popitem(last=False)
        if rows.ids:
            self._id_w = max(self._id_w, max(cell_len(printable(i)) for i in rows.ids[:2000]))
        self.refresh()

    def set_metric(self, key: tuple[str, str] | None, head: str) -> None:
        """Show the per-example values of metric ``key`` = (method, name) in a column headed ``head``."""
        if key == self.metric_key:
            return
        self.metric_key, self._metric_head = key, head
        self._asked = {b for b in self._asked if isinstance(b, int)}
        self.refresh()

    def set_key_column(self, values: np.ndarray | None, head: str) -> None:
        """Show ``values`` (one per store row: a sort key computed over the store) in the value column headed
        ``head``, in place of the metric column; None gives the column back to the metric."""
        self._key_values = None if values is None else np.asarray(values, np.float64)
        if values is not None:
            self._metric_head = head
        self.refresh()

    @property
    def shows_value(self) -> bool:
        """The value column is shown (a metric's, or a sort key's)."""
        return self.metric_key is not None or self._key_values is not None

    def set_note(self, note: str) -> None:
        """The note at the right of the header (the view, or the progress of a pass over the store)."""
        self._order_note = note
        self.refresh()
        self.post_message(self.NoteChanged())

    @property
    def note(self) -> str:
        return self._order_note

    def note_fits(self, width: int) -> bool:
        """The whole note fits the header's line of ``width`` cells after the column heads."""
        return cell_len(self._column_heads(width)) + 1 + cell_len(self._order_note) <= width

    def set_order(self, order: np.ndarray | None, note: str = "") -> None:
        """Show the store rows in ``order`` (a sort or a filter; None: store order); the cursor stays on its example
        when it is still shown, else goes to the first row."""
        row = self.current_row
        self._order = None if order is None else np.asarray(order, dtype=np.int64)
        self._order_note = note
        self.post_message(self.NoteChanged())
        if self._order is not None:  # store row -> view position, for moving by row and for n / N
            self._pos = np.full(max(self._n, int(self._order.max(initial=-1)) + 1), -1, dtype=np.int64)
            self._pos[self._order] = np.arange(len(self._order))
        self.virtual_size = Size(self.size.width, self.row_count + 1)
        pos = self.position_of(row) if row is not None else None
        self.scroll_to(y=0, animate=False)
        if pos is None:
            pos = 0
        if self.cursor == pos:
            self._scroll_to_cursor()
            if self.row_count:
                self.post_message(self.Highlighted(self.row_at(pos)))
        self.cursor = pos
        self.refresh()

    def _row(self, row: int):
        """(block, offset) of a store row, or None when its block is not read yet (asked for once)."""
        b = row // BLOCK
        blk = self._blocks.get(b)
        stale = blk is not None and blk.metric_key != self.metric_key  # read for another metric column
        if blk is None or stale:
            ask = b if blk is None else (b, self.metric_key)
            if ask not in self._asked:
                self._asked.add(ask)
                # to the app itself: posted while the screen renders, a bubbling message would stop at the screen
                # (Textual ends propagation at the sender, and the sender here is the screen)
                self.app.post_message(self.NeedRows(b))
            if blk is None:
                return None
        return blk, row - b * BLOCK

    def _label_name(self, k: int) -> str:
        if k < 0:
            return "—"
        return printable(self._labels.get(int(k), str(int(k))))

    # ---------------------------------------------------------------- rendering
    def _columns(self, width: int) -> tuple[int, int]:
        """Widths of the id and label columns for a row of ``width`` cells: ids first (up to 16 cells), labels
        share the rest (3 to 8 cells each, cut with '…'); the metric column takes METRIC_W + 1 when it is shown."""
        avail = width - 2 - 5 - 2 - (METRIC_W + 1 if self.shows_value else 0)  # mark, " len", separators
        want_id = min(self._id_w, 16)
        lw = min(self._label_w, max(3, (avail - want_id) // 2))
        id_w = max(3, min(want_id, avail - 2 * lw))
        return id_w, lw

    def _row_text(self, i: int, width: int) -> tuple[str, tuple[str, Style]]:
        row = self.row_at(i)
        id_w, lw = self._columns(width)
        found = self._row(row)
        if found is None or found[1] >= len(found[0].label):
            return _fit(f"#{row + 1} …", width - 2), ("·", Style(dim=True))
        blk, k = found
        ex_id = printable(blk.ids[k]) if blk.ids is not None else f"#{row + 1}"
        if blk.task_cells is not None:
            first, second, marks = blk.task_cells
            mark = (_MONO_MARKS if self.monochrome else _MARKS)[marks[k]]
            cols = [_fit(ex_id, id_w), _fit(first[k].rjust(lw), lw), _fit(second[k].rjust(lw), lw)]
        else:
            label, pred = int(blk.label[k]), int(blk.pred[k])
            mark = (_MONO_MARKS if self.monochrome else _MARKS)[None if label < 0 else label == pred]
            cols = [_fit(ex_id, id_w), _fit(self._label_name(label), lw), _fit(self._label_name(pred), lw)]
        cols.append(f"{int(blk.n_tokens[k]):>4}")
        if self._key_values is not None:
            cols.append(metric_cell(self._key_values[row] if row < len(self._key_values) else None))
        elif self.metric_key:
            v = blk.metric[k] if blk.metric_key == self.metric_key and blk.metric is not None else None
            cols.append(metric_cell(v))
        return " ".join(cols), mark

    def header_text(self, width: int) -> str:
        """The column heads, and the note after them when the whole of it fits (else the screen shows it)."""
        head = self._column_heads(width)
        if self._order_note and self.note_fits(width):
            head = set_cell_size(head, width - cell_len(self._order_note) - 1) + " " + self._order_note
        return head

    def _column_heads(self, width: int) -> str:
        id_w, lw = self._columns(width)
        right = self._heads != ("label", "pred")  # numbers: their heads right-aligned above them
        cols = [set_cell_size("id", id_w)] + [_fit(h.rjust(lw) if right else h, lw) for h in self._heads] + [" len"]
        if self.shows_value:
            head = self._metric_head
            cols.append(head.rjust(METRIC_W) if cell_len(head) <= METRIC_W else _fit(head, METRIC_W))
        return "  " + " ".join(cols)

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        base = self.paint_style
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
        top = int(self.scroll_offset.y)
        self._scroll_to_cursor()
        if int(self.scroll_offset.y) == top:  # the two rows the cursor left and reached, not the whole list
            width = self.size.width
            self.refresh(*(Region(0, pos - top + 1, width, 1) for pos in (old, new)))
        else:
            self.refresh()
        if self.row_count:
            self.post_message(self.Highlighted(self.row_at(new)))

    def _scroll_to_cursor(self) -> None:
        visible = max(1, self.scrollable_content_region.height - 1)
        top = int(self.scroll_offset.y)
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + visible:
            self.scroll_to(y=self.cursor - visible + 1, animate=False)

    def move_to(self, i: int) -> None:
        """Move the cursor to view position ``i`` (clamped)."""
        if self.row_count:
            self.cursor = max(0, min(self.row_count - 1, i))

    def move_to_row(self, row: int) -> None:
        """Move the cursor to store row ``row`` when the view shows it."""
        pos = self.position_of(row)
        if pos is not None:
            self.move_to(pos)

    def step_row(self, row: int, step: int) -> int:
        """The store row ``step`` positions after ``row`` in the view (clamped; ``row`` itself when not shown)."""
        pos = self.position_of(row)
        if pos is None or not self.row_count:
            return row
        return self.row_at(max(0, min(self.row_count - 1, pos + step)))

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
