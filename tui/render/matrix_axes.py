"""The matrix screen's layout and axes: how its lines are shared, the row labels and the column header (pure: numpy
and rich only).

:func:`plan` shares the lines between the layer strip, the column header and the heatmap, and decides how many
matrix rows a line draws: one while the rows fit (each line's label then names exactly its row), else two (colour:
upper half block and lower; the label names both, "upper/lower"), block-averaged when even that does not fit (a
block's label is its 1-based range of positions and its first token). Without colour a line always draws one row.

The gutter (the labels' cells, left of the heatmap, the layer strip and the header alike) is as wide as the longest
label needs, within bounds; the columns follow in the rest (:func:`columns`, the strip's geometry). The header
writes each column's label top to bottom in the column's first cell, cut with "…"; with one cell per column and room
for it, a position ruler comes first. Every text is made printable and measured in terminal cells (rich.cells), so
control characters never reach the terminal and wide characters never shift a column.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rich.cells import cell_len, set_cell_size
from rich.style import Style
from rich.text import Text

from .heatmap import block_factor
from .tokens import JOIN_MARK, printable

CUT = "…"  # a label cut to its room
WIDE = "▯"  # a character two cells wide in a one-cell column
BASE = "◌"  # carries a combining mark that has no letter before it
CURSOR_AXIS = Style(reverse=True, bold=True)  # the cursor's row label and column label
_DIM = Style(dim=True)
_PLAIN = Style()

STRIP_MAX = 8  # layer-strip lines at most (more layers: the ones around the current layer)
HEADER_MAX = 4  # column-header lines at most, unless the heatmap leaves lines over
HEADER_ROOM = 8  # column-header lines at most when the heatmap leaves lines over
HEADER_FIT = 3  # the header gives up lines down to this many (the strip down to 1) so that rows fit one a line
GUTTER_MIN, GUTTER_MAX = 6, 16  # cells for the row labels (the strip's "▶L12↓" needs 5)
RULER_EVERY = 10  # the ruler numbers every RULER_EVERY-th column
HALVES = "▀/▄ rows"  # over the labels when a line draws two rows: the upper half's row, then the lower half's


@dataclass(frozen=True)
class Geometry:
    """How the matrix screen draws: lines of the strip, the header and the heatmap; matrix rows per line; block
    factors of rows and columns; cells per column; the gutter's cells; whether the header starts with a ruler."""

    strip: int
    header: int
    lines: int
    per_line: int
    fr: int
    fc: int
    cw: int
    gutter: int
    ruler: bool


def fit(text: str, width: int) -> str:
    """``text`` in at most ``width`` terminal cells: cut with :data:`CUT` when longer (no padding)."""
    if cell_len(text) <= width:
        return text
    if width <= 0:
        return ""
    return set_cell_size(text, width - 1).rstrip() + CUT if width > 1 else CUT


