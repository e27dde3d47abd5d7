"""attr-tui metrics screen (``f``) and the browse screen's metric line: Pilot tests for behaviour, SVG snapshots for
looks (100x30 truecolor, 80x24, NO_COLOR).

The stores are synthetic with fixed values: examples from :func:`synthetic.make_store`, then metrics written with
``store.add_metrics`` the way ``attr-compute eval`` writes them (per-example values with a NaN, summaries, settings
with the preset, curves and levels for the AOPC variant). The means are chosen so that every column sorts the methods
differently and the best value sits on a different method in each column. Update the snapshots with
``--snapshot-update``.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from rich.console import Console
from synthetic import make_store
from test_tui import async_test, open_modal, screen_text, set_color_env, settle

N = 12
NAN_ROW = 3  # every metric is undefined for example 3
#: method -> metric -> mean over the examples. Store order of the methods: rollout, normxlogit, norm.
MEANS = {
    "rollout": {"comprehensiveness": 0.30, "sufficiency": 0.03, "aopc@attcat": 0.21, "lodds": -0.80},
    "normxlogit": {"comprehensiveness": 0.41, "sufficiency": 0.08, "aopc@attcat": 0.33, "lodds": -1.20,
                   "kendall": 0.25},
    "norm": {"comprehensiveness": 0.22, "sufficiency": 0.20, "aopc@attcat": 0.35, "lodds": -0.50},
}
LOWER_IS_BETTER = {"sufficiency", "lodds", "accuracy", "kendall"}  # by base name, as compute.metrics has them
COLUMNS = ["comprehensiveness", "sufficiency", "aopc@attcat", "lodds", "kendall"]  # the screen's column order
AOPC_SETTINGS = {"levels": "ninths", "perturbation": "delete", "protect": "cls_sep", "cls": "label", "side": "top",
                 "absolute": True, "attend": "all", "skip_last": True, "preset": "attcat", "metric": "aopc",
                 "pad_id": 0}


def per_example(mean: float) -> np.ndarray:
    """N values whose finite mean is ``mean``: mean + 0.01 * (i - 5.5) with example NAN_ROW undefined."""
    v = mean + 0.01 * (np.arange(N) - 5.5)
    v[NAN_ROW] = np.nan
    v[N - 1 - NAN_ROW] = mean  # keeps the finite mean at `mean` (the missing row had the mirror offset)
    return v


def higher_is_better(name: str) -> bool:
    return name.partition("@")[0] not in LOWER_IS_BETTER


def stored(mean: float, i: int) -> float:
    """Example i's value as the store keeps it (float32)."""
    return float(np.float32(per_example(mean)[i]))


def metric_data(means: dict = MEANS):
    from store import MetricData

    out = []
    for method, row in means.items():
        for name, mean in row.items():
            v = per_example(mean)
            finite = v[np.isfinite(v)]
            summary = {"mean": float(finite.mean()), "std": float(finite.std()), "n": int(finite.size)}
            curves = levels = None
            settings = {"preset": None, "metric": name.partition("@")[0], "pad_id": 0}
            if name == "aopc@attcat":
                settings = dict(AOPC_SETTINGS)
                levels = np.tile(np.arange(1, 10), (N, 1)) + (np.arange(N) % 2)[:, None]  # mean level k + 0.5
                curves = 0.9 - 0.08 * np.arange(1, 10)[None, :] + np.zeros((N, 1))
                curves[NAN_ROW, 5:] = np.nan
                levels[NAN_ROW, 5:] = -1
            if name == "kendall":
                settings = {"form": "argsort", "metric": "kendall"}
            out.append(MetricData(method, name, v, settings, summary, higher_is_better(name),
                                  f"{name} of {method}", curves, levels))
    return out


def make_metrics_store(path, means: dict = MEANS) -> None:
    from store import add_metrics

    make_store(str(path), n_examples=N, L=3, seed=0)
    add_metrics(str(path), metric_data(means))


@pytest.fixture(scope="module")
def metrics_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("metrics") / "metrics.h5"
    make_metrics_store(path)
    return path


@pytest.fixture(scope="module")
def partial_store(tmp_path_factory):
    """Metrics for rollout and normxlogit only: norm has none."""
    path = tmp_path_factory.mktemp("metrics_partial") / "partial.h5"
    make_metrics_store(path, {m: MEANS[m] for m in ("rollout", "normxlogit")})
    return path


@pytest.fixture(scope="module")
def wide_store(tmp_path_factory):
    """Eleven metrics: more columns than 80 cells hold."""
    names = ["comprehensiveness", "sufficiency", "aopc", "aopc@attcat", "aopc@masklrp", "aopc@normxlogit", "lodds",
             "lodds@attcat", "accuracy", "spearman", "dot_product"]
    means = {m: {n: 0.1 * (j + 1) + 0.01 * i for j, n in enumerate(names)} for i, m in
             enumerate(("rollout", "normxlogit", "norm"))}
    path = tmp_path_factory.mktemp("metrics_wide") / "wide.h5"
    make_metrics_store(path, means)
    return path


