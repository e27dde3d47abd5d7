"""The browse screen's layer strip widget (drawn by :mod:`tui.render.layer_strip`)."""

from __future__ import annotations

import numpy as np

from ..render.layer_strip import strip_text
from .rendered_lines import RenderedLines


class LayerStrip(RenderedLines):
    """Layers x tokens of the current method (:func:`tui.render.layer_strip.strip_text`): a line per layer view and
    one for the final scores, the current one marked; hidden for methods without layer views."""

    DEFAULT_CSS = "LayerStrip { height: auto; }"

    def show(self, views: np.ndarray | None, final: np.ndarray, layer: int | None, signed: bool, mode, *,
             rows: int, cmap: str = "dark") -> None:
        if views is None or not len(views):
            self.display = False
            return
        self.display = True
        lines = np.vstack([np.asarray(views, np.float64), np.asarray(final, np.float64)[None, :]])
        labels = [f"L{i + 1}" for i in range(len(views))] + ["final"]
        current = len(views) if layer is None else layer
        self.show_content(lambda width: strip_text(lines, labels, current, signed, mode, width=max(width, 20), rows=rows,
                                                label_w=7, cmap=cmap))
