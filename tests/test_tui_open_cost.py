"""attr-tui on a large store (issue 38, point 15): what the app's process reads to open a store does not grow with the
number of examples, and the whole-store check of a store too large to check before the app starts runs in a process
of its own (niced), reports damage in one notification, and ends with the app."""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np

from synthetic import make_store
from test_tui import _damaged_past_the_first_example, async_test, color_env, screen_text, settle  # noqa: F401 - a fixture


def _count_reads(monkeypatch) -> list[tuple[str, int]]:
    """Every read of the store in this process, (dataset, elements read)."""
    from store.reader import Store

    seen: list[tuple[str, int]] = []
    read = Store._read

    def counted(self, name, sel, expect=None):
        out = read(self, name, sel, expect)
        seen.append((name, int(out.size)))
        return out

    monkeypatch.setattr(Store, "_read", counted)
    return seen


async def _open_and_settle(path) -> tuple[int, object]:
    from tui.app import create_app

    app = create_app(path, verify_store=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, rounds=20)
        assert app.current == 0 and 0 in app.cache
        await app.workers.wait_for_complete()
        await pilot.pause()
        errors = [n.message for n in app._notifications if n.severity == "error"]
    return app, errors


def small_and_large(tmp_path):
    """Stores of 1,100 and 4,400 examples, the same first ones."""
    small, large = tmp_path / "small.h5", tmp_path / "large.h5"
    make_store(str(small), n_examples=1100)
    make_store(str(large), n_examples=4400)
    return small, large


@async_test
async def test_opening_reads_the_same_in_a_small_and_a_large_store(tmp_path, monkeypatch, color_env):
    """The app's process reads the same datasets, as many values each, a bounded number of times, for 1,100 and 4,400 examples
    (the same first examples): opening, the list's first rows, the first example and its neighbours. The whole-store
    check (verify_store, as attr-tui asks for a large store) read every example in the app's process before."""
    small, large = small_and_large(tmp_path)
    reads = _count_reads(monkeypatch)
    counts = []
    for path in (small, large):
        reads.clear()
        _, errors = await _open_and_settle(path)
        assert not errors
        counts.append(sorted(reads))
    # the same reads; how often the list's visible rows are read again follows the frames drawn (timing), not n
    assert sorted(set(counts[0])) == sorted(set(counts[1]))
    assert max(len(c) for c in counts) < 80, [len(c) for c in counts]
    assert sum(k for _, k in counts[1]) < 40_000  # a block of index and digest rows, a few examples: not the store


@async_test
async def test_a_key_reads_the_same_in_a_small_and_a_large_store(tmp_path, monkeypatch, color_env):
    """Issue 38.15: what j reads (the read-ahead's next neighbour, the list's rows it draws) does not grow with the
    store: the same datasets, as many values each, for 1,100 and 4,400 examples, key by key."""
    from tui.app import create_app

    small, large = small_and_large(tmp_path)
    reads = _count_reads(monkeypatch)
    per_store = []
    for path in (small, large):
        app = create_app(path)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, rounds=20)
            keys = []
            for i in range(1, 6):
                reads.clear()
                await pilot.press("j")
                await settle(pilot)
                assert app.current == i
                keys.append(sorted(reads))
        per_store.append(keys)
    assert per_store[0] == per_store[1]
    for key in per_store[1]:
        assert sum(k for _, k in key) < 2_000, key  # an example's runs (a neighbour), not a block of the store


@async_test
async def test_the_whole_store_check_runs_in_another_process(tmp_path, monkeypatch, color_env):
    """verify() is never called in the app's process; the child that runs it reports the damage as the one-line
    notification it was before, and has exited once the app has."""
    import importlib

    verifying = importlib.import_module("store.verify")  # the module (the package's ``verify`` is the function)
    calls = []
    real = verifying.verify
    monkeypatch.setattr(verifying, "verify", lambda *a, **k: (calls.append(threading.current_thread().name),
                                                                real(*a, **k)))
    path = _damaged_past_the_first_example(tmp_path)
    app, errors = await _open_and_settle(path)
    assert calls == []
    proc = app.verify_process
    assert proc is not None and proc.pid != os.getpid()
    assert proc.returncode == 1
    assert any("could not read the whole store" in e and f"store '{path}' is damaged: /methods/rollout/matrices" in e
               for e in errors), errors


