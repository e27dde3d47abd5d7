"""The generation screen (``v``, a generation store): the whole generation of the current example as a target x
source heatmap (inseq's view): a row per generated token (step), a column per token of prompt and continuation, each
row coloured over the tokens before its target and blank from the target on.

Top to bottom: a line naming the example, method, view (final or a layer), size, block factor and normalisation;
the colour bar; the column header (each source token top to bottom, as on the matrix screen); the heatmap, each line
labelled by its step's generated token; a status line with the cursor's step (its target, probability and foil) and
source (token, position, value). Up and down move the app's step cursor, so the browse screen shows the step the
heatmap was left at; left and right move over the sources. Rows are never averaged with the blank cells after a
target (render.heatmap.block_nanmean). The example's steps come from the app's cache (the browse screen read
them); the global scale from the store's statistics, read on a worker.
"""

from __future__ import annotations

import numpy as np
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Header, Static

from ..colors import Scale, format_score
from ..colors import normalize_within as scale_of
from ..data import LoadedExample
from ..render.heatmap import block_nanmean, heatmap_lines
from ..render.matrix_axes import Geometry, header_lines, labelled
from ..render.matrix_axes import geometry as axes_geometry
from ..render.tokens import ColorBar, printable
from ..widgets.footer import FittedFooter
from .example_cursor import ExampleCursor

NORMALISATIONS = ("generation", "step", "global")  # one scale for the whole heatmap, one per row, the store's
_DIM = Style(dim=True)
_FIXED_LINES = 6  # the title, info, colour bar, status and footer lines (and one spare): the rest is the header's
# and the map's


