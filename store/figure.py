"""One example's tokens coloured by several methods, one row per method: the description that every figure format
draws (tui/export.py: SVG, LaTeX; store/render_html.py: HTML files and the notebooks' views). Colours are the TUI's
truecolor ramps (store/palette.py), so a figure looks like the screen. Pure: numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .palette import DEFAULT_COLORMAP, Scale, clip_legend, clip_mark, lightness, rgb, rgb_many
from .text import printable

BAR_STEPS = 11
EXPLAINED_MARK = "▸"  # before the explained token, as on the screen


def hex_colour(value: float, cmap: str) -> str | None:
    """"#rrggbb" of a normalised value in ``cmap``; None for a non-finite value."""
    c = rgb(value, cmap)
    return None if c is None else "#%02x%02x%02x" % c


@dataclass(frozen=True)
class Figure:
    example_id: str
    tokens: list[str]
    rows: list[tuple[str, Scale]]  # (method, normalised scores), in display order
    explained: int = -1
    note: str = ""  # e.g. "scale per method" or the store name
    cmap: str = DEFAULT_COLORMAP  # palette.COLORMAPS: the screen's, so the figure looks like it

    def cells(self):
        """(method, [(token text, joined to the previous, "#rrggbb" background, dark text?)]) per row; the text of a
        token beyond its row's scale ends in its clip mark (palette.CLIP_MARKS)."""
        out = []
        for name, scale in self.rows:
            row = []
            colours = rgb_many([float(scale.values[i]) if i < len(scale.values) else 0.0
                                for i in range(len(self.tokens))], self.cmap)  # at once: a long example's
            for i, tok in enumerate(self.tokens):
                joined = i > 0 and tok.startswith("##") and len(tok) > 2
                colour = colours[i]
                row.append((printable(tok[2:] if joined else tok) + clip_mark(scale, i), joined,
                            "#%02x%02x%02x" % colour if colour else "#ffffff",
                            colour is None or lightness(colour) > 60))
            out.append((name, row))
        return out

    def bars(self) -> list[tuple[str, Scale]]:
        """The colour bars to draw: one when every row has the same scale, else one per method, named."""
        ends = {(float(sc.lo), float(sc.hi), sc.signed) for _, sc in self.rows}
        return [("", self.rows[0][1])] if len(ends) == 1 else list(self.rows)

    def legend(self, scale: Scale) -> str:
        """The legend of the clip marks the rows drawn with the bar of ``scale`` carry (one bar: every row's)."""
        bars = self.bars()
        return clip_legend([sc for _, sc in self.rows] if len(bars) == 1 and not bars[0][0] else [scale])

    def bar(self, scale: Scale) -> list[tuple[float, str]]:
        """(value, colour) steps of the colour bar of ``scale`` from its low end to its high end."""
        vs = np.linspace(-1.0 if scale.signed else 0.0, 1.0, BAR_STEPS)
        return [(float(v), hex_colour(float(v), self.cmap)) for v in vs]
