"""Every key of every screen does what its footer or help entry says: pressing it changes the state it names.

One table per screen maps each bound key to a function of the app that reads the state the key must change; a key
added to a screen without an entry here fails :func:`test_every_binding_has_a_check`. Each screen is driven by one
app through all its keys (an app per key would cost a minute of the suite).
"""

from __future__ import annotations

import os

import pytest
from synthetic import make_store
from test_tui import async_test, open_modal, set_color_env, settle
from test_tui_heads import head_masks
from test_tui_metrics import metric_data


@pytest.fixture(scope="module")
def full_store(tmp_path_factory):
    """Three methods (two with full matrices), three head masks, per-head attention, five metrics, 12 examples."""
    from store import MethodLayout, StoreWriter, add_metrics, open_store

    d = tmp_path_factory.mktemp("bindings")
    scratch, path = str(d / "src.h5"), str(d / "full.h5")
    exs = make_store(scratch, n_examples=12, L=3, seed=0, signed_matrices=True, heads="cls")
    with open_store(scratch) as s:
        layouts = [MethodLayout(**m) for m in s._method_layouts.values()]
    w = StoreWriter.create(path, n_layers=3, n_heads=4, labels={0: "negative", 1: "positive"}, methods=layouts,
                           provenance={"model": "synthetic"}, attrs={"model_id": "synthetic"},
                           head_masks=head_masks(3, 4, seed=0), heads="cls")
    w.append(exs)
    w.close(complete=True)
    add_metrics(path, metric_data())
    return path


@pytest.fixture
def env(monkeypatch, tmp_path):
    set_color_env(monkeypatch)
    monkeypatch.chdir(tmp_path)  # figures and screenshots go to the current directory
    return tmp_path


def screen_name(app) -> str:
    return type(app.screen).__name__


def files(app) -> int:
    return len(os.listdir(os.getcwd()))


def prompt_open(app) -> bool:
    return bool(app.browse.query("#prompt"))


# key -> what it changes. Keys bound together (escape,c,q) are each checked.
BROWSE = {
    "left_square_bracket": lambda a: a.layer, "right_square_bracket": lambda a: a.layer,
    "m": lambda a: a.method_index, "M": lambda a: a.method_index,
    "g": lambda a: a.glyphs, "l": lambda a: a.show_strip, "s": lambda a: a.norm,
    "t": lambda a: a.scale_tokens.get(a.method.name),
    "full_stop": lambda a: a.token, "comma": lambda a: a.token,
    "c": screen_name, "x": screen_name, "a": screen_name, "e": files,
    "slash": prompt_open, "escape": prompt_open,
    "n": lambda a: a.current, "N": lambda a: a.current, "r": lambda a: a.view.matches is None,
    "j": lambda a: a.current, "k": lambda a: a.current,
    # a generation store's (test_generation_keys)
    "less_than_sign": lambda a: a.step, "greater_than_sign": lambda a: a.step, "v": screen_name,
}
EXAMPLE_LIST = {key: (lambda a: a.current) for key in ("j", "k", "down", "up", "pagedown", "pageup", "home", "end")}
APP = {"h": screen_name, "f": screen_name, "question_mark": screen_name, "q": lambda a: a.is_running,
       "ctrl+c": lambda a: a.is_running}
