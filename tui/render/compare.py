"""Methods side by side: token rows aligned column by column, and the difference of two methods (pure: rich only).

Every method's row shows the same tokens, so a column holds one token for every method and is as wide as the token's
widest rendering (glyph prefixes differ by sign). Columns are packed into blocks that fit the width; each block shows
one line per method, labelled with the method's name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rich.cells import cell_len, set_cell_size
from rich.style import Style
from rich.text import Text

from ..colors import DEFAULT_COLORMAP, Mode, Scale, normalize, normalize_within, top_k
from .tokens import JOIN_MARK, ColorBar, token_cells

_LABEL = Style(bold=True)
DIFFERENCE = "A−B"  # the difference view's row: a bar of its own


@dataclass(frozen=True)
class Row:
    name: str
    scale: Scale
    raw: np.ndarray  # the scores before normalisation (top-k marks come from them)


def scales(rows: dict[str, np.ndarray], signed: dict[str, bool], shared: bool,
           keep: dict[str, np.ndarray | None] | None = None) -> dict[str, Scale]:
    """One :class:`Scale` per method: each by its own range, or (``shared``) all by the largest |score| of them
    (when any is signed) or their joint min..max, so that colours compare across methods of the same units.
    ``keep[m]``: the tokens that set method m's scale (colors.SCALE_TOKENS; None: all)."""
    keep = keep or {}
    if not shared:
        return {m: normalize(s, signed[m], keep.get(m)) for m, s in rows.items()}
    kept = [np.asarray(s, np.float64)[: len(keep[m])][keep[m][: len(s)]] if keep.get(m) is not None
            else np.asarray(s, np.float64) for m, s in rows.items()]
    finite = [s[np.isfinite(s)] for s in kept]
    every = np.concatenate(finite) if finite else np.zeros(0)
    if any(signed.values()):
        big = float(np.abs(every).max()) if every.size else 0.0
        return {m: normalize_within(s, True, None, big) for m, s in rows.items()}
    lo, hi = (float(every.min()), float(every.max())) if every.size else (0.0, 0.0)
    return {m: normalize_within(s, False, lo, hi) for m, s in rows.items()}


def difference(a: Scale, b: Scale) -> Scale:
    """A minus B of two normalised views, on a diverging scale of its own largest |difference|."""
    d = np.asarray(a.values, np.float64) - np.asarray(b.values, np.float64)
    finite = np.isfinite(d)  # a token without a value in either (a generation step's later tokens) has none
    big = float(np.abs(d[finite]).max()) if finite.any() else 0.0
    values = np.clip(d / big, -1, 1) if big > 0 else np.where(finite, 0.0, np.nan)
    return Scale(values, -big, big, True)


def aligned_blocks(tokens: list[str], rows: list[Row], width: int, mode: Mode, *, glyphs: bool, k: int,
                   explained: int = -1, cmap: str = DEFAULT_COLORMAP, explained_end: int = -1) -> list[Text]:
    """Lines of aligned token rows: for each block of columns that fits ``width``, one line per method
    (``explained``, ``explained_end``: token_cells' marks of the explained position and a qa span's end)."""
    if not rows:
        return []
    label_w = min(max(cell_len(r.name) for r in rows), 14) + 1
    cells = [token_cells(tokens, r.scale, mode, glyphs=glyphs, top=top_k(r.raw, r.scale.signed, k, explained),
                         explained=explained, cmap=cmap, explained_end=explained_end) for r in rows]
    col_w = [max(cell_len(c[i].text) + c[i].joined for c in cells) for i in range(len(tokens))]
    room = max(width - label_w, 4)
    blocks, start, used = [], 0, 0
    for i, w in enumerate(col_w):
        if used and used + w + 1 > room:
            blocks.append((start, i))
            start, used = i, 0
        used += w + 1
    blocks.append((start, len(tokens)))
    lines: list[Text] = []
    for b0, b1 in blocks:
        for r, row_cells in zip(rows, cells):
            t = Text(no_wrap=True, overflow="crop")
            t.append(set_cell_size(r.name, label_w - 1) + " ", _LABEL)
            for i in range(b0, b1):
                cell = row_cells[i]
                shown = JOIN_MARK + cell.text if cell.joined else cell.text  # a word's pieces stay visibly one word
                t.append(set_cell_size(shown, col_w[i]), cell.style)
                t.append(" ")
            lines.append(t)
        lines.append(Text(""))
    return lines[:-1]


def legend_lines(rows: list[Row], width: int, mode: Mode, *, glyphs: bool, k: int, cmap: str = DEFAULT_COLORMAP,
                 clipped: str = "") -> list[Text]:
    """The colour bars of the drawn rows, one per ramp they are drawn with: a signed method's diverging one, a
    non-negative method's sequential one (and the difference's), each labelled with its methods when there are
    several bars. A bar that stands for several scales shows words at its ends (the table's "scale" column has each
    method's numbers); the first bar carries the clip legend and top-k."""
    groups: dict[object, list[Row]] = {}
    for r in rows:
        groups.setdefault(DIFFERENCE if r.name == DIFFERENCE else r.scale.signed, []).append(r)
    names = [", ".join(r.name for r in rs) for rs in groups.values()]
    label_w = min(max(cell_len(n) for n in names), max(width // 3, 4)) + 1 if len(groups) > 1 else 0
    lines = []
    for n, rs in enumerate(groups.values()):
        signed = rs[0].scale.signed
        label = set_cell_size(names[n], label_w - 1) + " " if label_w else ""  # the bars start at one column
        several = len({(r.scale.lo, r.scale.hi) for r in rs}) > 1
        ends = (("−max", "+max") if signed else ("min", "max")) if several else None
        bar = ColorBar(rs[0].scale, mode, glyphs=glyphs, top_k=0 if n else k, cmap=cmap, ends=ends,
                       clipped="" if n else clipped)
        line = Text(label, _LABEL, no_wrap=True, overflow="crop")
        line.append_text(bar.render(max(width - cell_len(label), 12)))
        lines.append(line)
    return lines