@async_test
async def test_quitting_ends_a_whole_store_check_still_running(tmp_path, monkeypatch, color_env):
    """A check still running when the app quits is stopped (it kept the process alive for the whole read of the
    store before), and says nothing."""
    import tui.app
    from tui.app import create_app

    monkeypatch.setattr(tui.app, "verify_command", lambda path, nice=0: [sys.executable, "-c",
                                                                      "import time; time.sleep(60)"])
    path = tmp_path / "s.h5"
    make_store(str(path), n_examples=4)
    app = create_app(path, verify_store=True)
    async with app.run_test(size=(80, 24)) as pilot:
        for _ in range(100):
            await pilot.pause(0.02)
            if app.verify_process is not None:
                break
        proc = app.verify_process
        assert proc is not None and proc.poll() is None
    t = time.monotonic()
    while proc.poll() is None and time.monotonic() - t < 5:
        time.sleep(0.02)
    assert proc.returncode is not None and time.monotonic() - t < 5
    assert not [n for n in app._notifications if n.severity == "error"]


def test_reading_the_next_example_looks_up_no_dataset_again(tmp_path, monkeypatch):
    """The browse screen's read of an example (tui.data.read_example: 26 reads on the benchmark's store) opens each
    dataset once per file handle: looking a path up and dropping its chunk cache at every read was most of "next
    example" (41 -> 1.8 ms per example on a 100k store, load 8.5 on 2 cores). A refresh that reopens the file
    opens them again; what is read stays right."""
    import h5py

    from store import open_store
    from tui.data import read_example

    path = tmp_path / "s.h5"
    exs = make_store(str(path), n_examples=40, with_values=True)
    lookups = []
    get = h5py.Group.__getitem__
    monkeypatch.setattr(h5py.Group, "__getitem__", lambda self, name: (lookups.append(name), get(self, name))[1])
    with open_store(path) as s:
        methods = tuple(s.methods)
        read_example(s, 0, methods)
        lookups.clear()
        for i in range(1, 40):
            ex = read_example(s, i, methods)
            assert ex.tokens == exs[i].tokens and ex.id == exs[i].id
            np.testing.assert_allclose(ex.scores["rollout"], exs[i].results["rollout"]["scores"], rtol=1e-6)
        assert lookups == []
        s.refresh(reopen=True)
        ex = read_example(s, 3, methods)
        assert ex.tokens == exs[3].tokens
        assert lookups  # a new handle: its datasets opened anew


# What only the other screens (and the writing side of store/) need: importing it was a third of attr-tui's start
# (imports 0.58 s of CPU before the first frame on the 2-core machine; plotext alone 0.14 s under -X importtime).
NOT_FOR_THE_FIRST_SCREEN = (
    "plotext", "textual_plotext", "store.writer", "store.copying", "store.metrics", "store.compact", "store.h5",
    "store.render_html", "tui.export", "tui.screens.metrics", "tui.screens.heads", "tui.screens.attention",
    "tui.screens.compare", "tui.screens.matrix", "tui.screens.head_matrix", "tui.screens.help",
    "tui.widgets.curve_chart", "tui.widgets.head_grid", "tui.widgets.metric_table", "tui.render.head_grid",
    "tui.render.attention_grid", "tui.render.matrix_axes", "tui.render.compare")


def test_attr_tui_imports_only_what_the_first_screen_draws():
    """`attr-tui STORE` imports the CLI and the app (the browse screen): no other screen, no plotting library, no
    store-writing module; each is imported when it is first opened."""
    import json
    import subprocess
    from pathlib import Path

    code = "import json, sys, tui.cli, tui.app; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    loaded = set(json.loads(out.stdout))
    assert "tui.screens.browse" in loaded and "store.reader" in loaded
    assert sorted(m for m in NOT_FOR_THE_FIRST_SCREEN if m in loaded) == []


