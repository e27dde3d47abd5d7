"""attr-tui on a generation store (task "generate", format 2.0): the prompt and the continuation drawn as one text, the
step cursor (< >) that the colours, the layer strip, compare, export figures and the disagreement sort follow, the
target x source heatmap (v), the notebook view per step; a store of the earlier format still opens. Stores from a
synthetic writer (tests/generation_stores.py: no model, no torch); at 80x24 and 120x40, with snapshots."""

from __future__ import annotations

import os
import shutil
import sys
import uuid

import numpy as np
import pytest
from generation_stores import write_generation_store
from test_tui import async_test, screen_text, set_color_env, settle
from test_tui_snapshots import _run

from store import open_store
from store.palette import normalize
from tui.agreement import spearman
from tui.render.tokens import EXPLAINED_MARK


@pytest.fixture(scope="module")
def gen_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("gen") / "gen.h5"
    write_generation_store(path)
    return path


def _right(app) -> list[str]:
    """The detail pane's text of each line (right of the list's border)."""
    return [line.split("▕", 1)[1].strip() if "▕" in line else "" for line in screen_text(app).splitlines()]


async def _press(pilot, *keys):
    for key in keys:
        await pilot.press(key)
        await settle(pilot)


def _cells(app):
    return app.browse.query_one("#tokens").layout_data.cells


def _assert_step_colours(app, path, index: int, step: int, method: str = "attention"):
    """The token cells are the step's row of ``method``: coloured before the target, the target marked, the rest
    without colour; the shown scores are the store's row."""
    with open_store(path) as s:
        ex = s[index]
        row = ex.step_scores(method)[step]
        pos = ex.step_position(step)
        tokens = ex.tokens
    shown = app.example(app.current)
    assert (shown.step, shown.explain_pos, shown.upto) == (step, pos, pos)
    np.testing.assert_array_equal(shown.scores[method], row)
    cells = _cells(app)
    assert [c.text.lstrip(EXPLAINED_MARK) for c in cells] == tokens  # the prompt and the continuation, one text
    assert [i for i, c in enumerate(cells) if c.text.startswith(EXPLAINED_MARK)] == [pos]
    assert all(c.style.bgcolor is not None for c in cells[:pos])
    assert all(c.style.bgcolor is None for c in cells[pos:])
    assert cells[pos].style.bold and all(c.style.dim for c in cells[pos + 1:])
    if method != "attention":
        return
    # the colours are the row's own scale over the tokens before the target (the default "view" normalisation)
    want = normalize(row[:pos], False).values
    darkest = int(np.argmin(want))
    brightest = int(np.argmax(want))
    lum = [sum(c.style.bgcolor.get_truecolor()) for c in cells[:pos]]
    assert lum[brightest] == max(lum) and lum[darkest] == min(lum)


@async_test
async def test_the_step_cursor_moves_the_colours_through_the_generation(gen_store, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch)
    app = create_app(gen_store)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        right = _right(app)
        assert app.sub_title == "4 examples · generate · tiny-gpt2"
        assert right[2] == "<step 1/3> ▸Ġthe p 0.87 vs Ġa 0.44"
        assert right[3] == "logit diff. +2.86  prompt 4 + 3 generated"
        lines = screen_text(app).splitlines()
        assert lines[1].split("▕")[0].split() == ["id", "prompt", "steps", "len"]
        assert [line.split("▕")[0].split() for line in lines[2:6]] == [
            ["·", "gen0", "4", "3", "7"], ["·", "gen1", "5", "6", "11"], ["·", "gen2", "1", "0", "1"],
            ["·", "gen3", "3", "3", "6"]]
        _assert_step_colours(app, gen_store, 0, 0)
        await _press(pilot, "greater_than_sign")
        assert _right(app)[2] == "<step 2/3> ▸Ġmat p 0.25 vs Ġbed 0.13"
        _assert_step_colours(app, gen_store, 0, 1)
        await _press(pilot, "greater_than_sign", "greater_than_sign")  # clamped at the last step
        _assert_step_colours(app, gen_store, 0, 2)
        await _press(pilot, "m")  # another method (signed): the same step
        _assert_step_colours(app, gen_store, 0, 2, "grad")
        await _press(pilot, "M", "less_than_sign")
        assert app.step == 1
        await _press(pilot, "j")  # the next example keeps the step
        _assert_step_colours(app, gen_store, 1, 1)
        assert _right(app)[2] == "<step 2/6> ▸, p 0.41"  # no foil
        assert _right(app)[3].startswith("logit ") and "prompt 5 + 6 generated" in _right(app)[3]
        await _press(pilot, "j")  # EOS at the first step: the prompt alone, uncoloured
        assert _right(app)[2] == "no generated tokens (EOS first)"
        assert all(c.style.bgcolor is None for c in _cells(app)) and [c.text for c in _cells(app)] == ["Hello"]
        await _press(pilot, "greater_than_sign")  # nothing to step through: no error
        await _press(pilot, "j")
        _assert_step_colours(app, gen_store, 3, 1)  # step 2 of 3 again (the cursor stayed at 1)
        text = screen_text(app)
        assert all(len(line) <= 80 for line in text.splitlines()) and len(text.splitlines()) == 24


