"""The head matrix screen (enter on the heads or the attention screen): one head's full token-to-token attention
matrix, and a grid of every head's matrix as thumbnails (stores made with ``attr-compute --heads --matrices all``).

Two views, ``g`` switches: the head (bertviz's head view as a heatmap: rows are the tokens that attend, columns the
tokens they attend to, every line labelled with its token, the column header with theirs, a colour bar from 0 to
the head's largest weight, a status line with the cursor cell's tokens and value), and the grid (bertviz's model
view: a thumbnail per layer × head, for examples up to render.head_thumbnails.GRID_MAX_TOKENS tokens). ``[ ]``
step the layer, ``, .`` the head, the arrows the cursor (the head's cell, or the head on the grid), ``j k`` the
example.

The head view reads only the head it draws (one n x n block of /heads/attention a redraw); the grid reads the
example's heads once, and the head view then draws from them. Reads run on a worker; a store that keeps no full
matrix per head says in one line how to get them, and the screen does not open.
"""

from __future__ import annotations

import numpy as np
from rich.style import Style
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Header, Static

from ..colors import format_score, normalize_within
from ..data import HeadMatrix, read_head_matrix
from ..render.drawn import Drawn
from ..render.heatmap import block_mean, heatmap_lines
from ..render.head_thumbnails import GRID_MAX_TOKENS, grid_geometry, grid_info, grid_text, thumbnails
from ..render.matrix_axes import header_lines, labelled
from ..render.matrix_axes import geometry as axes_geometry
from ..render.tokens import ColorBar, printable
from ..widgets.footer import FittedFooter
from .example_cursor import ExampleCursor

_DIM = Style(dim=True)
_BOLD = Style(bold=True)
_FIXED_LINES = 5  # the title, info, colour bar, status and footer lines: the rest is the header's and the map's
NO_FULL_HEADS = {
    "none": "this store keeps no per-head attention: run attr-compute with --heads --matrices all",
    "cls": "this store keeps each head's explained row only (--heads with --matrices cls): run attr-compute with "
           "--heads --matrices all for every head's full matrix",
}


def open_head_matrix(app, layer: int = 0, head: int = 0) -> None:
    """Push the screen for the current example at head (``layer``, ``head``), or say in one line why it cannot
    open (no example yet, no full matrix per head in the store)."""
    meta = app.meta
    if meta is None or app.current is None:
        return
    if meta.heads != "all":
        app.notify(NO_FULL_HEADS.get(meta.heads, NO_FULL_HEADS["none"]), markup=False)
        return
    app.push_screen(HeadMatrixScreen(app.current, layer, head))