@pytest.fixture(scope="module")
def plain_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("plain") / "plain.h5"
    make_store(str(path), n_examples=4, L=3, seed=0)
    return path


@pytest.fixture
def color_env(monkeypatch):
    set_color_env(monkeypatch)


async def open_metrics(pilot, key: str = "f"):
    """Press ``key`` on the browse screen and wait until the metrics screen has read its metrics and laid out."""
    from tui.screens.metrics import MetricsScreen

    return await open_modal(pilot, key, MetricsScreen, "data")


def table_rows(app) -> dict[str, str]:
    """The table's method lines, by method (the cursor mark stripped), in screen order."""
    lines = screen_text(app).splitlines()
    head = next(i for i, line in enumerate(lines) if line.lstrip(" ‹").startswith("method"))
    rows = {}
    for line in lines[head + 1:]:
        words = line.replace("▶", " ").split()
        if not words or words[0] not in MEANS:
            break
        rows[words[0]] = line
    return rows


def header_line(app) -> str:
    return next(line for line in screen_text(app).splitlines() if line.lstrip(" ‹").startswith("method"))


def plain(widget) -> str:
    """What a Static shows, as plain text at the widget's width (trailing blanks dropped)."""
    console = Console(width=max(widget.content_size.width, 1), file=io.StringIO(), color_system=None,
                      legacy_windows=False)
    with console.capture() as capture:
        console.print(widget.content)
    return "\n".join(line.rstrip() for line in capture.get().splitlines())


def drawn(app, selector: str) -> str:
    """A widget's lines as drawn on the screen (a line-API pane has no content to print), trailing blanks dropped."""
    region = app.query_one(selector).region
    lines = screen_text(app).splitlines()[region.y:region.bottom]
    return "\n".join(line[region.x:region.right].rstrip() for line in lines)


def detail(screen) -> str:
    return plain(screen.query_one("#metrics-detail"))


def example_line(screen) -> str:
    return plain(screen.query_one("#metrics-example"))


def expected_order(name: str, descending: bool, means: dict = MEANS) -> list[str]:
    have = [m for m in means if name in means[m]]
    return sorted(have, key=lambda m: means[m][name], reverse=descending) + [m for m in means if m not in have]


# ---------------------------------------------------------------- Pilot: behaviour
@async_test
async def test_f_opens_and_closes_the_metrics_screen(metrics_store, color_env):
    from tui.app import create_app
    from tui.screens.metrics import MetricsScreen

    app = create_app(metrics_store)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_metrics(pilot)
        assert isinstance(screen, MetricsScreen)
        assert list(screen.data.methods) == ["rollout", "normxlogit", "norm"]
        assert list(screen.data.names) == COLUMNS
        text = screen_text(app)
        assert "3 methods × 5 metrics" in text
        head = header_line(app)
        for short, up in (("comp", "↑"), ("suff", "↓"), ("aopc@attcat", "↑"), ("lodds", "↓"), ("kendall", "↓")):
            assert f"{short} {up}" in head, short  # the better direction of every column
        footer = text.splitlines()[-1]
        assert "method" in footer and "sort by" in footer and "s order" in footer and "close" in footer
        for close in ("escape", "f", "q"):
            await pilot.press(close)
            await pilot.pause()
            assert not isinstance(app.screen, MetricsScreen) and app.is_running, close
            if close != "q":
                await open_metrics(pilot)
        assert app.is_running  # q closed the screen, it did not quit the app


@async_test
async def test_footer_and_help_list_the_key(metrics_store, color_env):
    from tui.app import create_app

    for width in (80, 100):
        app = create_app(metrics_store)
        async with app.run_test(size=(width, 24)) as pilot:
            await settle(pilot)
            footer = screen_text(app).splitlines()[-1]
            assert "f metrics" in footer and "q quit" in footer, footer  # all of it fits
            assert ("palette" in footer) == (width >= 90), footer  # ^p's entry gives way below 90 columns
            await pilot.press("question_mark")
            await pilot.pause()
            text = screen_text(app)
            assert "metrics (p: curves)" in text and "head masks" in text and "command palette" in text


