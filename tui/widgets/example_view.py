"""The right-hand side of the browse screen: example info, method and layer bars, colour bar, tokens.

These widgets only format what the app hands them (a LoadedExample and view settings); they never read the store.
"""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.style import Style
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from ..colors import Scale
from ..data import LoadedExample, MethodInfo
from ..render import ColorBar, TokenLayout, printable, printable_text

_DIM = Style(dim=True)
_BOLD = Style(bold=True)


def _label_name(labels: dict[int, str], k: int | None) -> str:
    if k is None or k < 0:
        return "—"
    return printable(labels.get(int(k), str(int(k))))


class InfoPanel(Static):
    """Two lines: id, position, length, truncation; gold label, prediction with its probability, correct mark."""

    DEFAULT_CSS = "InfoPanel { height: 2; }"

    def show_example(self, ex: LoadedExample, labels: dict[int, str], total: int, *, monochrome: bool = False) -> None:
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(printable(ex.id), _BOLD)
        t.append(f"  {ex.index + 1}/{total}  {len(ex.tokens)} tokens", _DIM)
        if ex.truncated:
            t.append("  truncated", _BOLD if monochrome else Style(bold=True, color="yellow"))
            t.append(f" (of {ex.n_orig_tokens})", _DIM)
        t.append("\n")
        t.append("label ", _DIM)
        t.append(_label_name(labels, ex.label))
        t.append("  pred ", _DIM)
        t.append(_label_name(labels, ex.pred))
        if 0 <= ex.pred < len(ex.probs):
            t.append(f" {float(ex.probs[ex.pred]):.2f}")
        good, bad = (Style(), _BOLD) if monochrome else (Style(color="green"), Style(color="red", bold=True))
        mark = {True: ("  ✓ correct", good), False: ("  ✗ wrong", bad), None: ("  · unlabelled", _DIM)}[ex.correct]
        t.append(*mark)
        self.update(t)

    def show_message(self, message: str) -> None:
        self.update(Text(message, style=_DIM))


class TextPanel(Static):
    """The example's text (and pair text), literally, cropped to a few lines."""

    DEFAULT_CSS = "TextPanel { height: auto; max-height: 3; color: $text-muted; }"

    def show_example(self, ex: LoadedExample | None) -> None:
        t = Text()
        if ex is not None:
            t.append("text ", _BOLD)
            t.append(printable_text(ex.text))
            if ex.pair is not None:
                t.append("\npair ", _BOLD)
                t.append(printable_text(ex.pair))
        self.update(t)


class _LayerLadder:
    """``layer 2/12`` and a ladder of the layers with the current one highlighted, fitted to the width."""

    def __init__(self, info: MethodInfo, layer: int | None):
        self.info, self.layer = info, layer

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        v, layer = self.info.n_layer_views, self.layer
        t = Text(no_wrap=True, overflow="crop")
        if not v:
            t.append("final", _BOLD)
            t.append(f"  ({self.info.name} has no layer views)", _DIM)
            yield t
            return
        t.append("final" if layer is None else f"layer {layer + 1}/{v}", _BOLD)
        t.append("  ")
        wide = t.cell_len + sum(len(str(i)) + 1 for i in range(1, v + 1)) + 6 <= options.max_width
        for i in range(v):
            cur = i == layer
            if wide:
                t.append(" ")
                t.append(str(i + 1), Style(reverse=True, bold=True) if cur else _DIM)
            else:
                t.append("▮" if cur else "·", _BOLD if cur else _DIM)
        t.append(" ")
        t.append("final", Style(reverse=True, bold=True) if layer is None else _DIM)
        yield t


class MethodBar(Static):
    """Line 1: the method, its position among the methods, signed or not. Line 2 (only in stores with metrics): the
    current example's faithfulness metrics for this method. Last line: the layer ladder."""

    DEFAULT_CSS = "MethodBar { height: auto; min-height: 2; }"

    def show(self, info: MethodInfo, position: int, total: int, layer: int | None,
             values: dict[str, float] | None = None, metrics: RenderableType | None = None) -> None:
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append("method ", _DIM)
        t.append(info.name, Style(bold=True, underline=True))
        t.append(f" {position + 1}/{total}", _DIM)
        t.append("  signed" if info.signed else "  non-negative", _DIM)
        for key, value in (values or {}).items():  # e.g. IG's completeness delta of this example
            t.append(f"  {printable(key)} ", _DIM)
            t.append(f"{value:+.2e}")
        if info.description:
            t.append(f"  {info.description}", _DIM)
        lines = [t] if metrics is None else [t, metrics]
        self.update(Group(*lines, _LayerLadder(info, layer)))


class ColorBarView(Static):
    DEFAULT_CSS = "ColorBarView { height: 1; }"

    def show(self, scale: Scale, mode, glyphs: bool, top_k: int, scope: str = "") -> None:
        self.update(ColorBar(scale, mode, glyphs=glyphs, top_k=top_k, scope=scope))


class TokenView(VerticalScroll):
    """Scrollable token text (tab focuses it; arrows then scroll)."""

    DEFAULT_CSS = """
    TokenView { height: 1fr; border-top: solid $primary 40%; }
    TokenView > Static { width: 100%; }
    """

    def compose(self):
        yield Static(id="token-text")

    @property
    def body(self) -> Static:
        return self.query_one("#token-text", Static)

    def show_tokens(self, layout: TokenLayout) -> None:
        self.layout_data = layout
        self.body.update(layout)

    def show_message(self, message: str) -> None:
        self.layout_data = None
        self.body.update(Text(message, style=_DIM))