class HeadMatrixScreen(ExampleCursor, ModalScreen[None]):
    """One head's matrix, or every head's thumbnail. Modal: the browse keys do not reach the screen below."""

    BINDINGS = [
        Binding("left_square_bracket", "layer(-1)", "layer", id="head_matrix.layer.previous"),
        Binding("right_square_bracket", "layer(1)", "layer", id="head_matrix.layer.next", show=False),
        Binding("comma", "head(-1)", "head", id="head_matrix.head.previous", show=False),
        Binding("full_stop", "head(1)", "head", id="head_matrix.head.next"),
        Binding("g", "grid", "grid", id="head_matrix.grid"),
        Binding("enter", "open_head", "head", id="head_matrix.open", show=False),
        Binding("j", "example(1)", "example", id="head_matrix.next"),
        Binding("k", "example(-1)", "previous", id="head_matrix.previous", show=False),
        Binding("up", "move(-1, 0)", "cursor", id="head_matrix.up", show=False),
        Binding("down", "move(1, 0)", "cursor", id="head_matrix.down", show=False),
        Binding("left", "move(0, -1)", "cursor", id="head_matrix.left", show=False),
        Binding("right", "move(0, 1)", "cursor", id="head_matrix.right", show=False),
        Binding("escape,q", "close", "close", id="head_matrix.close"),
    ]

    DEFAULT_CSS = """
    HeadMatrixScreen { background: $background; }
    HeadMatrixScreen #hm-info, HeadMatrixScreen #hm-bar, HeadMatrixScreen #hm-status { height: 1; padding: 0 1; }
    HeadMatrixScreen #hm-cols { height: auto; padding: 0 1; }
    HeadMatrixScreen #hm-map { height: 1fr; padding: 0 1; }
    """

    def __init__(self, index: int, layer: int = 0, head: int = 0):
        super().__init__()
        self.index = index
        self.layer_index, self.head_index = layer, head  # 0-based (Widget.layer is CSS's)
        self.show_grid = False  # the grid of every head (else one head's heatmap)
        self.data: HeadMatrix | None = None  # of (index, layer, head), or the example's every head
        self.pos = (0, 0)  # the head view's cursor: (row, column) token positions, kept across heads and examples
        self.cell = (0, 0)  # the drawn cell that holds it
        self.reads = 0  # reads of the store made (each one example's head, or its every head)
        self.sub_title = "head matrix"

    def compose(self) -> ComposeResult:
        yield Header(icon="◆")
        yield Static(Text("reading the head…", style=_DIM), id="hm-info")
        yield Static(id="hm-bar")
        yield Static(id="hm-cols")
        yield Static(id="hm-map")
        yield Static(id="hm-status")
        yield FittedFooter()

    def on_mount(self) -> None:
        self._need()

    # ---------------------------------------------------------------- reading (the only HDF5 reads of this screen)
    def _has(self) -> bool:
        """Whether what the view draws is in memory: the grid needs every head, the head view its head."""
        d = self.data
        if d is None or d.index != self.index:
            return False
        if d.heads is not None or (self.show_grid and len(d.tokens) > GRID_MAX_TOKENS):
            return True  # every head, or an example too long for the grid (it says so)
        return not self.show_grid and (d.layer, d.head) == (self.layer_index, self.head_index)

    def _need(self) -> None:
        if self._has():
            self._draw()
        else:
            self._read(self.index, self.layer_index, self.head_index, self.show_grid)

    @work(thread=True, exclusive=True, group="head-matrix", name="read head matrix")
    def _read(self, index: int, layer: int, head: int, every: bool) -> None:
        app = self.app
        try:
            with app.store_lock:
                n = int(app.store.index_rows(index, index + 1)["n_tokens"][0])
                data = read_head_matrix(app.store, index, layer, head, every=every and n <= GRID_MAX_TOKENS)
        except Exception as err:
            app.call_from_thread(self.notify, f"could not read the head matrix: {err}", severity="error",
                                 markup=False)
            return
        app.call_from_thread(self._loaded, data)

    def _loaded(self, data: HeadMatrix) -> None:
        if data.index != self.index or (data.heads is None and (data.layer, data.head) != (self.layer_index, self.head_index)):
            return  # overtaken by another key
        self.reads += 1
        self.data = data
        self._draw()

    # ---------------------------------------------------------------- drawing
    def _draw(self) -> None:
        d = self.data
        if d is None or d.index != self.index:
            return
        width = max(self.size.width - 2, 16)
        height = max(self.size.height - _FIXED_LINES, 4)
        L, H = self.app.store.n_layers, self.app.store.n_heads
        self.sub_title = f"head matrix · {L} layers × {H} heads"
        if self.show_grid:
            self._draw_grid(d, L, H, width, height)
        else:
            self._draw_head(d, width, height)

    def _matrix(self, d: HeadMatrix) -> np.ndarray:
        return d.heads[self.layer_index, self.head_index] if d.heads is not None else d.matrix

    def _draw_head(self, d: HeadMatrix, width: int, height: int) -> None:
        app = self.app
        mono = app.color_mode == "mono"
        m = self._matrix(d)
        n = m.shape[0]
        # the strip's line of the matrix screen's layout is the heatmap's here
        geom, labels = axes_geometry(d.tokens, n, n, None, width=width, height=height + 1, mono=mono, views=0)
        cells, _ = block_mean(m, geom.fr, geom.fc)
        scale = normalize_within(cells, False, 0.0, None)
        r = min(self.pos[0] // geom.fr, cells.shape[0] - 1)
        c = min(self.pos[1] // geom.fc, cells.shape[1] - 1)
        self.cell = (r, c)
        info = Text(no_wrap=True, overflow="ellipsis")
        info.append(printable(d.id), _BOLD)
        info.append(f"  layer {self.layer_index + 1}/{app.store.n_layers} · head {self.head_index + 1}/{app.store.n_heads}"
                    f" · {n}×{n}", _DIM)
        if geom.fr > 1 or geom.fc > 1:
            info.append(f" · blocks {geom.fr}×{geom.fc} averaged", _BOLD)
        info.append(" · rows attend to columns", _DIM)
        self.query_one("#hm-info", Static).update(info)
        self.query_one("#hm-bar", Static).update(ColorBar(scale, app.color_mode, glyphs=mono, cmap=app.colormap,
                                                          scope="this head"))
        self.query_one("#hm-cols", Static).display = True
        self.query_one("#hm-bar", Static).display = True
        self.query_one("#hm-cols", Static).update(Text("\n").join(header_lines(d.tokens, n, geom, c)))
        lines = heatmap_lines(scale.values.reshape(cells.shape), app.color_mode, per_line=geom.per_line,
                              cursor=(r, c), cell_width=geom.cw, signed=False, cmap=app.colormap)
        out = labelled(labels, lines, geom.gutter, r * geom.fr)
        self.query_one("#hm-map", Static).update(Drawn(Text("\n").join(out)))
        self.query_one("#hm-status", Static).update(self._status(d.tokens, cells, n, geom))

    def _status(self, tokens: list[str], cells: np.ndarray, n: int, geom) -> Text:
        """The cursor's cell: the attending token and the attended one (1-based positions, ranges for blocks) and
        the weight (a block's mean)."""
        r, c = self.cell
        q0, k0 = r * geom.fr, c * geom.fc
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(f"L{self.layer_index + 1} H{self.head_index + 1}  ", _BOLD)
        t.append(printable(tokens[q0]), _BOLD)
        t.append(f" ({q0 + 1}{'' if geom.fr == 1 else f'-{min(q0 + geom.fr, n)}'}) → ", _DIM)
        t.append(printable(tokens[k0]), _BOLD)
        t.append(f" ({k0 + 1}{'' if geom.fc == 1 else f'-{min(k0 + geom.fc, n)}'})  ", _DIM)
        t.append(format_score(float(cells[r, c])) + ("" if geom.fr == geom.fc == 1 else " (block mean)"))
        return t

    def _draw_grid(self, d: HeadMatrix, L: int, H: int, width: int, height: int) -> None:
        app = self.app
        n = len(d.tokens)
        status = self.query_one("#hm-status", Static)
        self.query_one("#hm-cols", Static).display = False
        self.query_one("#hm-bar", Static).display = False
        if d.heads is None:  # too long for thumbnails: the head view reads one head at a time
            self.query_one("#hm-info", Static).update(Text(f"{printable(d.id)}  {n} tokens", style=_BOLD))
            self.query_one("#hm-map", Static).update(Text(
                f"thumbnails of every head are drawn for examples up to {GRID_MAX_TOKENS} tokens: g shows this "
                "head's matrix", style=_DIM))
            status.update(Text(""))
            return
        geom = grid_geometry(L, H, n, width, height + 1, self.layer_index, self.head_index, mono=app.color_mode == "mono")
        cells = thumbnails(d.heads[:, geom.heads.start:geom.heads.stop], geom.rows, geom.cols)
        full = np.zeros((L, H) + cells.shape[2:])
        full[:, geom.heads.start:geom.heads.stop] = cells
        self.query_one("#hm-info", Static).update(grid_info(d.id, (L, H), n, geom))
        self.query_one("#hm-map", Static).update(Drawn(grid_text(full, geom, self.layer_index, self.head_index,
                                                                  app.color_mode, app.colormap)))
        m = d.heads[self.layer_index, self.head_index].astype(np.float64)
        q, k = np.unravel_index(int(np.argmax(m)), m.shape)
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(f"L{self.layer_index + 1} H{self.head_index + 1}", _BOLD)
        t.append("  largest: ", _DIM)
        t.append(f"{printable(d.tokens[q])} → {printable(d.tokens[k])} {format_score(float(m[q, k]))}", _BOLD)
        t.append("  · enter: this head", _DIM)
        status.update(t)

    def on_resize(self, event) -> None:
        self.call_after_refresh(self._draw)

    def redraw(self) -> None:
        self._draw()

    # ---------------------------------------------------------------- actions
    def _shape(self) -> tuple[int, int]:
        return self.app.store.n_layers, self.app.store.n_heads

    def set_head(self, layer: int, head: int) -> None:
        L, H = self._shape()
        self.layer_index, self.head_index = layer % L, head % H
        self._need()

    def action_layer(self, step: int) -> None:
        self.set_head(self.layer_index + step, self.head_index)

    def action_head(self, step: int) -> None:
        self.set_head(self.layer_index, self.head_index + step)

    def action_grid(self) -> None:
        self.show_grid = not self.show_grid
        self._need()

    def action_open_head(self) -> None:
        if self.show_grid:
            self.action_grid()

    def action_move(self, dr: int, dc: int) -> None:
        if self.show_grid:
            L, H = self._shape()
            self.layer_index = max(0, min(self.layer_index + dr, L - 1))
            self.head_index = max(0, min(self.head_index + dc, H - 1))
            self._draw()
            return
        d = self.data
        if d is None:
            return
        n = len(d.tokens)
        geom_f = self._factors()
        r = max(0, min(self.cell[0] + dr, (n - 1) // geom_f[0]))
        c = max(0, min(self.cell[1] + dc, (n - 1) // geom_f[1]))
        self.pos = (r * geom_f[0], c * geom_f[1])
        self._draw()

    def _factors(self) -> tuple[int, int]:
        """The block factors of the last head view drawn (rows, columns)."""
        d = self.data
        n = len(d.tokens)
        geom, _ = axes_geometry(d.tokens, n, n, None, width=max(self.size.width - 2, 16),
                                height=max(self.size.height - _FIXED_LINES, 4) + 1,
                                mono=self.app.color_mode == "mono", views=0)
        return geom.fr, geom.fc

    def show_example(self) -> None:
        self._need()

    def action_close(self) -> None:
        self.dismiss(None)
