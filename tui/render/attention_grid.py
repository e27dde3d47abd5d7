"""What the attention screen draws, as pure functions of one example's per-head attention rows (no Textual, no HDF5).

The grid is bertviz's model view in cells: one line per layer, one thumbnail per head, each thumbnail the explained
token's attention row over the tokens, left to right. When the tokens outnumber a thumbnail's columns, a column is
the largest weight of its block of neighbouring tokens (a peak stays visible; a mean would hide it). With colour a
column is a background on the colormap's non-negative ramp; without (NO_COLOR, mono) it is a bar of the sparkline
ramp, so the shape reads without hue. When the heads or layers do not fit, the ones around the cursor are shown and
the info line says which.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from rich.style import Style
from rich.text import Span, Text

from ..colors import DEFAULT_COLORMAP, Mode, background, format_score
from .tokens import printable

NORMS = ("head", "example")
NORM_NAMES = {"head": "each head its own maximum", "example": "one scale over every head of the example"}
SPARK = " ▁▂▃▄▅▆▇█"  # mono: blank for (almost) nothing, then eighths of the scale
CURSOR_MARK = "▶"
LABEL_W = 4  # "L12 "
MAX_CELL = 16  # columns of a thumbnail at most (wider ones tell nothing more)
MIN_CELL = 2
LEVELS = 64  # steps of a thumbnail's colour scale (and the sparkline's input): finer than the eye tells apart
TOP_TOKENS = 5

_DIM = Style(dim=True)
_BOLD = Style(bold=True)
_CURSOR_AXIS = Style(bold=True, reverse=True)


@dataclass(frozen=True)
class Geometry:
    """How the grid fits: ``cell`` columns per thumbnail, ``per`` tokens per column, the heads and layers shown."""

    cell: int
    per: int
    heads: range
    layers: range


def window(total: int, current: int, room: int) -> range:
    """The ``room`` consecutive indices of ``total`` that keep ``current`` in view, near the middle."""
    room = max(1, min(room, total))
    lo = max(0, min(current - room // 2, total - room))
    return range(lo, lo + room)


def geometry(n_layers: int, n_heads: int, n_tokens: int, width: int, height: int, layer: int, head: int) -> Geometry:
    """The grid's layout in ``width`` x ``height`` cells (the head numbers take one line), the cursor at
    (``layer``, ``head``) kept in view."""
    room = max(width - LABEL_W, 1)
    cell = max(min(MAX_CELL, n_tokens, room // max(n_heads, 1) - 1), min(MIN_CELL, n_tokens), 1)
    per = math.ceil(n_tokens / cell)
    cell = math.ceil(n_tokens / per)  # no column left empty
    heads = window(n_heads, head, room // (cell + 1))
    layers = window(n_layers, layer, height - 1)
    return Geometry(cell, per, heads, layers)


def thumbnails(rows: np.ndarray, per: int, norm: str) -> np.ndarray:
    """[L, H, n] attention rows -> [L, H, ceil(n / per)] columns in [0, 1]: block maxima, on the scale ``norm``."""
    x = np.nan_to_num(np.asarray(rows, np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    L, H, n = x.shape
    cols = math.ceil(n / per)
    padded = np.zeros((L, H, cols * per))
    padded[..., :n] = x
    blocks = padded.reshape(L, H, cols, per).max(axis=-1)
    top = blocks.max(axis=-1, keepdims=True) if norm == "head" else np.full((1, 1, 1), blocks.max(initial=0.0))
    return np.clip(np.divide(blocks, top, out=np.zeros_like(blocks), where=top > 0), 0.0, 1.0)


def spark(value: float) -> str:
    """The sparkline glyph of a value in [0, 1]."""
    return SPARK[min(len(SPARK) - 1, max(0, int(round(float(value) * (len(SPARK) - 1)))))]


def grid_text(cells: np.ndarray, geom: Geometry, layer: int, head: int, mode: Mode,
              cmap: str = DEFAULT_COLORMAP) -> Text:
    """The head numbers, then one line per shown layer: its label and a thumbnail per shown head, the cursor's
    marked by :data:`CURSOR_MARK` and its layer and head labels reversed. Built as one string with its spans (a
    12 x 12 grid has over 700 cells; appending them one by one cost more than the 50 ms a key may take)."""
    parts: list[str] = []
    spans: list[Span] = []
    at = 0

    def put(text: str, style: Style | None = None) -> None:
        nonlocal at
        parts.append(text)
        if style is not None:
            spans.append(Span(at, at + len(text), style))
        at += len(text)

    levels = np.rint(np.clip(cells, 0.0, 1.0) * (LEVELS - 1)).astype(np.int64)
    put(" " * LABEL_W)
    for h in geom.heads:
        label = str(h + 1)
        put(" ")
        put(label.ljust(geom.cell)[:geom.cell] if len(label) <= geom.cell else " " * geom.cell,
            _CURSOR_AXIS if h == head else _DIM)
    for l in geom.layers:
        put("\n")
        put(f"L{l + 1}".ljust(LABEL_W - 1), _CURSOR_AXIS if l == layer else _DIM)
        put(" ")
        for h in geom.heads:
            cursor = (l, h) == (layer, head)
            # without colour a blank column and the gap between cells look alike: a rule separates them
            put(CURSOR_MARK if cursor else "│" if mode == "mono" else " ", _BOLD if cursor else _DIM)
            if mode == "mono":
                put("".join(spark(v / (LEVELS - 1)) for v in levels[l, h]), _BOLD if cursor else None)
            else:
                for v in levels[l, h]:
                    put(" ", _cell_style(int(v), mode, cmap))
    return Text("".join(parts), spans=spans, no_wrap=True, overflow="crop")


@functools.lru_cache(maxsize=1024)
def _cell_style(level: int, mode: Mode, cmap: str) -> Style:
    """The background of a thumbnail column at ``level`` of :data:`LEVELS` (made once per level and colormap)."""
    return Style(bgcolor=background(level / (LEVELS - 1), mode, cmap))


def info_text(ex_id: str, tokens: list[str], explain_pos: int, shape: tuple[int, int], geom: Geometry,
              norm: str, width: int) -> Text:
    """The line above the grid (cut to ``width`` with "…"): the example, whose row the cells show, the model's
    shape, the layers and heads shown when not all fit."""
    L, H = shape
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(printable(ex_id), _BOLD)
    t.append(f"  row of ▸{printable(tokens[explain_pos])} · ", _DIM)
    for k, (what, total, shown) in enumerate((("layers", L, geom.layers), ("heads", H, geom.heads))):
        sep = " × " if k else ""
        if len(shown) < total:  # the rest scrolls into view with the cursor
            t.append(f"{sep}{what} {shown.start + 1}-{shown.stop} of {total}", _BOLD)
        else:
            t.append(f"{sep}{total} {what}", _DIM)
    t.append(f" · {len(tokens)} tokens · scale: {norm}", _DIM)
    t.truncate(max(width, 1), overflow="ellipsis")
    return t


def detail_text(rows: np.ndarray, tokens: list[str], explain_pos: int, layer: int, head: int, geom: Geometry,
                norm: str, width: int) -> Text:
    """Two lines, each cut to ``width`` with "…": the cursor head's largest weights (token and probability), then
    how to read a cell."""
    row = np.nan_to_num(np.asarray(rows[layer, head], np.float64))
    order = np.argsort(-row, kind="stable")[:TOP_TOKENS]
    t = Text()
    t.append(f"L{layer + 1} H{head + 1}", _BOLD)
    t.append(f"  ▸{printable(tokens[explain_pos])} → ", _DIM)
    for k, i in enumerate(order):
        if k:
            t.append(" · ", _DIM)
        t.append(printable(tokens[int(i)]), _BOLD)
        t.append(f" {format_score(float(row[i]))}")
    per = f", {geom.per} a column (their max)" if geom.per > 1 else ""
    how = Text(f"a cell: the row, tokens left to right{per} · scale: {NORM_NAMES[norm]} (s)", _DIM)
    for line in (t, how):
        line.truncate(max(width, 1), overflow="ellipsis")
    return Text("\n").join([t, how])
