"""The metrics screen (``f``): the store's faithfulness metrics as a methods × metrics table, sortable.

Layout, top to bottom: a legend (the sort column and direction, what ★ ↑ ↓ mean), the table (rows are methods,
columns metrics: the mean over the examples, the best value of each column bold with ★; the arrows move the row
cursor, ←/→ or tab pick the sort column, ``s`` flips the direction), the browse screen's current example with its own
value of every metric of the method under the cursor, and a detail panel for that method (every metric with
mean ± std, n, its settings and its mean curve) or, with ``p``, a chart of the sort column's mean per-level curves
for the method under the cursor and the next ones (plotext). A store without metrics shows one line saying how to
get them.

The metrics are read when the screen opens, by a thread worker under the app's store lock (values [N] and curves
[N, K] per metric: small); the worker posts :class:`MetricsLoaded` and the screen draws from memory from then on.
"""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Header, Static

from ..colors import Mode
from ..commands import MetricsCommands
from ..data import MetricsData, read_for_screen, read_metrics
from ..render.metric_table import (
    EMPTY_MESSAGE,
    ExampleValues,
    Legend,
    MetricDetail,
    higher_is_better,
    sorted_methods,
)
from ..widgets.footer import FittedFooter
from ..widgets.curve_chart import CurveChart, curve_series, legend_text
from ..widgets.metric_table import MetricTable

_ROWS = Binding.Group("method")
_COLUMNS = Binding.Group("sort by")


class MetricsLoaded(Message):
    def __init__(self, data: MetricsData, problems: list[str]):
        super().__init__()
        self.data = data
        self.problems = problems


class MetricsFailed(Message):
    def __init__(self, error: str):
        super().__init__()
        self.error = error


