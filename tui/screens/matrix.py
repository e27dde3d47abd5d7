"""The matrix screen (``x``): the current example's token-to-token matrix of one layer, and its layer strip.

Top to bottom: a line naming the example, method, layer, size, block factor and normalisation; the layer strip under
a line saying what it shows (one line per layer view of the method, one coloured cell per token, the current layer
marked ▶); the colour bar, which says what the heatmap shows (that layer's own matrix, not rolled out); the column header
(each column's token written top to bottom, a position ruler over it when the columns are one cell wide); the heatmap
(rows: the token that receives, columns: the token it takes from); a status line with the cursor's row and column
tokens, positions and value. Every heatmap line is labelled in the gutter left of it: while the rows fit, one row a
line (full cells) named by its token; else two rows a line (half blocks, "upper/lower"), averaged over blocks when
even that does not fit (a block named by its range and first token). The cursor's row and column labels are
reversed. The strip, the header and the heatmap share the gutter and the columns (tui/render/matrix_axes.py lays
them out; the layout follows the terminal's size).
A store made with ``--matrices cls`` keeps only the explained token's row: that row is drawn and the screen says why
the rest is absent. The matrix is read on a worker (never on the UI thread); the global scale comes from the
store's precomputed statistics, or is computed once on a worker and cached by the store.
Under ``--matrices all`` the screen never holds an example's [L, n, n]: the layer shown is read on a worker a band
of rows at a time and kept as the block means it draws (tui/data.py read_matrix_layer: the downsampled heatmap takes
every entry of that layer, no other layer is read); the per-example scale reads every layer once, by bands.
"""

from __future__ import annotations

from functools import partial

import numpy as np
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Header, Static

from ..colors import Scale, format_score
from ..colors import normalize_within as scale_of
from ..commands import MatrixCommands
from ..data import LRU, MatrixLayer, matrix_layer, read_matrix_bounds, read_matrix_layer, read_matrices
from ..widgets.footer import FittedFooter
from ..render.heatmap import heatmap_lines
from ..render.layer_strip import strip_text
from ..render.matrix_axes import Geometry, header_lines, labelled
from ..render.matrix_axes import geometry as axes_geometry
from ..render.tokens import ColorBar, printable
from .example_cursor import ExampleCursor

NORMALISATIONS = ("layer", "example", "global")
_DIM = Style(dim=True)
_FIXED_LINES = 6  # the title, info, strip caption, colour bar, status and footer lines: the rest is the strip's,
# header's and map's


