"""attr-tui: browse the token attributions of a store.

:func:`create_app` is the one way to build the app (the CLI and the tests both use it). The app never reads HDF5 on
the UI thread: thread workers read under ``self.store_lock`` and post messages; loaded examples are kept in a small
LRU so stepping through layers and methods re-reads nothing.
"""

from __future__ import annotations

import os
import subprocess
import threading

import numpy as np
import time
from functools import partial

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.message import Message
from textual.worker import get_current_worker

from store import Store, open_store
from store.verify import command as verify_command

from .colors import (COLORMAPS, DEFAULT_COLORMAP, MODES, SCALE_TOKEN_NAMES, Mode, default_scale_tokens, detect_mode,
                     scale_keep)
from .data import LRU, LoadedExample, MetricsData, StoreMeta, read_example, read_meta, read_metrics
from .live import file_state, writer_alive
from .render.metric_table import short_name
from .render.task import list_cells
from .render.tokens import printable
from .screens.browse import BrowseScreen  # the other screens are imported when first opened (a faster start)
from .view import ListView
from .widgets import ExampleList
from .widgets.example_list import BLOCK as ROW_BLOCK
from .widgets.example_list import RowBlock

POLL_SECONDS = 2.0  # how often the app looks at its store's file (one stat; more only when it changed)
# An incomplete store that has not grown for this long is asked whether a process still writes it (live.py): none
# does, or that cannot be told, and it is shown as "incomplete", not "writing".
STALL_SECONDS = 60.0
ALIVE_SECONDS = 10.0  # how often a stalled store asks again (a /proc scan: about 16 ms for 124 processes)
UNMOUNT_LOCK_SECONDS = 1.0  # how long quitting waits for a read in progress before it leaves the file to the exit
CACHE_SIZE = 64
VERIFY_NICE = 10  # the whole-store check's process yields the CPU to the app's


# ---------------------------------------------------------------- messages posted by the workers
class MetaLoaded(Message):
    def __init__(self, meta: StoreMeta):
        super().__init__()
        self.meta = meta


class RowsLoaded(Message):
    """One block of the example list's rows (label, prediction, length, ids), read on a worker."""

    def __init__(self, block: int, rows: RowBlock):
        super().__init__()
        self.block = block
        self.rows = rows


class MetricValuesLoaded(Message):
    """The store's metric names and summaries (each example's values are read with the example); no curves."""

    def __init__(self, data: MetricsData):
        super().__init__()
        self.data = data


class ExampleLoaded(Message):
    def __init__(self, example: LoadedExample):
        super().__init__()
        self.example = example


class StoreRefreshed(Message):
    """The store's header after a poll; ``writer_alive`` (live.writer_alive) when it was asked, ``metrics`` when the
    file changed and its metric records were read again."""

    def __init__(self, meta: StoreMeta, writer_alive: bool | None = None, metrics: MetricsData | None = None):
        super().__init__()
        self.meta = meta
        self.writer_alive = writer_alive
        self.metrics = metrics


class ReadFailed(Message):
    def __init__(self, what: str, error: str):
        super().__init__()
        self.what = what
        self.error = error


