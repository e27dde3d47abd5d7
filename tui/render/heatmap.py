"""Token-to-token matrices in a terminal (pure: numpy and rich only).

A matrix is first block-averaged down to the cells available (:func:`block_mean`: each output cell is the mean of
the entries of its block; blocks at the edges may be smaller, and the count-weighted mean of the cells equals the
mean of the matrix). When its rows fit the lines, each line draws one row: a cell is its colour as a background
(:func:`full_cell_lines`). Otherwise a line draws two rows with the upper half block "▀": the foreground colour is
the upper row, the background the lower one (:func:`half_block_lines`). Without colour a line holds one row, drawn
with the glyph ramp. :func:`heatmap_lines` picks one of these.
"""

from __future__ import annotations

import math

import numpy as np
from rich.style import Style
from rich.text import Text

from ..colors import DEFAULT_COLORMAP, Mode, background, glyph, sign_mark, token_style

UPPER_HALF = "▀"
CURSOR_MARK = "●"  # the cursor's cell when a line draws one row: on the cell's own colour, or reversed without colour
CURSOR_STYLE = Style(reverse=True, bold=True)
NO_VALUE_MARK = "·"  # a cell without a value, drawn without colour


def block_factor(n: int, room: int) -> int:
    """The smallest block size that fits ``n`` entries into ``room`` cells."""
    return max(1, math.ceil(n / max(room, 1)))


def block_mean(m: np.ndarray, fr: int, fc: int) -> tuple[np.ndarray, np.ndarray]:
    """Block means of ``m`` over blocks of ``fr`` x ``fc`` entries, and the number of entries of each block.
    Non-finite entries count as 0 (a NaN never paints a whole block)."""
    m = np.nan_to_num(np.asarray(m, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    r, c = m.shape
    R, C = math.ceil(r / fr), math.ceil(c / fc)
    padded = np.zeros((R * fr, C * fc))
    padded[:r, :c] = m
    ones = np.zeros_like(padded)
    ones[:r, :c] = 1.0
    sums = padded.reshape(R, fr, C, fc).sum(axis=(1, 3))
    counts = ones.reshape(R, fr, C, fc).sum(axis=(1, 3))
    return sums / np.maximum(counts, 1), counts


def block_nanmean(m: np.ndarray, fr: int, fc: int) -> np.ndarray:
    """Block means of ``m`` over its finite entries only; NaN for a block without any (a generation heatmap's cells
    after each step's target, which carry no attribution, stay blank instead of averaging in as 0)."""
    m = np.asarray(m, dtype=np.float64)
    finite = np.isfinite(m)
    means, counts = block_mean(np.where(finite, m, 0.0), fr, fc)
    share, _ = block_mean(finite.astype(np.float64), fr, fc)  # the finite fraction of each block
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(share > 0, means / share, np.nan)


def half_block_lines(values: np.ndarray, mode: Mode, *, cursor: tuple[int, int] | None = None,
                     cell_width: int = 1, signed: bool = True, cmap: str = DEFAULT_COLORMAP) -> list[Text]:
    """Lines drawing normalised ``values`` [R, C] (in [-1, 1] or [0, 1]): two rows per line in colour modes, one
    per line (glyphs) without colour. The cell at ``cursor`` (row, column) is a bright marker in colour, and
    :data:`CURSOR_MARK` in reverse video without."""
    v = np.asarray(values, dtype=np.float64)
    R, C = v.shape if v.ndim == 2 else (0, 0)
    lines: list[Text] = []
    if mode == "mono":
        for r in range(R):
            t = Text(no_wrap=True, overflow="crop")
            for c in range(C):
                x = v[r, c]
                if not np.isfinite(x):  # no value (block_nanmean): a dim dot, apart from the blank of the lowest fifth
                    if cursor == (r, c):
                        t.append(CURSOR_MARK.center(cell_width), CURSOR_STYLE)
                    else:
                        t.append(NO_VALUE_MARK.center(cell_width), Style(dim=True))
                    continue
                if cell_width == 1:
                    ch = sign_mark(x) if x < 0 else glyph(x)  # a negative cell shows its sign, not its size
                else:
                    ch = sign_mark(x) + glyph(x) if signed else glyph(x) * cell_width
                if cursor == (r, c):  # the mark: a reversed blank shows nothing where reverse video does not
                    t.append(CURSOR_MARK.center(cell_width), CURSOR_STYLE)
                else:
                    t.append(ch.ljust(cell_width)[:cell_width])
            lines.append(t)
        return lines
    for r0 in range(0, R, 2):
        t = Text(no_wrap=True, overflow="crop")
        for c in range(C):
            top = background(v[r0, c], mode, cmap)
            bottom = background(v[r0 + 1, c], mode, cmap) if r0 + 1 < R else None
            style = Style(color=top, bgcolor=bottom)
            glyph_ = UPPER_HALF
            if top is None:  # no upper value: its half blank, the lower one drawn as the background
                glyph_ = " "
            if cursor is not None and cursor[1] == c and cursor[0] in (r0, r0 + 1):
                # the cursor's half becomes a bright marker so the cell stays visible on any colour
                mark = "black" if cmap == "light" else "white"  # the colour farthest from the map's zero
                style = Style(color=mark if cursor[0] == r0 else top, bgcolor=mark if cursor[0] != r0 else bottom,
                              bold=True)
                glyph_ = UPPER_HALF
            t.append(glyph_ * cell_width, style)
        lines.append(t)
    return lines


def full_cell_lines(values: np.ndarray, mode: Mode, *, cursor: tuple[int, int] | None = None, cell_width: int = 1,
                    cmap: str = DEFAULT_COLORMAP) -> list[Text]:
    """Lines drawing normalised ``values`` [R, C] one row per line in a colour mode: each cell its colour as the
    background of ``cell_width`` blanks; the cell at ``cursor`` keeps its colour and shows :data:`CURSOR_MARK` in
    black or white, whichever reads on it."""
    v = np.asarray(values, dtype=np.float64)
    R, C = v.shape if v.ndim == 2 else (0, 0)
    lines = []
    for r in range(R):
        t = Text(no_wrap=True, overflow="crop")
        for c in range(C):
            if cursor == (r, c):
                t.append(CURSOR_MARK.center(cell_width), token_style(v[r, c], mode, cmap=cmap) + Style(bold=True))
            else:
                t.append(" " * cell_width, Style(bgcolor=background(v[r, c], mode, cmap)))
        lines.append(t)
    return lines


def heatmap_lines(values: np.ndarray, mode: Mode, *, per_line: int, cursor: tuple[int, int] | None = None,
                  cell_width: int = 1, signed: bool = True, cmap: str = DEFAULT_COLORMAP) -> list[Text]:
    """The heatmap's lines: ``per_line`` rows a line in colour (1: full cells, 2: half blocks); one row a line with
    glyphs without colour."""
    if mode != "mono" and per_line == 1:
        return full_cell_lines(values, mode, cursor=cursor, cell_width=cell_width, cmap=cmap)
    return half_block_lines(values, mode, cursor=cursor, cell_width=cell_width, signed=signed, cmap=cmap)
