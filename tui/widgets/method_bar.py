"""The method bar: the method, its per-example values and metrics, and (without the layer strip) a layer ladder."""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.style import Style
from rich.text import Text

from ..data import MethodInfo
from ..render.tokens import printable
from .rendered_lines import RenderedLines

_DIM = Style(dim=True)
_BOLD = Style(bold=True)


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


class MethodBar(RenderedLines):
    """Line 1 (wrapped): the method, its position among the methods, signed or not, its description. Next (only in
    stores with metrics): the
    current example's faithfulness metrics for this method. Last line: the layer ladder, unless the layer strip
    shows the layers."""

    DEFAULT_CSS = "MethodBar { height: auto; }"
    FITTED = False

    def show(self, info: MethodInfo, position: int, total: int, layer: int | None,
             values: dict[str, float] | None = None, metrics: RenderableType | None = None, *,
             ladder: bool = True) -> None:
        t = Text()  # wraps: the description continues on the next line where the line is short
        t.append("method ", _DIM)
        t.append(info.name, Style(bold=True, underline=True))
        t.append(f" {position + 1}/{total}", _DIM)
        t.append("  signed" if info.signed else "  non-negative", _DIM)
        if not ladder and info.n_layer_views:  # the strip marks the layer; its number is said here
            t.append("  " + ("final" if layer is None else f"layer {layer + 1}/{info.n_layer_views}"), _BOLD)
        for key, value in (values or {}).items():  # e.g. IG's completeness delta of this example
            t.append(f"  {printable(key)} ", _DIM)
            t.append(f"{value:+.2e}")
        if info.description:
            t.append(f"  {info.description}", _DIM)
        lines = [t] if metrics is None else [t, metrics]
        if ladder:  # the layer strip below shows the layers otherwise
            lines.append(_LayerLadder(info, layer))
        group = Group(*lines)
        self.show_content(lambda width: group)
