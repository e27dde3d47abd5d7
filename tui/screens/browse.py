"""The browse screen (the home screen): the example list on the left; on the right the example, the method bar, the
layer strip, the colour bar and the tokens coloured by the current method and layer.

The screen draws the app's state (method, layer, normalisation, the loaded example) and turns its keys into changes
of that state; the app owns the store, the state and the workers that read. A one-line prompt at the bottom takes the
text of a search or a length filter.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, Static

from ..colors import (NORMALISATION_NAMES, NORMALISATIONS, SCALE_TOKEN_NAMES, SCALE_TOKENS, clip_legend, default_k,
                      normalize, normalize_within, top_k)
from ..commands import BrowseCommands, ViewCommands
from ..data import LoadedExample
from ..render.metric_table import MetricLine
from ..render.tokens import TokenLayout, token_cells, token_info
from ..widgets.footer import FittedFooter
from ..widgets import ColorBarView, ExampleList, InfoPanel, LayerStrip, MethodBar, TextPanel, TokenView

_LAYERS = Binding.Group("layer")


class BrowseScreen(Screen[None]):
    COMMANDS = {BrowseCommands, ViewCommands}

    DEFAULT_CSS = """
    BrowseScreen #body { height: 1fr; }
    BrowseScreen #list-pane { width: 43%; min-width: 28; max-width: 48; border-right: vkey $primary 40%; }
    BrowseScreen #view-note { height: auto; color: $text-muted; text-style: bold; padding: 0 0 0 2; }
    BrowseScreen #main { width: 1fr; padding: 0 0 0 1; }
    BrowseScreen #prompt { dock: bottom; margin-bottom: 1; border: round $primary; height: 3; }
    """

    BINDINGS = [
        Binding("left_square_bracket", "layer(-1)", "previous layer", id="layer.previous", group=_LAYERS),
        Binding("right_square_bracket", "layer(1)", "next layer", id="layer.next", group=_LAYERS),
        # a generation store's step cursor (the generated token explained) and its target x source heatmap: in help
        # and the example's step line ("<step 2/6>"), as 80 columns of footer are full
        Binding("less_than_sign", "step(-1)", "previous step", id="step.previous", show=False),
        Binding("greater_than_sign", "step(1)", "next step", id="step.next", show=False),
        Binding("v", "generation", "heatmap", id="generation", show=False),  # in help: 80 columns are full
        Binding("m", "method(1)", "method", id="method.next"),
        Binding("M", "method(-1)", "previous method", id="method.previous", show=False),
        Binding("g", "toggle_glyphs", "glyphs", id="glyphs", show=False),
        Binding("full_stop", "token(1)", "next token", id="token.next", show=False),
        Binding("comma", "token(-1)", "previous token", id="token.previous", show=False),
        Binding("l", "toggle_strip", "layer strip", id="strip", show=False),
        Binding("c", "app.compare", "compare", id="compare"),
        Binding("x", "app.matrix", "matrix", id="matrix", show=False),  # in help and the palette: 80 columns are full
        Binding("a", "app.attention", "attention", id="attention", show=False),  # likewise
        Binding("e", "app.export", "export figure", id="export", show=False),
        Binding("s", "normalisation", "scale", id="normalisation", show=False),
        Binding("t", "scale_tokens", "scale tokens", id="scale.tokens", show=False),
        Binding("slash", "search", "search", id="search", show=False),
        Binding("n", "next_match(1)", "next match", id="search.next", show=False),
        Binding("N", "next_match(-1)", "previous match", id="search.previous", show=False),
        Binding("r", "reset_view", "store order", id="view.reset", show=False),
        Binding("escape", "stop", "cancel", id="view.cancel", show=False),
        # Examples move with j/k wherever the focus is (the list itself binds them too, with arrows and pages).
        Binding("j", "example(1)", "next example", id="app.example.next", show=False),
        Binding("k", "example(-1)", "previous example", id="app.example.previous", show=False),
    ]

    def compose(self) -> ComposeResult:
        app = self.app
        yield Header(icon="◆")
        with Horizontal(id="body"):
            with Vertical(id="list-pane"):
                # the view's note (sort, filter, search, a pass's progress) where the list's header has no room
                yield Static(id="view-note")
                yield ExampleList(id="examples", monochrome=app.color_mode == "mono")
            with Vertical(id="main"):
                yield InfoPanel(id="info")
                yield TextPanel(id="text")
                yield MethodBar(id="method")
                yield LayerStrip(id="strip")
                yield ColorBarView(id="colorbar")
                yield TokenView(id="tokens")
        yield FittedFooter()

    def on_mount(self) -> None:
        self.query_one("#view-note").display = False
        self.query_one(InfoPanel).show_message("reading the store…")
        self.query_one(ExampleList).focus()
        self.app.start()

    def on_resize(self, event) -> None:
        self.draw()  # the layer strip's height follows the terminal's
        self.show_note()

    def on_example_list_note_changed(self, message: ExampleList.NoteChanged) -> None:
        self.show_note()

    def show_note(self) -> None:
        """The list's note on its own line (wrapped) when the list's header has no room for the whole of it."""
        lst = self.query_one(ExampleList)
        shown = bool(lst.note) and not lst.note_fits(lst.scrollable_content_region.width or lst.size.width)
        note = self.query_one("#view-note", Static)
        note.update(Text(lst.note) if shown else "")
        note.display = shown

    # ---------------------------------------------------------------- drawing
    def show_message(self, message: str, tokens: str | None = None) -> None:
        self.query_one(InfoPanel).show_message(message)
        if tokens is not None:
            self.query_one(TokenView).show_message(tokens)

    def draw(self) -> None:
        """Draw the current example in the current method, layer and normalisation (when it is read)."""
        app = self.app
        ex = app.example(app.current)
        info = app.method
        if ex is None or info is None:
            return
        if app.layer is not None and app.layer >= info.n_layer_views:
            app.layer = None
        scores = ex.view(info.name, app.layer)
        scale = ex.cut(self.scale(ex, info, scores))
        k = default_k(len(ex.tokens))
        top = top_k(scores, info.signed, k, ex.explain_pos)
        mono = app.color_mode == "mono"
        self.query_one(InfoPanel).show_example(ex, app.meta.labels, app.example_list.store_rows, monochrome=mono)
        self.query_one(TextPanel).show_example(ex)
        metrics = (MetricLine(app.metrics.of(info.name), ex.index, info.name, ex.metric_values, ex.step_metric_values)
                   if app.metrics.names else None)
        views = ex.layer_scores.get(info.name) if app.show_strip else None
        final = ex.scores[info.name]
        if ex.upto >= 0 and views is not None:  # a generation step: its sources, the tokens before its target
            views, final = (views[:, :ex.upto], final[:ex.upto]) if ex.upto else (None, final)
        strip = views is not None and len(views) > 0
        self.query_one(MethodBar).show(info, app.method_index, len(app.meta.methods), app.layer,
                                       ex.values.get(info.name), metrics, ladder=not strip)
        cells = token_cells(ex.tokens, scale, app.color_mode, glyphs=app.glyphs, top=top, explained=ex.explain_pos,
                            explained_end=ex.explained_end, cmap=app.colormap)
        self.query_one(LayerStrip).show(views, final, app.layer, info.signed, app.color_mode,
                                        rows=self._strip_rows(TokenLayout(cells)), cmap=app.colormap)
        scope = {"view": "", "example": "per example, ", "global": "global, "}[app.norm]
        if app.norm == "global" and info.name not in app.global_scales:
            scope = "global: reading…, "
        # the store's statistics are over every token
        scope += SCALE_TOKEN_NAMES["all" if app.norm == "global" else app.scale_tokens_of(info.name, ex)]
        self.query_one(ColorBarView).show(scale, app.color_mode, app.glyphs, k, scope, cmap=app.colormap,
                                          clipped=clip_legend([scale]))
        view = self.query_one(TokenView)
        if app.token is not None and 0 <= app.token < len(cells):  # the token cursor: reversed, its numbers above
            cells[app.token] = replace(cells[app.token], style=cells[app.token].style + Style(reverse=True))
            view.border_title = Text(token_info(ex.tokens, scores, app.token, info.signed))
        else:
            view.border_title = None
        view.show_tokens(TokenLayout(cells))

    def redraw(self) -> None:
        self.draw()

    def _strip_rows(self, tokens: TokenLayout) -> int:
        """Lines the layer strip may take: what the terminal has left once the header, footer, the example's lines,
        the method bar, the colour bar and the tokens (at least four lines of them, fewer when they need fewer)
        have theirs, so that every layer shows where the tokens leave room."""
        main = self.query_one("#main")
        width = max(main.size.width - 1, 20)
        taken = sum(self.query_one(w).outer_size.height for w in ("#info", "#text", "#method", "#colorbar"))
        token_lines = min(len(tokens.breaks(width)), 4) + 1  # and the token view's top border
        return max(2, self.app.size.height - 2 - taken - token_lines)

    def scale(self, ex: LoadedExample, info, scores: np.ndarray):
        """The colour scale of the shown view under the chosen normalisation (NORMALISATIONS)."""
        app = self.app
        keep = app.scale_keep(ex, [info.name])[info.name]
        if app.norm == "example":  # every view of this example's method on one scale
            layer_views = ex.layer_scores.get(info.name)
            views = [ex.scores[info.name]] + ([] if layer_views is None else list(layer_views))
            every = np.concatenate([np.asarray(v, np.float64)[: len(keep)][keep[: len(v)]] if keep is not None
                                    else np.asarray(v, np.float64).ravel() for v in views])
            finite = every[np.isfinite(every)]
            if finite.size:
                return normalize_within(scores, info.signed, None if info.signed else float(finite.min()),
                                        float(np.abs(finite).max()) if info.signed else float(finite.max()))
        if app.norm == "global":
            stats = app.global_scales.get(info.name)
            view = stats.get("final" if app.layer is None else f"layer {app.layer + 1}") if stats else None
            if view is not None and view.count:
                return normalize_within(scores, info.signed, None if info.signed else view.min,
                                        view.max_abs if info.signed else view.max)
        return normalize(scores, info.signed, keep)

    # ---------------------------------------------------------------- keys
    @property
    def bindings_settled(self) -> bool:
        """Whether check_action can answer: most keys wait for the store's header (read in a worker)."""
        return self.app.meta is not None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        app = self.app
        if action == "layer":
            info = app.method
            return True if info is not None and info.n_layer_views else None
        if action == "method":
            return True if app.meta is not None and len(app.meta.methods) > 1 else None
        if action in ("step", "generation"):  # a generation store's keys: absent elsewhere
            return app.meta is not None and app.meta.generation
        return True

    def action_layer(self, step: int) -> None:
        """[ ]: the previous / next layer view; after the last layer, the method's final scores; both wrap."""
        app = self.app
        info = app.method
        if info is None or not info.n_layer_views:
            return
        v = info.n_layer_views
        pos = v if app.layer is None else app.layer  # positions 0..v-1 are layers, v is "final"
        pos = (pos + step) % (v + 1)
        app.set_layer(None if pos == v else pos)

    def action_method(self, step: int) -> None:
        self.app.set_method(self.app.method_index + step)

    def action_generation(self) -> None:
        """v: the target x source heatmap of the current example's whole generation."""
        self.app.action_generation()

    def action_step(self, step: int) -> None:
        """< / >: the step cursor to the previous / next generated token (a generation store)."""
        ex = self.app.example(self.app.current)
        if ex is not None and ex.steps is not None:
            self.app.set_step(ex.step + step)

    def action_toggle_glyphs(self) -> None:
        app = self.app
        if app.color_mode == "mono":
            app.notify("no colour here: glyphs stay on", markup=False)
            return
        app.glyphs = not app.glyphs
        self.draw()

    def action_toggle_strip(self) -> None:
        """l: the layer strip on / off (off gives its lines to the tokens)."""
        self.app.show_strip = not self.app.show_strip
        self.draw()

    def action_scale_tokens(self) -> None:
        """t: the colour scale set by the content tokens (special and explained ones left out) or by all tokens."""
        app = self.app
        ex = app.example(app.current)
        if app.method is None or ex is None:
            return
        now = app.scale_tokens_of(app.method.name, ex)
        app.set_scale_tokens(app.method.name, SCALE_TOKENS[(SCALE_TOKENS.index(now) + 1) % len(SCALE_TOKENS)])

    def action_normalisation(self) -> None:
        """s: colours scaled per view (this example's view), per example (all its views), or over the whole store."""
        app = self.app
        self.set_normalisation(NORMALISATIONS[(NORMALISATIONS.index(app.norm) + 1) % len(NORMALISATIONS)])

    def set_normalisation(self, norm: str) -> None:
        app = self.app
        app.norm = norm
        app.notify(f"scale: {NORMALISATION_NAMES[norm]}", timeout=3, markup=False)
        if norm == "global" and app.method is not None and app.method.name not in app.global_scales:
            app.read_global_scale(app.method.name)
        self.draw()

    def action_token(self, step: int) -> None:
        """. / ,: the token cursor to the next / previous token (from none: the first / the last)."""
        app = self.app
        ex = app.example(app.current)
        if ex is None or not ex.tokens:
            return
        if app.token is None:
            app.token = 0 if step > 0 else len(ex.tokens) - 1
        else:
            app.token = max(0, min(len(ex.tokens) - 1, app.token + step))
        self.draw()

    def action_example(self, step: int) -> None:
        lst = self.app.example_list
        lst.move_to(lst.cursor + step)

    # ---------------------------------------------------------------- search, filters and the prompt
    def action_search(self) -> None:
        """Search the example texts: a prompt at the bottom; enter searches, n / N go to the next / previous match."""
        app = self.app
        if app.meta is None or app.screen is not self or self.query("#prompt"):
            return
        self.prompt("search the texts (enter; n / N next / previous, empty clears):", app.view.query,
                    app.view.search)

    def prompt(self, title: str, value: str, submit) -> None:
        """A one-line input at the bottom; enter calls ``submit(text)``, escape closes it."""
        box = Input(value=value, placeholder=title, id="prompt")
        box.border_title = title
        box.submit_to = submit
        self.mount(box, before=self.query_one(Footer))
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "prompt":
            return
        submit = event.input.submit_to
        text = event.value
        event.input.remove()
        self.app.example_list.focus()
        submit(text)

    def filter_length(self) -> None:
        from ..finding import parse_length

        app = self.app

        def submit(text: str) -> None:
            try:
                lo, hi = parse_length(text)
            except ValueError as err:
                app.notify(str(err), severity="warning", markup=False)
                return
            app.view.set_filter(replace(app.view.filter, length=(lo, hi)))

        self.prompt("tokens, low-high (e.g. 10-40):", "", submit)

    def action_next_match(self, step: int) -> None:
        self.app.view.next_match(step)

    def action_reset_view(self) -> None:
        self.app.view.reset()

    def action_stop(self) -> None:
        """Escape: close the prompt, or cancel a running sort, filter or search."""
        for box in self.query("#prompt"):
            box.remove()
            self.app.example_list.focus()
            return
        self.app.view.stop()