class MatrixScreen(ExampleCursor, ModalScreen[None]):
    COMMANDS = {MatrixCommands}
    ANNOUNCE_GLOBAL = True

    BINDINGS = [
        Binding("left_square_bracket", "layer(-1)", "layer", id="matrix.layer.previous"),
        Binding("right_square_bracket", "layer(1)", "layer", id="matrix.layer.next", show=False),
        Binding("m", "method(1)", "method", id="matrix.method"),
        Binding("s", "normalisation", "scale", id="matrix.normalisation"),  # s as on the browse screen
        Binding("j", "example(1)", "example", id="matrix.next"),
        Binding("k", "example(-1)", "previous", id="matrix.previous", show=False),
        Binding("up", "move(-1, 0)", "cursor", id="matrix.up", show=False),
        Binding("down", "move(1, 0)", "cursor", id="matrix.down", show=False),
        Binding("left", "move(0, -1)", "cursor", id="matrix.left", show=False),
        Binding("right", "move(0, 1)", "cursor", id="matrix.right", show=False),
        Binding("escape,x,q", "close", "close", id="matrix.close"),
    ]

    DEFAULT_CSS = """
    MatrixScreen { background: $background; }
    MatrixScreen #matrix-info, MatrixScreen #matrix-bar, MatrixScreen #matrix-status { height: 1; padding: 0 1; }
    MatrixScreen #matrix-strip, MatrixScreen #matrix-cols { height: auto; padding: 0 1; }
    MatrixScreen #matrix-map { height: 1fr; padding: 0 1; }
    """

    def __init__(self, methods: list[str], method: str, index: int, layer: int):
        super().__init__()
        self.methods = methods  # those with matrices
        self.method = method
        self.index = index
        self.view_layer = layer
        self.norm = "layer"
        self.pos = (0, 0)  # the cursor's (row, column) token positions: kept across block sizes and examples
        self.cell = (0, 0)  # the cell that holds them in the last draw's blocks (clamped to the matrix)
        self.shape: tuple[int, int, int] | None = None  # (L, rows, n) of (index, method); None: no matrices
        self.matrices: np.ndarray | None = None  # [L, 1, n] of (index, method) under --matrices cls (else not held)
        self.loaded_key: tuple[int, str] | None = None
        self.layer_cache = LRU(8)  # (index, method, layer, fr, fc) -> MatrixLayer (--matrices all: read by bands)
        self.bounds: dict[tuple[int, str], tuple[float, float]] = {}  # every layer's min and max (scale: example)
        self.shown: MatrixLayer | None = None  # the layer drawn last
        self._asked: set = set()  # the layers and bounds being read (a draw meanwhile asks for them once)
        self.global_scale: dict | None = None
        self.geometry: Geometry | None = None  # how the last draw laid the screen out

    def compose(self) -> ComposeResult:
        yield Header(icon="◆")
        yield Static(Text("reading the matrices…", style=_DIM), id="matrix-info")
        yield Static(id="matrix-strip")
        yield Static(id="matrix-bar")
        yield Static(id="matrix-cols")
        yield Static(id="matrix-map")
        yield Static(id="matrix-status")
        yield FittedFooter()

    def on_mount(self) -> None:
        self._read(self.index, self.method)

    # ---------------------------------------------------------------- workers
    def _on_worker(self, reader, then, *args) -> None:
        """A worker's body: ``reader(store)`` under the store's lock, then ``then(*args, result)`` on the UI thread;
        a damaged store says so in a notification."""
        app = self.app
        try:
            with app.store_lock:
                result = reader(app.store)
        except Exception as err:
            app.call_from_thread(self.notify, f"could not read the matrices: {err}", severity="error", markup=False)
            return
        app.call_from_thread(then, *args, result)

    def _read(self, index: int, method: str) -> None:
        """The matrices' shape; under --matrices cls also the explained rows ([L, 1, n], small)."""

        def reader(store):
            shape = store[index].matrix_shape(method)
            return shape, (read_matrices(store, index, method) if shape is not None and shape[1] == 1 else None)

        self.run_worker(partial(self._on_worker, reader, self._loaded, index, method), thread=True, exclusive=True,
                        group="matrix", name="read matrices")

    def _loaded(self, index: int, method: str, read) -> None:
        if (index, method) != (self.index, self.method):
            return
        (self.shape, self.matrices), self.loaded_key = read, (index, method)
        if self.shape is not None:
            self.view_layer = min(self.view_layer, self.shape[0] - 1)
        self._draw()

    def _read_layer(self, key: tuple[int, str, int, int, int]) -> None:
        """One layer in the drawn blocks, by bands (not exclusive: a read asked for stays asked until it is done)."""
        self.run_worker(partial(self._on_worker, lambda store: read_matrix_layer(store, *key), self._read_done,
                                self.layer_cache.put, key), thread=True, group="matrix layer", name="read a layer")

    def _read_bounds(self, key: tuple[int, str]) -> None:
        self.run_worker(partial(self._on_worker, lambda store: read_matrix_bounds(store, *key), self._read_done,
                                self.bounds.__setitem__, key), thread=True, group="matrix bounds",
                        name="read the bounds")

    def _read_done(self, keep, key, value) -> None:
        self._asked.discard(key)
        keep(key, value)
        self._draw()

    # ---------------------------------------------------------------- drawing
    def _signed(self) -> bool:
        return next(m.signed for m in self.app.meta.methods if m.name == self.method)

    def _scale(self, layer: MatrixLayer, bounds: tuple[float, float] | None) -> Scale:
        """The scale of the shown layer (its ends: the layer's own, every layer's, or the store's) and its cells
        on it (the layer's own: the cells' own range)."""
        signed = self._signed()
        lo, hi = layer.lo, layer.hi
        if self.norm == "example" and bounds is not None:
            lo, hi = bounds
        if self.norm == "global":
            view = (self.global_scale or {}).get(f"matrix {self.view_layer + 1}")
            if view is not None and view.count:
                lo, hi = (-view.max_abs, view.max_abs) if signed else (view.min, view.max)
        if self.norm == "layer":
            return scale_of(layer.cells, signed)
        hi = max(abs(lo), abs(hi)) if signed else hi
        return Scale(np.clip(scale_of(layer.cells, signed, None if signed else lo, hi).values, -1, 1), -hi if signed
                     else lo, hi, signed)

    def _draw(self) -> None:
        app = self.app
        ex = app.example(self.index)
        info = self.query_one("#matrix-info")
        if self.loaded_key != (self.index, self.method):
            return
        tokens = ex.tokens if ex is not None else [str(i) for i in range(self.shape[-1] if self.shape else 0)]
        if self.shape is None:
            info.update(Text(f"{self.method} keeps no matrices in this store: run attr-compute with --matrices all",
                             style=_DIM))
            return
        L, rows, n = self.shape
        # the row a --matrices cls store keeps: a generation store's is its index row's, not the step shown
        stored = ex.steps.explain_pos if ex is not None and ex.steps is not None else getattr(ex, "explain_pos", None)
        explained = stored if ex is not None and rows == 1 else None
        views = None if ex is None else ex.layer_scores.get(self.method)
        geom, labels = axes_geometry(tokens, rows, n, explained, width=max(self.size.width - 2, 16),
                                     height=max(self.size.height - _FIXED_LINES, 4), mono=app.color_mode == "mono",
                                     views=0 if views is None else len(views))
        self.geometry = geom
        layer = self._layer(geom)
        bounds = self._example_bounds()
        if layer is None or (self.norm == "example" and bounds is None):
            info.update(Text(f"reading layer {self.view_layer + 1} of {self.method}…", style=_DIM))
            return
        self.shown = layer
        cells = layer.cells
        cell_scale = self._scale(layer, bounds)
        r, c = min(self.pos[0] // geom.fr, cells.shape[0] - 1), min(self.pos[1] // geom.fc, cells.shape[1] - 1)
        self.cell = (r, c)
        info.update(self._info(ex, L, rows, n, geom))
        self.query_one("#matrix-strip").update(self._strip(views, geom))
        # the heatmap under it is that layer's own matrix; the strip's layer views are the method's scores (rolled
        # out, for rollout and its kin): the bar says which
        self.query_one("#matrix-bar").update(ColorBar(cell_scale, app.color_mode, glyphs=app.color_mode == "mono",
                                                      cmap=app.colormap, scope=self._what()))
        self.query_one("#matrix-cols").update(Text("\n").join(header_lines(tokens, n, geom, c)))
        self.query_one("#matrix-map").update(self._map(cell_scale, cells.shape, cell_scale.signed, geom, labels, rows))
        self.query_one("#matrix-status").update(self._status(tokens, explained, cells, rows, n, geom))
        self.sub_title = f"matrix · {self.method}"

    def _layer(self, geom) -> MatrixLayer | None:
        """The shown layer in the geometry's blocks: from the rows held (--matrices cls), else read by bands on a
        worker (None until it is)."""
        if self.matrices is not None:
            return matrix_layer(self.matrices[self.view_layer], geom.fr, geom.fc)
        key = (self.index, self.method, self.view_layer, geom.fr, geom.fc)
        layer = self.layer_cache.get(key)
        if layer is None and key not in self._asked:
            self._asked.add(key)
            self._read_layer(key)
        return layer

    def _example_bounds(self) -> tuple[float, float] | None:
        """Every layer's min and max (the per-example scale), None until read (read only for that scale)."""
        if self.norm != "example":
            return None
        if self.matrices is not None:
            x = np.nan_to_num(np.asarray(self.matrices, np.float64), nan=0.0, posinf=0.0, neginf=0.0)
            return float(x.min()), float(x.max())
        key = (self.index, self.method)
        bounds = self.bounds.get(key)
        if bounds is None and key not in self._asked:
            self._asked.add(key)
            self._read_bounds(key)
        return bounds

    def _what(self) -> str:
        """What the heatmap shows, for its colour bar."""
        return f"layer {self.view_layer + 1}'s own matrix (not rolled out)"

    def _info(self, ex, L: int, rows: int, n: int, geom) -> Text:
        head = Text(no_wrap=True, overflow="ellipsis")
        head.append(printable(ex.id if ex else str(self.index)), Style(bold=True))
        head.append(f"  {self.method} · layer {self.view_layer + 1}/{L} · {rows}×{n}", _DIM)
        if geom.fr > 1 or geom.fc > 1:
            head.append(f" · blocks {geom.fr}×{geom.fc} averaged", Style(bold=True))
        head.append(f" · scale: {self.norm}", _DIM)
        return head

    def _map(self, scale: Scale, shape: tuple[int, int], signed: bool, geom, labels, rows: int) -> Text:
        """The heatmap's lines, each after its label (the cursor's row reversed)."""
        app = self.app
        r, c = self.cell
        lines = heatmap_lines(scale.values.reshape(shape), app.color_mode, per_line=geom.per_line, cursor=(r, c),
                              cell_width=geom.cw, signed=signed, cmap=app.colormap)
        out = labelled(labels, lines, geom.gutter, r * geom.fr)
        if rows == 1:
            out.append(Text(""))
            out.append(Text("only the explained token's row is stored (--matrices cls): run attr-compute with "
                            "--matrices all for the full matrix", style=_DIM))
        return Text("\n").join(out)

    def _status(self, tokens: list[str], explained: int | None, cells: np.ndarray, rows: int, n: int, geom) -> Text:
        """The cursor's row and column: tokens, 1-based positions (ranges for blocks), the value."""
        r, c = self.cell
        fr, fc = geom.fr, geom.fc
        q0, k0 = r * fr, c * fc
        q_tok = tokens[explained] if explained is not None else (tokens[q0] if q0 < len(tokens) else "?")
        k_tok = tokens[k0] if k0 < len(tokens) else "?"
        status = Text(no_wrap=True, overflow="ellipsis")
        status.append(f"{printable(q_tok)}", Style(bold=True))
        status.append(f" ({q0 + 1}{'' if fr == 1 else f'-{min(q0 + fr, rows)}'}) ← ", _DIM)
        status.append(f"{printable(k_tok)}", Style(bold=True))
        status.append(f" ({k0 + 1}{'' if fc == 1 else f'-{min(k0 + fc, n)}'})  ", _DIM)
        status.append(format_score(float(cells[r, c])) + ("" if fr == fc == 1 else " (block mean)"))
        return status

    def _strip(self, views, geom) -> Text:
        """Layers x tokens: one line per layer view of the method, the current layer marked; its columns are the
        heatmap's (same blocks, same widths, same gutter), so a column of the strip lies above the same tokens."""
        if views is None or not len(views):
            return Text("no layer views for this method", style=_DIM)
        labels = [f"L{i + 1}" for i in range(len(views))]
        caption = Text(f"layer views: {self.method}'s scores at each layer, as on the browse screen", style=_DIM,
                       no_wrap=True, overflow="ellipsis")
        return Text("\n").join([caption, strip_text(views, labels, self.view_layer, self._signed(),
                                                    self.app.color_mode, width=self.size.width - 2, rows=geom.strip,
                                                    label_w=geom.gutter, f=geom.fc, cw=geom.cw,
                                                    cmap=self.app.colormap)])

    def on_resize(self, event) -> None:
        if self.loaded_key is not None:
            self._draw()  # the layout follows the terminal's size

    # ---------------------------------------------------------------- actions
    def action_layer(self, step: int) -> None:
        if self.shape is None:
            return
        self.set_layer((self.view_layer + step) % self.shape[0])

    def set_layer(self, layer: int) -> None:
        self.view_layer = layer
        self._draw()

    def set_method(self, method: str) -> None:
        if method in self.methods and method != self.method:
            self.action_method(self.methods.index(method) - self.methods.index(self.method))

    def action_method(self, step: int) -> None:
        if len(self.methods) < 2:
            return
        self.method = self.methods[(self.methods.index(self.method) + step) % len(self.methods)]
        self.global_scale = None
        if self.norm == "global":
            self._read_global(self.method)
        self._read(self.index, self.method)

    def action_normalisation(self) -> None:
        self.set_normalisation(NORMALISATIONS[(NORMALISATIONS.index(self.norm) + 1) % len(NORMALISATIONS)])

    def redraw(self) -> None:
        self._draw()

    def set_normalisation(self, norm: str) -> None:
        self.norm = norm
        if self.norm == "global" and self.global_scale is None:
            self._read_global(self.method)
        self._draw()

    def show_example(self) -> None:
        self._read(self.index, self.method)

    def action_move(self, dr: int, dc: int) -> None:
        """One cell of the drawn blocks; the cursor is kept as the first token position of its new cell."""
        fr, fc = self.block_step()
        self.pos = (max(0, self.cell[0] + dr) * fr, max(0, self.cell[1] + dc) * fc)
        self._draw()

    def action_close(self) -> None:
        self.dismiss(None)