COMPARE = {
    "j": lambda a: a.screen.index, "k": lambda a: a.screen.index, "s": lambda a: a.screen.shared,
    "d": lambda a: a.screen.difference, "plus": lambda a: a.screen.top, "equals_sign": lambda a: a.screen.top,
    "minus": lambda a: a.screen.top, "a": lambda a: bool(a.screen.query("SelectionList")), "e": files,
    "escape": screen_name, "c": screen_name, "q": screen_name,
    "less_than_sign": lambda a: a.step, "greater_than_sign": lambda a: a.step,  # a generation store's
}
GENERATION = {
    "up": lambda a: a.step, "down": lambda a: a.step, "left": lambda a: a.screen.cell,
    "right": lambda a: a.screen.cell, "left_square_bracket": lambda a: a.screen.view_layer,
    "right_square_bracket": lambda a: a.screen.view_layer, "m": lambda a: a.screen.method,
    "s": lambda a: a.screen.norm, "j": lambda a: a.screen.index, "k": lambda a: a.screen.index,
    "escape": screen_name, "v": screen_name, "q": screen_name,
}
MATRIX = {
    "left_square_bracket": lambda a: a.screen.view_layer, "right_square_bracket": lambda a: a.screen.view_layer,
    "m": lambda a: a.screen.method, "s": lambda a: a.screen.norm,
    "j": lambda a: a.screen.index, "k": lambda a: a.screen.index,
    "up": lambda a: a.screen.cell, "down": lambda a: a.screen.cell, "left": lambda a: a.screen.cell,
    "right": lambda a: a.screen.cell, "escape": screen_name, "x": screen_name, "q": screen_name,
}
METRICS = {
    "up": lambda a: a.screen.cursor, "down": lambda a: a.screen.cursor, "home": lambda a: a.screen.cursor,
    "end": lambda a: a.screen.cursor, "left": lambda a: a.screen.sort, "right": lambda a: a.screen.sort,
    "tab": lambda a: a.screen.sort, "shift+tab": lambda a: a.screen.sort, "s": lambda a: a.screen.descending,
    "p": lambda a: a.screen.chart,
    "pagedown": lambda a: a.screen.query_one("#metrics-side").scroll_y,
    "pageup": lambda a: a.screen.query_one("#metrics-side").scroll_y,
    "ctrl+p": screen_name, "enter": screen_name, "escape": screen_name, "f": screen_name, "q": screen_name,
}
HEADS = {
    "m": lambda a: a.screen.current, "M": lambda a: a.screen.current,
    "up": lambda a: a.screen.cursor_layer, "down": lambda a: a.screen.cursor_layer,
    "home": lambda a: a.screen.cursor_layer, "end": lambda a: a.screen.cursor_layer,
    "left": lambda a: a.screen.cursor_head, "right": lambda a: a.screen.cursor_head,
    "ctrl+p": screen_name, "escape": screen_name, "h": screen_name, "q": screen_name,
    "enter": lambda a: (screen_name(a), len(a._notifications)),  # the head matrix, or why this store has none
}
ATTENTION = {
    "up": lambda a: a.screen.cursor_layer, "down": lambda a: a.screen.cursor_layer,
    "left": lambda a: a.screen.cursor_head, "right": lambda a: a.screen.cursor_head,
    "j": lambda a: a.screen.index, "k": lambda a: a.screen.index, "s": lambda a: a.screen.norm,
    "escape": screen_name, "a": screen_name, "q": screen_name,
    "enter": lambda a: (screen_name(a), len(a._notifications)),  # the head matrix, or why this store has none
}
HELP = {"escape": screen_name, "question_mark": screen_name}


def _keys(bindings) -> set[str]:
    return {k.strip() for b in bindings for k in b.key.split(",")}


def test_every_binding_has_a_check():
    from tui.app import AttrApp
    from tui.screens.attention import AttentionScreen
    from tui.screens.browse import BrowseScreen
    from tui.screens.compare import CompareScreen
    from tui.screens.generation import GenerationScreen
    from tui.screens.heads import HeadsScreen
    from tui.screens.help import HelpScreen
    from tui.screens.matrix import MatrixScreen
    from tui.screens.metrics import MetricsScreen
    from tui.widgets.example_list import ExampleList

    for owner, table in ((AttrApp, APP), (BrowseScreen, BROWSE), (ExampleList, EXAMPLE_LIST),
                         (CompareScreen, COMPARE), (MatrixScreen, MATRIX), (MetricsScreen, METRICS),
                         (HeadsScreen, HEADS), (AttentionScreen, ATTENTION), (HelpScreen, HELP),
                         (GenerationScreen, GENERATION)):
        assert _keys(owner.BINDINGS) == set(table), owner.__name__


async def press_and_check(pilot, table, key, before_key=None):
    """Press ``key`` and assert the state ``table[key]`` reads has changed."""
    app = pilot.app
    read = table[key]
    await settle(pilot)
    before = read(app)
    await pilot.press(key)
    for _ in range(3):  # a key whose effect waits for a worker (a read, an export) gets more rounds
        await app.workers.wait_for_complete()
        await settle(pilot)
        after = read(app)
        if after != before:
            break
    assert after != before, (key, before, after)


async def close_and_reopen(pilot, table, keys, open_key, screen_cls, ready):
    """Each of ``keys`` closes the screen (checked through ``table``); the screen is opened again between them."""
    for i, key in enumerate(keys):
        assert isinstance(pilot.app.screen, screen_cls)
        await press_and_check(pilot, table, key)
        if i < len(keys) - 1:
            await open_modal(pilot, open_key, screen_cls, ready)


async def back_to_browse(pilot):
    app = pilot.app
    for _ in range(3):
        if screen_name(app) == "BrowseScreen":
            break
        await pilot.press("escape")
        await settle(pilot)
    assert screen_name(app) == "BrowseScreen"


@async_test
async def test_browse_and_list_keys(full_store, env):
    from tui.app import create_app

    app = create_app(full_store)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        for key in ("right_square_bracket", "left_square_bracket", "m", "M", "g", "l", "s", "t", "full_stop",
                    "full_stop", "comma"):  # the token cursor: none -> 0 -> 1 -> 0
            await press_and_check(pilot, BROWSE, key)
        for key in ("c", "x", "a"):
            await press_and_check(pilot, BROWSE, key)
            await back_to_browse(pilot)
        await press_and_check(pilot, BROWSE, "e")  # three figure files in the current directory
        await press_and_check(pilot, BROWSE, "slash")
        await press_and_check(pilot, BROWSE, "escape")  # closes the prompt
        await pilot.press("slash")
        await pilot.press(*"movie", "enter")
        await settle(pilot)
        await app.workers.wait_for_complete()
        await settle(pilot)
        assert app.view.matches is not None and len(app.view.matches) > 2
        await press_and_check(pilot, BROWSE, "n")
        await press_and_check(pilot, BROWSE, "N")
        await press_and_check(pilot, BROWSE, "r")
        for key in ("j", "k"):
            await press_and_check(pilot, BROWSE, key)
        for key in ("down", "up", "pagedown", "pageup", "end", "home"):
            await press_and_check(pilot, EXAMPLE_LIST, key)
        for key in ("h", "f", "question_mark"):
            await press_and_check(pilot, APP, key)
            await back_to_browse(pilot)
        await press_and_check(pilot, APP, "q")