class GenerationScreen(ExampleCursor, ModalScreen[None]):
    BINDINGS = [
        Binding("up", "move(-1, 0)", "step", id="generation.up"),
        Binding("down", "move(1, 0)", "step", id="generation.down", show=False),
        Binding("left", "move(0, -1)", "source", id="generation.left"),
        Binding("right", "move(0, 1)", "source", id="generation.right", show=False),
        Binding("left_square_bracket", "layer(-1)", "layer", id="generation.layer.previous"),
        Binding("right_square_bracket", "layer(1)", "layer", id="generation.layer.next", show=False),
        Binding("m", "method(1)", "method", id="generation.method"),
        Binding("s", "normalisation", "scale", id="generation.normalisation"),
        Binding("j", "example(1)", "example", id="generation.next"),
        Binding("k", "example(-1)", "previous", id="generation.previous", show=False),
        Binding("escape,v,q", "close", "close", id="generation.close"),
    ]

    DEFAULT_CSS = """
    GenerationScreen { background: $background; }
    GenerationScreen #gen-info, GenerationScreen #gen-bar, GenerationScreen #gen-status { height: 1; padding: 0 1; }
    GenerationScreen #gen-cols { height: auto; padding: 0 1; }
    GenerationScreen #gen-map { height: 1fr; padding: 0 1; }
    """

    def __init__(self, method: str, index: int, layer: int | None = None):
        super().__init__()
        self.method = method
        self.index = index
        self.view_layer = layer  # None: the method's final scores; else a layer view (0-based)
        self.norm = "generation"
        self.source = 0  # the cursor's column: a token position
        self.cell = (0, 0)  # the cursor's cell in the last draw's blocks
        self.global_scale: dict | None = None
        self.geometry: Geometry | None = None

    def compose(self) -> ComposeResult:
        yield Header(icon="◆")
        yield Static(Text("reading the example…", style=_DIM), id="gen-info")
        yield Static(id="gen-bar")
        yield Static(id="gen-cols")
        yield Static(id="gen-map")
        yield Static(id="gen-status")
        yield FittedFooter()

    def on_mount(self) -> None:
        self.show_example()

    # ---------------------------------------------------------------- data
    def show_example(self) -> None:
        if self.app.cache.get(self.index) is not None:
            self._draw()
        else:
            self._read_example(self.index)

    def example_read(self, ex: LoadedExample) -> None:
        self._draw()

    # ---------------------------------------------------------------- drawing
    def _signed(self) -> bool:
        return next(m.signed for m in self.app.meta.methods if m.name == self.method)

    def _views(self) -> int:
        return next(m.n_layer_views for m in self.app.meta.methods if m.name == self.method)

    def grid(self, ex: LoadedExample) -> np.ndarray:
        """[T, n] of the shown view: the final scores of every step, or one layer view of every step."""
        s = ex.steps
        if self.view_layer is None or s.layer_scores.get(self.method) is None:
            return s.scores[self.method]
        return s.layer_scores[self.method][:, self.view_layer, :]

    def _scale(self, cells: np.ndarray, whole: np.ndarray) -> Scale:
        """The cells normalised under ``self.norm``; blank (NaN) cells stay NaN."""
        signed = self._signed()
        finite = np.isfinite(cells)
        if self.norm == "step":  # each row on its own scale
            values = np.vstack([scale_of(row, signed).values if np.isfinite(row).any() else np.zeros_like(row)
                                for row in cells]) if len(cells) else cells
            sc = Scale(values, -1.0 if signed else 0.0, 1.0, signed)
        else:
            lo, hi = self._bounds(whole, signed)
            if self.norm == "global":
                key = "final" if self.view_layer is None else f"layer {self.view_layer + 1}"
                view = (self.global_scale or {}).get(key)
                if view is not None and view.count:
                    lo, hi = (None if signed else view.min), (view.max_abs if signed else view.max)
            sc = scale_of(cells, signed, lo, hi)
        values = np.where(finite, np.asarray(sc.values, np.float64).reshape(cells.shape), np.nan)
        return Scale(values, sc.lo, sc.hi, sc.signed)

    @staticmethod
    def _bounds(m: np.ndarray, signed: bool) -> tuple[float | None, float | None]:
        x = np.asarray(m, np.float64)
        x = x[np.isfinite(x)]
        if not x.size:
            return None, 0.0
        return (None, float(np.abs(x).max())) if signed else (float(x.min()), float(x.max()))

    def _draw(self) -> None:
        app = self.app
        base = app.cache.get(self.index)
        if base is None or base.steps is None:
            return
        ex = base.at_step(app.step)
        info = self.query_one("#gen-info", Static)
        T, n = base.steps.n, len(base.tokens)
        self.sub_title = f"generation · {self.method}"
        if not T:
            info.update(Text(f"{printable(ex.id)}: no generated tokens (the model ended at the first step)",
                             style=_DIM))
            for w in ("#gen-bar", "#gen-cols", "#gen-map", "#gen-status"):
                self.query_one(w, Static).update("")
            return
        grid = self.grid(base)
        P = base.steps.prompt_len
        geom, labels = axes_geometry(base.tokens[P:], T, n, None, width=max(self.size.width - 2, 16),
                                     height=max(self.size.height - _FIXED_LINES, 4), mono=app.color_mode == "mono",
                                     views=0)
        self.geometry = geom
        cells = block_nanmean(grid, geom.fr, geom.fc)
        sc = self._scale(cells, grid)
        self.source = min(self.source, n - 1)
        r, c = min(ex.step // geom.fr, cells.shape[0] - 1), min(self.source // geom.fc, cells.shape[1] - 1)
        self.cell = (r, c)
        info.update(self._info(ex, T, n, geom))
        self.query_one("#gen-bar", Static).update(ColorBar(
            sc, app.color_mode, glyphs=app.color_mode == "mono", cmap=app.colormap,
            ends=("−max", "+max") if self.norm == "step" and sc.signed else ("min", "max") if self.norm == "step"
            else None, scope="targets ↓ × sources →, blank from each target on"))
        self.query_one("#gen-cols", Static).update(Text("\n").join(header_lines(base.tokens, n, geom, c)))
        lines = heatmap_lines(sc.values, app.color_mode, per_line=geom.per_line, cursor=(r, c), cell_width=geom.cw,
                              signed=sc.signed, cmap=app.colormap)
        out = labelled(labels, lines, geom.gutter, r * geom.fr)
        self.query_one("#gen-map", Static).update(Text("\n").join(out))
        self.query_one("#gen-status", Static).update(self._status(ex, cells, geom))

    def _info(self, ex: LoadedExample, T: int, n: int, geom) -> Text:
        head = Text(no_wrap=True, overflow="ellipsis")
        head.append(printable(ex.id), Style(bold=True))
        view = "final" if self.view_layer is None else f"layer {self.view_layer + 1}/{self._views()}"
        head.append(f"  {self.method} · {view} · {T} steps × {n} tokens", _DIM)
        if geom.fr > 1 or geom.fc > 1:
            head.append(f" · blocks {geom.fr}×{geom.fc} averaged", Style(bold=True))
        head.append(f" · scale: {self.norm}", _DIM)
        return head

    def _status(self, ex: LoadedExample, cells: np.ndarray, geom) -> Text:
        """The cursor's step (its target, p, foil) and source (token, 1-based position, value)."""
        r, c = self.cell
        task = ex.task or {}
        k0 = c * geom.fc
        status = Text(no_wrap=True, overflow="ellipsis")
        status.append(f"step {ex.step + 1}/{ex.steps.n} ", _DIM)
        status.append(f"▸{printable(ex.tokens[ex.explain_pos])}", Style(bold=True))
        status.append(f" p {task.get('prob', float('nan')):.2f}", _DIM)
        if task.get("foil_token", -1) >= 0:
            status.append(f" vs {printable(str(task.get('foil_word') or task['foil_token']))}", _DIM)
        status.append(" ← ", _DIM)
        status.append(printable(ex.tokens[k0]) if k0 < len(ex.tokens) else "?", Style(bold=True))
        status.append(f" ({k0 + 1}{'' if geom.fc == 1 else f'-{min(k0 + geom.fc, len(ex.tokens))}'})  ", _DIM)
        v = float(self.grid(ex)[ex.step, k0]) if geom.fc == 1 else float(cells[r, c])
        status.append("none: at or after the target" if not np.isfinite(v) else
                      format_score(v) + ("" if geom.fc == 1 else " (block mean)"))
        return status

    def on_resize(self, event) -> None:
        self._draw()

    def redraw(self) -> None:
        self._draw()

    # ---------------------------------------------------------------- actions
    def action_move(self, dr: int, dc: int) -> None:
        """Up / down: the app's step cursor (a block of steps when rows are averaged); left / right: the source."""
        app = self.app
        base = app.cache.get(self.index)
        if base is None or base.steps is None or not base.steps.n:
            return
        fr, fc = self.block_step()
        if dc:
            self.source = max(0, min(len(base.tokens) - 1, (self.cell[1] + dc) * fc))
        if dr:
            app.set_step(base.at_step(app.step).step + dr * fr)  # redraws every screen, this one too
        else:
            self._draw()

    def action_layer(self, step: int) -> None:
        """[ ]: the previous / next layer view; after the last, the final scores; both wrap."""
        v = self._views()
        if not v:
            return
        pos = v if self.view_layer is None else self.view_layer
        pos = (pos + step) % (v + 1)
        self.view_layer = None if pos == v else pos
        self._draw()

    def action_method(self, step: int) -> None:
        names = [m.name for m in self.app.meta.methods]
        if len(names) < 2:
            return
        self.method = names[(names.index(self.method) + step) % len(names)]
        if self.view_layer is not None and self.view_layer >= self._views():
            self.view_layer = None
        self.global_scale = None
        if self.norm == "global":
            self._read_global(self.method)
        self._draw()

    def action_normalisation(self) -> None:
        self.norm = NORMALISATIONS[(NORMALISATIONS.index(self.norm) + 1) % len(NORMALISATIONS)]
        if self.norm == "global" and self.global_scale is None:
            self._read_global(self.method)
        self._draw()

    def action_close(self) -> None:
        self.dismiss(None)