class AttrApp(App[int]):
    """The store, the browsing state every screen shares (method, layer, normalisation, the loaded examples, the
    list's view) and the workers that read; the screens (screens/) draw that state and change it."""

    TITLE = "attr-tui"
    CSS = "Footer.-compact FooterLabel { margin: 0 1 0 0; }"  # every screen's footer, on narrow terminals

    # Keys of every screen; each screen adds its own (screens/*.py BINDINGS) and its palette commands (COMMANDS).
    BINDINGS = [
        Binding("h", "heads", "heads", id="heads"),
        Binding("f", "metrics", "metrics", id="metrics"),
        Binding("question_mark", "help", "help", id="help"),
        Binding("q", "quit", "quit", id="quit"),
        # Ctrl-C quits as in every terminal program (Textual's own only says to press Ctrl-Q), wherever the focus is
        Binding("ctrl+c", "quit", "quit", id="quit.ctrl_c", show=False, priority=True),
    ]

    def __init__(self, store: Store, *, color_mode: Mode | None = None, poll_seconds: float = POLL_SECONDS,
                 owns_store: bool = False, colormap: str = DEFAULT_COLORMAP, verify_store: bool = False):
        super().__init__()
        self.store = store
        self.verify_store = verify_store  # read the whole store in a child process (attr-tui: a store too large to
        # check before the app starts)
        self.verify_process: subprocess.Popen | None = None
        self._quitting = False
        self.store_lock = threading.Lock()
        self.owns_store = owns_store
        self.poll_seconds = poll_seconds
        self.color_mode: Mode = color_mode or detect_mode(self.no_color, self.console.color_system)
        self.glyphs = self.color_mode == "mono"
        if self.color_mode == "16":
            # ANSI colours go to the terminal as they are: converted to RGB and mapped back to 16 colours, the ramps
            # collapsed to three steps a side and red came out as magenta
            self.ansi_color = True
        self.meta: StoreMeta | None = None
        self.cache = LRU(CACHE_SIZE)
        self.method_index = 0
        self.layer: int | None = None  # None: the method's final scores
        self.current: int | None = None
        self.token: int | None = None  # the browse screen's token cursor (None: none; another example clears it)
        self.step = 0  # a generation store's step cursor: the generated token explained (kept across examples, clamped)
        self.metrics_cache: tuple | None = None  # the metrics screen's full read, per state of the store
        self.compare_methods: list[str] | None = None  # the compare screen's choice, kept across examples
        self.view = ListView(self)  # sort, filter and search of the example list
        self.norm = "view"  # colour normalisation: screens.browse.NORMALISATIONS
        self.show_strip = True  # the browse screen's layer strip
        self.colormap = colormap  # colors.COLORMAPS
        self.list_metric_name: str | None = None  # the example list's metric column (its method: the current one)
        self.global_scales: dict[str, dict] = {}  # method -> store-wide scale statistics (read once)
        self.scale_tokens: dict[str, str] = {}  # method -> the tokens that set its colour scale (colors.SCALE_TOKENS)
        self.metrics = MetricsData()  # per-example metric values for the method bar (read after the header)
        self._poll_timer = None
        self._file_state = None  # live.file_state of the store when it was last read
        self.store_generation = 0  # counts the changes of the store's file seen (the metrics screen reads again)
        self._writer_alive: bool | None = None  # live.writer_alive, asked once the store stopped growing
        self._alive_asked = -ALIVE_SECONDS  # when it was last asked (monotonic)
        self._last_growth = time.monotonic()
        self._last_error: tuple[str, float] = ("", 0.0)

    # ---------------------------------------------------------------- screens
    def get_default_screen(self) -> BrowseScreen:
        return BrowseScreen()

    @property
    def browse(self) -> BrowseScreen:
        return self.screen_stack[0]

    def start(self) -> None:
        """Called by the browse screen once its widgets exist: read the store's header (then the rows shown)."""
        self.sub_title = "loading…"
        for note in getattr(self.store, "warnings", ()):  # e.g. a newer minor format: parts of it are not shown
            self.notify(note, title="store format", severity="warning", timeout=12, markup=False)
        self._read_header()
        if self.verify_store:
            self.run_worker(self._verify, thread=True, group="verify", name="verify store")

    def _verify(self) -> None:
        """The whole-store check in a process of its own (store/verify.py main), waited for on this worker: in the
        app's process its reads held the store's and HDF5's locks and the GIL between the app's reads (next example on
        the 100k benchmark store 400 ms against the 1k store's 150, under load), and quitting waited for it."""
        try:
            proc = self.verify_process = subprocess.Popen(
                verify_command(self.store.path, VERIFY_NICE), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, text=True, errors="replace")
        except OSError as err:
            self.post_message(ReadFailed("the whole store", f"the check could not start: {err.strerror or err}"))
            return
        if self._quitting:  # the app ended while the child started (on_unmount found no process to stop)
            proc.kill()
        out, _ = proc.communicate()
        if proc.returncode and not self._quitting:
            lines = out.strip().splitlines()
            self.post_message(ReadFailed("the whole store", lines[-1] if lines else
                                         f"the check ended with status {proc.returncode}"))

    def on_unmount(self) -> None:
        self._quitting = True
        proc = self.verify_process
        if proc is not None and proc.poll() is None:
            proc.kill()  # a check still running ends with the app
        # A read stuck in HDF5 holds the lock: quitting does not wait for it (the process exit closes the file).
        if self.owns_store and self.store_lock.acquire(timeout=UNMOUNT_LOCK_SECONDS):
            try:
                self.store.close()
            finally:
                self.store_lock.release()

    # ---------------------------------------------------------------- state
    @property
    def method(self):
        return self.meta.methods[self.method_index] if self.meta and self.meta.methods else None

    def _alive(self) -> bool:
        """False once the app is shutting down: a worker's late message then finds no widgets and is dropped."""
        try:
            return bool(self.is_running and self.screen_stack and self.screen_stack[0].query("#examples"))
        except Exception:  # noqa: BLE001 - no screen left to ask
            return False

    @property
    def example_list(self) -> ExampleList:
        return self.browse.query_one(ExampleList)

    def _set_subtitle(self) -> None:
        meta, n = self.meta, self.example_list.row_count
        if meta is None:
            return
        what = f"{n} example{'s' if n != 1 else ''}"
        if meta.complete:
            state = what
        elif time.monotonic() - self._last_growth > STALL_SECONDS and self._writer_alive is not True:
            state = f"{what}, incomplete"  # a killed run (attr-compute --resume finishes it)
        else:
            state = f"writing… {what}"
        # the state first: a long model path is what the header cuts off on a narrow terminal; the task (when the
        # model is not a classifier) before the model
        task = [meta.task] if meta.task != "classification" else []
        self.sub_title = " · ".join([state, *task, printable(meta.model)] if meta.model else [state, *task])

    # ---------------------------------------------------------------- workers (HDF5 reads happen only here)
    @work(thread=True, group="meta", name="read store header")
    def _read_header(self) -> None:
        self._file_state = file_state(self.store.path)  # before the read: a change during it is seen at the next poll
        try:
            with self.store_lock:
                meta = read_meta(self.store)
        except Exception as err:  # a damaged store: say so, keep the UI alive
            self.post_message(ReadFailed("the store header", str(err)))
            return
        try:
            with self.store_lock:
                metrics, _ = read_metrics(self.store, curves=False)
        except Exception as err:  # the examples stay browsable without them
            self.post_message(MetaLoaded(meta))
            self.post_message(ReadFailed("the metrics", str(err)))
            return
        # The first example with the header, posted before it: the list's first highlight then draws it from the
        # cache in the frame that draws the list (its own read waited for the header's trip through the UI).
        first = None
        if meta.n:
            try:
                with self.store_lock:
                    first = read_example(self.store, 0, tuple(m.name for m in meta.methods), metrics.keys())
            except Exception:  # noqa: BLE001 - the highlight reads it again and says what failed
                first = None
        self.post_message(MetaLoaded(meta))
        if metrics.names:
            self.post_message(MetricValuesLoaded(metrics))
        if first is not None:
            self.post_message(ExampleLoaded(first))

    def _load(self, index: int) -> None:
        self.run_worker(partial(self._read_examples, [index] + self._neighbours(index)), thread=True,
                        exclusive=True, group="example", name=f"read example {index}")

    def _neighbours(self, index: int) -> list[int]:
        """The examples next to ``index`` in the list's order, both ways, that are not read yet (read ahead)."""
        lst = self.example_list
        out = []
        for step in (1, -1, 2, -2):
            i = lst.step_row(index, step)
            if i != index and i not in self.cache and i not in out:
                out.append(i)
        return out

    def _prefetch(self, index: int) -> None:
        todo = self._neighbours(index)
        if todo:
            self.run_worker(partial(self._read_examples, todo, report_first=False), thread=True, exclusive=True,
                            group="prefetch", name=f"read ahead of {index}")

    def on_example_list_need_rows(self, message: ExampleList.NeedRows) -> None:
        self.run_worker(partial(self._read_rows, message.block, self.example_list.metric_key), thread=True,
                        group=f"rows {message.block}",
                        name=f"read rows of block {message.block}")

    def _read_rows(self, block: int, metric: tuple[str, str] | None) -> None:
        lo = block * ROW_BLOCK
        try:
            with self.store_lock:
                rows = self.store.index_rows(lo, lo + ROW_BLOCK)
                ids = self.store.ids_range(lo, lo + len(rows))
                values = None if metric is None else np.asarray(self.store.metric_values(*metric, lo, lo + len(rows)),
                                                                np.float64)
        except Exception as err:
            self.post_message(ReadFailed(f"examples {lo + 1}-{lo + ROW_BLOCK}", str(err)))
            return
        task = self.meta.task if self.meta is not None else "classification"
        cells = list_cells(task, rows) if task != "classification" else None
        self.post_message(RowsLoaded(block, RowBlock(np.array(rows["label"]), np.array(rows["pred"]),
                                                     np.array(rows["n_tokens"]), ids, metric, values, cells)))

    def _read_examples(self, indices: list[int], report_first: bool = True) -> None:
        worker = get_current_worker()
        methods = tuple(m.name for m in self.meta.methods)
        keys = self.metrics.keys()
        for k, i in enumerate(indices):
            if k and worker.is_cancelled:
                return
            try:
                with self.store_lock:
                    ex = read_example(self.store, i, methods, keys)
            except Exception as err:
                if k == 0 and report_first:
                    self.post_message(ReadFailed(f"example {i + 1}", str(err)))
                return
            self.post_message(ExampleLoaded(ex))

    def _poll(self) -> None:
        self.run_worker(self._refresh_store, thread=True, exclusive=True, group="refresh", name="refresh store")

    def _refresh_store(self) -> None:
        """A poll: one stat of the file; when it changed, the header again (the new rows are read when they are
        shown) and, for a complete store, its metric names and summaries (attr-compute eval adds them). The cost of a
        poll does not grow with the store."""
        state = file_state(self.store.path)
        changed = state != self._file_state
        stalled = time.monotonic() - self._last_growth > STALL_SECONDS
        if not changed and (self.meta is None or self.meta.complete or not stalled):
            return
        metrics = None
        try:
            with self.store_lock:
                self.store.refresh(reopen=changed)
                meta = read_meta(self.store)
                if changed and meta.complete:
                    metrics, _ = read_metrics(self.store, curves=False)
        except Exception as err:
            self.post_message(ReadFailed("new examples", str(err)))
            return
        self._file_state = state
        alive = None
        if stalled and not meta.complete:
            alive = self._writer_alive
            if time.monotonic() - self._alive_asked >= ALIVE_SECONDS:
                self._alive_asked = time.monotonic()
                alive = writer_alive(self.store.path)
        self.post_message(StoreRefreshed(meta, alive, metrics))

    # ---------------------------------------------------------------- messages from the workers
    def on_meta_loaded(self, message: MetaLoaded) -> None:
        if not self._alive():
            return
        self.meta = message.meta
        self.title = f"attr-tui · {printable(self.meta.name)}"
        self.example_list.set_size(self.meta.n, self.meta.labels, self.meta.task)
        self._set_subtitle()
        self.refresh_bindings()
        if self._poll_timer is None:  # a complete store too: eval may add metrics to it while it is open
            self._poll_timer = self.set_interval(self.poll_seconds, self._poll, name="poll store")
        if not self.meta.n:
            self._show_empty()

    def on_rows_loaded(self, message: RowsLoaded) -> None:
        if not self._alive():
            return
        self.example_list.put_block(message.block, message.rows)

    def on_store_refreshed(self, message: StoreRefreshed) -> None:
        if not self._alive():
            return
        old = self.meta
        self.meta = message.meta
        self._writer_alive = message.writer_alive
        if old is None or message.meta.n != old.n:
            self._last_growth = time.monotonic()
            self.example_list.set_size(message.meta.n, message.meta.labels, message.meta.task)
            self._render_current()  # the detail header's "i/N" follows the growing store
        self._set_subtitle()
        if message.metrics is not None and self._metric_state(message.metrics) != self._metric_state(self.metrics):
            self.store_generation += 1
            self.on_metric_values_loaded(MetricValuesLoaded(message.metrics))
            screen = self._metrics_screen_shown()
            if screen is not None:
                screen.on_screen_resume()  # it reads them again (its key counts the store's changes)

    @staticmethod
    def _metric_state(data: MetricsData) -> tuple:
        """What tells two reads of the metric records apart: names and summaries (a metric computed again)."""
        return tuple((m, n, tuple(sorted((k, str(v)) for k, v in info.summary.items())))
                     for m, row in (data.table or {}).items() for n, info in row.items())

    def on_metric_values_loaded(self, message: MetricValuesLoaded) -> None:
        if not self._alive():
            return
        self.metrics = message.data
        self.sync_list_metric()
        # examples read before the metric names were known lack their values: read the current one again
        self.cache.clear()
        if self.current is not None:
            self._load(self.current)

    def on_example_loaded(self, message: ExampleLoaded) -> None:
        if not self._alive():
            return
        self.cache.put(message.example.index, message.example)
        if message.example.index == self.current:
            self._render_current()
            screen = self._metrics_screen_shown()
            if screen is not None:  # its line of the example's values, now read
                screen.show_example_values()

    def on_read_failed(self, message: ReadFailed) -> None:
        if not self._alive():
            return
        text = f"could not read {message.what}: {message.error}"
        if text != self._last_error[0] or time.monotonic() - self._last_error[1] > 30:
            self.notify(text, severity="error", timeout=8, markup=False)  # once, not at every poll
            self._last_error = (text, time.monotonic())
        if self.meta is None:
            self.browse.show_message(f"could not read {message.what}")

    def on_example_list_highlighted(self, message: ExampleList.Highlighted) -> None:
        if not self._alive():  # a highlight posted while the app quits finds no screen
            return
        if message.index != self.current:
            self.token = None
        self.current = message.index
        self.browse.query_one("#tokens").scroll_home(animate=False)
        screen = self._metrics_screen_shown()
        if screen is not None:  # its line of the current example's values follows
            screen.show_example_values()
        if self.meta is None:
            return
        if message.index in self.cache:
            self._render_current()
            self._prefetch(message.index)
        else:
            self._load(message.index)

    # ---------------------------------------------------------------- drawing (the browse screen's)
    def _show_empty(self) -> None:
        self.browse.show_message("no examples yet" + ("" if self.meta.complete else " (writing…)"), "")

    def _render_current(self) -> None:
        self.browse.draw()

    def example(self, index: int | None) -> LoadedExample | None:
        """Example ``index`` as the screens show it, when it is read: in a generation store at the step cursor."""
        ex = self.cache.get(index) if index is not None else None
        return None if ex is None else ex.at_step(self.step)

    def set_step(self, step: int) -> None:
        """The step cursor to generated token ``step`` (clamped to the current example's); every screen follows."""
        ex = self.cache.get(self.current) if self.current is not None else None
        if ex is None or ex.steps is None or not ex.steps.n:  # no steps here: the cursor stays for the next example
            return
        self.step = min(max(step, 0), ex.steps.n - 1)
        self.token = None
        for screen in self.screen_stack:
            redraw = getattr(screen, "redraw", None)
            if redraw is not None:
                redraw()

    def read_global_scale(self, method: str) -> None:
        self._read_global_scale(method)

    @work(thread=True, group="global scale", name="global scale")
    def _read_global_scale(self, method: str) -> None:
        """The store's scale statistics of a method: the writer's, or one pass computed here (then kept)."""
        try:
            with self.store_lock:
                stats = self.store.scale_stats(method, compute=True)
        except Exception as err:
            self.post_message(ReadFailed(f"the global scale of {method}", str(err)))
            return
        self.call_from_thread(self._global_scale_read, method, stats)

    def _global_scale_read(self, method: str, stats) -> None:
        self.global_scales[method] = stats
        self._render_current()

    # ---------------------------------------------------------------- state changes and screens
    def set_colormap(self, name: str) -> None:
        """Colour every screen (and the exported figures) with colormap ``name`` (colors.COLORMAPS)."""
        self.colormap = name
        self.notify(f"colormap: {name} ({COLORMAPS[name].description})", timeout=3, markup=False)
        for screen in self.screen_stack:
            redraw = getattr(screen, "redraw", None)
            if redraw is not None:
                redraw()

    def scale_tokens_of(self, method: str, ex: LoadedExample) -> str:
        """The tokens that set ``method``'s colour scale on ``ex``: as chosen (t, kept for the session), else the rule
        every face follows for this example (palette.default_scale_tokens: the figures and notebooks read alike)."""
        return self.scale_tokens.get(method) or default_scale_tokens(ex.scores[method], ex.content)

    def scale_keep(self, ex: LoadedExample, methods: list[str]) -> dict[str, np.ndarray | None]:
        """The tokens that set each method's colour scale on ``ex`` (None: all), for render.compare.scales."""
        return {m: scale_keep(ex.scores[m], ex.content, self.scale_tokens.get(m)) for m in methods}

    def set_scale_tokens(self, method: str, tokens: str) -> None:
        self.scale_tokens[method] = tokens
        self.notify(f"scale of {printable(method)}: {SCALE_TOKEN_NAMES[tokens]}", timeout=3, markup=False)
        for screen in self.screen_stack:
            redraw = getattr(screen, "redraw", None)
            if redraw is not None:
                redraw()

    def set_layer(self, layer: int | None) -> None:
        """Show layer view ``layer`` (0-based) of the current method, or its final scores (None)."""
        self.layer = layer
        self._render_current()

    def list_metric(self) -> tuple[str, str] | None:
        """The list's metric column: the metric the list is sorted by, else the current method's metric last
        chosen (the metrics screen's enter), else its first; None when the method has none."""
        if self.view.metric is not None:
            return self.view.metric
        info = self.method
        names = [m.name for m in self.metrics.of(info.name)] if info is not None else []
        if not names:
            return None
        return info.name, self.list_metric_name if self.list_metric_name in names else names[0]

    def sync_list_metric(self) -> None:
        lst = self.example_list
        if self.view.column and self.view.key is not None:  # the sort key itself (1-ρ), not a stored metric
            lst.set_metric(None, "")
            lst.set_key_column(self.view.key, self.view.column)
            return
        lst.set_key_column(None, "")
        key = self.list_metric()
        lst.set_metric(key, short_name(key[1]) if key else "")

    def set_method(self, index: int) -> None:
        if self.meta is None or not self.meta.methods:
            return
        self.method_index = index % len(self.meta.methods)
        self.sync_list_metric()
        self.refresh_bindings()
        self._render_current()

    # A note belongs to the screen it was said on: Textual shows the app's notes on every screen, so a screen opened
    # or closed clears them (a stale "scale: ..." over the help screen, an export's file names back on browse).
    def push_screen(self, *args, **kwargs):
        self.clear_notifications()
        return super().push_screen(*args, **kwargs)

    def pop_screen(self):
        self.clear_notifications()
        return super().pop_screen()

    def switch_screen(self, screen):
        self.clear_notifications()
        return super().switch_screen(screen)

    def _metrics_screen_shown(self):
        """The metrics screen when it is the one shown, else None (without importing it: it may never be opened)."""
        if self.is_screen_installed("metrics") and self.screen is self.get_screen("metrics"):
            return self.screen
        return None

    def action_help(self) -> None:
        from .screens.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.color_mode, self.colormap,
                                        generation=self.meta is not None and self.meta.generation))

    def action_heads(self) -> None:
        """The heads screen: the store's head masks (it reads them itself, on a worker)."""
        from .screens.heads import HeadsScreen

        if not isinstance(self.screen, HeadsScreen):
            self.push_screen(HeadsScreen(self.color_mode))

    def action_attention(self) -> None:
        """The attention screen: the current example's per-head attention (it reads it itself, on a worker); a
        store without per-head attention says so in one line and reads nothing."""
        from .screens.attention import AttentionScreen

        if self.meta is None or self.current is None or isinstance(self.screen, AttentionScreen):
            return
        if self.meta.heads == "none":
            self.notify("this store keeps no per-head attention: run attr-compute with --heads", markup=False)
            return
        self.push_screen(AttentionScreen(self.current))

    def compare_set(self) -> list[str]:
        """The methods the compare screen shows: the chosen ones, else the current method and the next three."""
        names = [m.name for m in self.meta.methods] if self.meta else []
        chosen = [m for m in (self.compare_methods or []) if m in names]
        if len(chosen) >= 2:
            return chosen
        first = self.method.name if self.method is not None else (names[0] if names else None)
        return ([first] if first else []) + [m for m in names if m != first][:3]

    def set_compare_set(self, methods: list[str]) -> None:
        """Choose the compare screen's methods (2 to 6; kept across examples and used by the export)."""
        self.compare_methods = list(methods)[:6]
        self.notify("compare: " + ", ".join(printable(m) for m in self.compare_methods), timeout=3, markup=False)
        from .screens.compare import CompareScreen

        if isinstance(self.screen, CompareScreen):
            self.screen.set_methods(self.compare_methods)

    def action_compare(self) -> None:
        """The compare screen: the compare set side by side for the current example."""
        from .screens.compare import CompareScreen

        if self.meta is None or self.current is None or isinstance(self.screen, CompareScreen):
            return
        if len(self.meta.methods) < 2:
            self.notify("this store has one method: nothing to compare", markup=False)
            return
        self.push_screen(CompareScreen(self.compare_set(), self.current))

    def action_generation(self) -> None:
        """The generation screen: the current example's whole generation, target x source, in the current method."""
        from .screens.generation import GenerationScreen

        if self.meta is None or self.current is None or isinstance(self.screen, GenerationScreen):
            return
        if not self.meta.generation:
            self.notify("this store explains no generation: run attr-compute with --task generate", markup=False)
            return
        self.push_screen(GenerationScreen(self.method.name, self.current, self.layer))

    def action_matrix(self) -> None:
        """The matrix screen: the current method's token-to-token matrix (or the first method that has one)."""
        from .screens.matrix import MatrixScreen

        if self.meta is None or self.current is None or isinstance(self.screen, MatrixScreen):
            return
        with_matrices = [m.name for m in self.meta.methods if m.matrices != "none"]
        if not with_matrices:
            self.notify("no method in this store keeps matrices: run attr-compute with --matrices all (or cls)",
                        markup=False)
            return
        current = self.method.name if self.method is not None and self.method.name in with_matrices else with_matrices[0]
        self.push_screen(MatrixScreen(with_matrices, current, self.current, self.layer or 0))

    def export_figure(self, ex: LoadedExample, methods: list[str], *, shared: bool = False) -> list[str] | None:
        """Write ``ex`` with ``methods`` (one line each, final scores) as an SVG, LaTeX and HTML figure into the export
        directory; the paths are shown in a notification. Returns them (None when writing failed)."""
        from .render.compare import scales
        from .export import Figure, export_directory, figure_stem, write_figure

        signed = {m.name: m.signed for m in self.meta.methods}
        methods = [m for m in methods if m in ex.scores]
        sc = {m: ex.cut(v) for m, v in scales({m: ex.scores[m] for m in methods}, signed, shared,
                                               self.scale_keep(ex, methods)).items()}
        note = f"{self.meta.name} · {'shared scale' if shared else 'scale per method'}"
        if ex.step >= 0:  # a generation store: which generated token the figure explains
            note += f" · step {ex.step + 1}/{ex.steps.n}: {ex.tokens[ex.explain_pos]}"
        fig = Figure(ex.id, ex.tokens, [(m, sc[m]) for m in methods], ex.explain_pos, note, self.colormap)
        directory = export_directory(getattr(self.store, "path", None))
        stem = figure_stem(self.meta.name, ex.id, methods, shared=shared, step=ex.step)
        try:
            paths = write_figure(fig, directory, stem)
        except OSError as err:
            self.notify(f"could not write the figure in {directory}: {err.strerror or err}", severity="error",
                        markup=False)
            return None
        self.notify("figure written: " + ", ".join(paths), title="export", timeout=10, markup=False)
        return paths

    def action_export(self) -> None:
        """Export the current example with the compare set (or the current method) as a paper figure."""
        ex = self.example(self.current)
        if ex is None or self.meta is None or not self.meta.methods:
            return
        methods = self.compare_methods or [self.method.name]
        self.export_figure(ex, methods)

    def deliver_screenshot(self, filename=None, path=None, time_format=None):
        """Screenshots go to the export directory (Textual's default, ~/Downloads, is often missing over SSH)."""
        from .export import export_directory

        return super().deliver_screenshot(filename, path or export_directory(getattr(self.store, "path", None)),
                                          time_format)

    def action_metrics(self) -> None:
        """The metrics screen: methods × faithfulness metrics (it reads them itself, on a worker)."""
        if self._metrics_screen_shown() is not None:
            return
        from .screens.metrics import MetricsScreen

        # One screen for the app's life (installed, so closing it keeps it): opening it again builds nothing and
        # reads nothing unless the store changed; its sort and cursor stay as the user left them.
        if not self.is_screen_installed("metrics"):
            self.install_screen(MetricsScreen(self.color_mode), "metrics")
        self.push_screen("metrics")


def create_app(path_or_store: str | os.PathLike | Store, *, color_mode: str | None = None,
               poll_seconds: float = POLL_SECONDS, colormap: str = DEFAULT_COLORMAP,
               verify_store: bool = False) -> AttrApp:
    """Build the browser for a store (a path is opened here and closed when the app ends).

    ``color_mode``: None/"auto" detects it from the environment (NO_COLOR, COLORTERM, TERM) the way rich does;
    "truecolor", "256", "16" or "mono" force one. ``colormap``: a name of colors.COLORMAPS. Raises
    :class:`store.StoreError` for a path that is no store.
    """
    if colormap not in COLORMAPS:
        raise ValueError(f"unknown colormap '{colormap}': use one of {', '.join(COLORMAPS)}")
    owns = not isinstance(path_or_store, Store)
    store = open_store(path_or_store) if owns else path_or_store
    mode = None if color_mode in (None, "auto") else color_mode
    if mode is not None and mode not in MODES:
        raise ValueError(f"unknown colour mode '{color_mode}': use auto or one of {', '.join(MODES)}")
    return AttrApp(store, color_mode=mode, poll_seconds=poll_seconds, owns_store=owns, colormap=colormap,
                   verify_store=verify_store)