@async_test
async def test_default_sort_and_best_markers(metrics_store, color_env):
    """Sorted by the first column, best first; ★ on the best value of each column in its better direction."""
    from tui.app import create_app
    from tui.render.metric_table import BEST_MARK, fmt

    app = create_app(metrics_store)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_metrics(pilot)
        assert (screen.sort, screen.descending) == (0, True)
        rows = table_rows(app)
        assert list(rows) == expected_order("comprehensiveness", True) == ["normxlogit", "rollout", "norm"]
        assert screen.cursor == "normxlogit" and "▶ normxlogit" in screen_text(app)  # the cursor starts at the top
        assert "▼comp ↑" in header_line(app) and "sort ▼ comp high → low (best first)" in screen_text(app)
        for name in COLUMNS:
            have = {m: row[name] for m, row in MEANS.items() if name in row}
            best = (max if higher_is_better(name) else min)(have, key=have.get)
            for m, mean in have.items():
                cell = fmt(mean) + BEST_MARK
                assert (cell in rows[m]) == (m == best), (name, m, rows[m])
                assert fmt(mean) in rows[m]
        # lower is better: the smallest value carries the mark, not the largest
        assert fmt(-1.2) + BEST_MARK in rows["normxlogit"] and fmt(-0.5) + BEST_MARK not in rows["norm"]
        assert fmt(0.03) + BEST_MARK in rows["rollout"] and fmt(0.2) + BEST_MARK not in rows["norm"]
        assert rows["rollout"].rstrip().endswith("—") and rows["norm"].rstrip().endswith("—")  # no kendall
        # the mark is bold (and green with colour), so it reads without colour too
        text = screen.query_one("#metrics-table").render()
        marked = [sp for sp in text.spans if text.plain[sp.start:sp.end].strip().endswith(BEST_MARK)
                  and not sp.style.reverse]  # (the cursor row's reverse span ends with a marked cell)
        assert len(marked) == len(COLUMNS) and all(sp.style.bold for sp in marked)


@async_test
async def test_sort_column_and_direction_change_the_order(metrics_store, color_env):
    from tui.app import create_app

    app = create_app(metrics_store)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_metrics(pilot)
        await pilot.press("down")  # the cursor goes to rollout and stays on it whatever the order
        await pilot.pause()
        assert screen.cursor == "rollout"
        await pilot.press("right")
        await pilot.pause()
        # sufficiency: lower is better, so best first is ascending
        assert (screen.sort, screen.descending) == (1, False)
        assert list(table_rows(app)) == expected_order("sufficiency", False) == ["rollout", "normxlogit", "norm"]
        assert "▲suff ↓" in header_line(app) and "low → high (best first)" in screen_text(app)
        await pilot.press("s")
        await pilot.pause()
        assert screen.descending is True
        assert list(table_rows(app)) == ["norm", "normxlogit", "rollout"]
        assert "▼suff ↓" in header_line(app) and "high → low (worst first)" in screen_text(app)
        assert screen.cursor == "rollout" and "▶ rollout" in screen_text(app)
        await pilot.press("tab")
        await pilot.pause()
        assert (screen.sort, screen.descending) == (2, True)  # aopc@attcat, higher is better
        assert list(table_rows(app)) == expected_order("aopc@attcat", True) == ["norm", "normxlogit", "rollout"]
        await pilot.press("right")
        await pilot.pause()
        assert list(table_rows(app)) == expected_order("lodds", False) == ["normxlogit", "rollout", "norm"]
        await pilot.press("right")
        await pilot.pause()
        # kendall: only normxlogit has it; methods without a value come last in either direction
        assert next(iter(table_rows(app))) == "normxlogit"
        await pilot.press("s")
        await pilot.pause()
        assert list(table_rows(app)) == ["normxlogit", "rollout", "norm"]
        await pilot.press("right")
        await pilot.pause()
        assert screen.sort == 0 and list(table_rows(app)) == ["normxlogit", "rollout", "norm"]  # wraps around
        await pilot.press("left", "shift+tab")
        await pilot.pause()
        assert screen.sort == 3
        # up/down move along the current order, clamped at the ends
        order = list(table_rows(app))
        await pilot.press("home")
        await pilot.pause()
        assert screen.cursor == order[0]
        await pilot.press("down", "down", "down", "down")
        await pilot.pause()
        assert screen.cursor == order[-1]
        await pilot.press("up")
        await pilot.pause()
        assert screen.cursor == order[-2]
        await pilot.press("end")
        await pilot.pause()
        assert screen.cursor == order[-1]


@async_test
async def test_detail_panel_shows_the_method_under_the_cursor(metrics_store, color_env):
    from tui.app import create_app
    from tui.render.metric_table import fmt

    app = create_app(metrics_store)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_metrics(pilot)
        text = detail(screen)
        assert text.startswith("normxlogit  5 metrics · best in 3")  # comp, lodds, kendall
        for name, mean in MEANS["normxlogit"].items():
            v = per_example(mean)
            finite = v[np.isfinite(v)]
            assert f"mean {fmt(mean)} ± {fmt(float(finite.std()))}  n {N - 1}" in text, name
            assert f"{name} of normxlogit" in text  # the description
        assert "comprehensiveness ↑ (comp)  ★ best" in text
        assert "sufficiency ↓ (suff)  ★" not in text
        # the compact settings: preset first, the rest in a fixed order, token ids and the metric's name left out
        assert "preset attcat  perturbation delete  levels ninths  cls label" in text
        assert "pad_id" not in text and "metric aopc" not in text
        assert "form argsort" in text  # kendall's
        # the mean curve: a sparkline falling from 0.82 to 0.18, the mean levels (k + 0.5) and the mean values
        assert "curve  █▇▆▅" in text and "▁  0.820 → 0.180" in text and "(9 levels, mean over examples)" in text
        assert "level    1.5   2.5   3.5   4.5   5.5   6.5   7.5   8.5   9.5" in text
        assert "mean   0.820 0.740 0.660 0.580 0.500 0.420 0.340 0.260 0.180" in text
        await pilot.press("down")
        await pilot.pause()
        text = detail(screen)
        assert text.startswith("rollout  4 metrics · best in 1")  # sufficiency
        assert "sufficiency ↓ (suff)  ★ best" in text and "comprehensiveness ↑ (comp)  ★" not in text
        assert "not computed for this method: kendall" in text
        assert "curve" in text  # its aopc@attcat has curves too
        await pilot.click("#metrics-table", offset=(4, 3))  # a click on a row: the third method of the order
        await pilot.pause()
        assert screen.cursor == "norm" and detail(screen).startswith("norm  4 metrics · best in 1")


