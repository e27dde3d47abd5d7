"""The heads screen (``h``): the store's head masks (Mask-LRP) as a layers × heads grid, with per-head statistics.

Layout, top to bottom: the mask selector with every mask's count of selected heads (``m``/``M`` cycle), a legend,
then the grid (rows are layers 1..L, columns heads 1..H; the arrows move the cursor) beside a panel with everything
every mask knows about the head under the cursor and the current mask's settings. A store without head masks shows
one line saying how to get them.

The masks are read once, when the screen opens, by a thread worker under the app's store lock (they are a few
kilobytes); the worker posts :class:`HeadsLoaded` and the screen draws from memory from then on.
"""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Header, Static

from ..colors import Mode
from ..commands import HeadsCommands
from ..data import HeadMaskInfo, read_for_screen, read_head_masks
from ..render.head_grid import EMPTY_MESSAGE, detail_text, legend_text, settings_text, tabs_text
from ..widgets.footer import FittedFooter
from ..widgets.head_grid import HeadGrid
from .head_matrix import open_head_matrix

_HEADS = Binding.Group("head")


class HeadsLoaded(Message):
    def __init__(self, masks: tuple[HeadMaskInfo, ...], problems: list[str]):
        super().__init__()
        self.masks = masks
        self.problems = problems


class HeadsFailed(Message):
    def __init__(self, error: str):
        super().__init__()
        self.error = error


