"""The colour scale without the special tokens (issue 28, item 3): by default for a method whose explained token
dominates, so that content tokens of 0.017-0.044 next to a [CLS] of 0.656 get different colours; the colour bar
says which scale is in use; t switches it."""

from __future__ import annotations

import numpy as np
import pytest
from test_tui import async_test, screen_text, set_color_env, settle, token_cells

from store import ExampleData, MethodLayout, StoreWriter

CONTENT = [0.017, 0.021, 0.025, 0.030, 0.036, 0.044]
TOKENS = ["[CLS]", "a", "gripping", "and", "moving", "film", "!", "[SEP]"]


@pytest.fixture
def store(tmp_path):
    """rollout: [CLS] 0.656 dominates the content tokens; grad_l2: [CLS] in their range (no explained token
    dominates). [CLS] and [SEP] are special tokens (segment -1)."""
    path = tmp_path / "dominant.h5"
    n = len(TOKENS)
    rollout = np.array([0.656] + CONTENT + [0.050])
    grad = np.array([0.30, 0.10, 0.50, 0.20, 0.40, 0.60, 0.05, 0.25])
    segment = np.zeros(n, np.int8)
    segment[[0, -1]] = -1
    spans = np.array([[-1, -1]] + [[i, i + 1] for i in range(n - 2)] + [[-1, -1]])
    w = StoreWriter.create(str(path), n_layers=2, n_heads=2, labels={0: "neg", 1: "pos"},
                           methods=[MethodLayout("rollout", signed=False), MethodLayout("grad_l2", signed=False)],
                           provenance={})
    w.append([ExampleData(row=0, id="ex0", text="a gripping and moving film !", pair=None, token_ids=np.arange(n),
                          tokens=TOKENS, spans=spans, segment=segment, label=1, pred=1, probs=np.array([0.1, 0.9]),
                          target=1, explain_pos=0, n_orig_tokens=n, truncated=False,
                          results={"rollout": {"scores": rollout}, "grad_l2": {"scores": grad}})])
    w.close(complete=True)
    return path


def _backgrounds(app, positions):
    return [token_cells(app)[i].style.bgcolor for i in positions]


@async_test
async def test_scale_without_special_tokens_by_default_when_the_explained_token_dominates(store, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch, truecolor=False)  # 256 colours: the ramp's 11 steps, as over SSH
    app = create_app(store)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        content = range(1, 7)
        colours = _backgrounds(app, content)
        assert len(set(colours)) == 6  # every content token its own colour
        text = screen_text(app)
        bar = next(line for line in text.splitlines() if "w/o specials" in line)
        assert "0.017" in bar and "0.044" in bar and "0.656" not in bar
        # the specials are beyond the scale: drawn at its ends, never hidden
        assert token_cells(app)[0].style.bgcolor == token_cells(app)[6].style.bgcolor
        # t: all tokens; the content tokens then share the low end of the ramp
        await pilot.press("t")
        await settle(pilot)
        bar = next(line for line in screen_text(app).splitlines() if "all tokens" in line)
        assert "0.017" in bar and "0.656" in bar
        assert len(set(_backgrounds(app, content))) == 1
        # a method whose explained token does not dominate starts on all tokens
        await pilot.press("m")
        await settle(pilot)
        assert app.method.name == "grad_l2"
        assert any("all tokens" in line and "0.05" in line and "0.6" in line for line in screen_text(app).splitlines())


@async_test
async def test_scale_tokens_at_80_columns_and_without_colour(store, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch, no_color=True)
    app = create_app(store)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert any("w/o specials" in line and "0.017" in line and "0.044" in line for line in text.splitlines())
        glyphs = [token_cells(app)[i].text[0] for i in range(1, 7)]
        assert glyphs[0] == " " and glyphs[-1] == "█" and len(set(glyphs)) >= 4


def test_compare_scales_leave_out_the_tokens_not_kept():
    from tui.render.compare import scales

    rollout = np.array([0.656] + CONTENT + [0.050])
    keep = np.array([False] + [True] * 6 + [False])
    for shared in (False, True):
        sc = scales({"rollout": rollout, "b": rollout / 2}, {"rollout": False, "b": False}, shared,
                    {"rollout": keep, "b": None})
        assert sc["rollout"].hi == (0.328 if shared else 0.044) and sc["rollout"].lo == pytest.approx(0.0085 if shared else 0.017)
    sc = scales({"rollout": rollout}, {"rollout": False}, False, {"rollout": keep})["rollout"]
    assert sc.values[0] == 1.0 and sc.values[-1] == 1.0 and sc.values[1] == 0.0
