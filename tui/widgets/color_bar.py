"""The colour bar above the tokens: the scale's ends and middle, the normalisation, the top-k note."""

from __future__ import annotations

from textual.widgets import Static

from ..colors import Scale
from ..render.tokens import ColorBar
from .laid_out_once import LaidOutOnce



class ColorBarView(LaidOutOnce, Static):
    DEFAULT_CSS = "ColorBarView { height: 1; }"

    def show(self, scale: Scale, mode, glyphs: bool, top_k: int, scope: str = "", cmap: str = "dark",
             clipped: str = "") -> None:
        self.update(ColorBar(scale, mode, glyphs=glyphs, top_k=top_k, scope=scope, cmap=cmap, clipped=clipped))
