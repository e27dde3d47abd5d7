"""The compare screen (``c``): 2 to 6 methods for the current example, aligned token by token.

Above the token rows, a table gives each method's agreement with the first one (Spearman's rho over the tokens, the
explained one left out, and the overlap of their top-k tokens) and its stored per-example metrics. ``s`` switches
between one scale per method and a shared one, ``d`` shows the first method minus the second (each normalised
first), ``+``/``-`` change k, ``a`` chooses the methods; j/k move through the examples and the choice stays.
The example comes from the app's cache or one read on a worker: nothing here reads HDF5 on the UI thread.
"""

from __future__ import annotations

import math

from rich.console import Group
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Header, SelectionList, Static

from ..agreement import spearman, top_k_overlap
from ..colors import clip_legend, default_k, format_score
from ..commands import CompareCommands
from ..widgets.footer import FittedFooter
from ..render.compare import DIFFERENCE, Row, aligned_blocks, difference, legend_lines, scales
from ..render.metric_table import fmt
from ..data import LoadedExample
from ..render.tokens import printable
from .example_cursor import ExampleCursor

MIN_METHODS, MAX_METHODS = 2, 6
_DIM = Style(dim=True)


def _fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


class CompareScreen(ExampleCursor, ModalScreen[None]):
    COMMANDS = {CompareCommands}

    BINDINGS = [
        Binding("j", "example(1)", "example", id="compare.next"),
        Binding("k", "example(-1)", "previous example", id="compare.previous", show=False),
        Binding("s", "toggle_shared", "shared scale", id="compare.shared"),
        Binding("d", "toggle_difference", "A−B", id="compare.difference"),
        Binding("plus,equals_sign", "top_k(1)", "k+", id="compare.k_up"),
        Binding("minus", "top_k(-1)", "k−", id="compare.k_down"),
        Binding("a", "choose", "methods", id="compare.choose"),
        Binding("e", "export", "export", id="compare.export"),
        Binding("escape,c,q", "close", "close", id="compare.close"),
        # a generation store's step cursor, as on the browse screen (its step is in the header line)
        Binding("less_than_sign", "step(-1)", "previous step", id="compare.step.previous", show=False),
        Binding("greater_than_sign", "step(1)", "next step", id="compare.step.next", show=False),
    ]

    DEFAULT_CSS = """
    CompareScreen { background: $background; }
    CompareScreen #compare-table { height: auto; padding: 0 1; }
    CompareScreen #compare-bar { height: auto; padding: 0 1; }
    CompareScreen #compare-rows { height: 1fr; padding: 0 1; }
    CompareScreen SelectionList { height: auto; max-height: 12; border: round $primary; }
    """

    def __init__(self, methods: list[str], index: int):
        super().__init__()
        self.methods = list(methods)
        self.index = index
        self.shared = False
        self.difference = False
        self.k: int | None = None  # None: default_k of the example
        self.example: LoadedExample | None = None

    def compose(self) -> ComposeResult:
        yield Header(icon="◆")
        with Vertical():
            yield Static(Text("reading the example…", style=_DIM), id="compare-table")
            yield Static(id="compare-bar")
            with VerticalScroll(id="compare-rows"):
                yield Static(id="compare-tokens")
        yield FittedFooter()

    def on_mount(self) -> None:
        self.show_example()

    # ---------------------------------------------------------------- data
    def show_example(self) -> None:
        cached = self.app.example(self.index)
        if cached is not None:
            self.example = cached
            self._draw()
        else:
            self._read_example(self.index)

    def example_read(self, ex: LoadedExample) -> None:
        self.example = ex.at_step(self.app.step)
        self._draw()

    # ---------------------------------------------------------------- drawing
    @property
    def top(self) -> int:
        ex = self.example
        n = len(ex.tokens) if ex else 0
        return max(1, min(self.k if self.k is not None else default_k(n), max(n - 1, 1)))

    def _signed(self) -> dict[str, bool]:
        return {m.name: m.signed for m in self.app.meta.methods}

    def _draw(self) -> None:
        ex, app = self.example, self.app
        if ex is None:
            return
        ex = ex.at_step(app.step)  # a generation store's: the step cursor's token, as on the browse screen
        methods = [m for m in self.methods if m in ex.scores]
        signed = self._signed()
        raw = {m: ex.scores[m] for m in methods}
        sc = {m: ex.cut(v) for m, v in scales(raw, signed, self.shared, app.scale_keep(ex, methods)).items()}
        k = self.top
        first = raw[methods[0]]
        table = Table(box=None, pad_edge=False, padding=(0, 1), header_style=Style(bold=True))
        table.add_column("method")
        table.add_column("ρ vs 1st", justify="right")
        table.add_column(f"top-{k} ∩", justify="right")
        metric_names = list(app.metrics.names)[:3] if app.metrics.names else []
        table.add_column("scale")  # each method's ends: the colour bar's numbers when the scales differ
        for name in metric_names:
            table.add_column(name.replace("comprehensiveness", "compr.").replace("sufficiency", "suff."),
                             justify="right")
        for j, m in enumerate(methods):
            rho = 1.0 if j == 0 else spearman(first, raw[m], skip=ex.explain_pos)
            ov = 1.0 if j == 0 else top_k_overlap(first, raw[m], k, skip=ex.explain_pos,
                                                  signed=(signed[methods[0]], signed[m]))
            values = [fmt(ex.metric_values.get((m, n))) for n in metric_names]  # as the metrics screen: 4e-05 stays visible
            ends = format_score(sc[m].lo) + "…" + ("+" if sc[m].signed and sc[m].hi > 0 else "") + format_score(sc[m].hi)
            table.add_row(Text(m), _fmt(rho), _fmt(ov), ends, *values)
        head = Text(no_wrap=True, overflow="ellipsis")
        head.append(printable(ex.id), Style(bold=True))
        head.append(f"  {ex.index + 1}/{app.example_list.store_rows}  {len(ex.tokens)} tokens  ", _DIM)
        if ex.step >= 0:  # a generation store: the step shown
            head.append(f"<step {ex.step + 1}/{ex.steps.n}> ", _DIM)
            head.append(f"▸{printable(ex.tokens[ex.explain_pos])}  ", Style(bold=True))
        head.append(f"{'shared scale' if self.shared else 'scale per method'}", _DIM)
        # the rows' own width, less their padding and a vertical scrollbar (always counted: a long example has one,
        # and a block that filled the line to its last cell would wrap its end onto a line without a method label)
        pane = self.query_one("#compare-rows")
        width = max((pane.size.width or self.size.width) - 2 - pane.styles.scrollbar_size_vertical, 20)
        if self.difference and len(methods) >= 2:
            d = difference(sc[methods[0]], sc[methods[1]])
            rows = [Row(methods[0], sc[methods[0]], raw[methods[0]]), Row(methods[1], sc[methods[1]], raw[methods[1]]),
                    Row(DIFFERENCE, d, d.values)]
            head.append(f"  A−B = {methods[0]} − {methods[1]}, each normalised first", _DIM)
        else:
            rows = [Row(m, sc[m], raw[m]) for m in methods]
        self.query_one("#compare-table").update(Group(head, table))
        # a bar per ramp drawn: a signed method's diverging one is no min..max bar
        legend = legend_lines(rows, width, app.color_mode, glyphs=app.glyphs, k=k, cmap=app.colormap,
                              clipped=clip_legend(r.scale for r in rows))
        self.query_one("#compare-bar").update(Text("\n").join(legend))
        lines = aligned_blocks(ex.tokens, rows, width, app.color_mode, glyphs=app.glyphs, k=k,
                               explained=ex.explain_pos, explained_end=ex.explained_end, cmap=app.colormap)
        tokens = Text("\n").join(lines)
        tokens.no_wrap, tokens.overflow = True, "crop"  # join() takes the separator's wrapping: never wrap a row
        self.query_one("#compare-tokens").update(tokens)
        self.sub_title = "compare · " + ", ".join(methods)

    # ---------------------------------------------------------------- actions
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "step":  # a generation store's key: absent elsewhere
            return self.app.meta is not None and self.app.meta.generation
        return True

    def action_step(self, step: int) -> None:
        if self.example is not None and self.example.steps is not None:
            self.app.set_step(self.example.at_step(self.app.step).step + step)  # redraws this screen too

    def action_toggle_shared(self) -> None:
        self.shared = not self.shared
        self._draw()

    def action_toggle_difference(self) -> None:
        self.difference = not self.difference
        self._draw()

    def action_top_k(self, step: int) -> None:
        self.k = self.top + step
        self._draw()

    def action_choose(self) -> None:
        if self.query("SelectionList"):
            return
        names = [m.name for m in self.app.meta.methods]
        chooser = SelectionList[str](*[(n, n, n in self.methods) for n in names], id="compare-choose")
        chooser.border_title = f"methods ({MIN_METHODS}-{MAX_METHODS}): space toggles, enter keeps"
        self.query_one(Vertical).mount(chooser, before=0)
        chooser.focus()

    def on_key(self, event) -> None:
        chooser = self.query("SelectionList")
        if chooser and event.key in ("enter", "escape"):
            event.stop()
            picked = [n for n in (m.name for m in self.app.meta.methods) if n in chooser.first().selected]
            if event.key == "enter":
                if not MIN_METHODS <= len(picked) <= MAX_METHODS:
                    self.notify(f"choose {MIN_METHODS} to {MAX_METHODS} methods ({len(picked)} chosen)",
                                severity="warning", markup=False)
                    return
                self.methods = picked
                self.app.compare_methods = picked  # the choice persists for the next compare
            chooser.first().remove()
            self._draw()

    def redraw(self) -> None:
        self._draw()

    def set_methods(self, methods: list[str]) -> None:
        """Show ``methods`` (the app's compare set, changed from the palette)."""
        self.methods = list(methods)
        self._draw()

    def action_export(self) -> None:
        if self.example is not None:
            self.app.export_figure(self.example.at_step(self.app.step), self.methods, shared=self.shared)

    def action_close(self) -> None:
        self.dismiss(None)
