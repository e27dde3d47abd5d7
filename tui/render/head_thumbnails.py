"""The head matrix screen's grid: every head's full attention matrix as a thumbnail, layers × heads (bertviz's model
view), as pure functions of one example's [L, H, n, n] (no Textual, no HDF5).

A thumbnail is the head's matrix block-averaged down to its cells (render/heatmap.py's block_mean: a cell is the
mean of its block) and drawn as the heatmap draws (two rows a line with half blocks in colour, one row a line with
glyphs without), each head on its own scale: 0 to its largest cell. The cursor's head is marked ▶ and its layer and
head labels reversed; the layers and heads that do not fit are the ones away from the cursor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from rich.style import Style
from rich.text import Text

from ..colors import DEFAULT_COLORMAP, Mode
from .attention_grid import CURSOR_MARK, LABEL_W, window
from .heatmap import half_block_lines

GRID_MAX_TOKENS = 64  # examples up to this long get the grid (a longer one's thumbnails would average away its rows)
MAX_CELLS = 16  # a thumbnail's columns at most
_DIM = Style(dim=True)
_BOLD = Style(bold=True)
_CURSOR_AXIS = Style(bold=True, reverse=True)


@dataclass(frozen=True)
class GridGeometry:
    """``cols`` cells and ``lines`` lines per thumbnail (``rows`` matrix rows drawn: two a line in colour), the
    heads and layers shown."""

    cols: int
    lines: int
    rows: int
    heads: range
    layers: range


def grid_geometry(n_layers: int, n_heads: int, n: int, width: int, height: int, layer: int, head: int, *,
                  mono: bool) -> GridGeometry:
    """The grid in ``width`` x ``height`` cells (the head numbers take a line): thumbnails as wide as the heads
    allow (a gap before each), about as tall as wide (a cell is two half-block rows high), fewer lines when the
    layers need them."""
    room = max(width - LABEL_W, 2)
    cols = max(1, min(MAX_CELLS, n, room // max(n_heads, 1) - 1))
    per_row = 1 if mono else 2
    lines = max(1, min(math.ceil(min(cols, n) / per_row), (height - 1) // max(n_layers, 1)))
    heads = window(n_heads, head, room // (cols + 1))
    layers = window(n_layers, layer, max(height - 1, 1) // lines)
    return GridGeometry(cols, lines, min(n, lines * per_row), heads, layers)


def thumbnails(heads: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """[L, H, n, n] -> [L, H, R, C] block means (R <= rows, C <= cols), each head scaled to [0, 1] by its largest
    cell (non-finite entries count as 0)."""
    x = np.nan_to_num(np.asarray(heads, np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    L, H, n, m = x.shape
    fr, fc = math.ceil(n / max(rows, 1)), math.ceil(m / max(cols, 1))
    R, C = math.ceil(n / fr), math.ceil(m / fc)
    padded = np.zeros((L, H, R * fr, C * fc))
    padded[..., :n, :m] = x
    ones = np.zeros((R * fr, C * fc))
    ones[:n, :m] = 1.0
    sums = padded.reshape(L, H, R, fr, C, fc).sum(axis=(3, 5))
    means = sums / np.maximum(ones.reshape(R, fr, C, fc).sum(axis=(1, 3)), 1.0)
    top = means.max(axis=(2, 3), keepdims=True)
    return np.divide(means, top, out=np.zeros_like(means), where=top > 0)


def grid_text(cells: np.ndarray, geom: GridGeometry, layer: int, head: int, mode: Mode,
              cmap: str = DEFAULT_COLORMAP) -> Text:
    """The head numbers, then ``geom.lines`` lines per shown layer: its label, and each shown head's thumbnail
    (``cells`` from :func:`thumbnails`) after a gap, the cursor's marked."""
    out = Text(" " * LABEL_W, no_wrap=True, overflow="crop")
    for h in geom.heads:
        label = str(h + 1)
        out.append(" ")
        out.append(label.ljust(geom.cols)[:geom.cols] if len(label) <= geom.cols else " " * geom.cols,
                   _CURSOR_AXIS if h == head else _DIM)
    blank = " " * geom.cols
    for l in geom.layers:
        drawn = {h: half_block_lines(cells[l, h], mode, signed=False, cmap=cmap) for h in geom.heads}
        for k in range(geom.lines):
            out.append("\n")
            out.append(f"L{l + 1}".ljust(LABEL_W - 1) if k == 0 else " " * (LABEL_W - 1),
                       _CURSOR_AXIS if l == layer and k == 0 else _DIM)
            out.append(" ")
            for h in geom.heads:
                cursor = (l, h) == (layer, head)
                out.append(CURSOR_MARK if cursor and k == 0 else "│" if mode == "mono" else " ",
                           _BOLD if cursor else _DIM)
                lines = drawn[h]
                if k < len(lines):
                    out.append_text(lines[k])
                    out.append(" " * (geom.cols - lines[k].cell_len))
                else:
                    out.append(blank)
    return out


def grid_info(ex_id: str, shape: tuple[int, int], n: int, geom: GridGeometry) -> Text:
    """The line above the grid: the example, the heads shown when not all fit, what a thumbnail is."""
    from .tokens import printable

    L, H = shape
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(printable(ex_id), _BOLD)
    t.append("  every head's matrix · ", _DIM)
    for k, (what, total, shown) in enumerate((("layers", L, geom.layers), ("heads", H, geom.heads))):
        sep = " × " if k else ""
        if len(shown) < total:
            t.append(f"{sep}{what} {shown.start + 1}-{shown.stop} of {total}", _BOLD)
        else:
            t.append(f"{sep}{total} {what}", _DIM)
    t.append(f" · {n}×{n} · each head 0 to its max", _DIM)
    return t
