"""attr-tui head matrix screen (enter on the heads or the attention screen; issue 38, point 12): one head's full
token-to-token matrix of a store made with ``attr-compute --heads --matrices all``, and the grid of every head's
thumbnail. Pilot tests at 80x24 and 120x40 (values checked against the store read directly), what it reads, the
one-line refusal of stores without full per-head matrices, SVG snapshots."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import make_store
from test_tui import async_test, open_modal, screen_text, set_color_env, settle

from store import open_store


@pytest.fixture(scope="module")
def heads_store(tmp_path_factory):
    """3 layers x 4 heads, every head's full matrix (the examples are 3-11 tokens long)."""
    path = tmp_path_factory.mktemp("head-matrix") / "heads-all.h5"
    make_store(str(path), n_examples=5, L=3, seed=1, heads="all", H=4)
    return path


@pytest.fixture
def color_env(monkeypatch):
    set_color_env(monkeypatch)


def _head_reads(monkeypatch) -> list[int]:
    """The sizes of the app's reads of /heads/attention: the reads of the store that read heads first (the app's;
    the test opens the file again to check values only after that)."""
    from store.reader import Store

    sizes: list[int] = []
    read = Store._read
    app_store = []

    def counted(self, name, sel, expect=None):
        out = read(self, name, sel, expect)
        if name == "heads/attention" and (not app_store or app_store[0] is self):
            app_store[:1] = [self]
            sizes.append(int(out.size))
        return out

    monkeypatch.setattr(Store, "_read", counted)
    return sizes


async def _open(pilot, key: str = "h"):
    from tui.screens.head_matrix import HeadMatrixScreen

    await settle(pilot)
    await pilot.press(key)
    await settle(pilot)
    return await open_modal(pilot, "enter", HeadMatrixScreen, "data")


def _value(s, index: int, layer: int, head: int, q: int, k: int) -> str:
    from tui.colors import format_score

    return format_score(float(s[index].heads()[layer, head, q, k]))


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
@async_test
async def test_one_heads_matrix_with_its_tokens_cursor_value_and_navigation(heads_store, color_env, monkeypatch,
                                                                            size):
    from tui.app import create_app
    from tui.render.tokens import printable

    reads = _head_reads(monkeypatch)
    app = create_app(heads_store)
    async with app.run_test(size=size) as pilot:
        screen = await _open(pilot)
        with open_store(heads_store) as s:
            ex = s[0]
            n = ex.n_tokens
            text = screen_text(app)
            lines = text.splitlines()
            assert len(lines) == size[1] and all(len(line) <= size[0] for line in lines)
            assert f"{ex.id}  layer 1/3 · head 1/4 · {n}×{n}" in text and "blocks" not in text
            # every row labelled with its token, in order, the cursor's first
            labelled = [line for line in lines if "│" not in line and any(line.startswith(f" {printable(t)}")
                                                                          for t in ex.tokens)]
            assert len(labelled) >= n
            assert f"L1 H1  {printable(ex.tokens[0])} (1) → {printable(ex.tokens[0])} (1)  {_value(s, 0, 0, 0, 0, 0)}" \
                   in text
            assert reads == [n * n]  # that head's block, not the example's 3 x 4 heads
            await pilot.press("down", "down", "right")
            await pilot.pause()
            assert (f"L1 H1  {printable(ex.tokens[2])} (3) → {printable(ex.tokens[1])} (2)  "
                    f"{_value(s, 0, 0, 0, 2, 1)}") in screen_text(app)
            await pilot.press("right_square_bracket", "full_stop", "full_stop")
            await settle(pilot)
            text = screen_text(app)
            assert (screen.layer_index, screen.head_index) == (1, 2) and "layer 2/3 · head 3/4" in text
            assert (f"L2 H3  {printable(ex.tokens[2])} (3) → {printable(ex.tokens[1])} (2)  "
                    f"{_value(s, 0, 1, 2, 2, 1)}") in text
            assert reads == [n * n] * 4  # one head per redraw
            await pilot.press("comma", "left_square_bracket", "left_square_bracket")
            await settle(pilot)
            assert (screen.layer_index, screen.head_index) == (2, 1)  # the layers wrap around
            # j: the next example's same head, the cursor kept where it fits
            await pilot.press("j")
            await settle(pilot)
            ex1 = s[1]
            assert screen.index == 1 == app.current and screen.data.index == 1
            q, k = min(2, ex1.n_tokens - 1), min(1, ex1.n_tokens - 1)
            assert (f"L3 H2  {printable(ex1.tokens[q])} ({q + 1}) → {printable(ex1.tokens[k])} ({k + 1})  "
                    f"{_value(s, 1, 2, 1, q, k)}") in screen_text(app)
            assert reads[-1] == ex1.n_tokens ** 2
        await pilot.press("escape")
        await pilot.pause()
        assert type(app.screen).__name__ == "HeadsScreen"