@async_test
async def test_the_next_example_is_laid_out_once(tmp_path, monkeypatch, color_env):
    """j to an example already read (the read-ahead's) lays the screen out at most once: a panel whose height followed
    its content (the token view, the text) asked Textual for a second layout after the first had placed it (its
    virtual size), a third of "next example" on the 100k benchmark store. And not at all where no panel's height (nor
    the token view's scroll bar) changes: every panel's update asked for a layout of the screen (issue 38.15). What is
    drawn is the example's (tokens, header)."""
    from textual.screen import Screen

    from tui.app import create_app

    path = tmp_path / "s.h5"
    exs = make_store(str(path), n_examples=12)
    layouts = []
    real = Screen._refresh_layout
    monkeypatch.setattr(Screen, "_refresh_layout", lambda self, *a, **k: (layouts.append(1), real(self, *a, **k))[1])
    app = create_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)

        def shape():
            view = app.browse.query_one("#tokens")
            return ([app.browse.query_one(w).outer_size.height for w in ("#info", "#text", "#method", "#strip")],
                    view.show_vertical_scrollbar)

        per_key, expected = [], []
        for i in range(1, 12):
            before, was = len(layouts), shape()
            await pilot.press("j")
            await settle(pilot)
            assert app.current == i
            per_key.append(len(layouts) - before)
            expected.append(int(shape() != was))
            text = screen_text(app)
            assert f"ex{i}  {i + 1}/12  {len(exs[i].tokens)} tokens" in text
            assert app.browse.query_one("#tokens").layout_data.cells[1].text == exs[i].tokens[1]
    assert per_key == expected and 0 in expected, (per_key, expected)


@async_test
async def test_opening_reads_each_example_once(tmp_path, monkeypatch, color_env):
    """The first example and the read-ahead's neighbours are read once each on opening (the header's worker reads
    the first with the header: it was read again when the metric names came in after the list had asked for it)."""
    from store import add_metrics, MetricData

    path = tmp_path / "s.h5"
    exs = make_store(str(path), n_examples=12)
    add_metrics(str(path), [MetricData("rollout", "comprehensiveness", np.linspace(0, 1, 12), {}, {"mean": 0.5}, True)])
    reads = _count_reads(monkeypatch)
    app, errors = await _open_and_settle(path)
    assert not errors
    scores = [k for name, k in reads if name == "methods/rollout/scores"]
    assert scores == [len(exs[i].tokens) for i in (0, 1, 2)], scores
    assert app.cache.get(0).metric_values == {("rollout", "comprehensiveness"): 0.0}


@async_test
async def test_the_footer_is_built_again_only_when_its_keys_change(tmp_path, monkeypatch, color_env):
    """Opening builds the footer's keys twice (before the bindings are known, then with them), not at every
    refresh_bindings (four times); a key that changes no binding builds nothing; a method without layer views
    disables the layer keys, and the footer is built again to show it."""
    from tui.app import create_app
    from tui.widgets.footer import FittedFooter

    path = tmp_path / "s.h5"
    make_store(str(path), n_examples=6)
    builds = []
    real = FittedFooter.compose
    monkeypatch.setattr(FittedFooter, "compose", lambda self: (builds.append(1), (yield from real(self)))[1])
    app = create_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert len(builds) == 2
        footer = app.browse.query_one(FittedFooter)
        layer_key = next(k for k in footer.query("FooterKey") if k.key == "left_square_bracket")
        assert not layer_key.has_class("-disabled")
        await pilot.press("j")
        await settle(pilot)
        assert len(builds) == 2
        for _ in range(2):  # rollout -> normxlogit -> norm (no layer views)
            await pilot.press("m")
            await settle(pilot)
        assert app.method.name == "norm"
        for _ in range(5):  # the new keys are mounted after the frame that asked for them
            await pilot.pause()
        assert len(builds) == 3
        layer_key = next(k for k in footer.query("FooterKey") if k.key == "left_square_bracket")
        assert layer_key.has_class("-disabled")


