"""Heatmap drawing (tui/heatmap.py): block means keep the mean, half blocks carry two rows per line."""

from __future__ import annotations

import numpy as np
import pytest

from tui.colors import background
from tui.render.heatmap import UPPER_HALF, block_factor, block_mean, half_block_lines


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
    assert len(lines) == 2 and lines[0].plain == " █" and lines[1].plain[0] == "-"
    assert any(s.style.reverse for s in lines[1].spans)