@async_test
async def test_the_layer_strip_shows_the_steps_sources(gen_store, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch)
    app = create_app(gen_store)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await _press(pilot, "greater_than_sign", "right_square_bracket")  # step 2, layer 1
        shown = app.example(app.current)
        with open_store(gen_store) as s:
            np.testing.assert_array_equal(shown.view("attention", 0), s[0].step_layer_scores("attention")[1, 0])
        strip = app.browse.query_one("#strip")
        assert strip.display
        # the strip's lines cover the step's sources (5 tokens before Ġmat), not the tokens after its target
        first = screen_text(app).splitlines()
        assert any("▶L1" in line for line in first)


@async_test
async def test_the_heatmap_shows_every_step_and_moves_the_step_cursor(gen_store, monkeypatch):
    from tui.app import create_app
    from tui.screens.generation import GenerationScreen

    set_color_env(monkeypatch)
    app = create_app(gen_store)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await _press(pilot, "v")
        assert isinstance(app.screen, GenerationScreen)
        lines = screen_text(app).splitlines()
        assert lines[1].split() == ["gen0", "attention", "·", "final", "·", "3", "steps", "×", "7", "tokens", "·",
                                    "scale:", "generation"]
        labels = [line.split()[0] for line in lines if line.strip().startswith(("Ġthe", "Ġmat", "."))]
        assert labels[:3] == ["Ġthe", "Ġmat", "."]  # a row per generated token
        status = lines[-2]
        assert status.startswith(" step 1/3 ▸Ġthe p 0.87 vs Ġa ← The (1)"), status
        await _press(pilot, "down", "right", "right")
        assert app.step == 1
        status = screen_text(app).splitlines()[-2]
        with open_store(gen_store) as s:
            value = float(s[0].step_scores("attention")[1, 2])
        assert status.startswith(" step 2/3 ▸Ġmat p 0.25 vs Ġbed ← Ġsat (3)"), status
        assert f"{value:.3g}" in status, status
        await _press(pilot, "right", "right", "right")  # the target itself: no attribution
        assert "none: at or after the target" in screen_text(app).splitlines()[-2]
        # the cells at and after each target are blank, the ones before coloured
        screen = app.screen
        base = app.cache.get(app.current)
        grid = screen.grid(base)
        assert np.isnan(grid[0, 4:]).all() and np.isfinite(grid[0, :4]).all()
        await _press(pilot, "s")
        assert "scale: step" in screen_text(app).splitlines()[1]
        await _press(pilot, "right_square_bracket")
        assert "layer 1/2" in screen_text(app).splitlines()[1]
        await _press(pilot, "escape")
        assert not isinstance(app.screen, GenerationScreen)
        _assert_step_colours(app, gen_store, 0, 1)  # the browse screen shows the step the heatmap was left at
        await _press(pilot, "j", "j", "v")  # EOS first: says so
        assert "no generated tokens" in screen_text(app)


