"""Heatmap drawing (tui/render/heatmap.py): block means keep the mean, half blocks carry two rows per line, full cells
one."""

from __future__ import annotations

import numpy as np
import pytest

from tui.colors import background, token_style
from tui.render.heatmap import CURSOR_MARK, UPPER_HALF, block_factor, block_mean, half_block_lines, heatmap_lines


@pytest.mark.parametrize("shape,f", [((7, 7), (2, 2)), ((12, 5), (3, 2)), ((512, 512), (20, 9)), ((1, 40), (1, 3))])
def test_block_mean_preserves_the_mean(shape, f):
    rng = np.random.default_rng(0)
    m = rng.normal(size=shape)
    means, counts = block_mean(m, *f)
    assert counts.sum() == m.size
    assert (means * counts).sum() / counts.sum() == pytest.approx(m.mean(), abs=1e-12)
    assert means.shape == (-(-shape[0] // f[0]), -(-shape[1] // f[1]))
    # the first block is the plain mean of its entries
    assert means[0, 0] == pytest.approx(m[:f[0], :f[1]].mean())


def test_block_factor():
    assert block_factor(10, 40) == 1 and block_factor(40, 40) == 1 and block_factor(41, 40) == 2
    assert block_factor(512, 30) == 18


def test_half_blocks_two_rows_per_line():
    v = np.array([[0.0, 1.0], [1.0, 0.5], [0.25, 0.0]])
    lines = half_block_lines(v, "truecolor")
    assert len(lines) == 2 and all(line.plain == UPPER_HALF * 2 for line in lines)
    spans = [(s.style.color, s.style.bgcolor) for s in lines[0].spans]
    assert spans[0] == (background(0.0, "truecolor"), background(1.0, "truecolor"))
    assert spans[1] == (background(1.0, "truecolor"), background(0.5, "truecolor"))
    last = [(s.style.color, s.style.bgcolor) for s in lines[1].spans]
    assert last[0] == (background(0.25, "truecolor"), None)  # an odd row count: the lower half is empty


def test_half_blocks_without_colour_use_one_row_per_line_and_glyphs():
    v = np.array([[0.0, 1.0], [-1.0, 0.5]])
    lines = half_block_lines(v, "mono", cursor=(1, 1))
    assert len(lines) == 2 and lines[0].plain == " █" and lines[1].plain == "-" + CURSOR_MARK
    assert [(s.start, s.end) for s in lines[1].spans if s.style.reverse] == [(1, 2)]  # the cursor's cell only
    # the mark, not the cell's glyph, so the cursor shows on a blank cell and where reverse video does not
    # (a terminal without it, a plain-text capture): a reversed blank among blanks read as nothing in tmux's capture
    blank = half_block_lines(np.zeros((2, 3)), "mono", cursor=(0, 1), cell_width=3, signed=False)
    assert [t.plain for t in blank] == [" " * 3 + CURSOR_MARK.center(3) + " " * 3, " " * 9]


def test_full_cells_one_row_per_line_with_the_cursor_marked_on_its_colour():
    v = np.array([[0.0, 1.0], [1.0, 0.5], [0.25, 0.0]])
    lines = heatmap_lines(v, "truecolor", per_line=1, cursor=(1, 1), cell_width=3)
    assert len(lines) == 3 and [line.plain for line in lines[::2]] == [" " * 6, " " * 6]
    assert [s.style.bgcolor for s in lines[2].spans] == [background(0.25, "truecolor"), background(0.0, "truecolor")]
    assert lines[1].plain == "   " + CURSOR_MARK.center(3)
    cur = lines[1].spans[1].style
    assert cur.bgcolor == background(0.5, "truecolor") and cur.color == token_style(0.5, "truecolor").color
    # two rows a line and mono are the half blocks' and the glyphs'
    assert [t.plain for t in heatmap_lines(v, "truecolor", per_line=2)] == [UPPER_HALF * 2] * 2
    assert len(heatmap_lines(v, "mono", per_line=1)) == 3 and len(heatmap_lines(v, "mono", per_line=2)) == 3
