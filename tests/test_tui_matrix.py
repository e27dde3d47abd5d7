"""The matrix screen (x): heatmap of the current layer, layer strip, cursor read-out, normalisations, cls rows."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import make_store
from test_tui import async_test, open_modal, screen_text, set_color_env, settle

from store import ExampleData, MethodLayout, StoreWriter, open_store
from tui.colors import format_score


def one_example_store(path, layout: MethodLayout, tokens: list[str], results: dict) -> None:
    """A complete store of one example with these tokens and one method's results."""
    n = len(tokens)
    ex = ExampleData(row=0, id="only", text=" ".join(tokens[1:-1]), pair=None, token_ids=np.arange(n), tokens=tokens,
                     spans=np.full((n, 2), -1), segment=np.zeros(n), label=1, pred=1, probs=np.array([0.2, 0.8]),
                     target=1, explain_pos=0, n_orig_tokens=n, truncated=False, results={layout.name: results})
    w = StoreWriter.create(str(path), n_layers=2, n_heads=2, labels={0: "neg", 1: "pos"}, methods=[layout],
                           provenance={})
    w.append([ex])
    w.close(complete=True)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("mx") / "mx.h5"
    make_store(str(path), n_examples=6, L=3, seed=5)
    return path


async def open_matrix(pilot):
    from tui.screens.matrix import MatrixScreen

    return await open_modal(pilot, "x", MatrixScreen, "matrices")


def status_line(app) -> str:
    return screen_text(app).splitlines()[-2]


@async_test
async def test_heatmap_cursor_layers_and_scales(store_path, monkeypatch):
    set_color_env(monkeypatch)
    from tui.app import create_app

    with open_store(store_path) as s:
        ex0, ex1 = s[0], s[1]
        m0, toks0, m1 = ex0.matrices("rollout"), ex0.tokens, ex1.matrices("rollout")
    app = create_app(store_path)
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await open_matrix(pilot)
        n = len(toks0)
        text = screen_text(app)
        assert f"layer 1/3 · {n}×{n}" in text and "blocks" not in text  # fits: no averaging
        assert "▶L1" in text and "L3" in text
        assert status_line(app).strip().startswith(f"{toks0[0]} (1) ← {toks0[0]} (1)")
        assert format_score(float(m0[0, 0, 0])) in status_line(app)
        await pilot.press("down", "down", "right")
        await pilot.pause()
        line = status_line(app)
        assert f"{toks0[2]} (3) ← {toks0[1]} (2)" in line and format_score(float(m0[0, 2, 1])) in line, line
        await pilot.press("right_square_bracket")
        await pilot.pause()
        assert screen.view_layer == 1 and "layer 2/3" in screen_text(app) and "▶L2" in screen_text(app)
        assert format_score(float(m0[1, 2, 1])) in status_line(app)
        await pilot.press("left_square_bracket", "left_square_bracket")
        assert screen.view_layer == 2  # wraps
        for want in ("example", "global", "layer"):
            await pilot.press("s")
            await app.workers.wait_for_complete()
            await pilot.pause()
            await pilot.pause()
            assert screen.norm == want and f"scale: {want}" in screen_text(app)
        assert screen.global_scale is not None and "matrix 3" in screen.global_scale
        await pilot.press("j")
        for _ in range(30):
            await app.workers.wait_for_complete()
            await pilot.pause()
            if screen.loaded_key == (1, "rollout"):
                break
        assert screen.index == 1 and app.example_list.cursor == 1
        np.testing.assert_array_equal(screen.matrices, m1)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, type(screen))


@async_test
async def test_large_matrix_is_block_averaged(tmp_path, monkeypatch):
    set_color_env(monkeypatch)
    from tui.app import create_app

    n, L = 150, 2
    rng = np.random.default_rng(1)
    lay = MethodLayout("rollout", signed=False, n_layer_views=L, matrices="all", n_matrix_layers=L)
    toks = ["[CLS]"] + [f"w{i}" for i in range(n - 2)] + ["[SEP]"]
    path = tmp_path / "long.h5"
    one_example_store(path, lay, toks, {"scores": rng.random(n), "layer_scores": rng.random((L, n)),
                                        "matrices": rng.random((L, n, n))})
    app = create_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_matrix(pilot)
        text = screen_text(app)
        assert "blocks" in text and "averaged" in text
        line = status_line(app)
        assert "(block mean)" in line and "(1-" in line


@async_test
async def test_cls_matrices_show_the_row_and_say_why(tmp_path, monkeypatch):
    set_color_env(monkeypatch, no_color=True)
    from tui.app import create_app

    n, L = 6, 2
    rng = np.random.default_rng(2)
    lay = MethodLayout("alti", signed=False, n_layer_views=L, matrices="cls", n_matrix_layers=L)
    path = tmp_path / "cls.h5"
    one_example_store(path, lay, ["[CLS]", "a", "fine", "film", "!", "[SEP]"],
                      {"scores": rng.random(n), "layer_scores": rng.random((L, n)), "matrices": rng.random((L, 1, n))})
    app = create_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_matrix(pilot)
        text = screen_text(app)
        assert screen.matrices.shape == (L, 1, n)
        assert "only the explained token's row is stored (--matrices cls)" in text and "--matrices all" in text
        assert f"1×{n}" in text


@async_test
async def test_store_without_matrices_says_so(tmp_path, monkeypatch):
    set_color_env(monkeypatch)
    from tui.app import create_app

    path = tmp_path / "none.h5"
    one_example_store(path, MethodLayout("norm", signed=False), ["[CLS]", "a", "b", "[SEP]"],
                      {"scores": np.arange(4, dtype=float)})
    app = create_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("x")
        await pilot.pause()
        assert any("--matrices all" in n.message for n in app._notifications)