@async_test
async def test_example_values_follow_the_browse_selection(metrics_store, color_env):
    from tui.app import create_app
    from tui.render.metric_table import fmt, short_name

    app = create_app(metrics_store)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await pilot.press("j", "j")
        await settle(pilot)
        assert app.current == 2
        screen = await open_metrics(pilot)
        line = example_line(screen)
        assert line.startswith("example ex2 3/12 · normxlogit:")
        for name, mean in MEANS["normxlogit"].items():
            assert f"{short_name(name)} {fmt(stored(mean, 2))}" in line, name
        await pilot.press("down")  # the method under the cursor: its values
        await pilot.pause()
        line = example_line(screen)
        assert "· rollout:" in line and f"comp {fmt(stored(0.30, 2))}" in line and "kendall" not in line
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("j")
        await settle(pilot)
        screen = await open_metrics(pilot)
        line = example_line(screen)
        assert screen.cursor == "rollout"  # the screen is kept: its cursor stays where it was left
        assert line.startswith(f"example ex{NAN_ROW} {NAN_ROW + 1}/12") and "comp —" in line  # undefined here
        app.example_list.move_to(7)  # the selection moves while the screen is open (the palette's go-to-example)
        await settle(pilot)
        await pilot.pause()
        line = example_line(screen)
        assert line.startswith("example ex7 8/12 · rollout:") and f"comp {fmt(stored(0.30, 7))}" in line


@async_test
async def test_method_bar_shows_metric_values(metrics_store, partial_store, plain_store, color_env):
    """Browse screen: one line under the method with the current example's metrics for the current method."""
    from tui.app import create_app
    from tui.render.metric_table import fmt

    def bar(app) -> str:
        return drawn(app, "#method")

    app = create_app(metrics_store)
    async with app.run_test(size=(120, 24)) as pilot:
        await settle(pilot)
        lines = bar(app).splitlines()  # the layers are in the strip below
        assert len(lines) == 2 and lines[0].startswith("method rollout 1/3")
        expected = "  ".join(f"{s} {fmt(stored(MEANS['rollout'][n], 0), 2)}"
                             for s, n in (("comp", "comprehensiveness"), ("suff", "sufficiency"),
                                          ("aopc@attcat", "aopc@attcat"), ("lodds", "lodds")))
        assert lines[1] == expected, lines[1]
        await pilot.press("j")
        await settle(pilot)
        assert f"comp {fmt(stored(0.30, 1), 2)}" in bar(app)
        await pilot.press("m")  # normxlogit: its kendall too
        await settle(pilot)
        assert f"kendall {fmt(stored(0.25, 1), 2)}" in bar(app).splitlines()[1]
    app = create_app(metrics_store)
    async with app.run_test(size=(80, 24)) as pilot:  # 46 cells: cut at whole entries, one line
        await settle(pilot)
        await pilot.press("m")
        await settle(pilot)
        lines = bar(app).splitlines()  # normxlogit has layer views: the strip shows them
        # the method's line wraps its description (issue 38: nothing cut at 80 columns); the metrics one line
        assert lines[-1].startswith("comp ") and lines[-1].endswith("…+2") and len(lines) == 3, lines
        assert " ".join(lines[:-1]).endswith("norm x logit"), lines
        assert "method normxlogit 2/3" in screen_text(app) and "…+2" in screen_text(app)
    app = create_app(partial_store)
    async with app.run_test(size=(100, 24)) as pilot:
        await settle(pilot)
        await pilot.press("M")  # norm has no metrics in this store
        await settle(pilot)
        assert bar(app).splitlines()[1] == "no metrics for norm"
    app = create_app(plain_store)
    async with app.run_test(size=(100, 24)) as pilot:  # no metrics at all: the method line only (strip below)
        await settle(pilot)
        lines = bar(app).splitlines()  # the method's line, wrapped: no metric line
        assert " ".join(lines).endswith("final  attention rollout") and "metrics" not in bar(app), lines


@async_test
async def test_many_columns_scroll_to_the_sort_column(wide_store, color_env):
    from tui.app import create_app

    app = create_app(wide_store)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_metrics(pilot)
        head = header_line(app)
        assert head.rstrip().endswith("›") and "‹" not in head  # more columns on the right
        assert all(len(line) <= 80 for line in screen_text(app).splitlines())
        for _ in range(len(screen.data.names) - 1):
            await pilot.press("right")
        await pilot.pause()
        head = header_line(app)
        assert screen.sort_name == "dot_product" and "dot ↑" in head and head.lstrip().startswith("‹"), head


