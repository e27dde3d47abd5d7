"""The layer strip's cells coloured at once (tui.colors.background_styles, store.palette.rgb_many): the same colours
as the cell-by-cell rule (background, rgb) in every mode and colormap, non-finite values and -0.0 included."""

from __future__ import annotations

import numpy as np
import pytest
from rich.style import Style

from store.palette import rgb, rgb_many
from tui.colors import COLORMAPS, MODES, background, background_styles

VALUES = np.r_[np.linspace(-1.2, 1.2, 241), -0.0, 0.05, -0.05, 0.15, 0.25, 0.35, np.nan, np.inf, -np.inf,
               np.random.default_rng(3).uniform(-1, 1, 200)]


@pytest.mark.parametrize("cmap", list(COLORMAPS))
def test_rgb_many_is_rgb_of_each_value(cmap):
    assert rgb_many(VALUES, cmap) == [rgb(v, cmap) for v in VALUES]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cmap", list(COLORMAPS))
def test_background_styles_are_the_cell_by_cell_styles(mode, cmap):
    assert background_styles(VALUES, mode, cmap) == [Style(bgcolor=background(v, mode, cmap)) for v in VALUES]


def _strip_cell_by_cell(lines, labels, current, signed, mode, *, width, rows, label_w, cmap):
    """strip_text as it was built before (Text.append per cell, background per cell): the reference."""
    from rich.text import Text

    from tui.colors import glyph, normalize_within
    from tui.render.heatmap import block_mean
    from tui.render.layer_strip import CURRENT_MARK, strip_geometry, window

    V, n = lines.shape
    f, cw = strip_geometry(n, max(width - label_w, 1))
    cells, _ = block_mean(lines, 1, f)
    vals = normalize_within(cells, signed).values.reshape(cells.shape)
    out = Text(no_wrap=True, overflow="crop")
    shown = window(V, V - 1 if current is None else current, rows)
    dim = Style(dim=True)
    for k, r in enumerate(shown):
        cur = r == current
        label = f"{CURRENT_MARK if cur else ' '}{labels[r]}"
        above, below = k == 0 and shown.start > 0, k == len(shown) - 1 and shown.stop < V
        mark = "↕" if above and below else "↑" if above else "↓" if below else " "
        out.append(label[:label_w - 1].ljust(label_w - 1), Style(bold=True) if cur else dim)
        out.append(mark, Style(bold=True) if mark != " " else dim)
        for x in vals[r]:
            if mode == "mono":
                out.append(glyph(x) * cw, Style(bold=cur))
            else:
                out.append(" " * cw, Style(bgcolor=background(x, mode, cmap)))
        if k < len(shown) - 1:
            out.append("\n")
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("signed", [False, True])
def test_the_strip_is_the_cell_by_cell_strip(mode, signed):
    from tui.render.layer_strip import strip_text

    rng = np.random.default_rng(7)
    for V, n, current, rows, width in ((7, 30, 6, 7, 44), (13, 200, 3, 5, 60), (4, 9, None, 4, 80)):
        lines = rng.normal(size=(V, n)) if signed else rng.random((V, n))
        lines[0, 2] = np.nan
        labels = [f"L{i}" for i in range(1, V)] + ["final"]
        got = strip_text(lines, labels, current, signed, mode, width=width, rows=rows, label_w=7, cmap="light")
        want = _strip_cell_by_cell(lines, labels, current, signed, mode, width=width, rows=rows, label_w=7,
                                   cmap="light")
        assert got.plain == want.plain
        assert got.spans == want.spans


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cmap", list(COLORMAPS))
def test_token_styles_are_token_style_of_each_token(mode, cmap):
    from tui.colors import token_style, token_styles

    top = {0, 5, 17, len(VALUES) - 1}
    assert token_styles(VALUES, mode, top, cmap) == [token_style(v, mode, top=i in top, cmap=cmap)
                                                     for i, v in enumerate(VALUES)]