@async_test
async def test_compare_keys(full_store, env):
    from tui.app import create_app
    from tui.screens.compare import CompareScreen

    app = create_app(full_store)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_modal(pilot, "c", CompareScreen, "example")
        for key in ("j", "k", "s", "d", "plus", "equals_sign", "minus", "e"):
            await press_and_check(pilot, COMPARE, key)
        await press_and_check(pilot, COMPARE, "a")
        await pilot.press("escape")  # closes the selection list, not the screen
        await settle(pilot)
        assert screen_name(app) == "CompareScreen"
        await close_and_reopen(pilot, COMPARE, ("escape", "c", "q"), "c", CompareScreen, "example")


@async_test
async def test_generation_keys(tmp_path_factory, env):
    """A generation store's keys: the step cursor on the browse and compare screens, the heatmap screen's."""
    from generation_stores import write_generation_store

    from tui.app import create_app
    from tui.screens.compare import CompareScreen
    from tui.screens.generation import GenerationScreen

    path = tmp_path_factory.mktemp("gen-bindings") / "gen.h5"
    write_generation_store(path)
    app = create_app(path)
    async with app.run_test(size=(120, 40)) as pilot:
        for key in ("greater_than_sign", "less_than_sign"):
            await press_and_check(pilot, BROWSE, key)
        await open_modal(pilot, "c", CompareScreen, "example")
        for key in ("greater_than_sign", "less_than_sign"):
            await press_and_check(pilot, COMPARE, key)
        await pilot.press("escape")
        await open_modal(pilot, "v", GenerationScreen, "geometry")
        for key in ("down", "up", "right", "left", "right_square_bracket", "left_square_bracket", "s", "m", "j",
                    "k"):
            await press_and_check(pilot, GENERATION, key)
        await close_and_reopen(pilot, GENERATION, ("escape", "v", "q"), "v", GenerationScreen, "geometry")


@async_test
async def test_matrix_keys(full_store, env):
    from tui.app import create_app
    from tui.screens.matrix import MatrixScreen

    app = create_app(full_store)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_modal(pilot, "x", MatrixScreen, "matrices")
        for key in ("right_square_bracket", "left_square_bracket", "s", "j", "k", "down", "right", "up", "left",
                    "m"):
            await press_and_check(pilot, MATRIX, key)
        await close_and_reopen(pilot, MATRIX, ("escape", "x", "q"), "x", MatrixScreen, "matrices")


@async_test
async def test_attention_keys(full_store, env):
    from tui.app import create_app
    from tui.screens.attention import AttentionScreen

    app = create_app(full_store)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_modal(pilot, "a", AttentionScreen, "data")
        for key in ("down", "right", "up", "left", "s", "j", "k", "enter"):
            await press_and_check(pilot, ATTENTION, key)
        await close_and_reopen(pilot, ATTENTION, ("escape", "a", "q"), "a", AttentionScreen, "data")


@async_test
async def test_metrics_keys(full_store, env):
    from tui.app import create_app
    from tui.screens.metrics import MetricsScreen

    app = create_app(full_store)
    async with app.run_test(size=(120, 24)) as pilot:
        await open_modal(pilot, "f", MetricsScreen, "data")
        for key in ("down", "up", "end", "home", "right", "left", "tab", "shift+tab", "s", "pagedown", "pageup",
                    "p"):
            await press_and_check(pilot, METRICS, key)
        await press_and_check(pilot, METRICS, "ctrl+p")  # the palette over the metrics screen
        await pilot.press("escape")
        await settle(pilot)
        await close_and_reopen(pilot, METRICS, ("escape", "f", "q", "enter"), "f", MetricsScreen, "data")


@async_test
async def test_heads_and_help_keys(full_store, env):
    from tui.app import create_app
    from tui.screens.heads import HeadsScreen

    app = create_app(full_store)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_modal(pilot, "h", HeadsScreen, "masks")
        for key in ("m", "M", "down", "up", "end", "home", "right", "left", "enter"):
            await press_and_check(pilot, HEADS, key)
        await press_and_check(pilot, HEADS, "ctrl+p")
        await pilot.press("escape")
        await settle(pilot)
        await close_and_reopen(pilot, HEADS, ("escape", "h", "q"), "h", HeadsScreen, "masks")
        await back_to_browse(pilot)
        for key in ("escape", "question_mark"):
            await pilot.press("question_mark")
            await settle(pilot)
            assert screen_name(app) == "HelpScreen"
            await press_and_check(pilot, HELP, key)
