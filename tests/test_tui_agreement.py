"""Rank agreement of two attributions (tui/agreement.py) against scipy-free hand-computed answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tui.agreement import ranks, spearman, top_k_overlap


def test_ranks_average_ties():
    assert ranks(np.array([10.0, 30.0, 20.0, 30.0])).tolist() == [1.0, 3.5, 2.0, 3.5]
    assert ranks(np.array([5.0, 5.0, 5.0])).tolist() == [2.0, 2.0, 2.0]


def test_spearman_known_values():
    a = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    assert spearman(a, a * 7 + 1) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)
    # d = (0, 0, 1, -1, 0): rho = 1 - 6 * 2 / (5 * 24) = 0.9
    assert spearman(a, np.array([1.0, 2.0, 4.0, 3.0, 5.0])) == pytest.approx(0.9)
    # ties: the Pearson correlation of the averaged ranks (1, 2.5, 2.5, 4) and (1, 2, 3, 4)
    r = np.array([1.0, 2.5, 2.5, 4.0]) - 2.5
    s = np.array([1.0, 2.0, 3.0, 4.0]) - 2.5
    want = (r * s).sum() / math.sqrt((r * r).sum() * (s * s).sum())
    assert spearman(np.array([0.1, 0.5, 0.5, 0.9]), np.array([1.0, 2.0, 3.0, 4.0])) == pytest.approx(want)


def test_spearman_leaves_the_explained_token_out_and_handles_degenerate_input():
    a = np.array([100.0, 1.0, 2.0, 3.0])
    b = np.array([-100.0, 1.0, 2.0, 3.0])
    assert spearman(a, b) < 1.0 and spearman(a, b, skip=0) == pytest.approx(1.0)
    assert math.isnan(spearman(np.ones(4), np.arange(4.0)))
    assert math.isnan(spearman(np.array([1.0]), np.array([2.0])))
    assert spearman(np.array([np.nan, 1.0, 2.0]), np.array([0.0, 1.0, 2.0])) == pytest.approx(1.0)


def test_top_k_overlap():
    a = np.array([9.0, 5.0, 4.0, 3.0, 2.0, 1.0])
    b = np.array([9.0, 1.0, 4.0, 5.0, 2.0, 3.0])
    assert top_k_overlap(a, b, 2, skip=0) == pytest.approx(0.5)  # {1, 2} vs {3, 2}
    assert top_k_overlap(a, b, 3, skip=0) == pytest.approx(2 / 3)  # {1, 2, 3} vs {3, 2, 5}
    assert top_k_overlap(a, b, 5, skip=0) == pytest.approx(1.0)
    assert top_k_overlap(a, b, 99, skip=0) == pytest.approx(1.0)  # k capped at the tokens there are
    assert math.isnan(top_k_overlap(np.array([1.0]), np.array([1.0]), 1, skip=0))