@async_test
async def test_the_grid_of_every_head_then_one_of_them(heads_store, color_env, monkeypatch):
    from tui.app import create_app
    from tui.render.tokens import printable

    reads = _head_reads(monkeypatch)
    app = create_app(heads_store)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await _open(pilot)
        await pilot.press("g")
        await settle(pilot)
        with open_store(heads_store) as s:
            ex = s[0]
            n = ex.n_tokens
            text = screen_text(app)
            assert f"{ex.id}  every head's matrix · 3 layers × 4 heads · {n}×{n}" in text
            lines = text.splitlines()
            assert [line.split()[:4] for line in lines if line.split()[:4] == ["1", "2", "3", "4"]]
            assert [line[:4] for line in lines if line[:4].strip() in ("L1", "L2", "L3") and "largest" not in line] == \
                [" L1 ", " L2 ", " L3 "]  # each layer's first line (a thumbnail is 4 lines high here)
            assert reads == [n * n, 3 * 4 * n * n]  # the head, then every head once
            heads = ex.heads()
            await pilot.press("down", "right", "right")
            await pilot.pause()
            m = heads[1, 2].astype(np.float64)
            q, k = np.unravel_index(int(np.argmax(m)), m.shape)
            from tui.colors import format_score

            assert (f"L2 H3  largest: {printable(ex.tokens[q])} → {printable(ex.tokens[k])} "
                    f"{format_score(float(m[q, k]))}") in screen_text(app)
            assert "▶" in next(line for line in screen_text(app).splitlines() if line.startswith(" L2"))
            await pilot.press("enter")
            await settle(pilot)
            assert not screen.show_grid and (screen.layer_index, screen.head_index) == (1, 2)
            assert "layer 2/3 · head 3/4" in screen_text(app)
            assert f"L2 H3  {printable(ex.tokens[0])} (1) → {printable(ex.tokens[0])} (1)  " \
                   f"{_value(s, 0, 1, 2, 0, 0)}" in screen_text(app)
            assert len(reads) == 2  # drawn from the heads the grid read


@async_test
async def test_from_the_attention_screen_at_its_cursor(heads_store, color_env):
    from tui.app import create_app
    from tui.screens.attention import AttentionScreen

    app = create_app(heads_store)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_modal(pilot, "a", AttentionScreen, "data")
        await pilot.press("down", "right")
        screen = await _open(pilot, "")
        assert (screen.layer_index, screen.head_index) == (1, 1) and "layer 2/3 · head 2/4" in screen_text(app)


@pytest.mark.parametrize("heads", ["none", "cls"])
@async_test
async def test_a_store_without_full_head_matrices_says_how_to_get_them(tmp_path, color_env, heads):
    from tui.app import create_app

    path = tmp_path / f"{heads}.h5"
    make_store(str(path), n_examples=3, heads=heads)
    app = create_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("h")
        await settle(pilot)
        await pilot.press("enter")
        await pilot.pause()
        assert type(app.screen).__name__ == "HeadsScreen"
        notes = [n.message for n in app._notifications]
        assert len(notes) == 1 and "\n" not in notes[0], notes
        assert notes[0].endswith("run attr-compute with --heads --matrices all" if heads == "none" else
                                 "run attr-compute with --heads --matrices all for every head's full matrix")


@async_test
async def test_every_key_changes_what_it_says(heads_store, color_env):
    """Each key of the screen changes the state it names (as tests/test_tui_bindings.py checks the others)."""
    from tui.app import create_app
    from tui.screens.head_matrix import HeadMatrixScreen

    table = {
        "left_square_bracket": lambda s: s.layer_index, "right_square_bracket": lambda s: s.layer_index,
        "comma": lambda s: s.head_index, "full_stop": lambda s: s.head_index, "g": lambda s: s.show_grid,
        "j": lambda s: s.index, "k": lambda s: s.index, "up": lambda s: s.cell, "down": lambda s: s.cell,
        "left": lambda s: s.cell, "right": lambda s: s.cell,
    }
    keys = {k.strip() for b in HeadMatrixScreen.BINDINGS for k in b.key.split(",")}
    assert keys == set(table) | {"enter", "escape", "q"}
    app = create_app(heads_store)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await _open(pilot)
        for key in ("right_square_bracket", "left_square_bracket", "full_stop", "comma", "j", "k", "down", "right",
                    "up", "left", "g"):
            before = table[key](screen)
            await pilot.press(key)
            await settle(pilot)
            assert table[key](screen) != before, key
        await pilot.press("enter")  # on the grid: the head under its cursor
        await settle(pilot)
        assert not screen.show_grid
        for key in ("escape", "q"):
            await pilot.press(key)
            await pilot.pause()
            assert type(app.screen).__name__ == "HeadsScreen"
            await pilot.press("enter")
            await settle(pilot)
            assert isinstance(app.screen, HeadMatrixScreen)


def test_thumbnails_are_block_means_each_head_on_its_own_scale():
    from tui.render.head_thumbnails import thumbnails

    rng = np.random.default_rng(0)
    heads = rng.random((2, 3, 5, 5))
    heads[1, 2] = 0.0
    out = thumbnails(heads, 3, 2)  # blocks of 2 x 3 entries (the last ones smaller)
    assert out.shape == (2, 3, 3, 2)
    want = np.array([[heads[0, 1, r:r + 2, c:c + 3].mean() for c in (0, 3)] for r in (0, 2, 4)])
    np.testing.assert_allclose(out[0, 1], want / want.max())
    assert out[0, 0].max() == 1.0 and (out[1, 2] == 0).all()


# ---------------------------------------------------------------- snapshots
def _run(*keys: str):
    async def run_before(pilot) -> None:
        await settle(pilot)
        for key in keys:
            await pilot.press(key)
            await settle(pilot)

    return run_before


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
@pytest.mark.parametrize("view", ["head", "grid"])
def test_snapshot(snap_compare, heads_store, monkeypatch, view, size):
    from tui.app import create_app

    set_color_env(monkeypatch)
    keys = ("h", "enter", "down", "right", "full_stop") + (("g",) if view == "grid" else ())
    assert snap_compare(create_app(heads_store), terminal_size=size, run_before=_run(*keys))
