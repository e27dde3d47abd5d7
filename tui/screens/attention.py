"""The attention screen (``a``): the current example's per-head attention as a layers × heads grid (bertviz's model
view), each cell a thumbnail of the explained token's row (stores made with ``attr-compute --heads``).

Top to bottom: a line naming the example, the explained token, the model's shape and the scale; the grid (arrows
move the cursor; layers and heads that do not fit scroll with it); two lines with the cursor head's largest weights
and how to read a cell. One example's rows are read on a worker when it is shown (``j``/``k`` step through the list),
so a key's work does not grow with the store; drawing works from memory.
"""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Header, Static

from ..commands import AttentionCommands
from ..data import HeadAttention, read_head_attention
from ..render.drawn import Drawn
from ..render.attention_grid import NORMS, detail_text, geometry, grid_text, info_text, thumbnails
from ..widgets.footer import FittedFooter
from .example_cursor import ExampleCursor
from .head_matrix import open_head_matrix

_DIM = Style(dim=True)
_CURSOR = Binding.Group("head")


class AttentionScreen(ExampleCursor, ModalScreen[None]):
    """One example's heads. Modal: the browse keys do not reach the screen below."""

    COMMANDS = {AttentionCommands}

    BINDINGS = [
        Binding("up", "move(-1, 0)", "head", id="attention.up", group=_CURSOR),
        Binding("down", "move(1, 0)", "head", id="attention.down", group=_CURSOR),
        Binding("left", "move(0, -1)", "head", id="attention.left", group=_CURSOR),
        Binding("right", "move(0, 1)", "head", id="attention.right", group=_CURSOR),
        Binding("j", "example(1)", "example", id="attention.next"),
        Binding("k", "example(-1)", "previous", id="attention.previous", show=False),
        Binding("s", "scale", "scale", id="attention.scale"),
        Binding("enter", "head_matrix", "head matrix", id="attention.matrix", show=False),
        Binding("escape,a,q", "close", "close", id="attention.close"),
    ]

    DEFAULT_CSS = """
    AttentionScreen { background: $background; }
    AttentionScreen #attention-info { height: 1; padding: 0 1; }
    AttentionScreen #attention-grid { height: 1fr; padding: 0 1; }
    AttentionScreen #attention-detail { height: 2; padding: 0 1; }
    """

    def __init__(self, index: int):
        super().__init__()
        self.index = index
        self.data: HeadAttention | None = None  # of self.index, once read
        self.cursor_layer = 0
        self.cursor_head = 0
        self.norm = NORMS[0]
        self.sub_title = "head attention"

    def compose(self) -> ComposeResult:
        yield Header(icon="◆")
        yield Static(Text("reading the heads…", style=_DIM), id="attention-info")
        yield Static(id="attention-grid")
        yield Static(id="attention-detail")
        yield FittedFooter()

    def on_mount(self) -> None:
        self._read(self.index)

    # ---------------------------------------------------------------- worker (the only HDF5 read of this screen)
    @work(thread=True, exclusive=True, group="attention", name="read head attention")
    def _read(self, index: int) -> None:
        app = self.app
        try:
            with app.store_lock:
                data = read_head_attention(app.store, index)
        except Exception as err:
            app.call_from_thread(self.notify, f"could not read the head attention: {err}", severity="error",
                                 markup=False)
            return
        app.call_from_thread(self._loaded, data)

    def _loaded(self, data: HeadAttention) -> None:
        if data.index != self.index:
            return  # a read overtaken by j/k
        self.data = data
        L, H, _ = data.rows.shape
        self.cursor_layer, self.cursor_head = min(self.cursor_layer, L - 1), min(self.cursor_head, H - 1)
        self.sub_title = f"head attention · {L} layers × {H} heads"
        self._draw()

    # ---------------------------------------------------------------- drawing
    def _draw(self) -> None:
        d = self.data
        if d is None:
            return
        L, H, n = d.rows.shape
        grid = self.query_one("#attention-grid", Static)
        width = grid.size.width or self.app.size.width - 2
        height = grid.size.height or max(self.app.size.height - 6, 2)
        geom = geometry(L, H, n, width, height, self.cursor_layer, self.cursor_head)
        cells = thumbnails(d.rows, geom.per, self.norm)
        self.query_one("#attention-info", Static).update(info_text(d.id, d.tokens, d.explain_pos, (L, H), geom,
                                                                   self.norm, width))
        grid.update(Drawn(grid_text(cells, geom, self.cursor_layer, self.cursor_head, self.app.color_mode,
                                     self.app.colormap)))
        self.query_one("#attention-detail", Static).update(
            detail_text(d.rows, d.tokens, d.explain_pos, self.cursor_layer, self.cursor_head, geom, self.norm, width))

    def on_resize(self, event) -> None:
        self.call_after_refresh(self._draw)

    def redraw(self) -> None:
        self._draw()

    # ---------------------------------------------------------------- actions
    def action_move(self, d_layer: int, d_head: int) -> None:
        if self.data is None:
            return
        L, H, _ = self.data.rows.shape
        self.cursor_layer = max(0, min(self.cursor_layer + d_layer, L - 1))
        self.cursor_head = max(0, min(self.cursor_head + d_head, H - 1))
        self._draw()

    def action_scale(self) -> None:
        self.set_scale(NORMS[(NORMS.index(self.norm) + 1) % len(NORMS)])

    def set_scale(self, norm: str) -> None:
        self.norm = norm
        self._draw()

    def show_example(self) -> None:
        self._read(self.index)

    def action_head_matrix(self) -> None:
        """The cursor head's full matrix (screens/head_matrix.py)."""
        open_head_matrix(self.app, self.cursor_layer, self.cursor_head)

    def action_close(self) -> None:
        self.dismiss(None)