def plan(rows: int, height: int, *, mono: bool, views: int) -> tuple[int, int, int, int, int]:
    """(strip lines, header lines, heatmap lines, rows a line, row block factor) for ``rows`` matrix rows in
    ``height`` lines shared by the strip, the header and the heatmap. Lines the heatmap does not need go to the strip
    (every layer) and then to the header (longer column labels)."""
    strip = max(1, min(views, STRIP_MAX, max(2, height // 5)))
    header = min(HEADER_MAX, max(1, (height - strip) // 4))
    short = rows - (height - strip - header)  # lines the rows lack to have one each
    if 0 < short <= max(header - HEADER_FIT, 0) + strip - 1:  # header lines, then strip lines give way
        take = min(short, max(header - HEADER_FIT, 0))
        header, strip = header - take, strip - (short - take)
    lines = max(height - strip - header, 1)
    per_line = 1 if mono or rows <= lines else 2
    fr = 1 if rows == 1 else block_factor(rows, lines * per_line)
    needed = -(-(-(-rows // fr)) // per_line) + (3 if rows == 1 else 0)  # the cls row: and the note under it
    spare = max(lines - needed, 0)
    more = min(spare, max(min(views, STRIP_MAX) - strip, 0))
    strip, spare = strip + more, spare - more
    header += min(spare, max(HEADER_ROOM - header, 0))
    return strip, header, max(height - strip - header, 1), per_line, fr


def columns(n: int, width: int) -> tuple[int, int]:
    """(column block factor, cells per column) for ``n`` columns in ``width`` cells (the layer strip's geometry)."""
    fc = block_factor(n, max(width, 1))
    return fc, (max(1, min(3, width // max(n, 1))) if fc == 1 else 1)


def row_labels(tokens: list[str], rows: int, fr: int, per_line: int,
               explained: int | None = None) -> list[list[tuple[str, range]]]:
    """Each heatmap line's label as parts (text, matrix rows it names): a row's token; two rows' tokens
    "upper/lower"; a block's range and first token ("15-21 w14", the range spanning both blocks of a line). A
    store of the explained row only (``rows`` 1) names that row by the explained token."""
    def tok(q: int) -> str:
        return printable(tokens[q]) if q < len(tokens) else "?"

    if rows == 1:
        return [[(tok(explained if explained is not None else 0), range(0, 1))]]
    out = []
    step = fr * per_line
    for a in range(0, rows, step):
        b = min(a + step, rows)
        if fr > 1:
            span = f"{a + 1}-{b}" if b > a + 1 else f"{a + 1}"
            out.append([(f"{span} {tok(a)}", range(a, b))])
        elif b - a == 2:
            out.append([(tok(a), range(a, a + 1)), ("/", range(0)), (tok(a + 1), range(a + 1, b))])
        else:
            out.append([(tok(a), range(a, b))])
    return out


def gutter(labels: list[list[tuple[str, range]]], total_width: int) -> int:
    """Cells for the labels: the longest one and a space, within [GUTTER_MIN, a sixth of the width]."""
    need = max((sum(cell_len(t) for t, _ in parts) for parts in labels), default=0) + 1
    return max(GUTTER_MIN, min(need, max(GUTTER_MIN + 3, min(GUTTER_MAX, total_width // 6))))


def _fit_parts(parts: list[tuple[str, range]], width: int) -> list[tuple[str, range]]:
    """The parts of a label cut to ``width`` cells together; two names "a/b" share the room, the shorter keeps its
    length."""
    if sum(cell_len(t) for t, _ in parts) <= width:
        return parts
    if len(parts) != 3:
        return [(fit(parts[0][0], width), parts[0][1])]
    (a, ra), sep, (b, rb) = parts
    room = width - cell_len(sep[0])
    wa = max(1, min(cell_len(a), room - min(cell_len(b), room // 2)))
    return [(fit(a, wa), ra), sep, (fit(b, room - wa), rb)]


def label_text(parts: list[tuple[str, range]], width: int, cursor_row: int | None) -> Text:
    """A line's label in exactly ``width`` cells (the last one a space); the part naming ``cursor_row`` reversed."""
    t = Text(no_wrap=True, overflow="crop")
    for text, rows in _fit_parts(parts, width - 1):
        t.append(text, CURSOR_AXIS if cursor_row in rows else _DIM)
    t.append(" " * (width - t.cell_len))
    return t


def labelled(labels: list[list[tuple[str, range]]], lines: list[Text], width: int, cursor_row: int | None) -> list[Text]:
    """Each heatmap line after its row's label (:func:`label_text`), the label naming ``cursor_row`` reversed."""
    out = []
    for parts, line in zip(labels, lines):
        t = label_text(parts, width, cursor_row)
        t.append_text(line)
        out.append(t)
    return out


def column_cells(label: str, lines: int, cw: int) -> list[str]:
    """A column's label down ``lines`` lines, each exactly ``cw`` cells: one character (with its combining marks) a
    line, the last line :data:`CUT` when the label is longer (one line: its first character); a character wider than
    the column is :data:`WIDE`."""
    chars: list[str] = []
    for ch in label:
        if cell_len(ch) == 0:
            if chars:
                chars[-1] += ch
            else:
                chars.append(BASE + ch)
        else:
            chars.append(ch)
    if len(chars) > lines:  # cut, with the mark where there are two lines or more (one line: the first character)
        chars = chars[:max(lines - 1, 1)] + [CUT]
    chars += [""] * (lines - len(chars))
    return [(c if cell_len(c) <= cw else WIDE) + " " * (cw - min(cell_len(c), cw)) for c in chars][:lines]


def column_label(token: str) -> str:
    """A column's label: the token made printable; a WordPiece continuation "##ing" as "·ing" (the browse screen's
    join mark), so that the few lines of a vertical label show its letters."""
    joined = token.startswith("##") and len(token) > 2
    return JOIN_MARK + printable(token[2:]) if joined else printable(token)


def header_lines(tokens: list[str], n: int, geom: Geometry, cursor_col: int) -> list[Text]:
    """The column header: ``geom.header`` lines over the heatmap's columns, each column labelled by its (block's
    first) token top to bottom, the cursor's column reversed; when the columns are one cell each they alternate plain
    and dim so that neighbours read apart. The gutter is blank but for "pos" on the ruler and, when a line draws two
    rows, :data:`HALVES` on the last line."""
    C = math.ceil(n / geom.fc)
    ruler = [ruler_line(n, geom)] if geom.ruler else []
    k = geom.header - len(ruler)
    down = [column_cells(column_label(tokens[j * geom.fc]) if j * geom.fc < len(tokens) else "?", k, geom.cw)
            for j in range(C)]
    out = []
    for y in range(k):
        legend = HALVES if geom.per_line == 2 and y == k - 1 else ""
        legend = legend if len(legend) < geom.gutter else legend[:3] if geom.gutter > 3 else ""
        t = Text(no_wrap=True, overflow="crop")
        t.append(legend.ljust(geom.gutter), _DIM)
        for j in range(C):
            style = CURSOR_AXIS if j == cursor_col else _DIM if geom.cw > 1 or j % 2 else _PLAIN
            t.append(down[j][y], style)
        out.append(t)
    return ruler + out


def ruler_line(n: int, geom: Geometry) -> Text:
    """Positions (1-based, the first token of the column) every :data:`RULER_EVERY`-th column, each written from
    its column on."""
    C = math.ceil(n / geom.fc)
    t = Text(fit("pos", geom.gutter - 1).ljust(geom.gutter - 1) + " ", style=_DIM, no_wrap=True, overflow="crop")
    line = [" "] * (C * geom.cw)
    for j in range(0, C, RULER_EVERY):
        number = str(j * geom.fc + 1)
        room = min(RULER_EVERY * geom.cw - 1, C * geom.cw - j * geom.cw)
        if len(number) <= room:
            line[j * geom.cw:j * geom.cw + len(number)] = number
    t.append("".join(line), _DIM)
    return t


def geometry(tokens: list[str], rows: int, n: int, explained: int | None, *, width: int, height: int, mono: bool,
             views: int) -> tuple[Geometry, list[list[tuple[str, range]]]]:
    """The screen's :class:`Geometry` and its row labels, for a ``rows`` x ``n`` matrix in ``width`` cells (gutter
    included) and ``height`` lines (strip, header and heatmap)."""
    strip, header, lines, per_line, fr = plan(rows, height, mono=mono, views=views)
    labels = row_labels(tokens, rows, fr, per_line, explained)
    g = gutter(labels, width)
    fc, cw = columns(n, width - g)
    return Geometry(strip, header, lines, per_line, fr, fc, cw, g, ruler=cw == 1 and header >= HEADER_MAX), labels