@async_test
async def test_compare_export_and_help_work_per_step(gen_store, tmp_path, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    app = create_app(gen_store)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await _press(pilot, "greater_than_sign", "c")
        text = screen_text(app)
        assert "<step 2/3> ▸Ġmat" in text.splitlines()[1]
        rows = [line for line in text.splitlines() if line.startswith(" attention ") and "Ġcat" in line]
        assert rows and "▸Ġmat" in rows[0]
        await _press(pilot, "greater_than_sign")  # the compare screen's own step keys
        assert "<step 3/3> ▸." in screen_text(app).splitlines()[1] and app.step == 2
        await _press(pilot, "e")
        svg = [f for f in os.listdir(tmp_path) if f.endswith(".svg")]
        assert svg == ["gen-gen0-step3-attention+grad+ig.svg"], svg
        assert "step 3/3: ." in (tmp_path / svg[0]).read_text()
        await _press(pilot, "escape", "question_mark")
        assert "<  >" in screen_text(app) and "step: the generated token" in screen_text(app)


@async_test
async def test_the_disagreement_sort_ranks_at_the_step(gen_store, monkeypatch):
    from tui.finding import disagreement

    with open_store(gen_store) as s:
        got = disagreement(s, "grad", "ig", step=1)
        for i, ex in enumerate(s):
            if not ex.n_steps:
                assert np.isnan(got[i])
                continue
            t = min(1, ex.n_steps - 1)
            p = ex.step_position(t)
            want = 1.0 - spearman(ex.step_scores("grad")[t][:p], ex.step_scores("ig")[t][:p])
            assert got[i] == pytest.approx(want), i


def test_the_notebook_view_draws_a_step(gen_store):
    from store.render_html import example_figure

    with open_store(gen_store) as s:
        fig = example_figure(s[0], ["grad"], step=1)
        assert fig.explained == 5 and "step 2/3: Ġmat" in fig.note
        values = fig.rows[0][1].values
        assert np.isfinite(values[:5]).all() and np.isnan(values[5:]).all()
        assert [c[2] for c in fig.cells()[0][1]][5:] == ["#ffffff", "#ffffff"]  # no colour after the target
        last = example_figure(s[0], ["grad"])  # default: the last step, which sees the whole text
        assert last.explained == 6 and "step 3/3" in last.note
        assert "no generated tokens" in example_figure(s[2]).note


@async_test
async def test_a_store_of_the_earlier_format_still_opens(monkeypatch):
    """Format 1.6 (tests/fixtures/store-1.6.h5, written by the last 1.x writer): browsed as before, no step keys."""
    from test_store import FIXTURE_1_6

    from tui.app import create_app

    set_color_env(monkeypatch)
    app = create_app(FIXTURE_1_6)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert app.meta.task == "classification" and not app.meta.generation and app.meta.n == 10
        assert "label" in screen_text(app) and app.example(app.current).step == -1
        assert not app.browse.check_action("step", (1,)) and not app.browse.check_action("generation", ())
        await _press(pilot, "greater_than_sign", "v")
        assert app.screen is app.browse and app.step == 0


# ---------------------------------------------------------------- snapshots
GENERATION_SCREENS = {"browse-step2": ("greater_than_sign",), "heatmap": ("v", "down")}


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
@pytest.mark.parametrize("screen", list(GENERATION_SCREENS))
def test_snapshot_generation(snap_compare, gen_store, monkeypatch, screen, size):
    from tui.app import create_app

    set_color_env(monkeypatch)
    assert snap_compare(create_app(gen_store), terminal_size=size, run_before=_run(*GENERATION_SCREENS[screen]))


def test_snapshot_generation_no_color(snap_compare, gen_store, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch, no_color=True)
    assert snap_compare(create_app(gen_store), terminal_size=(80, 24), run_before=_run("j", "greater_than_sign"))


def test_snapshot_generation_heatmap_no_color(snap_compare, gen_store, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch, no_color=True)
    assert snap_compare(create_app(gen_store), terminal_size=(80, 24), run_before=_run("j", "v", "down"))


# ---------------------------------------------------------------- a real terminal
@pytest.mark.skipif(shutil.which("tmux") is None, reason="no tmux installed")
@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_steps_and_heatmap_in_tmux(gen_store, tmp_path, size):
    """attr-tui in tmux: the step cursor, the heatmap at the step, export, and q twice ends it with status 0."""
    from test_tui_tmux import ROOT, _tmux, _wait

    sock = f"attr-tui-gen-{uuid.uuid4().hex[:8]}"
    status = tmp_path / "status"
    env = f"env PYTHONPATH={ROOT} TERM=xterm-256color"
    cmd = f"sh -c 'cd {tmp_path} && {env} {sys.executable} -m tui.cli {gen_store}; echo $? > {status}'"

    def pane() -> str:
        return _tmux(sock, "capture-pane", "-p")

    try:
        _tmux(sock, "-f", os.devnull, "new-session", "-d", "-x", str(size[0]), "-y", str(size[1]), "-c", str(ROOT),
              cmd)
        assert _wait(lambda: "<step 1/3> ▸Ġthe" in pane()), pane()
        _tmux(sock, "send-keys", ">")
        assert _wait(lambda: "<step 2/3> ▸Ġmat" in pane()), pane()
        _tmux(sock, "send-keys", "e")
        assert _wait(lambda: any(p.name.endswith("-step2-attention.svg") for p in tmp_path.iterdir())), pane()
        _tmux(sock, "send-keys", "v")
        assert _wait(lambda: "step 2/3 ▸Ġmat" in pane() and "3 steps × 7 tokens" in pane()), pane()
        _tmux(sock, "send-keys", "q")
        assert _wait(lambda: "<step 2/3> ▸Ġmat" in pane()), pane()
        _tmux(sock, "send-keys", "q")
        assert _wait(status.exists, 20), pane()
        assert _wait(lambda: status.read_text().strip() != "", 5) and status.read_text().strip() == "0"
    finally:
        _tmux(sock, "kill-server")


# ---------------------------------------------------------------- metrics per step (issue 37, point 5)
STEP_METRICS = ("comprehensiveness", "sufficiency")


@pytest.fixture(scope="module")
def gen_metrics_store(tmp_path_factory):
    """The generation store with two metrics of attention kept per step (format 2.1) and one of grad without
    (a record as before 2.1)."""
    from store import MetricData, add_metrics

    path = tmp_path_factory.mktemp("genmetrics") / "gen.h5"
    exs = write_generation_store(path)
    S = sum(len(e.tokens) - e.prompt_len for e in exs)
    steps = np.arange(S, dtype=np.float64) / 10 + 0.05
    steps[1] = np.nan  # a step the metric does not define
    records = []
    for k, name in enumerate(STEP_METRICS):
        v = steps + k
        means, a = [], 0
        for e in exs:
            T = len(e.tokens) - e.prompt_len
            part = v[a:a + T]
            means.append(np.nanmean(part) if np.isfinite(part).any() else np.nan)
            a += T
        records.append(MetricData("attention", name, np.array(means), {}, {}, True, name, steps=v))
    records.append(MetricData("grad", "comprehensiveness", np.array([0.5, 0.6, np.nan, 0.7]), {}, {}, True, "c"))
    add_metrics(str(path), records)
    return path


@async_test
async def test_the_metric_line_shows_the_steps_value_beside_the_mean(gen_metrics_store, monkeypatch):
    """Browse: the method bar's metrics at the step cursor ('comp 0.15 μ0.25'), moving with it; a metric kept
    without steps shows its mean alone; the metrics screen names the step and shows both."""
    from test_tui_metrics import drawn, example_line, open_metrics

    from tui.app import create_app
    from tui.render.metric_table import fmt

    set_color_env(monkeypatch)
    with open_store(gen_metrics_store) as s:
        want = {name: (s.metric_values("attention", name), s.metric_steps("attention", name))
                for name in STEP_METRICS}

    def entries(i: int, t: int, digits: int = 2) -> str:
        off = [0, 3, 9, 9][i]
        return "  ".join(f"{short} {fmt(float(steps[off + t]), digits)} μ{fmt(float(means[i]), digits)}"
                         for short, (means, steps) in zip(("comp", "suff"), want.values()))

    def metric_line(app) -> str:
        return next(line for line in drawn(app, "#method").splitlines() if line.startswith("comp"))

    app = create_app(gen_metrics_store)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert metric_line(app) == entries(0, 0)
        await _press(pilot, "greater_than_sign")  # step 2: undefined there
        assert metric_line(app) == entries(0, 1) and "comp — μ" in entries(0, 1)
        await _press(pilot, "j", "greater_than_sign")  # example 2 (the cursor kept at step 2), step 3
        assert app.example(app.current).step == 2
        assert metric_line(app) == entries(1, 2)
        screen = await open_metrics(pilot)
        assert screen.cursor == "grad"  # sorted first: its record keeps no steps, the mean alone
        assert example_line(screen) == f"example gen1 2/4 · grad:  comp {fmt(0.6, 3)}"
        await _press(pilot, "down")
        line = example_line(screen)
        assert line.startswith("example gen1 2/4 · attention · step 3/6 (μ: the mean over its steps):"), line
        assert entries(1, 2, 3) in line, line
        await _press(pilot, "escape", "m")  # grad on the browse screen: the mean alone
        assert metric_line(app) == f"comp {fmt(0.6, 2)}"
        await _press(pilot, "j")  # T = 0: no step, no mean
        assert metric_line(app) == "comp —"


def test_snapshot_generation_metrics_80x24(snap_compare, gen_metrics_store, monkeypatch):
    """The browse screen of a generation store with metrics per step, at the second step of its second example."""
    from tui.app import create_app

    set_color_env(monkeypatch)
    assert snap_compare(create_app(gen_metrics_store), terminal_size=(80, 24),
                        run_before=_run("j", "greater_than_sign"))
