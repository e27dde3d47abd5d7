"""The colour bar above the tokens: the scale's ends and middle, the normalisation, the top-k note."""

from __future__ import annotations

from ..colors import Scale
from ..render.tokens import ColorBar
from .rendered_lines import RenderedLines


class ColorBarView(RenderedLines):
    DEFAULT_CSS = "ColorBarView { height: 1; }"

    def show(self, scale: Scale, mode, glyphs: bool, top_k: int, scope: str = "", cmap: str = "dark",
             clipped: str = "") -> None:
        self.show_content(ColorBar(scale, mode, glyphs=glyphs, top_k=top_k, scope=scope, cmap=cmap, clipped=clipped).line)
