"""The methods × metrics table of the metrics screen. It draws what the screen hands it (:meth:`MetricTable.show`),
fitted to its size by :func:`tui.metricsview.table_lines`: columns that do not fit are left out around the sort
column, rows scroll with the cursor. A click on a row posts :class:`MetricTable.Clicked`.
"""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.geometry import Size
from textual.message import Message
from textual.widget import Widget

from ..colors import Mode
from ..data import MetricsData
from ..render.metric_table import table_lines


class MetricTable(Widget, can_focus=False):
    DEFAULT_CSS = """
    MetricTable { height: auto; max-height: 50%; padding: 0 1; }
    """

    class Clicked(Message):
        def __init__(self, method: str):
            super().__init__()
            self.method = method

    def __init__(self, mode: Mode, *, id: str | None = None):
        super().__init__(id=id)
        self.mode = mode
        self.data = MetricsData()
        self.rows: list[str] = []
        self.sort = 0
        self.descending = True
        self.cursor: str | None = None
        self._top = 0  # index in rows of the first method drawn

    def show(self, data: MetricsData, rows: list[str], sort: int, descending: bool, cursor: str | None) -> None:
        resized = len(rows) != len(self.rows) or data is not self.data
        self.data, self.rows, self.sort, self.descending, self.cursor = data, rows, sort, descending, cursor
        self.refresh(layout=resized)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self.rows) + 1 if self.rows else 1

    def render(self) -> Text:
        size = self.content_size
        lines, self._top = table_lines(self.data, self.rows, self.sort, self.descending, self.cursor,
                                       size.width, max(size.height, 1), self.mode)
        text = Text("\n").join(lines)
        text.no_wrap, text.overflow = True, "crop"
        return text

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None or offset.y < 1:
            return
        r = self._top + offset.y - 1
        if 0 <= r < len(self.rows):
            self.post_message(self.Clicked(self.rows[r]))
