"""attr-tui attention screen (``a``): the per-head attention of a store made with ``attr-compute --heads`` as a
layers × heads grid. Pilot tests at 80x24 and 120x40, a store without heads, the renderer's numbers, an SVG snapshot.
The stores are synthetic with fixed seeds (tests/synthetic.py: rows that sum to 1, from their own generator)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from synthetic import make_store
from test_tui import async_test, open_modal, screen_text, set_color_env, settle

from store import open_store


@pytest.fixture(scope="module")
def bert_base_store(tmp_path_factory):
    """12 layers x 12 heads (BERT-base's shape), the explained rows only (--matrices cls)."""
    path = tmp_path_factory.mktemp("attention") / "heads12.h5"
    make_store(str(path), n_examples=6, L=12, seed=3, heads="cls", H=12)
    return path


@pytest.fixture(scope="module")
def full_heads_store(tmp_path_factory):
    """3 layers x 4 heads, the full [L, H, n, n] (--matrices all)."""
    path = tmp_path_factory.mktemp("attention") / "heads-all.h5"
    make_store(str(path), n_examples=5, L=3, seed=1, heads="all", H=4)
    return path


@pytest.fixture
def color_env(monkeypatch):
    set_color_env(monkeypatch)


def lines_of(app) -> list[str]:
    return screen_text(app).splitlines()


def grid_rows(lines: list[str]) -> dict[str, str]:
    """Layer label -> its grid line."""
    return {m.group(1): line for line in lines if (m := re.match(r"^ (L\d+)\s", line)) and "H" not in line[:8]}


def top_line(s, index: int, layer: int, head: int) -> str:
    """The detail line the screen must show for (layer, head) of example ``index``, from the store itself."""
    from tui.colors import format_score
    from tui.render.tokens import printable

    ex = s[index]
    row = ex.head_rows()[layer, head].astype(np.float64)
    best = int(np.argmax(row))
    return f"{printable(ex.tokens[best])} {format_score(float(row[best]))}"


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
@async_test
async def test_the_grid_of_a_12x12_model_fits_and_follows_the_cursor(bert_base_store, color_env, size):
    from tui.app import create_app
    from tui.screens.attention import AttentionScreen

    app = create_app(bert_base_store)
    async with app.run_test(size=size) as pilot:
        screen = await open_modal(pilot, "a", AttentionScreen, "data")
        lines = lines_of(app)
        assert len(lines) == size[1] and all(len(line) <= size[0] for line in lines)
        rows = grid_rows(lines)
        assert list(rows) == [f"L{i}" for i in range(1, 13)]  # every layer, no scrolling needed
        heads_line = next(line for line in lines if re.match(r"^\s+1\s+2\s+3", line))
        assert heads_line.split() == [str(h) for h in range(1, 13)]  # every head
        assert "row of ▸[CLS] · 12 layers × 12 heads" in screen_text(app)
        assert " of 12" not in screen_text(app)
        cell = screen.query_one("#attention-grid").size.width  # wider terminal, wider thumbnails
        assert cell >= size[0] - 2 - 2
        with open_store(bert_base_store) as s:
            assert f"L1 H1  ▸[CLS] → {top_line(s, 0, 0, 0)}" in screen_text(app)
            await pilot.press("down", "down", "right", "right", "right")
            await pilot.pause()
            assert (screen.cursor_layer, screen.cursor_head) == (2, 3)
            assert f"L3 H4  ▸[CLS] → {top_line(s, 0, 2, 3)}" in screen_text(app)
            assert "▶" in grid_rows(lines_of(app))["L3"]
            # the cursor stops at the edges
            for _ in range(15):
                await pilot.press("down", "right")
            await pilot.pause()
            assert (screen.cursor_layer, screen.cursor_head) == (11, 11)
            # j: the next example, read on a worker, with the cursor kept
            await pilot.press("j")
            await settle(pilot)
            assert screen.index == 1 and screen.data.index == 1 and app.current == 1
            assert f"L12 H12  ▸[CLS] → {top_line(s, 1, 11, 11)}" in screen_text(app)
        await pilot.press("s")
        await pilot.pause()
        assert screen.norm == "example" and "scale: example" in screen_text(app)
        await pilot.press("escape")
        await pilot.pause()
        assert type(app.screen).__name__ == "BrowseScreen"


@async_test
async def test_a_deep_wide_model_scrolls_with_the_cursor_at_80x24(tmp_path, color_env):
    from tui.app import create_app
    from tui.screens.attention import AttentionScreen

    path = tmp_path / "deep.h5"
    make_store(str(path), n_examples=2, L=30, seed=2, heads="cls", H=40)
    app = create_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_modal(pilot, "a", AttentionScreen, "data")
        lines = lines_of(app)
        assert len(lines) == 24 and all(len(line) <= 80 for line in lines)
        first = list(grid_rows(lines))
        assert first[0] == "L1" and len(first) < 30
        info = screen_text(app)
        assert f"layers 1-{len(first)} of 30 × heads 1-" in info and " of 40 ·" in info
        reads, real = [], app.store._read
        app.store._read = lambda *a, **k: reads.append(a[0]) or real(*a, **k)
        for _ in range(29):
            await pilot.press("down")
        for _ in range(39):
            await pilot.press("right")
        await pilot.pause()
        assert (screen.cursor_layer, screen.cursor_head) == (29, 39)
        assert reads == []  # the cursor draws from memory: a key's work does not grow with the store
        rows = grid_rows(lines_of(app))
        assert list(rows)[-1] == "L30" and "▶" in rows["L30"]
        assert f"layers {31 - len(rows)}-30 of 30 × heads " in screen_text(app) and "-40 of 40" in screen_text(app)


@async_test
async def test_full_matrices_show_the_explained_row(full_heads_store, color_env):
    from tui.app import create_app
    from tui.screens.attention import AttentionScreen

    app = create_app(full_heads_store)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_modal(pilot, "a", AttentionScreen, "data")
        with open_store(full_heads_store) as s:
            np.testing.assert_array_equal(screen.data.rows, s[0].heads()[:, :, s[0].explain_pos])
            assert f"L1 H1  ▸[CLS] → {top_line(s, 0, 0, 0)}" in screen_text(app)


@async_test
async def test_a_store_without_heads_says_so_and_reads_nothing(tmp_path, color_env, monkeypatch):
    import store.reader
    from tui.app import create_app

    path = tmp_path / "plain.h5"
    make_store(str(path), n_examples=3)
    reads = []
    for name in ("heads", "head_rows"):  # every way to the per-head attention
        monkeypatch.setattr(store.reader.Example, name, lambda self, _n=name: reads.append(_n))
    app = create_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert app.meta.heads == "none"
        await pilot.press("a")
        await settle(pilot)
        assert type(app.screen).__name__ == "BrowseScreen" and reads == []
        notes = [n.message for n in app._notifications]
        assert notes == ["this store keeps no per-head attention: run attr-compute with --heads"]


@async_test
async def test_help_and_palette_name_the_key(bert_base_store, color_env):
    from tui.app import create_app
    from tui.commands import AttentionCommands, BrowseCommands
    from tui.screens.attention import AttentionScreen

    app = create_app(bert_base_store)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        assert "h  a" in screen_text(app) and "head masks / attention" in screen_text(app)
        await pilot.press("escape")
        await pilot.pause()
        titles = [t for t, _, _ in BrowseCommands(app.screen)._commands()]
        assert "attention: every head of this example" in titles
        screen = await open_modal(pilot, "a", AttentionScreen, "data")
        commands = {t: run for t, run, _ in AttentionCommands(screen)._commands()}
        assert {"scale: example", "attention: close"} <= set(commands) and "scale: head" not in commands
        commands["scale: example"]()
        await pilot.pause()
        assert screen.norm == "example" and "scale: example" in screen_text(app)


def test_thumbnails_are_block_maxima_on_the_chosen_scale():
    from tui.render.attention_grid import geometry, spark, thumbnails

    rows = np.array([[[0.1, 0.6, 0.2, 0.05, 0.05], [0.2, 0.2, 0.2, 0.2, 0.2]]])  # [1, 2, 5]
    # blocks of 2 tokens: (0.1, 0.6) (0.2, 0.05) (0.05, -) -> 0.6 0.2 0.05; the second head 0.2 throughout
    np.testing.assert_allclose(thumbnails(rows, 2, "head"), [[[1.0, 1 / 3, 0.05 / 0.6], [1.0, 1.0, 1.0]]])
    np.testing.assert_allclose(thumbnails(rows, 2, "example"), [[[1.0, 1 / 3, 0.05 / 0.6], [1 / 3, 1 / 3, 1 / 3]]])
    np.testing.assert_allclose(thumbnails(rows, 1, "head")[0, 0], rows[0, 0] / 0.6)
    assert thumbnails(np.zeros((1, 1, 3)), 1, "head").tolist() == [[[0.0, 0.0, 0.0]]]  # nothing: no division
    assert (spark(0.0), spark(0.5), spark(1.0)) == (" ", "▄", "█")
    # 12 x 12 at 80 columns (78 inside the padding): every head, thumbnails as wide as fits
    g = geometry(12, 12, 60, 78, 17, 0, 0)
    assert (len(g.layers), len(g.heads), g.cell, g.per) == (12, 12, 5, 12)
    assert 4 + 12 * (g.cell + 1) <= 78
    g = geometry(12, 12, 7, 118, 33, 0, 0)  # short examples: a column per token
    assert (g.cell, g.per) == (7, 1)


def test_attention_modules_do_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; import tui.screens.attention, tui.render.attention_grid; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(__import__("pathlib").Path(__file__).parents[1]))


def _run(*keys: str):
    async def run_before(pilot) -> None:
        await settle(pilot)
        for key in keys:
            await pilot.press(key)
            await settle(pilot)

    return run_before


@pytest.mark.parametrize("no_color", [False, True], ids=["color", "no_color"])
def test_snapshot_attention_80x24(snap_compare, bert_base_store, monkeypatch, no_color):
    from tui.app import create_app

    set_color_env(monkeypatch, no_color=no_color)
    assert snap_compare(create_app(bert_base_store), terminal_size=(80, 24),
                        run_before=_run("a", "down", "right", "right"))