class MetricsScreen(ModalScreen[None]):
    """Faithfulness metrics of the store. Modal: the browse keys ([ ] j k m ...) do not reach the screen below."""

    COMMANDS = {MetricsCommands}

    BINDINGS = [
        Binding("up", "move(-1)", "method", id="metrics.up", group=_ROWS),
        Binding("down", "move(1)", "method", id="metrics.down", group=_ROWS),
        Binding("left", "sort_column(-1)", "sort by", id="metrics.column.previous", group=_COLUMNS),
        Binding("right", "sort_column(1)", "sort by", id="metrics.column.next", group=_COLUMNS),
        Binding("tab", "sort_column(1)", "next sort column", id="metrics.column.tab", show=False),
        Binding("shift+tab", "sort_column(-1)", "previous sort column", id="metrics.column.backtab", show=False),
        Binding("s", "toggle_order", "order", id="metrics.order"),
        Binding("p", "toggle_chart", "curves", id="metrics.chart"),
        Binding("enter", "sort_examples", "sort examples", id="metrics.sort_examples"),
        Binding("home", "first_row", "first method", id="metrics.first", show=False),
        Binding("end", "last_row", "last method", id="metrics.last", show=False),
        Binding("pagedown", "scroll_detail(1)", "scroll the panel", id="metrics.page_down", show=False),
        Binding("pageup", "scroll_detail(-1)", "scroll the panel", id="metrics.page_up", show=False),
        Binding("escape,f,q", "close", "close", id="metrics.close"),
        # ctrl+p is the app's (a priority binding, so it works here); this one only shows it in the footer.
        Binding("ctrl+p", "app.command_palette", "palette", show=False),
    ]

    DEFAULT_CSS = """
    MetricsScreen { background: $background; align: left top; }
    MetricsScreen #metrics-legend { height: 1; padding: 0 1; }
    MetricsScreen #metrics-example { height: auto; padding: 0 1; margin: 1 0 0 0; }
    MetricsScreen #metrics-side {
        height: 1fr; border-top: hkey $primary 40%; padding: 0 1; scrollbar-size-vertical: 1;
    }
    MetricsScreen #metrics-detail { width: 100%; }
    MetricsScreen #metrics-chart { height: 1fr; min-height: 10; border-top: hkey $primary 40%; }
    MetricsScreen #metrics-chart-legend { height: auto; padding: 0 1; }
    MetricsScreen.-chart MetricTable { max-height: 30%; }  /* the chart needs the lines: the table scrolls */
    """

    def __init__(self, mode: Mode):
        super().__init__()
        self.mode = mode
        self.data: MetricsData | None = None  # None until the worker reports
        self.sort = 0  # index of the sort column in data.names
        self.descending = True
        self.cursor: str | None = None  # the method under the cursor (it stays on its method when the order changes)
        self.chart = False  # p: the curves of the sort column's metric instead of the detail panel
        self.sub_title = "faithfulness metrics"

    # ---------------------------------------------------------------- layout
    def compose(self) -> ComposeResult:
        yield Header(icon="◆")
        yield Static(Text("reading the metrics…", style=Style(dim=True)), id="metrics-legend")
        yield MetricTable(self.mode, id="metrics-table")
        yield Static(id="metrics-example")
        with VerticalScroll(id="metrics-side", can_focus=False):
            yield Static(id="metrics-detail")
        yield CurveChart(id="metrics-chart")
        yield Static(id="metrics-chart-legend")
        yield FittedFooter()

    def on_mount(self) -> None:
        self._show_body(False)
        self._read_key = self._store_key()
        self.run_worker(self._read_metrics, thread=True, exclusive=True, group="metrics", name="read metrics")

    def on_screen_resume(self) -> None:
        """Opened again: read again only when the store has grown since (the app keeps this screen)."""
        key = self._store_key()
        if self.data is not None and key != self._read_key:
            self._read_key = key
            self.run_worker(self._read_metrics, thread=True, exclusive=True, group="metrics", name="read metrics")
        elif self.has_metrics:
            self.show_example_values()  # the browse screen's example may have changed

    def _store_key(self):
        meta = getattr(self.app, "meta", None)
        return None if meta is None else (meta.n, meta.complete, self.app.store_generation)

    # ---------------------------------------------------------------- worker (the only HDF5 read of this screen)
    def _read_metrics(self) -> None:
        read_for_screen(self, self._cached_metrics, MetricsLoaded, MetricsFailed)

    def _cached_metrics(self, store):
        """The metrics with their values and mean curves, read once per state of the store (its examples and metric
        records) and kept by the app: opening the screen again reads and allocates nothing."""
        key = (len(store), tuple((m, tuple(store.metric_names(m))) for m in (store.metric_methods or ())),
               self.app.store_generation)
        cached = getattr(self.app, "metrics_cache", None)
        if cached is None or cached[0] != key:
            cached = (key, read_metrics(store))
            self.app.metrics_cache = cached
        return cached[1]

    def on_metrics_loaded(self, message: MetricsLoaded) -> None:
        old = self.data.names if self.data is not None else ()
        self.data = message.data
        for problem in message.problems:
            self.notify(problem, severity="warning", timeout=8, markup=False)
        if not self.data.names:
            self._show_message(EMPTY_MESSAGE)
            return
        n_methods, n_metrics = len(self.data.methods), len(self.data.names)
        self.sub_title = (f"metrics · {n_methods} method{'s' if n_methods != 1 else ''} × "
                          f"{n_metrics} metric{'s' if n_metrics != 1 else ''}")
        if tuple(old) != tuple(self.data.names):  # first read, or other metrics: the first column, best first
            self.sort = 0
            self.descending = higher_is_better(self.data, self.data.names[0])
        if self.cursor not in self.rows:  # a re-read after the store grew keeps the sort and the cursor
            self.cursor = self.rows[0] if self.rows else None
        self._show_body(True)
        self.refresh_bindings()
        self._draw()

    def on_metrics_failed(self, message: MetricsFailed) -> None:
        self.data = MetricsData()
        self.notify(f"could not read the metrics: {message.error}", severity="error", timeout=8, markup=False)
        self._show_message("could not read the metrics (see the notification)")

    def _show_body(self, shown: bool) -> None:
        for selector in ("#metrics-table", "#metrics-example"):
            self.query_one(selector).display = shown
        self.query_one("#metrics-side").display = shown and not self.chart
        self.query_one(CurveChart).display = shown and self.chart
        self.query_one("#metrics-chart-legend").display = shown and self.chart

    def _show_message(self, message: str) -> None:
        self.query_one("#metrics-legend", Static).update(Text(message, style=Style(dim=True)))
        self._show_body(False)
        self.refresh_bindings()

    # ---------------------------------------------------------------- state
    @property
    def has_metrics(self) -> bool:
        return bool(self.data is not None and self.data.names)

    @property
    def sort_name(self) -> str | None:
        return self.data.names[self.sort] if self.has_metrics else None

    @property
    def rows(self) -> list[str]:
        """The methods in the current order."""
        if not self.has_metrics:
            return []
        return sorted_methods(self.data, self.sort_name, self.descending)

    # ---------------------------------------------------------------- drawing
    def _draw(self) -> None:
        if not self.has_metrics:
            return
        rows = self.rows
        if self.cursor not in rows:
            self.cursor = rows[0] if rows else None
        self.query_one("#metrics-legend", Static).update(Legend(self.data, self.sort, self.descending))
        self.query_one(MetricTable).show(self.data, rows, self.sort, self.descending, self.cursor)
        self._draw_method()

    def _draw_method(self) -> None:
        self.show_example_values()
        if self.chart:
            self._draw_chart()
        else:
            self.query_one("#metrics-detail", Static).update(MetricDetail(self.data, self.cursor, self.mode))

    def chart_methods(self) -> list[str]:
        """The methods whose curves the chart draws: the one under the cursor first, then the table's order (six at
        most, one marker each)."""
        rows = self.rows
        return ([self.cursor] if self.cursor in rows else []) + [m for m in rows if m != self.cursor][:5]

    def _draw_chart(self) -> None:
        name = self.sort_name
        series = curve_series(self.data, name, self.chart_methods())
        self.query_one(CurveChart).show(name, series)
        self.query_one("#metrics-chart-legend", Static).update(legend_text(series, max(self.size.width - 2, 20)))

    def show_example_values(self) -> None:
        """The browse screen's current example, with its value of every metric of the method under the cursor
        (the app calls this when the browse selection changes)."""
        if not self.has_metrics:
            return
        app = self.app
        index = getattr(app, "current", None)
        ex_id, total, ex = None, 0, None
        if index is not None:
            ex = app.cache.get(index) if hasattr(app, "cache") else None
            ex_id = ex.id if ex is not None else app.example_list.id_of(index)
            total = app.example_list.store_rows if hasattr(app, "example_list") else 0
        known = ex.metric_values if ex is not None else {}
        ex = ex.at_step(getattr(app, "step", 0)) if ex is not None else None  # a generation store's shown step
        at_step = None if ex is None or ex.step_metric_values is None else {
            k: v for k, v in ex.step_metric_values.items() if k[0] == self.cursor}
        step = f"step {ex.step + 1}/{ex.steps.n}" if at_step and ex.step >= 0 else ""
        values = ExampleValues(self.data.of(self.cursor), self.cursor, index, ex_id, total, known, at_step, step)
        self.query_one("#metrics-example", Static).update(values)

    def on_metric_table_clicked(self, message: MetricTable.Clicked) -> None:
        self.set_cursor(message.method)

    # ---------------------------------------------------------------- actions
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Table keys: hidden from the footer when the store has no metrics, greyed while loading."""
        if action in ("move", "sort_column", "toggle_order", "first_row", "last_row", "scroll_detail", "sort_examples",
                      "toggle_chart"):
            if self.data is not None and not self.has_metrics:
                return False
            return True if self.has_metrics else None
        return True

    def set_cursor(self, method: str) -> None:
        """Put the row cursor on ``method`` (the detail panel and the example's values follow)."""
        if not self.has_metrics or method not in self.data.methods:
            return
        self.cursor = method
        self.query_one(MetricTable).show(self.data, self.rows, self.sort, self.descending, self.cursor)
        self._draw_method()
        self.query_one("#metrics-side", VerticalScroll).scroll_home(animate=False)

    def set_sort(self, column: int, descending: bool | None = None) -> None:
        """Sort by column ``column`` (wraps around); ``descending`` None: that metric's better direction (best
        first). The cursor stays on its method."""
        if not self.has_metrics:
            return
        self.sort = column % len(self.data.names)
        self.descending = higher_is_better(self.data, self.sort_name) if descending is None else descending
        self._draw()

    def action_move(self, step: int) -> None:
        rows = self.rows
        if not rows:
            return
        i = rows.index(self.cursor) if self.cursor in rows else 0
        self.set_cursor(rows[max(0, min(i + step, len(rows) - 1))])

    def action_first_row(self) -> None:
        if self.rows:
            self.set_cursor(self.rows[0])

    def action_last_row(self) -> None:
        if self.rows:
            self.set_cursor(self.rows[-1])

    def action_sort_column(self, step: int) -> None:
        self.set_sort(self.sort + step)

    def action_toggle_chart(self) -> None:
        """p: the mean per-level curves of the sort column's metric (deletion / insertion, comprehensiveness ...) for
        the method under the cursor and the next ones, drawn by plotext; p again: the detail panel."""
        self.chart = not self.chart
        self.set_class(self.chart, "-chart")
        self._show_body(self.has_metrics)
        self._draw_method()

    def action_toggle_order(self) -> None:
        self.set_sort(self.sort, not self.descending)

    def action_scroll_detail(self, step: int) -> None:
        side = self.query_one("#metrics-side", VerticalScroll)
        if step > 0:
            side.scroll_page_down(animate=False)
        else:
            side.scroll_page_up(animate=False)

    def action_sort_examples(self) -> None:
        """Sort the example list by the chosen cell: the method under the cursor, the sort column's metric, best
        examples first; back to the examples."""
        name = self.sort_name
        if self.cursor is None or name is None or self.data.get(self.cursor, name) is None:
            self.notify("no such metric for this method", markup=False)
            return
        best_first = self.data.get(self.cursor, name).higher_is_better
        self.app.list_metric_name = name  # the list's metric column keeps this metric for other methods too
        self.app.view.sort_by_metric(self.cursor, name, best_first)
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)