class HeadsScreen(ModalScreen[None]):
    """Head masks of the store. Modal: the browse keys ([ ] j k ...) do not reach the screen below."""

    COMMANDS = {HeadsCommands}

    BINDINGS = [
        Binding("m", "next_mask", "mask", id="heads.mask.next"),
        Binding("M", "prev_mask", "previous mask", id="heads.mask.previous", show=False),
        Binding("up", "move(-1, 0)", "head", id="heads.up", group=_HEADS),
        Binding("down", "move(1, 0)", "head", id="heads.down", group=_HEADS),
        Binding("left", "move(0, -1)", "head", id="heads.left", group=_HEADS),
        Binding("right", "move(0, 1)", "head", id="heads.right", group=_HEADS),
        Binding("home", "first_layer", "first layer", id="heads.first", show=False),
        Binding("end", "last_layer", "last layer", id="heads.last", show=False),
        Binding("enter", "head_matrix", "head matrix", id="heads.matrix", show=False),
        Binding("escape,h,q", "close", "close", id="heads.close"),
        # ctrl+p is the app's (a priority binding, so it works here); this one only shows it in the footer.
        Binding("ctrl+p", "app.command_palette", "palette", show=False),
    ]

    DEFAULT_CSS = """
    HeadsScreen { background: $background; align: left top; }
    HeadsScreen #heads-tabs { height: 1; padding: 0 1; }
    HeadsScreen #heads-legend { height: 1; padding: 0 1; }
    HeadsScreen #heads-body { height: 1fr; }
    HeadsScreen #heads-side {
        width: 1fr; border-left: vkey $primary 40%; padding: 0 0 0 1; scrollbar-size-vertical: 1;
    }
    HeadsScreen #heads-detail, HeadsScreen #heads-settings { width: 100%; }
    HeadsScreen #heads-settings { margin: 1 0 0 0; }
    """

    def __init__(self, mode: Mode):
        super().__init__()
        self.mode = mode
        self.masks: tuple[HeadMaskInfo, ...] | None = None  # None until the worker reports
        self.current = 0
        self.cursor_layer = 0
        self.cursor_head = 0
        self.sub_title = "head masks"

    # ---------------------------------------------------------------- layout
    def compose(self) -> ComposeResult:
        yield Header(icon="◆")
        yield Static(Text("reading the head masks…", style=Style(dim=True)), id="heads-tabs")
        yield Static(id="heads-legend")
        with Horizontal(id="heads-body"):
            yield HeadGrid(self.mode, id="heads-grid")
            with VerticalScroll(id="heads-side", can_focus=False):
                yield Static(id="heads-detail")
                yield Static(id="heads-settings")
        yield FittedFooter()

    def on_mount(self) -> None:
        self.query_one("#heads-body").display = False
        self.query_one("#heads-legend").display = False
        self.run_worker(self._read_masks, thread=True, exclusive=True, group="heads", name="read head masks")

    # ---------------------------------------------------------------- worker (the only HDF5 read of this screen)
    def _read_masks(self) -> None:
        read_for_screen(self, read_head_masks, HeadsLoaded, HeadsFailed)

    def on_heads_loaded(self, message: HeadsLoaded) -> None:
        self.masks = message.masks
        for problem in message.problems:
            self.notify(problem, severity="warning", timeout=8, markup=False)
        if not self.masks:
            self._show_message(EMPTY_MESSAGE)
            return
        n_layers, n_heads = self.masks[0].shape
        self.sub_title = f"head masks · {n_layers} layers × {n_heads} heads"
        self.query_one("#heads-body").display = True
        self.query_one("#heads-legend").display = True
        self.refresh_bindings()
        self._draw()

    def on_heads_failed(self, message: HeadsFailed) -> None:
        self.masks = ()
        self.notify(f"could not read the head masks: {message.error}", severity="error", timeout=8, markup=False)
        self._show_message("could not read the head masks (see the notification)")

    def _show_message(self, message: str) -> None:
        self.query_one("#heads-tabs", Static).update(Text(message, style=Style(dim=True)))
        self.query_one("#heads-body").display = False
        self.query_one("#heads-legend").display = False
        self.refresh_bindings()

    # ---------------------------------------------------------------- drawing
    @property
    def info(self) -> HeadMaskInfo | None:
        return self.masks[self.current] if self.masks else None

    def _draw(self) -> None:
        info = self.info
        if info is None:
            return
        n_layers, n_heads = info.shape
        self.cursor_layer = max(0, min(self.cursor_layer, n_layers - 1))
        self.cursor_head = max(0, min(self.cursor_head, n_heads - 1))
        self.query_one("#heads-tabs", Static).update(tabs_text(self.masks, self.current))
        self.query_one(HeadGrid).show(self.masks, self.current, self.cursor_layer, self.cursor_head)
        self._draw_detail()
        self.query_one("#heads-settings", Static).update(settings_text(info))

    def _draw_detail(self) -> None:
        text = detail_text(self.masks, self.cursor_layer, self.cursor_head, self.mode)
        self.query_one("#heads-detail", Static).update(text)

    def on_head_grid_format_changed(self, message: HeadGrid.FormatChanged) -> None:
        info = self.info
        if info is not None:
            self.query_one("#heads-legend", Static).update(legend_text(info, message.fmt, message.formats, self.mode))

    def on_head_grid_clicked(self, message: HeadGrid.Clicked) -> None:
        self.move_to(message.layer, message.head)

    # ---------------------------------------------------------------- actions
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Mask and cursor keys: hidden from the footer when the store has no masks, greyed while loading."""
        if action in ("next_mask", "prev_mask", "move", "first_layer", "last_layer"):
            if self.masks is not None and not self.masks:
                return False
            enough = 1 if action in ("next_mask", "prev_mask") else 0
            return True if self.masks is not None and len(self.masks) > enough else None
        return True

    def set_mask(self, index: int) -> None:
        """Show mask ``index`` (wraps around); the cursor stays on its head."""
        if not self.masks:
            return
        self.current = index % len(self.masks)
        self._draw()

    def move_to(self, layer: int, head: int) -> None:
        info = self.info
        if info is None:
            return
        n_layers, n_heads = info.shape
        self.cursor_layer = max(0, min(layer, n_layers - 1))
        self.cursor_head = max(0, min(head, n_heads - 1))
        self.query_one(HeadGrid).show(self.masks, self.current, self.cursor_layer, self.cursor_head)
        self._draw_detail()

    def action_next_mask(self) -> None:
        self.set_mask(self.current + 1)

    def action_prev_mask(self) -> None:
        self.set_mask(self.current - 1)

    def action_move(self, d_layer: int, d_head: int) -> None:
        self.move_to(self.cursor_layer + d_layer, self.cursor_head + d_head)

    def action_first_layer(self) -> None:
        self.move_to(0, self.cursor_head)

    def action_last_layer(self) -> None:
        info = self.info
        if info is not None:
            self.move_to(info.shape[0] - 1, self.cursor_head)

    def action_head_matrix(self) -> None:
        """The current example's matrix of the head under the cursor (screens/head_matrix.py)."""
        open_head_matrix(self.app, self.cursor_layer, self.cursor_head)

    def action_close(self) -> None:
        self.dismiss(None)
