"""The layer strip: one line per layer view of a method (layers x tokens), one coloured cell per token, the current
layer marked (pure: numpy and rich only).

Every line is drawn on one scale (the strip's own, over all its lines), so a token that brightens from layer to layer
shows as a column that brightens. When the tokens do not fit the width, columns are block means of neighbouring
tokens (the heatmap's downsampling); when they fit easily, each token gets up to three cells. With more lines than
room, the lines around the current one are shown, with ↑ / ↓ after the label where lines are left out.
"""

from __future__ import annotations

import numpy as np
from rich.style import Style
from rich.text import Span, Text

from ..colors import DEFAULT_COLORMAP, Mode, background_styles, glyph, normalize_within
from .heatmap import block_factor, block_mean

CURRENT_MARK = "▶"
_DIM = Style(dim=True)


def strip_geometry(n: int, width: int) -> tuple[int, int]:
    """(block factor, cells per column) for n tokens in ``width`` cells."""
    f = block_factor(n, max(width, 1))
    cw = max(1, min(3, width // max(n, 1))) if f == 1 else 1
    return f, cw


def window(total: int, current: int, rows: int) -> range:
    """The ``rows`` consecutive lines of ``total`` that keep ``current`` in view, near the middle."""
    rows = max(1, min(rows, total))
    lo = max(0, min(current - rows // 2, total - rows))
    return range(lo, lo + rows)


def strip_text(lines: np.ndarray, labels: list[str], current: int | None, signed: bool, mode: Mode, *, width: int,
               rows: int, label_w: int = 8, f: int | None = None, cw: int | None = None,
               cmap: str = DEFAULT_COLORMAP) -> Text:
    """Draw ``lines`` [V, n] (one row of scores per label) in ``width`` cells after a ``label_w``-cell label;
    ``current`` (a row index, or None) is marked with :data:`CURRENT_MARK` and bold. ``f``/``cw`` force the
    columns' geometry (the matrix screen aligns the strip with its heatmap)."""
    lines = np.asarray(lines, np.float64)
    V, n = lines.shape
    room = max(width - label_w, 1)
    if f is None or cw is None:
        f, cw = strip_geometry(n, room)
    cells, _ = block_mean(lines, 1, f)
    vals = normalize_within(cells, signed).values.reshape(cells.shape)
    shown = window(V, V - 1 if current is None else current, rows)
    styles = None if mode == "mono" else background_styles(vals[shown.start:shown.stop], mode, cmap)
    # the text and its spans as Text.append makes them, one span per cell, without a call per cell
    plain: list[str] = []
    spans: list[Span] = []
    at = 0

    def put(text: str, style: Style) -> None:
        nonlocal at
        plain.append(text)
        if style:  # as Text.append: a null style (no colour for a non-finite value) makes no span
            spans.append(Span(at, at + len(text), style))
        at += len(text)

    for k, r in enumerate(shown):
        cur = r == current
        label = f"{CURRENT_MARK if cur else ' '}{labels[r]}"
        # lines left out above or below the window: marked after the first or the last label shown
        above, below = k == 0 and shown.start > 0, k == len(shown) - 1 and shown.stop < V
        mark = "↕" if above and below else "↑" if above else "↓" if below else " "
        put(label[:label_w - 1].ljust(label_w - 1), Style(bold=True) if cur else _DIM)
        put(mark, Style(bold=True) if mark != " " else _DIM)
        if styles is None:
            bold = Style(bold=cur)
            for x in vals[r]:
                put(glyph(x) * cw, bold)
        else:
            cell = " " * cw
            for style in styles[k * len(vals[r]):(k + 1) * len(vals[r])]:
                put(cell, style)
        if k < len(shown) - 1:
            plain.append("\n")
            at += 1
    out = Text("".join(plain), no_wrap=True, overflow="crop")
    out.spans = spans
    return out