@async_test
async def test_store_without_metrics(plain_store, color_env):
    from tui.app import create_app
    from tui.screens.metrics import MetricsScreen

    app = create_app(plain_store)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_metrics(pilot)
        assert isinstance(screen, MetricsScreen) and not screen.has_metrics
        text = screen_text(app)
        assert "no metrics in this store: run attr-compute eval STORE --metrics ..." in text
        assert "Traceback" not in text and "Error" not in text
        assert screen.check_action("move", (1,)) is False and screen.check_action("toggle_order", ()) is False
        footer = text.splitlines()[-1]
        assert "close" in footer and "order" not in footer and "sort" not in footer
        await pilot.press("down", "right", "s")  # nothing to do: no error
        await pilot.press("f")
        await pilot.pause()
        assert not isinstance(app.screen, MetricsScreen)


@async_test
async def test_palette_opens_metrics_sorts_and_closes(metrics_store, color_env):
    from tui.app import create_app
    from tui.screens.metrics import MetricsScreen

    async def palette(pilot, query: str) -> None:
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*query)
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause()

    app = create_app(metrics_store)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await palette(pilot, "metrics: faith")
        screen = await open_metrics(pilot, key="")
        assert isinstance(screen, MetricsScreen) and screen.has_metrics
        await palette(pilot, "sort: lodds")
        assert app.screen is screen and (screen.sort_name, screen.descending) == ("lodds", False)
        assert list(table_rows(app)) == expected_order("lodds", False)
        await palette(pilot, "order: descending")
        assert screen.descending is True and list(table_rows(app)) == expected_order("lodds", True)
        await palette(pilot, "method: norm")
        assert screen.cursor == "norm"  # "method: normxlogit" is not offered: the cursor is on it
        await palette(pilot, "metrics: close")
        assert not isinstance(app.screen, MetricsScreen)


@async_test
async def test_palette_offers_metrics_only_where_valid(metrics_store, color_env):
    from tui.app import create_app
    from tui.commands import BrowseCommands, HeadsCommands, MetricsCommands

    app = create_app(metrics_store)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        assert type(app.screen).COMMANDS.isdisjoint({MetricsCommands, HeadsCommands})
        browse = [c for c in BrowseCommands(app.screen)._commands() if c[0].startswith("metrics:")]
        assert [t for t, _, _ in browse] == ["metrics: faithfulness metrics"]
        assert "3 methods × 5 metrics" in browse[0][2]
        screen = await open_metrics(pilot)
        assert type(screen).COMMANDS == {MetricsCommands}  # the browse screen's commands are not offered here
        on_metrics = [t for t, _, _ in MetricsCommands(screen)._commands()]
        assert on_metrics == ["sort: sufficiency", "sort: aopc@attcat", "sort: lodds", "sort: kendall",
                              "order: ascending", "method: rollout", "method: norm", "examples: sort by this metric",
                              "metrics: close"]


# ---------------------------------------------------------------- pure functions
def test_formatting_helpers():
    from tui.render.metric_table import fmt, settings_items, short_name, sparkline

    assert fmt(0.41) == "0.410" and fmt(-1.2) == "-1.200" and fmt(0.21, 2) == "0.21"
    assert fmt(None) == "—" and fmt(float("nan")) == "—" and fmt(12.345) == "12.35" and fmt(1234.5) == "1234"
    assert short_name("comprehensiveness") == "comp" and short_name("aopc@attcat") == "aopc@attcat"
    assert short_name("sufficiency@x") == "suff@x" and short_name("custom") == "custom"
    assert sparkline(np.array([1.0, 0.5, 0.0])) == "█▅▁"
    assert sparkline(np.array([2.0, 2.0])) == "▅▅" and sparkline(np.array([np.nan, 1.0, 0.0])) == " █▁"
    items = settings_items({"metric": "aopc", "pad_id": 0, "zeta": 1, "cls": "label", "preset": "attcat",
                            "absolute": True, "side": None})
    assert items == [("preset", "attcat"), ("cls", "label"), ("absolute", "yes"), ("zeta", "1")]


def test_sorting_and_best_with_missing_values():
    from tui.data import MetricInfo, MetricsData
    from tui.render.metric_table import best_methods, sorted_methods

    def info(m, name, mean, hib):
        return MetricInfo(m, name, np.array([mean]), {"mean": mean, "std": 0.0, "n": 1}, {}, hib)

    table = {"a": {"x": info("a", "x", 0.2, False), "y": info("a", "y", 1.0, True)},
             "b": {"x": info("b", "x", 0.1, False)},
             "c": {"x": info("c", "x", 0.1, False), "y": info("c", "y", 1.0, True)}}
    data = MetricsData(("a", "b", "c"), ("x", "y"), table)
    assert sorted_methods(data, "x", False) == ["b", "c", "a"]  # ties keep the store order
    assert sorted_methods(data, "x", True) == ["a", "b", "c"]
    assert sorted_methods(data, "y", True) == ["a", "c", "b"] and sorted_methods(data, "y", False) == ["a", "c", "b"]
    assert best_methods(data, "x") == {"b", "c"} and best_methods(data, "y") == {"a", "c"}  # ties: all marked


