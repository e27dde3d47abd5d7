"""Rich renderables for the token view and the colour bar (pure: no Textual, no HDF5).

Token text is always appended as data (``Text.append``), never parsed as markup: a token ``[bold]`` shows as is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.style import Style
from rich.text import Text

from store.figure import EXPLAINED_MARK
from store.text import printable, printable_text  # noqa: F401 (shown as the HTML views show them; re-exported)

from ..colors import (DEFAULT_COLORMAP, GLYPHS, Mode, Scale, clip_mark, format_score, glyph, sign_mark, token_style,
                      token_styles)

JOIN_MARK = "·"  # drawn between a WordPiece "##" continuation and the piece before it
_JOIN_STYLE = Style(dim=True)
_NO_VALUE = Style(dim=True)  # a token without an attribution in the shown view


@dataclass(frozen=True)
class TokenCell:
    text: str  # what is drawn (glyph prefix included)
    style: Style
    joined: bool  # a "##" continuation: drawn after JOIN_MARK instead of a space


# EXPLAINED_MARK (store.figure's, imported above) goes before the token whose prediction is explained: a shape, it
# survives NO_COLOR
SPAN_END_MARK = "◂"  # after the last token of an explained qa answer span (EXPLAINED_MARK is before its first)


def token_cells(tokens: list[str], scale: Scale, mode: Mode, *, glyphs: bool, top: set[int],
                explained: int = -1, cmap: str = DEFAULT_COLORMAP, explained_end: int = -1) -> list[TokenCell]:
    """One cell per token, styled by its normalised score. With ``glyphs`` every token is prefixed by its sign
    mark (signed methods) and its magnitude glyph, which is how NO_COLOR output keeps sign and size. The explained
    token carries :data:`EXPLAINED_MARK`; ``explained_end`` (a qa span's end) :data:`SPAN_END_MARK` after it; a
    token beyond the scale (drawn at its end) its clip mark (palette.CLIP_MARKS). A token without a value (NaN: a
    generation step's tokens from its target on, palette.cut_after) is drawn without colour and glyph, dim (the
    explained one bold)."""
    cells = []
    values = [float(scale.values[i]) if i < len(scale.values) else 0.0 for i in range(len(tokens))]
    styles = token_styles(values, mode, top, cmap)
    for i, tok in enumerate(tokens):
        v = values[i]
        joined = i > 0 and tok.startswith("##") and len(tok) > 2
        shown = printable(tok[2:] if joined else tok)
        if not np.isfinite(v):
            shown = (EXPLAINED_MARK if i == explained else "") + shown
            cells.append(TokenCell(shown, Style(bold=True) if i == explained else _NO_VALUE, joined))
            continue
        if glyphs:
            shown = (sign_mark(v) if scale.signed else "") + glyph(v) + shown
        if i == explained:
            shown = EXPLAINED_MARK + shown
        if i == explained_end:
            shown += SPAN_END_MARK
        shown += clip_mark(scale, i)  # beyond the scale, drawn at its end
        cells.append(TokenCell(shown, styles[i], joined))
    return cells


def token_info(tokens: list[str], scores: np.ndarray, i: int, signed: bool) -> str:
    """One line on token ``i``: its position, its piece (and the word its pieces make), its score in the shown view
    and its rank (1: the largest score, or |score| for signed methods; ties share the better rank)."""
    s = np.nan_to_num(np.asarray(scores, np.float64), nan=-np.inf)
    key = np.abs(s) if signed else s
    rank = 1 + int((key > key[i]).sum())
    start, end = i, i + 1
    while start > 0 and tokens[start].startswith("##"):
        start -= 1
    while end < len(tokens) and tokens[end].startswith("##") and len(tokens[end]) > 2:
        end += 1
    word = tokens[start] + "".join(t[2:] for t in tokens[start + 1:end]) if end - start > 1 else ""
    value = float(scores[i])
    shown = ("+" if signed and value > 0 else "") + format_score(value)
    return (f"{i + 1}/{len(tokens)} {printable(tokens[i])}" + (f" (of {printable(word)})" if word else "")
            + f"  {shown}  rank {rank}/{len(tokens)}")


class TokenLayout:
    """Tokens laid out in lines of the available width, breaking only between tokens.

    :meth:`breaks` finds where the lines start from the cells' widths alone (integers, no text drawn), and
    :meth:`line` draws one line: the token view draws only the lines it shows (a 4,096-token example costs the lines
    on screen, not its hundreds of lines)."""

    def __init__(self, cells: list[TokenCell]):
        self.cells = cells
        self._widths: list[int] | None = None
        self._breaks: tuple[int, list[tuple[int, int]]] | None = None  # (width, each line's cells)

    @property
    def widths(self) -> list[int]:
        """Each cell's width in terminal cells (measured once)."""
        if self._widths is None:
            self._widths = [cell_len(c.text) for c in self.cells]
        return self._widths

    def breaks(self, width: int) -> list[tuple[int, int]]:
        """The cells [start, end) of each line at ``width`` (one empty line for no cells): a token goes to the next
        line when it and its separator (a space, or JOIN_MARK before a "##" piece) do not fit."""
        width = max(width, 1)
        if self._breaks is not None and self._breaks[0] == width:
            return self._breaks[1]
        starts, used = [0], 0
        for i, (w, cell) in enumerate(zip(self.widths, self.cells)):
            if used and used + 1 + w > width:  # both separators are one cell wide
                starts.append(i)
                used = 0
            used += w + (1 if used or cell.joined else 0)
        ends = [*starts[1:], len(self.cells)]
        if len(starts) > 1 and used == 0:  # the last line drew nothing (empty pieces): no line for it
            starts.pop()
            ends.pop()
        lines = list(zip(starts, ends))
        self._breaks = (width, lines)
        return lines

    def line(self, start: int, end: int) -> Text:
        """The line of cells [start, end): tokens after a space, "##" pieces after JOIN_MARK."""
        line = Text()
        for cell in self.cells[start:end]:
            if line.cell_len or cell.joined:
                sep, sep_style = (JOIN_MARK, _JOIN_STYLE) if cell.joined else (" ", Style())
                line.append(sep, sep_style)
            line.append(cell.text, cell.style)
        return line

    def lines(self, width: int) -> list[Text]:
        return [self.line(a, b) for a, b in self.breaks(width)]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        text = Text("\n").join(self.lines(options.max_width))
        text.overflow = "fold"
        yield text

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        total = sum(w + 1 for w in self.widths)
        return Measurement(1, max(1, min(total, options.max_width)))


class ColorBar:
    """The scale of the current view with its numbers: ``-M [cold..0..warm] +M`` or ``min [ramp] max``."""

    def __init__(self, scale: Scale, mode: Mode, *, glyphs: bool, top_k: int = 0, scope: str = "",
                 cmap: str = DEFAULT_COLORMAP, ends: tuple[str, str] | None = None, clipped: str = ""):
        """``ends``: words in place of the scale's numbers (a bar that stands for several scales); ``clipped``: the
        legend of the clip marks the tokens drawn carry (palette.clip_legend)."""
        self.scale, self.mode, self.glyphs, self.top_k, self.scope = scale, mode, glyphs, top_k, scope
        self.cmap, self.ends, self.clipped = cmap, ends, clipped

    def render(self, width: int) -> Text:
        s = self.scale
        left = format_score(s.lo)
        right = ("+" if s.signed and s.hi > 0 else "") + format_score(s.hi)
        if self.ends is not None:
            left, right = self.ends
        # what matters most first: the scope (a scale wider than the view), the clip marks' legend, top-k; the last
        # ones go first when the line is short
        notes = [f"  {n}" for n in (self.scope, self.clipped) if n] + ([f"  top-{self.top_k} underlined"]
                                                                        if self.top_k else [])
        room = width - len(left) - len(right) - 2
        while notes and room - len("".join(notes)) < 11:
            notes.pop()
        note = "".join(notes)
        cells = max(5, min(31, room - len(note)))
        if s.signed and cells % 2 == 0:
            cells -= 1
        values = np.linspace(-1.0 if s.signed else 0.0, 1.0, cells)
        text = Text()
        text.append(left, Style(bold=True))
        text.append(" ")
        centre = cells // 2 if s.signed else -1
        for j, v in enumerate(values):
            ch = glyph(v) if (self.glyphs or self.mode == "mono") else " "
            if j == centre:
                ch = "0"
            text.append(ch, token_style(v, self.mode, cmap=self.cmap))
        text.append(" ")
        text.append(right, Style(bold=True))
        if note:
            text.append(note, Style(dim=True))
        return text

    def line(self, width: int) -> Text:
        """The bar as one line of ``width`` cells (cropped, never wrapped)."""
        text = self.render(width)
        text.no_wrap = True
        text.overflow = "crop"
        return text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.line(options.max_width)


def ramp_legend(signed: bool) -> str:
    """One line explaining the glyphs (for the help screen)."""
    ramp = "".join(f"'{g}'" for g in GLYPHS)
    if signed:
        return f"sign mark + or - then magnitude glyph {ramp} (lowest fifth of |score| to highest)"
    return f"magnitude glyph {ramp} (lowest fifth of the min..max range to highest)"