@async_test
async def test_a_layout_repaints_no_scroll_bar_whose_pane_did_not_change(tmp_path, monkeypatch, color_env):
    """j lays the screen out when a panel's height changes; Textual then updated the scroll bars of every scrolling
    pane it placed (ScrollView._size_updated compares the layout's virtual size, which a line-API pane does not
    take, with its own: they always differ), and the example list's bar, 22 lines, was drawn again at every such
    key (3.7 ms of the 43 ms of CPU per next on the 100k benchmark store, issue 38.15). The list's bar is repainted
    only when the list scrolls or grows, the token view's only when its lines or size change; what they show
    stays right (the bar's extent follows the store's rows, the token view's its lines)."""
    from textual.screen import Screen
    from textual.scrollbar import ScrollBar

    from tui.app import create_app

    path = tmp_path / "s.h5"
    make_store(str(path), n_examples=12)
    refreshed, layouts = [], []
    real_refresh, real_layout = ScrollBar.refresh, Screen._refresh_layout
    monkeypatch.setattr(ScrollBar, "refresh", lambda self, *a, **k: (refreshed.append(self), real_refresh(self, *a, **k))[1])
    monkeypatch.setattr(Screen, "_refresh_layout", lambda self, *a, **k: (layouts.append(1), real_layout(self, *a, **k))[1])
    app = create_app(path)
    async with app.run_test(size=(80, 14)) as pilot:  # 14 lines: the tokens overflow, their bar comes and goes
        await settle(pilot)
        lst, view = app.example_list, app.browse.query_one("#tokens")
        list_bar, view_bar = lst.vertical_scrollbar, view.vertical_scrollbar
        assert list_bar.window_virtual_size == 13  # the header and 12 rows
        laid_out = view_kept = 0
        for i in range(1, 9):
            shape = (view.size, view.virtual_size, view.show_vertical_scrollbar)
            refreshed.clear(), layouts.clear()
            await pilot.press("j")
            await settle(pilot)
            assert app.current == i and lst.scroll_offset.y == 0
            laid_out += bool(layouts)
            assert [b for b in refreshed if b is list_bar] == [], i
            if layouts and shape == (view.size, view.virtual_size, view.show_vertical_scrollbar):
                view_kept += 1
                assert [b for b in refreshed if b is view_bar] == [], i
            assert view_bar.window_virtual_size == len(view._lines) or not view.show_vertical_scrollbar
        assert laid_out >= 4 and view_kept  # layouts, one of them with the token view's lines as they were
        assert list_bar.window_virtual_size == 13 and list_bar.window_size == lst.scrollable_content_region.height


@async_test
async def test_a_paint_looks_up_a_line_panes_style_once(tmp_path, monkeypatch, color_env):
    """The example list, the layer strip and the token view draw line by line; each line asked Textual for the
    widget's style (Widget.rich_style walks the widget's ancestors and their rules), a third of the layer strip's
    paint. Now once per paint of the widget, whatever its lines; the lines drawn are the same (the strip's labels,
    the list's rows, the tokens)."""
    from textual.dom import DOMNode
    from textual.widget import Widget

    from tui.app import create_app

    path = tmp_path / "s.h5"
    exs = make_store(str(path), n_examples=12)
    lookups, paints = [], []
    real_style, real_lines = DOMNode.rich_style, Widget.render_lines
    monkeypatch.setattr(DOMNode, "rich_style", property(lambda self: (lookups.append(self), real_style.fget(self))[1]))
    monkeypatch.setattr(Widget, "render_lines", lambda self, crop: (paints.append(self), real_lines(self, crop))[1])
    app = create_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        panes = [app.example_list, app.browse.query_one("#strip"), app.browse.query_one("#tokens")]
        for i in range(1, 4):
            lookups.clear(), paints.clear()
            await pilot.press("j")
            await settle(pilot)
            for pane in panes:
                painted = sum(p is pane for p in paints)
                assert painted and sum(w is pane for w in lookups) <= painted, (type(pane).__name__, i)
            text = screen_text(app)
            assert f"ex{i}  {i + 1}/12" in text and "▶final" in text and f"ex{i + 1}" in text
            assert app.browse.query_one("#tokens").layout_data.cells[1].text == exs[i].tokens[1]


@async_test
async def test_the_token_view_moved_without_new_lines_is_not_drawn_again(tmp_path, color_env):
    """A layout that moves or resizes the token view (another example's panels above it) without changing its lines
    keeps the lines it drew: it redrew them in a frame of its own at every such key. Lines that change (a narrower
    terminal) are drawn anew."""
    from tui.app import create_app

    path = tmp_path / "s.h5"
    make_store(str(path), n_examples=12)
    app = create_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        view = app.browse.query_one("#tokens")
        drawn, lines = dict(view._strips), list(view._lines)
        assert drawn
        refreshed = []
        real = view.refresh
        view.refresh = lambda *a, **k: (refreshed.append(1), real(*a, **k))[1]
        view.on_resize(None)
        assert view._strips == drawn and view._lines == lines and refreshed == []
        del view.refresh
        await pilot.resize_terminal(60, 24)
        await settle(pilot)
        assert view._lines != lines


