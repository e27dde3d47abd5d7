"""attr-tui: Pilot tests for behaviour, unit tests for the colour scales, CLI errors and import hygiene."""

from __future__ import annotations

import asyncio
import functools
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from rich.console import Console
from synthetic import make_store

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- helpers (also used by test_tui_snapshots.py)
def async_test(fn):
    """Run an async test with asyncio.run (no pytest async plugin needed)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


async def _workers_done(app) -> None:
    """Every worker finished; one cancelled meanwhile (an exclusive group's newer worker replaced it, as the app's
    periodic store refresh does under load) counts as finished, not as a failure of the test."""
    from textual.worker import WorkerCancelled

    for _ in range(100):
        running = [w for w in app.workers if not w.is_finished]
        if not running:
            return
        try:
            await app.workers.wait_for_complete(running)
            return
        except WorkerCancelled:
            continue  # wait for the others (the cancelled one is finished now)


async def settle(pilot, rounds: int = 40) -> None:
    """Wait until the workers are done and the messages they posted are handled (handlers may start more)."""
    app = pilot.app
    for _ in range(rounds):
        await _workers_done(app)
        await pilot.pause()
        if all(w.is_finished for w in app.workers) and app.current is not None and app.current in app.cache:
            # the list reads the rows it draws on workers of its own: let one more frame ask for them
            await pilot.pause()
            await _workers_done(app)
            await pilot.pause()
            if not getattr(app.example_list, "_asked", None):
                return
    await pilot.pause()


async def open_modal(pilot, key: str, screen_type, loaded: str):
    """Press ``key`` on the browse screen (none: already pressed) and wait until the ``screen_type`` screen has read
    its data (its attribute ``loaded`` is set) and laid out."""
    app = pilot.app
    await settle(pilot)
    if key:
        await pilot.press(key)
    for _ in range(100):
        await app.workers.wait_for_complete()
        await pilot.pause()
        if isinstance(app.screen, screen_type) and getattr(app.screen, loaded) is not None:
            break
    await pilot.pause()
    await pilot.pause()
    return app.screen


def screen_text(app) -> str:
    """The screen as plain text: what a user reads, colours dropped."""
    update = app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), record=True, force_terminal=True,
                      color_system=None, legacy_windows=False)
    console.print(update)
    return console.export_text()


def set_color_env(monkeypatch, *, no_color: bool = False, truecolor: bool = True) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    if truecolor:
        monkeypatch.setenv("COLORTERM", "truecolor")
    else:
        monkeypatch.delenv("COLORTERM", raising=False)
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    else:
        monkeypatch.delenv("NO_COLOR", raising=False)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tui") / "demo.h5"
    make_store(str(path), n_examples=12, L=3, seed=0)
    return path


@pytest.fixture
def color_env(monkeypatch):
    set_color_env(monkeypatch)


def token_cells(app):
    return app.query_one("#tokens").layout_data.cells


# ---------------------------------------------------------------- Pilot: behaviour
@async_test
async def test_first_example_tokens_visible(store_path, color_env):
    from store import open_store
    from tui.app import create_app

    with open_store(store_path) as s:
        first = s[0]
        tokens, ex_id = first.tokens, first.id
    app = create_app(store_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert app.current == 0
        assert ex_id in text
        for tok in tokens:
            assert tok in text
        assert "12 examples" in app.sub_title
        assert "rollout" in text and "final" in text


@async_test
async def test_j_changes_example(store_path, color_env):
    from tui.app import create_app

    app = create_app(store_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        before = screen_text(app)
        await pilot.press("j")
        await settle(pilot)
        assert app.current == 1
        after = screen_text(app)
        assert "ex1  2/12" in after and "ex1  2/12" not in before
        await pilot.press("down", "down", "k", "up")
        await settle(pilot)
        assert app.current == 1


@async_test
async def test_layer_stepping_changes_layer_and_colours(store_path, color_env):
    from tui.app import create_app

    app = create_app(store_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert app.layer is None
        final_styles = [c.style for c in token_cells(app)]
        reads = len(app.cache)
        await pilot.press("right_square_bracket")
        await settle(pilot)
        assert app.layer == 0
        assert "layer 1/3" in screen_text(app)
        assert [c.style for c in token_cells(app)] != final_styles
        await pilot.press("right_square_bracket", "right_square_bracket", "right_square_bracket")
        await settle(pilot)
        assert app.layer is None  # 1, 2, 3, then back to final
        assert [c.style for c in token_cells(app)] == final_styles
        await pilot.press("left_square_bracket")
        await settle(pilot)
        assert app.layer == 2 and "layer 3/3" in screen_text(app)
        assert len(app.cache) == reads  # layer stepping never re-reads the store


@async_test
async def test_m_cycles_methods(store_path, color_env):
    from tui.app import create_app

    app = create_app(store_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert "method rollout 1/3" in screen_text(app)
        await pilot.press("m")
        await settle(pilot)
        text = screen_text(app)
        assert "method normxlogit 2/3" in text and "signed" in text
        assert "+" in text.split("signed")[1]  # the colour bar reads -M .. 0 .. +M
        await pilot.press("right_square_bracket", "m")  # a layer view, then a method without layer views
        await settle(pilot)
        text = screen_text(app)
        assert "method norm 3/3" in text and "no layer views" in text
        assert app.screen.check_action("layer", (1,)) is None  # shown disabled in the footer
        await pilot.press("M")
        await settle(pilot)
        assert "method normxlogit 2/3" in screen_text(app)


@async_test
async def test_method_bar_shows_per_example_values(tmp_path, color_env):
    """A method's per-example scalars (integrated gradients' completeness delta) are shown beside its name."""
    from tui.app import create_app

    path = tmp_path / "values.h5"
    make_store(str(path), n_examples=4, L=3, seed=0, with_values=True)
    app = create_app(path)
    async with app.run_test(size=(100, 24)) as pilot:
        await settle(pilot)
        assert "ig_delta" not in screen_text(app)  # rollout has none
        await pilot.press("M")  # back to the last method, norm
        await settle(pilot)
        assert "method norm 3/3" in screen_text(app) and "ig_delta -1.25e-02" in screen_text(app)
        await pilot.press("j")
        await settle(pilot)
        assert "ig_delta -2.50e-02" in screen_text(app)


@async_test
async def test_command_palette_offers_methods_layers_and_ids(store_path, color_env):
    from tui.app import create_app

    app = create_app(store_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"normxlogit")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await settle(pilot)
        assert app.method.name == "normxlogit"
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"ex7")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await settle(pilot)
        assert app.current == 7


@async_test
async def test_q_quits(store_path, color_env):
    from tui.app import create_app

    app = create_app(store_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running


@async_test
async def test_ctrl_c_quits_from_every_screen_and_the_prompt(store_path, color_env):
    """Ctrl-C quits as in any terminal program (Textual's default only says to press Ctrl-Q), also from a modal
    screen and with the search prompt focused; the README names both keys."""
    from tui.app import create_app

    for keys in ((), ("question_mark",), ("c",), ("slash",)):
        app = create_app(store_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            if keys:
                await pilot.press(*keys)
                await settle(pilot)
            await pilot.press("ctrl+c")
            await pilot.pause()
            assert not app.is_running, keys
    readme = (ROOT / "README.md").read_text()
    assert "| `q` | quit (on a screen opened from the browse screen: close it) |" in readme
    assert "| `ctrl+c`, `ctrl+q` | quit, from any screen |" in readme


@async_test
async def test_help_screen(store_path, color_env):
    from tui.app import create_app
    from tui.screens.help import HelpScreen

    app = create_app(store_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = screen_text(app)
        assert "░▒▓█" in text and "sign of the score" in text
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)


@async_test
async def test_no_color_uses_glyphs_and_sign_marks(store_path, monkeypatch):
    from store import open_store
    from tui.app import create_app
    from tui.colors import GLYPHS

    set_color_env(monkeypatch, no_color=True)
    with open_store(store_path) as s:
        scores = s[0].scores("normxlogit")
    app = create_app(store_path)
    assert app.color_mode == "mono" and app.glyphs
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("m")  # normxlogit: signed
        await settle(pilot)
        cells = token_cells(app)
        assert all(c.style.bgcolor is None for c in cells)
        # the explained token ([CLS] here) carries the mark, and only it
        assert [c.text.startswith("▸") for c in cells] == [i == 0 for i in range(len(cells))]
        for cell, score in zip(cells, scores, strict=True):
            shown = cell.text.removeprefix("▸")
            assert shown[0] == ("+" if score > 0 else "-")
            assert shown[1] in GLYPHS
        text = screen_text(app)
        assert "[bold]" in text and "+" in text and "-" in text
        assert sum(bool(c.style.underline) for c in cells) >= 1  # top-k marked without colour


@async_test
async def test_256_colours_use_palette_entries(store_path, monkeypatch):
    from rich.color import ColorType

    from tui.app import create_app

    set_color_env(monkeypatch, truecolor=False)  # ssh: TERM=xterm-256color, no COLORTERM
    app = create_app(store_path)
    assert app.color_mode == "256"
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        cells = token_cells(app)
        assert all(c.style.bgcolor.type == ColorType.EIGHT_BIT for c in cells)


@async_test
async def test_bold_token_renders_literally(store_path, color_env):
    from store import open_store
    from tui.app import create_app

    with open_store(store_path) as s:
        target = next(i for i in range(len(s)) if "[bold]" in s[i].tokens)
    app = create_app(store_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        for _ in range(target):
            await pilot.press("j")
        await settle(pilot)
        assert app.current == target
        text = screen_text(app)
        token_area = text.split("─" * 10)[-1]
        assert "[bold]" in token_area
        cell = next(c for c in token_cells(app) if c.text == "[bold]")
        assert cell.text == "[bold]"


@async_test
async def test_growing_store_shows_new_examples(tmp_path, color_env):
    from store import StoreWriter, open_store
    from tui.app import create_app

    src = tmp_path / "src.h5"
    exs = make_store(str(src), n_examples=6)
    with open_store(src) as s:
        layouts = s._method_layouts
    from store import MethodLayout

    live = tmp_path / "live.h5"
    w = StoreWriter.create(str(live), n_layers=3, n_heads=4, labels={0: "negative", 1: "positive"},
                           methods=[MethodLayout(**m) for m in layouts.values()], provenance={})
    w.append(exs[:2])
    app = create_app(live, poll_seconds=0.1)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            assert app.example_list.row_count == 2
            assert "writing… 2 examples" in app.sub_title
            w.append(exs[2:5])
            for _ in range(50):
                await pilot.pause(0.05)
                if app.example_list.row_count == 5:
                    break
            assert app.example_list.row_count == 5
            assert "writing… 5 examples" in app.sub_title
            w.close(complete=True)
            for _ in range(50):
                await pilot.pause(0.05)
                if app.meta.complete:
                    break
            assert app.sub_title.endswith("5 examples") and "writing" not in app.sub_title
    finally:
        w.close()


@async_test
async def test_rows_beyond_first_index_chunk(tmp_path, color_env):
    """The list reads its rows block by block (1024 rows) as they are shown: at open only the first block; rows past
    it are the right ones; the header's count is the store's."""
    from tui.app import create_app

    path = tmp_path / "2100.h5"
    make_store(str(path), n_examples=2100, L=1)
    app = create_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        lst = app.example_list
        assert lst.row_count == 2100 and list(lst._blocks) == [0]
        assert "ex0" in screen_text(app) and "1/2100" in screen_text(app)
        await pilot.press("end")
        await settle(pilot)
        assert app.cache.get(2099).id == "ex2099"
        text = screen_text(app)
        assert "ex2099" in text and "ex2090" in text and "…" not in text.splitlines()[-3]
        assert set(lst._blocks) == {0, 2}  # the middle block was never shown, never read
        lst.move_to(1500)
        await settle(pilot)
        assert app.current == 1500 and "ex1500" in screen_text(app) and 1 in lst._blocks


_WRITER = r"""
import sys, time
from pathlib import Path
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
from synthetic import make_store
from store import MethodLayout, StoreWriter, open_store
src, live, go = Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
exs = make_store(str(src), n_examples=5)
with open_store(src) as s:
    layouts = [MethodLayout(**m) for m in s._method_layouts.values()]
w = StoreWriter.create(live, n_layers=3, n_heads=4, labels={0: "negative", 1: "positive"}, methods=layouts,
                       provenance={})
w.append(exs[:2])
while not go.exists():
    time.sleep(0.05)
w.append(exs[2:])
w.close(complete=True)
"""


@async_test
async def test_store_written_by_another_process(tmp_path, color_env):
    """attr-compute runs in another process: new rows and the final `complete` reach the open app."""
    from tui.app import create_app

    live, go = tmp_path / "live.h5", tmp_path / "go"
    env = dict(os.environ, HDF5_USE_FILE_LOCKING="FALSE")  # the writer's final reopen must not wait for our lock
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(ROOT), str(tmp_path / "src.h5"), str(live), str(go)],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(200):
            if live.exists():
                break
            time.sleep(0.05)
        time.sleep(0.3)
        app = create_app(live, poll_seconds=0.1)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            assert app.example_list.row_count == 2 and "writing… 2 examples" in app.sub_title
            go.touch()
            assert proc.wait(timeout=30) == 0, proc.stderr.read()
            for _ in range(100):
                await pilot.pause(0.05)
                if app.meta.complete:
                    break
            assert app.example_list.row_count == 5
            assert app.sub_title.endswith("5 examples") and "writing" not in app.sub_title
    finally:
        go.touch()
        proc.wait(timeout=30)


@async_test
async def test_example_list_100k_rows_is_fast(color_env):
    """The list asks only for the blocks of rows it draws: 100k rows move instantly and memory stays bounded."""
    from textual.app import App

    from tui.widgets import ExampleList
    from tui.widgets.example_list import BLOCK, MAX_BLOCKS, RowBlock

    n = 100_000
    asked = []

    class ListApp(App):
        def compose(self):
            yield ExampleList(id="examples")

        def on_mount(self):
            lst = self.query_one(ExampleList)
            lst.set_size(n, {0: "negative", 1: "positive"})
            lst.focus()

        def on_example_list_need_rows(self, message):
            asked.append(message.block)
            r = np.arange(message.block * BLOCK, min((message.block + 1) * BLOCK, n))
            self.query_one(ExampleList).put_block(message.block, RowBlock(r % 2, (r // 3) % 2, r % 500,
                                                                          [f"ex{i}" for i in r]))

    app = ListApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.pause()
        lst = app.query_one(ExampleList)
        assert asked == [0]
        t0 = time.perf_counter()
        await pilot.press("end")
        await pilot.pause()
        await pilot.pause()
        assert lst.cursor == n - 1
        assert "ex99999" in screen_text(app)
        assert asked == [0, (n - 1) // BLOCK]
        await pilot.press("pageup", "k", "k", "home", "j")
        await pilot.pause()
        assert lst.cursor == 1
        assert time.perf_counter() - t0 < 5
        for pos in range(0, n, 5000):  # jumping everywhere keeps at most MAX_BLOCKS blocks
            lst.move_to(pos)
            await pilot.pause()
        assert len(lst._blocks) <= MAX_BLOCKS


# ---------------------------------------------------------------- colour scales (pure functions)
def test_diverging_scale_is_symmetric():
    from tui.colors import background, normalize

    scale = normalize(np.array([-2.0, 0.5, 1.0, 0.0]), signed=True)
    assert scale.lo == -2.0 and scale.hi == 2.0
    np.testing.assert_allclose(scale.values, [-1.0, 0.25, 0.5, 0.0])
    for mode in ("truecolor", "256", "16"):
        assert background(0.0, mode) == background(-0.0, mode)
        for v in (0.2, 0.5, 1.0):
            pos, neg = background(v, mode), background(-v, mode)
            assert pos != neg  # hue tells the sign
            assert pos.get_truecolor() != neg.get_truecolor()


def test_brightness_grows_with_magnitude():
    from tui.colors import background, lightness

    for mode in ("truecolor", "256"):
        for sign in (1, -1):
            light = [lightness(background(sign * v, mode)) for v in np.linspace(0, 1, 21)]
            assert all(b >= a - 1e-9 for a, b in zip(light[:-1], light[1:], strict=True)), (mode, sign, light)
        for v in np.linspace(0.1, 1, 10):  # the same |value| looks about as bright on both sides
            assert abs(lightness(background(v, mode)) - lightness(background(-v, mode))) < 15


def test_sequential_scale_min_max():
    from tui.colors import normalize

    scale = normalize(np.array([0.1, 0.3, 0.5]), signed=False)
    assert (scale.lo, scale.hi) == (0.1, 0.5)
    np.testing.assert_allclose(scale.values, [0.0, 0.5, 1.0])
    flat = normalize(np.array([0.2, 0.2]), signed=False)
    np.testing.assert_allclose(flat.values, [0.0, 0.0])
    nan = normalize(np.array([np.nan, 1.0, -3.0]), signed=True)
    np.testing.assert_allclose(nan.values, [0.0, 1 / 3, -1.0])


def test_256_mode_uses_exact_palette_entries():
    from rich.color import ColorType

    from tui.colors import background

    for v in np.linspace(-1, 1, 21):
        assert background(v, "256").type == ColorType.EIGHT_BIT


def test_sign_distinguishable_without_colour():
    from tui.colors import Scale, normalize, sign_mark, token_style
    from tui.render.tokens import token_cells

    scale = normalize(np.array([0.8, -0.8, 0.0]), signed=True)
    cells = token_cells(["good", "bad", "x"], scale, "mono", glyphs=True, top=set())
    assert cells[0].text.startswith("+") and cells[1].text.startswith("-")
    assert cells[0].text[1] == cells[1].text[1]  # same magnitude, same glyph; only the mark differs
    assert cells[0].text != cells[1].text.replace("bad", "good")
    assert token_style(0.8, "mono") == token_style(-0.8, "mono")  # no colour: the style cannot carry the sign
    assert sign_mark(0.0) == "·" and isinstance(scale, Scale)


def test_glyph_ramp_and_top_k():
    from tui.colors import GLYPHS, default_k, glyph, token_style, top_k

    assert [glyph(v) for v in (0.0, 0.3, 0.5, 0.7, 1.0)] == list(GLYPHS)
    assert glyph(-1.0) == GLYPHS[-1]
    assert top_k(np.array([0.1, -0.9, 0.5]), signed=True, k=2) == {1, 2}
    assert top_k(np.array([0.1, -0.9, 0.5]), signed=False, k=2) == {0, 2}
    assert default_k(3) == 1 and default_k(100) == 5
    st = token_style(0.3, "truecolor", top=True)
    assert st.bold and st.underline


def test_tokens_are_literal_and_wordpieces_join():
    from tui.colors import normalize
    from tui.render.tokens import JOIN_MARK, TokenLayout, token_cells

    toks = ["[CLS]", "[bold]", "play", "##ing", "a\nb", "[/]", "[SEP]"]
    cells = token_cells(toks, normalize(np.arange(7.0), False), "truecolor", glyphs=False, top=set())
    text = _plain(TokenLayout(cells).lines(80))
    assert "[bold]" in text and "[/]" in text
    assert f"play{JOIN_MARK}ing" in text and "##" not in text
    assert "a\\nb" in text


def _plain(lines) -> str:
    return "\n".join(line.plain for line in lines)


def test_token_layout_breaks_between_tokens():
    from tui.colors import normalize
    from tui.render.tokens import TokenLayout, token_cells

    toks = [f"tok{i}" for i in range(30)]
    cells = token_cells(toks, normalize(np.arange(30.0), False), "256", glyphs=False, top=set())
    lines = TokenLayout(cells).lines(20)
    assert all(line.cell_len <= 20 for line in lines)
    assert " ".join(line.plain for line in lines).split() == toks
    glyph_cells = token_cells(toks, normalize(np.arange(30.0), False), "mono", glyphs=True, top=set())
    glyph_lines = TokenLayout(glyph_cells).lines(20)
    assert all(line.cell_len <= 20 for line in glyph_lines)
    assert re.findall(r"tok\d+", "\n".join(line.plain for line in glyph_lines)) == toks  # never split


def test_detect_mode():
    from tui.colors import detect_mode

    assert detect_mode(True, "truecolor") == "mono"
    assert detect_mode(False, None) == "mono"
    assert detect_mode(False, "truecolor") == "truecolor"
    assert detect_mode(False, "256") == "256"
    assert detect_mode(False, "standard") == "16"


# ---------------------------------------------------------------- command line
def test_cli_missing_file(tmp_path):
    from tui.cli import main

    result = CliRunner().invoke(main, [str(tmp_path / "missing.h5")])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attr-tui: error: ") and "not found" in lines[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize("kind", ["text", "hdf5", "directory"])
def test_cli_not_a_store(tmp_path, kind):
    from tui.cli import main

    path = tmp_path / "other.h5"
    if kind == "text":
        path.write_text("not hdf5\n")
    elif kind == "directory":
        path.mkdir()
    else:
        with h5py.File(path, "w") as f:
            f["x"] = np.arange(3)
    result = CliRunner().invoke(main, [str(path)])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attr-tui: error: ")
    assert "Traceback" not in result.output


def _damaged_past_the_first_example(tmp_path) -> Path:
    """A store whose first read is fine and whose rollout matrices (first read when an example's heatmap is shown)
    hold a flipped byte: open_store accepts it, a read of the whole store does not."""
    from store import open_store

    path = tmp_path / "flip.h5"
    make_store(str(path), n_examples=12)
    with h5py.File(path, "r") as f:
        info = f["methods/rollout/matrices"].id.get_chunk_info(0)
    data = bytearray(path.read_bytes())
    data[info.byte_offset + info.size // 2] ^= 0x10
    path.write_bytes(bytes(data))
    open_store(path).close()
    return path


def test_cli_refuses_a_store_damaged_past_what_opening_reads(tmp_path, monkeypatch):
    from tui.app import AttrApp
    from tui.cli import main

    path = _damaged_past_the_first_example(tmp_path)
    monkeypatch.setattr(AttrApp, "run", lambda self, *a, **k: None)  # never a terminal app in the test
    result = CliRunner().invoke(main, [str(path)])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, (result.exit_code, result.stderr)
    assert lines[0].startswith(f"attr-tui: error: store '{path}' is damaged: /methods/rollout/matrices"), lines[0]


@async_test
async def test_a_store_too_large_to_check_first_is_checked_on_a_worker(tmp_path, color_env):
    """Above tui.cli.VERIFY_AT_OPEN_BYTES the app opens at once and reads the whole store on a worker: the damage
    is a notification, not silence."""
    from tui.app import create_app

    app = create_app(_damaged_past_the_first_example(tmp_path), verify_store=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, rounds=20)
        notes = [n.message for n in app._notifications]
        assert any("could not read the whole store" in n and "/methods/rollout/matrices" in n for n in notes), notes


def test_cli_debug_shows_traceback(tmp_path):
    from store import StoreError
    from tui.cli import main

    result = CliRunner().invoke(main, [str(tmp_path / "missing.h5"), "--debug"])
    assert result.exit_code == 1 and isinstance(result.exception, StoreError)


def test_cli_usage_errors_exit_2_in_one_line():
    """Usage errors are one line like attr-compute's (click's own are usage, hint and error over four lines)."""
    from tui.cli import main

    cases = {(): "Missing argument 'STORE.h5'.",
             ("x.h5", "--color", "purple"): "Invalid value for '--color-system' / '--color': 'purple' is not one of",
             ("x.h5", "--bogus"): "No such option '--bogus'",
             ("x.h5", "--port", "8000"): "--host, --port and --max-sessions go with --serve",
             ("x.h5", "--max-sessions", "2"): "--host, --port and --max-sessions go with --serve",
             ("x.h5", "--serve", "--max-sessions", "0"): "Invalid value for '--max-sessions': 0 is not in the range "
                                                         "x>=1."}
    for args, message in cases.items():
        result = CliRunner().invoke(main, list(args))
        assert result.exit_code == 2, (args, result.output)
        lines = result.output.splitlines()  # CliRunner mixes stderr into output
        assert len(lines) == 1, (args, result.output)
        assert lines[0].startswith("attr-tui: error: ") and lines[0].endswith(" (see attr-tui --help)"), lines
        assert message in lines[0], (message, lines[0])


def test_import_hygiene():
    code = ("import tui.app, tui.cli, sys; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, "
            "sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------- issue 13: damage, newer formats, narrow subtitles
@async_test
async def test_growing_store_keeps_state_visible_at_80_columns_and_header_count_follows(tmp_path, color_env):
    from store import MethodLayout, StoreWriter, open_store
    from tui.app import create_app

    exs = make_store(str(tmp_path / "src.h5"), n_examples=6)
    with open_store(tmp_path / "src.h5") as s:
        layouts = s._method_layouts
    live = tmp_path / "live.h5"
    long_model = "/very/long/path/to/some/checkpoints/directory/of/a/fine-tuned/bert-base-uncased-sst2/final"
    w = StoreWriter.create(str(live), n_layers=3, n_heads=4, labels={0: "negative", 1: "positive"},
                           methods=[MethodLayout(**m) for m in layouts.values()], provenance={},
                           attrs={"model_id": long_model})
    w.append(exs[:2])
    app = create_app(live, poll_seconds=0.1)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            assert app.sub_title.startswith("writing… 2 examples"), app.sub_title
            header_line = screen_text(app).splitlines()[0]
            assert "writing… 2 examples" in header_line, header_line
            assert "1/2" in screen_text(app)
            w.append(exs[2:5])
            for _ in range(400):  # the poll is every 0.1 s; a loaded machine may take a few seconds
                await pilot.pause(0.05)
                if app.example_list.row_count == 5 and app.cache.get(0) is not None and "1/5" in screen_text(app):
                    break
            await settle(pilot)
            text = screen_text(app)
            assert "1/5" in text and "1/2" not in text, text
            assert "writing… 5 examples" in text.splitlines()[0]
    finally:
        w.close()


@async_test
async def test_newer_minor_format_is_announced(tmp_path, color_env):
    from tui.app import create_app

    path = tmp_path / "newer.h5"
    make_store(str(path), n_examples=3)
    with h5py.File(path, "r+") as f:
        f.attrs["encoding-version"] = np.bytes_(b"2.99.0")  # fixed-length, as the writer stores text attributes
    with pytest.warns(UserWarning):
        app = create_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        notes = [n.message for n in app._notifications]
        assert any("2.99.0" in n and "newer" in n for n in notes), notes


@async_test
async def test_damage_found_after_opening_is_shown_and_q_quits_while_a_read_holds_the_lock(store_path, color_env):
    from tui.app import create_app

    app = create_app(store_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)

        def broken(*_a, **_k):
            from store import StoreError
            raise StoreError(f"store '{store_path.name}' is damaged: examples/index cannot be read (bad checksum): "
                             "copy the file again, or recompute it with attr-compute --overwrite")

        import tui.app as tui_app
        original = tui_app.read_example
        tui_app.read_example = broken
        try:
            app.cache.clear() if hasattr(app.cache, "clear") else None
            await pilot.press("j")
            await settle(pilot, rounds=10)
            notes = [n.message for n in app._notifications]
            assert any("is damaged" in n for n in notes), notes
            assert "is damaged" in screen_text(app) or any("is damaged" in n for n in notes)
        finally:
            tui_app.read_example = original
        app.store_lock.acquire()  # a read stuck in HDF5: quitting must not wait for it
        t0 = time.monotonic()
        await pilot.press("q")
    assert time.monotonic() - t0 < 5
    app.store_lock.release()


@async_test
async def test_16_colours_reach_the_terminal_as_ansi_colours(store_path, monkeypatch):
    """TERM=xterm: the ramps' ANSI colours are not converted to RGB (and then mapped to the nearest of 16, which
    collapsed the ramps and turned red into magenta)."""
    from textual.filter import ANSIToTruecolor

    from tui.app import create_app
    from tui.colors import COLORMAPS, background

    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.delenv("COLORTERM", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    app = create_app(store_path)
    assert app.color_mode == "16" and app.ansi_color is True
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert all(not f.enabled for f in app._filters if isinstance(f, ANSIToTruecolor))
        cells = token_cells(app)
        used = {c.style.bgcolor.number for c in cells if c.style.bgcolor is not None}
        assert used <= set(COLORMAPS["dark"].warm_16) and len({background(v, "16").number for v in np.linspace(0, 1, 9)}) == 5


def test_cli_color_system_option(tmp_path):
    from tui.cli import main

    res = CliRunner().invoke(main, [str(tmp_path / "none.h5"), "--color-system", "purple"])
    assert res.exit_code == 2 and "--color-system" in res.output


@async_test
async def test_s_cycles_the_colour_normalisation(store_path, color_env):
    from store import open_store
    from tui.app import create_app

    with open_store(store_path) as s:
        ex = s[0]
        final, views = ex.scores("rollout"), ex.layer_scores("rollout")
        stats = s.scale_stats("rollout", compute=True)
    app = create_app(store_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        def bar() -> str:
            # the colour bar names the tokens its scale is over (colors.SCALE_TOKENS): random scores, all of them
            return next(line for line in screen_text(app).splitlines() if "all tokens" in line)

        assert app.norm == "view" and f"{final.min():.3g}" in bar() and f"{final.max():.3g}" in bar()
        await pilot.press("s")
        await settle(pilot)
        every = np.concatenate([final, views.ravel()])
        assert app.norm == "example" and "per example" in bar()
        assert f"{every.min():.3g}" in bar() and f"{every.max():.3g}" in bar()
        await pilot.press("s")
        await app.workers.wait_for_complete()
        await settle(pilot)
        assert app.norm == "global" and "global" in bar()
        assert f"{stats['final'].min:.3g}" in bar() and f"{stats['final'].max:.3g}" in bar()
        await pilot.press("s")
        await settle(pilot)
        assert app.norm == "view"


@pytest.mark.parametrize("cmap", ["dark", "light"])
def test_every_colormap_moves_away_from_its_zero(cmap):
    """Each colormap: 0 is the map's zero colour (black or white) on both sides; lightness moves monotonically away
    from it with |value| in truecolor and 256 colours (16 colours are the terminal's own: each step is another
    standard colour); the sign shows in the hue; both sides about equally far."""
    from tui.colors import COLORMAPS, background, lightness

    zero = 0.0 if cmap == "dark" else 100.0
    direction = 1 if cmap == "dark" else -1
    for mode in ("truecolor", "256", "16"):
        assert background(0.0, mode, cmap) == background(-0.0, mode, cmap)
        if mode != "16":  # the 16-colour zero is the terminal's own (bright) black or white
            assert abs(lightness(background(0.0, mode, cmap)) - zero) < 1
        for sign in (1, -1):
            if mode == "16":
                ramp = COLORMAPS[cmap].warm_16 if sign > 0 else COLORMAPS[cmap].cold_16
                used = [background(sign * v, mode, cmap).number for v in np.linspace(0, 1, 21)]
                assert sorted(set(used), key=used.index) == list(ramp), (cmap, sign, used)  # every step, in order
                continue
            light = [direction * lightness(background(sign * v, mode, cmap)) for v in np.linspace(0, 1, 21)]
            assert all(b >= a - 1e-9 for a, b in zip(light[:-1], light[1:], strict=True)), (cmap, mode, sign, light)
        for v in (0.3, 0.7, 1.0):
            assert background(v, mode, cmap).get_truecolor() != background(-v, mode, cmap).get_truecolor()
    for v in np.linspace(0.1, 1, 10):
        assert abs(lightness(background(v, "256", cmap)) - lightness(background(-v, "256", cmap))) < 15
    assert COLORMAPS[cmap].description


@async_test
async def test_colormap_from_the_palette_and_the_cli(store_path, color_env, tmp_path, monkeypatch):
    """The palette's colormap entry recolours the tokens (a zero score: black in dark, white in light) and the
    exported figure; --colormap starts with it; an unknown one is a usage error."""
    from click.testing import CliRunner

    from tui.app import create_app
    from tui.cli import main
    from tui.commands import BrowseCommands

    app = create_app(store_path)
    monkeypatch.chdir(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        assert app.colormap == "dark"
        dark_styles = [c.style.bgcolor for c in token_cells(app)]
        entry = next(c for c in BrowseCommands(app.screen)._commands() if c[0] == "colormap: light")
        entry[1]()
        await settle(pilot)
        assert app.colormap == "light"
        light_styles = [c.style.bgcolor for c in token_cells(app)]
        assert light_styles != dark_styles
        ex = app.cache.get(app.current)
        scale = app.browse.scale(ex, app.method, ex.scores[app.method.name])
        zero = int(np.argmin(scale.values))  # the minimum of a non-negative view maps to the zero colour
        assert light_styles[zero].get_truecolor() == (255, 255, 255)
        assert dark_styles[zero].get_truecolor() == (0, 0, 0)
        assert not any(c[0] == "colormap: light" for c in BrowseCommands(app.screen)._commands())
        paths = app.export_figure(ex, [app.method.name])
        svg = open(next(p for p in paths if p.endswith(".svg"))).read()
        assert "#ffffff" in svg.lower()
    result = CliRunner().invoke(main, [str(store_path), "--colormap", "nope"])
    assert result.exit_code == 2 and "nope" in result.output


@async_test
async def test_token_cursor_shows_each_tokens_value_rank_and_piece(store_path, color_env):
    """. and , move a cursor over the tokens; the token pane's title gives the token, its piece, its value in the
    shown view and its rank (by |score| for signed methods); the cursor's token is drawn reversed."""
    from store import open_store
    from tui.app import create_app
    from tui.colors import format_score

    with open_store(store_path) as s:
        ex = s[0]
        tokens, final = list(ex.tokens), np.asarray(ex.scores("rollout"), np.float64)
    app = create_app(store_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        pane = app.query_one("#tokens")
        assert app.token is None and not pane.border_title
        for i in range(len(tokens)):
            await pilot.press("full_stop")
            await pilot.pause()
            assert app.token == i
            rank = 1 + int((final > final[i]).sum())
            title = str(pane.border_title)
            assert f"{i + 1}/{len(tokens)}" in title and tokens[i] in title, title
            assert format_score(float(np.float32(final[i]))) in title and f"rank {rank}/{len(tokens)}" in title
            assert token_cells(app)[i].style.reverse and not any(c.style.reverse for k, c in
                                                                 enumerate(token_cells(app)) if k != i)
            assert f"rank {rank}/" in screen_text(app)
        await pilot.press("full_stop")  # stays on the last token
        assert app.token == len(tokens) - 1
        await pilot.press("comma")
        assert app.token == len(tokens) - 2
        await pilot.press("j")  # another example: the cursor goes
        await settle(pilot)
        assert app.token is None and not pane.border_title


@async_test
async def test_notifications_do_not_linger_across_screens(store_path, color_env):
    """Issue 38.13: a note of one screen (the browse screen's scale) is gone when another screen opens, and one of that
    screen is gone when it closes."""
    from tui.app import create_app
    from tui.screens.help import HelpScreen

    app = create_app(store_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("s")
        await settle(pilot)
        assert [n.message for n in app._notifications] == ["scale: per example (all its layers)"]
        await pilot.press("question_mark")
        await settle(pilot)
        assert isinstance(app.screen, HelpScreen) and list(app._notifications) == []
        app.notify("on the help screen")
        await pilot.press("escape")
        await settle(pilot)
        assert not isinstance(app.screen, HelpScreen) and list(app._notifications) == []