def test_metric_info_falls_back_to_the_values():
    from tui.data import MetricInfo

    m = MetricInfo("a", "x", np.array([1.0, np.nan, 3.0]), {}, {}, True)
    assert m.mean == 2.0 and m.std == 1.0 and m.n == 2 and m.value(1) is None and m.value(2) == 3.0
    assert m.value(None) is None and m.value(5) is None
    empty = MetricInfo("a", "x", np.array([np.nan]), {"mean": float("nan")}, {}, True)
    assert empty.mean is None and empty.n == 0


def test_pack_cuts_at_whole_entries():
    from rich.text import Text

    from tui.render.metric_table import pack

    entries = [Text(f"m{i} 0.{i}{i}") for i in range(6)]  # 7 cells each
    one = pack(entries, 30, max_lines=1)
    assert len(one) == 1 and one[0].plain == "m0 0.00  m1 0.11  m2 0.22  …+3"
    assert [t.plain for t in pack(entries, 30, first=Text("ex:"), indent=2)] == [
        "ex:  m0 0.00  m1 0.11  m2 0.22", "  m3 0.33  m4 0.44  m5 0.55"]


def test_metrics_modules_do_not_import_torch():
    import subprocess
    import sys
    from pathlib import Path

    code = ("import tui.screens.metrics, tui.render.metric_table, tui.widgets.metric_table, tui.app, sys; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------- SVG snapshots
def _run(*keys: str, browse: tuple[str, ...] = ()):
    async def run_before(pilot) -> None:
        await settle(pilot)
        for key in browse:
            await pilot.press(key)
            await settle(pilot)
        await open_metrics(pilot)
        for key in keys:
            await pilot.press(key)
            await pilot.pause()
        await settle(pilot)

    return run_before


def test_snapshot_metrics_100x30(snap_compare, metrics_store, monkeypatch):
    """Sorted by sufficiency (best first), the cursor on rollout, example ex2 selected on the browse screen."""
    from tui.app import create_app

    set_color_env(monkeypatch)
    assert snap_compare(create_app(metrics_store), terminal_size=(100, 30),
                        run_before=_run("right", "down", browse=("j", "j")))


def test_snapshot_metrics_80x24(snap_compare, metrics_store, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch)
    assert snap_compare(create_app(metrics_store), terminal_size=(80, 24), run_before=_run("right", "right", "s"))


def test_snapshot_metrics_no_color(snap_compare, metrics_store, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch, no_color=True)
    assert snap_compare(create_app(metrics_store), terminal_size=(80, 24), run_before=_run("down", "down"))


@pytest.mark.parametrize("no_color", [False, True], ids=["color", "no_color"])
@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_snapshot_metrics_curves(snap_compare, metrics_store, monkeypatch, size, no_color):
    """p: the mean curves of aopc@attcat (the third column) as a plotext chart."""
    from tui.app import create_app

    set_color_env(monkeypatch, no_color=no_color)
    assert snap_compare(create_app(metrics_store), terminal_size=size, run_before=_run("right", "right", "p"))


def test_snapshot_metrics_empty(snap_compare, plain_store, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch, no_color=True)
    assert snap_compare(create_app(plain_store), terminal_size=(80, 24), run_before=_run())


def test_snapshot_browse_metric_line_80x24(snap_compare, metrics_store, monkeypatch):
    """The browse screen of a store with metrics: the metric line under the method, cut at 80 columns."""
    from tui.app import create_app

    set_color_env(monkeypatch)

    async def run_before(pilot) -> None:
        await settle(pilot)
        for key in ("j", "m"):
            await pilot.press(key)
            await settle(pilot)

    assert snap_compare(create_app(metrics_store), terminal_size=(80, 24), run_before=run_before)


@async_test
async def test_enter_sorts_the_examples_by_the_chosen_cell(metrics_store, color_env):
    from store import open_store
    from tui.app import create_app
    from tui.finding import order

    app = create_app(metrics_store)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_metrics(pilot)
        method, name = screen.cursor, screen.sort_name
        await pilot.press("enter")
        for _ in range(20):
            await app.workers.wait_for_complete()
            await pilot.pause()
        assert app.screen is app.screen_stack[0]
        with open_store(metrics_store) as s:
            want = order(np.asarray(s.metric_values(method, name), np.float64), None,
                         descending=higher_is_better(name))
        lst = app.example_list
        assert [lst.row_at(i) for i in range(lst.row_count)] == want.tolist()
        assert name in screen_text(app) and ("↓" if higher_is_better(name) else "↑") in screen_text(app)
        # the list's metric column follows the sort: the sorted metric of the sorted method, row by row
        assert lst.metric_key == (method, name)
        text = screen_text(app).splitlines()
        top = next(k for k, ln in enumerate(text) if ln.lstrip().startswith("id ")) + 1  # under the column heads
        lines = text[top:top + lst.row_count]
        for i, line in enumerate(lines):
            row = lst.row_at(i)
            cell = line.split("▕")[0].rstrip()[-6:]
            v = float(np.float32(per_example(MEANS[method][name])[row]))
            assert cell == ("     —" if np.isnan(v) else f"{v:.3f}".rjust(6)), (i, row, line)


def list_cells(app) -> list[str]:
    """The metric column of the visible rows (its last 6 cells, before the list's border)."""
    n = app.example_list.row_count
    return [ln.split("▕")[0].rstrip()[-6:] for ln in screen_text(app).splitlines()[2:2 + n]]


def want_cells(method: str, name: str) -> list[str]:
    return ["     —" if np.isnan(v) else f"{v:.3f}".rjust(6)
            for v in (float(np.float32(x)) for x in per_example(MEANS[method][name]))]


@async_test
async def test_list_metric_column_follows_the_method(metrics_store, partial_store, plain_store, color_env):
    """The example list shows the current method's per-example metric, store row by store row; m switches it to
    the next method's; a method without metrics and a store without any show no column."""
    from tui.app import create_app

    app = create_app(metrics_store)
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        lst = app.example_list
        assert lst.metric_key == ("rollout", "comprehensiveness")
        assert screen_text(app).splitlines()[1].split("▕")[0].rstrip().endswith("  comp")
        assert list_cells(app) == want_cells("rollout", "comprehensiveness")
        await pilot.press("m")
        await settle(pilot)
        await app.workers.wait_for_complete()
        await settle(pilot)
        assert lst.metric_key == ("normxlogit", "comprehensiveness")
        assert list_cells(app) == want_cells("normxlogit", "comprehensiveness")
    app = create_app(partial_store)
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        await pilot.press("M")  # norm: no metrics in this store, no column
        await settle(pilot)
        assert app.example_list.metric_key is None
        assert "comp" not in screen_text(app).splitlines()[1]
    app = create_app(plain_store)
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(pilot)
        assert app.example_list.metric_key is None and " len " in screen_text(app).splitlines()[1] + " "


@async_test
async def test_p_plots_the_mean_curves_of_the_sort_metric(metrics_store, plain_store, color_env):
    """p swaps the detail panel for a plotext chart of the sort column's mean per-level curves (the method under the
    cursor first); a metric without stored curves says so; p again brings the panel back."""
    from tui.widgets.curve_chart import CurveChart

    app = create_app_for(metrics_store)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_metrics(pilot)
        chart = screen.query_one(CurveChart)
        assert not chart.display and screen.query_one("#metrics-side").display
        await pilot.press("p")
        await settle(pilot)
        assert chart.display and not screen.query_one("#metrics-side").display
        assert chart.metric == "comprehensiveness" and chart.series == []  # no curves stored for it
        assert "no per-level curves" in screen_text(app)
        while screen.sort_name != "aopc@attcat":
            await pilot.press("right")
        await settle(pilot)
        assert chart.metric == "aopc@attcat"
        assert [s.method for s in chart.series] == screen.chart_methods()[:len(chart.series)]
        assert chart.series and chart.series[0].method == screen.cursor
        for s in chart.series:
            info = screen.data.get(s.method, "aopc@attcat")
            keep = np.isfinite(info.curve)
            np.testing.assert_allclose(s.y, info.curve[keep])
            np.testing.assert_allclose(s.x, info.curve_levels[keep])
        text = screen_text(app)
        assert "aopc@attcat: mean curve" in text and all(s.method in text for s in chart.series)
        await pilot.press("down")  # another method under the cursor: it comes first
        await settle(pilot)
        assert chart.series[0].method == screen.cursor
        await pilot.press("p")
        await settle(pilot)
        assert not chart.display and screen.query_one("#metrics-side").display


def create_app_for(path):
    from tui.app import create_app

    return create_app(path)


def test_curve_series_leaves_out_what_is_missing():
    from tui.data import MetricInfo, MetricsData
    from tui.widgets.curve_chart import curve_series

    def info(method, curve, levels):
        return MetricInfo(method, "aopc", None, {}, {}, True, curve=curve, curve_levels=levels)

    data = MetricsData(("a", "b", "c", "d"), ("aopc",), {
        "a": {"aopc": info("a", np.array([0.5, np.nan, 0.2]), np.array([1.0, 2.0, 3.0]))},
        "b": {"aopc": info("b", None, None)},  # no curves stored
        "c": {"aopc": info("c", np.array([0.4, 0.3]), np.array([np.nan, 2.0]))},  # a level missing: 1..K
        "d": {"aopc": info("d", np.array([np.nan]), np.array([1.0]))}})  # nothing finite
    series = curve_series(data, "aopc", ["c", "a", "b", "d", "e"])
    assert [s.method for s in series] == ["c", "a"]
    np.testing.assert_array_equal(series[0].x, [1.0, 2.0]) and np.testing.assert_array_equal(series[0].y, [0.4, 0.3])
    np.testing.assert_array_equal(series[1].x, [1.0, 3.0]) and np.testing.assert_array_equal(series[1].y, [0.5, 0.2])


@async_test
async def test_metrics_screen_is_kept_and_not_read_again(metrics_store, color_env, monkeypatch):
    """f after f-escape shows the same screen (sort and cursor as left) without reading the store again; no
    widgets pile up from opening it (Textual's footer kept every removed key alive before widgets/footer.py)."""
    import gc

    from textual.widget import Widget

    from tui.app import create_app
    from tui.screens.metrics import MetricsScreen

    reads = []
    original = MetricsScreen._read_metrics
    monkeypatch.setattr(MetricsScreen, "_read_metrics", lambda self: (reads.append(1), original(self)))
    app = create_app(metrics_store)
    async with app.run_test(size=(100, 30)) as pilot:
        first = await open_metrics(pilot)
        await pilot.press("right", "down")
        await settle(pilot)
        sort, cursor = first.sort, first.cursor
        counts = []
        for _ in range(4):
            await pilot.press("escape")
            await settle(pilot)
            again = await open_metrics(pilot)
            assert again is first and (again.sort, again.cursor) == (sort, cursor)
            gc.collect()
            counts.append(sum(issubclass(type(o), Widget) for o in gc.get_objects()))
        assert len(reads) == 1
        assert counts[-1] == counts[0], counts


@async_test
async def test_curve_chart_at_80x24_keeps_its_legend_off_the_curves(metrics_store, color_env):
    """Issue 28, item 9: at 80x24 the legend is a line (under the chart since issue 38), not a box over the curves,
    and every curve has its own numbered marker, so each one can be told apart (also without colour)."""
    from tui.widgets.curve_chart import CurveChart

    app = create_app_for(metrics_store)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_metrics(pilot)
        await pilot.press("p")
        await settle(pilot)
        while screen.sort_name != "aopc@attcat":
            await pilot.press("right")
        await settle(pilot)
        chart = screen.query_one(CurveChart)
        assert len(chart.series) >= 2
        region = chart.region
        lines = screen_text(app).splitlines()
        legend = lines[region.bottom]  # under the chart (issue 38: the title line had no room for it at 80 columns)
        plot = [line[region.x:region.right] for line in lines[region.y + 2:region.bottom]]
        for k, s in enumerate(chart.series):
            assert f"{k + 1} {s.method}" in legend, legend
            assert not any(s.method in line for line in plot), plot  # no legend box over the curves
        # the stored curves are equal here: the one drawn last, the selected method's (1), shows right of the y axis
        assert any("1" in line.split("┤", 1)[-1] for line in plot)


@async_test
async def test_the_chart_at_80x24_names_every_curve_and_draws_the_selected_one_on_top(metrics_store, color_env):
    """Issue 38, item 4: at 80x24 the curves were marked 2-6 with no legend (the title was cut) and the selected
    method's curve (1) lay under curve 2. Every method's curves are equal in this store: only the curve drawn last
    shows, and it is the selected one's; the legend under the chart names every marker."""
    from tui.widgets.curve_chart import CurveChart

    app = create_app_for(metrics_store)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_metrics(pilot)
        while screen.sort_name != "aopc@attcat":
            await pilot.press("right")
        await pilot.press("p")
        await settle(pilot)
        chart = screen.query_one(CurveChart)
        assert chart.series[0].method == screen.cursor and len(chart.series) == 3
        lines = screen_text(app).splitlines()
        plot = [line.split("┤", 1)[1] for line in lines if "┤" in line]  # the plot's rows, right of the y axis
        assert plot and "1" in "".join(plot) and not {"2", "3"} & set("".join(plot)), plot
        legend = next(line for line in lines if "1 " + screen.cursor in line)
        for k, s in enumerate(chart.series):
            assert f"{k + 1} {s.method}" in legend


def test_the_chart_legend_wraps_six_long_names_at_80_columns():
    """Six methods with long names: the legend wraps under the chart, every marker named in full."""
    import asyncio

    from textual.app import App
    from textual.widgets import Static

    from tui.widgets.curve_chart import CurveChart, Series, legend_text

    names = [f"integrated_gradients_{k}" for k in range(6)]

    class Demo(App):  # the chart and its legend as the metrics screen lays them out
        def compose(self):
            yield CurveChart(id="chart")
            yield Static(id="legend")

    async def main():
        app = Demo()
        async with app.run_test(size=(80, 24)) as pilot:
            x = np.arange(1.0, 5.0)
            series = [Series(n, x, x * k) for k, n in enumerate(names)]
            app.query_one(CurveChart).show("aopc", series)
            app.query_one("#legend", Static).update(legend_text(series, 78))
            await pilot.pause()
            text = screen_text(app)
            for k, n in enumerate(names):
                assert f"{k + 1} {n}" in text, text

    asyncio.run(main())