_OPEN_AND_LIST_MODULES = r'''
import asyncio, json, sys
from tui.app import create_app

async def main():
    app = create_app(sys.argv[1], color_mode="256")
    async with app.run_test(size=(80, 24)) as pilot:
        view = app.query_one("#tokens")
        while not (app.current == 0 and 0 in app.cache and view.layout_data is not None and view.layout_data.cells):
            await asyncio.sleep(0.005)
        await app.workers.wait_for_complete()
        await pilot.pause()
        opened = sorted(sys.modules)
        await pilot.press("f")  # the metrics screen, when it is asked for
        await pilot.pause()
        print(json.dumps([opened, sorted(sys.modules), [type(s).__name__ for s in app.screen_stack]]))

asyncio.run(main())
'''


def test_opening_the_first_example_imports_no_other_screen(tmp_path):
    """Issue 38.15: drawing the first example imports nothing the browse screen does not use. The colour bar's
    clip legend asked numpy.unique, which imports numpy.ma (70 ms of CPU on the first draw, a tenth of the open on
    the 2-core machine) for a test of two signs; the other screens and the writing side of the store stay out
    until opened (the metrics screen here, imported when f opens it)."""
    import json
    import subprocess
    from pathlib import Path

    from store import add_metrics, MetricData

    path = tmp_path / "s.h5"
    make_store(str(path), n_examples=12)
    add_metrics(str(path), [MetricData("rollout", "comprehensiveness", np.linspace(0, 1, 12), {}, {"mean": 0.5}, True)])
    out = subprocess.run([sys.executable, "-c", _OPEN_AND_LIST_MODULES, str(path)], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-3000:]
    opened, later, screens = json.loads(out.stdout.strip().splitlines()[-1])
    assert "tui.screens.browse" in opened
    assert sorted(m for m in (*NOT_FOR_THE_FIRST_SCREEN, "numpy.ma") if m in opened) == []
    assert screens[-1] == "MetricsScreen" and "tui.screens.metrics" in later


@async_test
async def test_the_text_and_method_panels_render_their_content_once_per_example(tmp_path, monkeypatch, color_env):
    """j renders the example's text and the method bar once each: as Statics whose height follows their content
    they were rendered to measure that height and again to be painted (issue 38.15). What they show is the
    example's (its text, cut to three lines; the method line, the metrics line)."""
    from rich.console import Console, Group

    from store import add_metrics, MetricData
    from tui.app import create_app
    from tui.widgets.example_info import Clipped

    path = tmp_path / "s.h5"
    exs = make_store(str(path), n_examples=12)
    add_metrics(str(path), [MetricData("rollout", "comprehensiveness", np.linspace(0, 1, 12), {}, {"mean": 0.5}, True)])
    rendered = []
    real = Console.render

    def render(self, renderable, options=None):
        content = getattr(renderable, "renderable", renderable)  # a Static's content comes wrapped in its style
        if isinstance(content, Clipped):
            rendered.append("text")
        elif isinstance(content, Group) and content.renderables[0].plain.startswith("method "):
            rendered.append("method")
        return real(self, renderable, options)

    monkeypatch.setattr(Console, "render", render)
    app = create_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        for i in range(1, 7):
            rendered.clear()
            await pilot.press("j")
            await settle(pilot)
            assert app.current == i
            assert sorted(rendered) == ["method", "text"], (i, rendered)
            lines = screen_text(app).splitlines()
            text = app.browse.query_one("#text").region
            shown = " ".join(line[text.x:text.right].rstrip() for line in lines[text.y:text.bottom])
            assert shown == f"text {exs[i].text}" or shown.endswith("…"), shown
            bar = app.browse.query_one("#method").region
            assert lines[bar.y][bar.x:].startswith("method rollout 1/3  non-negative")
            assert f"comp {i / 11:.2f}" in [line[bar.x:].strip() for line in lines[bar.y:bar.bottom]]
