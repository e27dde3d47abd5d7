"""attr-tui heads screen (``h``): Pilot tests for behaviour, SVG snapshots for looks (100x30, 80x24, NO_COLOR).

The stores are synthetic with fixed seeds: examples from :func:`synthetic.make_store`, head masks made here the way
Mask-LRP makes them (METHODS.md 6.1): positional counts per offset and a 0.8 threshold, syntactic hits/totals per
relation against max(lambda_k) + 0.1, and their union (or sum). Update the snapshots with ``--snapshot-update``.
"""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import make_store
from test_tui import async_test, open_modal, screen_text, set_color_env, settle

RELATIONS = ["nsubj", "obj", "amod", "advmod"]


# ---------------------------------------------------------------- a store with head masks
def head_masks(n_layers: int, n_heads: int, *, seed: int = 0, how: str = "union",
               names: tuple[str, ...] = ("positional", "syntactic", "mask_lrp")):
    """HeadMaskData for a model of n_layers x n_heads: positional, syntactic and their combination."""
    from store import HeadMaskData

    rng = np.random.default_rng(seed)
    offsets = np.arange(-3, 4)
    n_queries = 1000
    counts = np.zeros((n_layers, n_heads, len(offsets)), dtype=np.int64)
    for layer in range(n_layers):
        for head in range(n_heads):
            p = rng.dirichlet(np.full(len(offsets), 0.3 if rng.random() < 0.3 else 2.0))
            counts[layer, head] = rng.multinomial(n_queries, p)
    counts[-1, 0] = [0, 0, 880, 90, 30, 0, 0]  # one head that both masks select: attends to the previous token
    freq = counts / n_queries
    pos_mask = (freq.max(-1) > 0.8).astype(np.uint8)
    pos_stats = {"offsets": offsets, "counts": counts, "freq_max": freq.max(-1),
                 "argmax_offset": offsets[freq.argmax(-1)]}
    pos_attrs = {"threshold": 0.8, "exclude_self": False, "n_queries": n_queries, "n_examples": 40,
                 "dataset": "sst2:validation"}

    totals = rng.integers(20, 400, size=(n_layers, n_heads, 4)).astype(np.int64)
    totals[rng.random(totals.shape) < 0.05] = 0  # a relation never seen by this head: rate NaN
    rate = rng.beta(2.0, 10.0, size=totals.shape)
    syntactic_heads = rng.random((n_layers, n_heads, 1)) < 0.1
    rate = np.where(syntactic_heads & (rng.random(totals.shape) < 0.5), rng.beta(9.0, 3.0, size=totals.shape), rate)
    totals[-1, 0, 0] = 200
    rate[-1, 0, 0] = 0.9  # ... and finds the subject's head
    hits = np.floor(totals * rate).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        rates = np.where(totals > 0, hits / np.maximum(totals, 1), np.nan)
    lambda_max = np.array([0.35, 0.42, 0.5, 0.3])
    thresholds = lambda_max + 0.1
    syn_mask = np.any(np.nan_to_num(rates, nan=-1.0) > thresholds, axis=-1).astype(np.uint8)
    syn_stats = {"hits": hits, "totals": totals, "rates": rates, "thresholds": thresholds, "lambda_max": lambda_max}
    syn_attrs = {"relations": RELATIONS, "margin": 0.1, "parser": "stanza 1.9 (UD v2)", "n_examples": 40,
                 "dataset": "sst2:validation"}

    combined = pos_mask.astype(np.uint8) + syn_mask if how == "sum" else (pos_mask | syn_mask).astype(np.uint8)
    made = {
        "positional": HeadMaskData("positional", pos_mask, arrays=pos_stats, attrs=pos_attrs),
        "syntactic": HeadMaskData("syntactic", syn_mask, arrays=syn_stats, attrs=syn_attrs),
        "mask_lrp": HeadMaskData("mask_lrp", combined, attrs={"how": how, "sources": ["positional", "syntactic"]}),
    }
    return [made[n] for n in names]


def make_heads_store(path, *, n_layers: int = 12, n_heads: int = 12, masks=None, n_examples: int = 4,
                     seed: int = 0) -> None:
    """A finished store of a few synthetic examples with the given head masks (None: the three Mask-LRP masks)."""
    from store import MethodLayout, StoreWriter, open_store

    scratch = str(path) + ".src.h5"
    exs = make_store(scratch, n_examples=n_examples, L=n_layers, seed=seed)
    with open_store(scratch) as s:
        layouts = [MethodLayout(**m) for m in s._method_layouts.values()]
    w = StoreWriter.create(str(path), n_layers=n_layers, n_heads=n_heads, labels={0: "negative", 1: "positive"},
                           methods=layouts, provenance={"model": "synthetic"}, attrs={"model_id": "synthetic"},
                           head_masks=head_masks(n_layers, n_heads, seed=seed) if masks is None else masks)
    w.append(exs)
    w.close(complete=True)


@pytest.fixture(scope="module")
def heads_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("heads") / "heads.h5"
    make_heads_store(path)
    return path


@pytest.fixture(scope="module")
def sum_store(tmp_path_factory):
    """A small model (4 x 6) whose mask_lrp is the SUM of the two masks (values 0..2)."""
    path = tmp_path_factory.mktemp("heads_sum") / "small.h5"
    make_heads_store(path, n_layers=4, n_heads=6, masks=head_masks(4, 6, seed=3, how="sum"), seed=1)
    return path


@pytest.fixture(scope="module")
def plain_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("plain") / "plain.h5"
    make_store(str(path), n_examples=4, L=3, seed=0)
    return path


@pytest.fixture
def color_env(monkeypatch):
    set_color_env(monkeypatch)


def _mask(path, name):
    from store import open_store

    with open_store(path) as s:
        hm = s.head_mask(name)
        return np.asarray(hm).copy(), dict(hm.stats), dict(hm.attrs)


async def open_heads(pilot, key: str = "h"):
    """Press ``key`` on the browse screen and wait until the heads screen has read its masks and laid out."""
    from tui.screens.heads import HeadsScreen

    return await open_modal(pilot, key, HeadsScreen, "masks")


def detail(screen) -> str:
    return str(screen.query_one("#heads-detail").render())


# ---------------------------------------------------------------- Pilot: behaviour
@async_test
async def test_h_opens_and_closes_the_heads_screen(heads_store, color_env):
    from tui.app import create_app
    from tui.screens.heads import HeadsScreen

    app = create_app(heads_store)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_heads(pilot)
        assert isinstance(screen, HeadsScreen)
        assert [m.name for m in screen.masks] == ["positional", "syntactic", "mask_lrp"]
        text = screen_text(app)
        for name in ("positional", "syntactic", "mask_lrp"):
            mask, _, _ = _mask(heads_store, name)
            assert f" {name} {int((mask > 0).sum())} " in text  # the count of selected heads per mask
        assert "of 144 heads (12×12)" in text
        assert "H12" in text and "L12" in text and "layer 1 · head 1" in text
        assert "m mask" in text and "close" in text  # the footer
        for close in ("escape", "h", "q"):
            await pilot.press(close)
            await pilot.pause()
            assert not isinstance(app.screen, HeadsScreen) and app.is_running, close
            if close != "q":
                await open_heads(pilot)
        assert app.is_running  # q closed the screen, it did not quit the app


@async_test
async def test_footer_and_help_list_the_key(heads_store, color_env):
    from tui.app import create_app

    app = create_app(heads_store)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        footer = screen_text(app).splitlines()[-1]
        # at 80 columns every key fits; ^p's entry gives way (it stays bound and the help screen lists it)
        assert "h heads" in footer and "c compare" in footer and "q quit" in footer, footer
        await pilot.press("question_mark")
        await pilot.pause()
        assert "head masks" in screen_text(app)


@async_test
async def test_cursor_moves_and_detail_follows(heads_store, color_env):
    from tui.app import create_app
    from tui.render.head_grid import offset_text

    _, pos, pos_attrs = _mask(heads_store, "positional")
    _, syn, _ = _mask(heads_store, "syntactic")
    app = create_app(heads_store)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_heads(pilot)
        await pilot.press("down", "down", "right", "right", "right")
        await pilot.pause()
        assert (screen.cursor_layer, screen.cursor_head) == (2, 3)
        text = detail(screen)
        assert "layer 3 · head 4" in text
        counts = pos["counts"][2, 3]
        order = np.argsort(-counts, kind="stable")[:3]
        for i in order:  # the top 3 offsets of this head with their share of the queries
            share = counts[i] / pos_attrs["n_queries"]
            assert f"{offset_text(int(pos['offsets'][i])):>6}  {share * 100:5.1f}%" in text
        for k, rel in enumerate(RELATIONS):  # the four relations against their thresholds, with hits/totals
            rate, thr = syn["rates"][2, 3, k], syn["thresholds"][k]
            shown = "—" if np.isnan(rate) else f"{rate * 100:.1f}%"
            assert f"{rel:<6} {shown:>6} " in text and f"{thr * 100:.1f}%" in text
            assert f"{syn['hits'][2, 3, k]}/{syn['totals'][2, 3, k]}" in text
        assert "mask_lrp" in text
        screen_before = screen_text(app)
        await pilot.press("up", "up", "up", "up", "left", "left", "left", "left", "left")
        await pilot.pause()
        assert (screen.cursor_layer, screen.cursor_head) == (0, 0)  # clamped at the edges
        assert "layer 1 · head 1" in detail(screen) and screen_text(app) != screen_before
        await pilot.press("end")
        await pilot.pause()
        assert screen.cursor_layer == 11
        for _ in range(15):
            await pilot.press("right")
        await pilot.pause()
        assert screen.cursor_head == 11 and "layer 12 · head 12" in detail(screen)
        # a click on a cell moves the cursor there: 1 cell of padding, "L12" labels, columns of 5 (" · 24")
        await pilot.click("#heads-grid", offset=(1 + 3 + 2 * 5 + 3, 1 + 4))
        await pilot.pause()
        assert (screen.cursor_layer, screen.cursor_head) == (4, 2) and "layer 5 · head 3" in detail(screen)


@async_test
async def test_m_switches_masks(heads_store, color_env):
    from tui.app import create_app

    app = create_app(heads_store)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_heads(pilot)
        await pilot.press("right")
        legend = str(screen.query_one("#heads-legend").render())
        assert screen.current == 0 and "% of queries" in legend
        assert "settings of positional" in screen_text(app) and "threshold" in screen_text(app)
        await pilot.press("m")
        await pilot.pause()
        assert screen.current == 1 and screen.cursor_head == 1  # the cursor stays on its head
        text = screen_text(app)
        assert "settings of syntactic" in text and "stanza" in text and "thresholds" in text
        assert "hit rate" in str(screen.query_one("#heads-legend").render())
        await pilot.press("m")
        await pilot.pause()
        assert screen.current == 2 and "how" in screen_text(app) and "union" in screen_text(app)  # its settings
        await pilot.press("m")
        await pilot.pause()
        assert screen.current == 0  # wraps around
        await pilot.press("M")
        await pilot.pause()
        assert screen.current == 2


@async_test
async def test_grid_cells_show_the_statistic_when_wide_enough(sum_store, heads_store, color_env):
    """A small model at 100 columns: '-1 83%' cells; BERT-base (12 x 12) at 100: percentages; at 80: marks."""
    from tui.app import create_app
    from tui.render.head_grid import offset_text
    from tui.widgets import HeadGrid

    mask, pos, _ = _mask(sum_store, "positional")
    app = create_app(sum_store)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_heads(pilot)
        assert screen.query_one(HeadGrid).fmt.width == 8
        off, freq = int(pos["argmax_offset"][0, 0]), float(pos["freq_max"][0, 0])
        row = next(line for line in screen_text(app).splitlines() if line.lstrip().startswith("L1 "))
        assert f"{offset_text(off)} {round(freq * 100)}%" in row
        assert row.count("●") == int(mask[0].sum())
    for size, width in (((100, 30), 3), ((80, 24), 0)):
        app = create_app(heads_store)
        async with app.run_test(size=size) as pilot:
            screen = await open_heads(pilot)
            assert screen.query_one(HeadGrid).fmt.width == width, size
            if width == 0:
                assert "too narrow" in str(screen.query_one("#heads-legend").render())


@async_test
async def test_summed_mask_shows_its_sources(sum_store, color_env):
    from tui.app import create_app

    pos, _, _ = _mask(sum_store, "positional")
    syn, _, _ = _mask(sum_store, "syntactic")
    combined, _, attrs = _mask(sum_store, "mask_lrp")
    assert attrs["how"] == "sum" and combined.max() == 2, "the fixture must select a head twice"
    layer, head = (int(i) for i in np.argwhere(combined == 2)[0])
    app = create_app(sum_store)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_heads(pilot)
        await pilot.press("m", "m")
        screen.move_to(layer, head)
        await pilot.pause()
        text = detail(screen)
        assert "selected ×2" in text and "by positional + syntactic" in text
        grid_text = screen_text(app)
        assert "◆PS" in grid_text and "twice" in grid_text
        only_p = np.argwhere((pos > 0) & (syn == 0))
        if len(only_p):
            screen.move_to(*(int(i) for i in only_p[0]))
            await pilot.pause()
            assert "by positional\n" in detail(screen) + "\n" and "syntactic  · not selected" in detail(screen)


@async_test
async def test_store_without_head_masks(plain_store, color_env):
    from tui.app import create_app
    from tui.screens.heads import HeadsScreen

    app = create_app(plain_store)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_heads(pilot)
        assert isinstance(screen, HeadsScreen) and screen.masks == ()
        text = screen_text(app)
        assert "no head masks in this store: run attr-compute with --methods mask_lrp" in text
        assert "Traceback" not in text and "Error" not in text
        assert screen.check_action("move", (1, 0)) is False and screen.check_action("next_mask", ()) is False
        footer = text.splitlines()[-1]
        assert "close" in footer and "mask" not in footer  # keys that do nothing here are not offered
        await pilot.press("down", "m")  # nothing to move: no error
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HeadsScreen)


@async_test
async def test_every_statistic_is_optional(tmp_path, color_env):
    """Masks with some, odd or no statistics: the screen shows what exists and never fails."""
    from store import HeadMaskData
    from tui.app import create_app

    L, H = 3, 4
    rng = np.random.default_rng(5)
    m = (rng.random((L, H)) < 0.4).astype(np.uint8)
    masks = [
        HeadMaskData("positional", m, arrays={"freq_max": rng.random((L, H))}),  # no counts, no offsets
        HeadMaskData("syntactic", m, arrays={"hits": np.ones((L, H, 4), np.int64),
                                             "totals": np.full((L, H, 4), 4, np.int64)}),  # no rates, thresholds
        HeadMaskData("custom", m, arrays={"counts": np.ones((2, 2))}, attrs={"note": "hand-made"}),  # wrong shape
        HeadMaskData("mask_lrp", m),  # no attrs at all
    ]
    path = tmp_path / "odd.h5"
    make_heads_store(path, n_layers=L, n_heads=H, masks=masks)
    app = create_app(path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_heads(pilot)
        assert [x.name for x in screen.masks] == ["positional", "syntactic", "mask_lrp", "custom"]
        text = detail(screen)
        share = f"{masks[0].arrays['freq_max'][0, 0] * 100:.1f}%"
        assert share in text.split("syntactic")[0]  # freq_max alone: the top offset's share, offset unknown
        assert "25.0%" in text.split("syntactic")[1]  # hits / totals when rates are not stored
        assert "custom" in text
        for name in ("positional", "syntactic", "mask_lrp", "custom"):
            assert f"settings of {name}" in screen_text(app)
            await pilot.press("m")
            await pilot.pause()
        await pilot.press("M")
        await pilot.pause()
        text = screen_text(app)
        assert "note" in text and "hand-made" in text  # the custom mask's settings; its odd counts are ignored
        assert "(none stored)" not in text
        await pilot.press("M")
        await pilot.pause()
        assert "(none stored)" in screen_text(app)  # mask_lrp without settings


@async_test
async def test_palette_opens_heads_and_switches_masks(heads_store, color_env):
    from tui.app import create_app
    from tui.screens.heads import HeadsScreen

    app = create_app(heads_store)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"heads")
        await pilot.pause(0.3)
        await pilot.press("enter")
        screen = await open_heads(pilot, key="")
        assert isinstance(screen, HeadsScreen)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"syntactic")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is screen and screen.current == 1
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"heads: close")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, HeadsScreen)


@async_test
async def test_palette_offers_heads_only_where_valid(heads_store, color_env):
    from tui.app import create_app
    from tui.commands import BrowseCommands, HeadsCommands

    app = create_app(heads_store)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        assert HeadsCommands not in type(app.screen).COMMANDS
        browse = [t for t, _, _ in BrowseCommands(app.screen)._commands() if t.startswith("heads:")]
        assert browse == ["heads: head masks"]
        screen = await open_heads(pilot)
        assert type(screen).COMMANDS == {HeadsCommands}  # no method or layer commands on the heads screen
        on_heads = [t for t, _, _ in HeadsCommands(screen)._commands()]
        assert on_heads == ["mask: syntactic", "mask: mask_lrp", "heads: close"]


# ---------------------------------------------------------------- pure functions
def test_cell_formats_fit_the_width():
    from tui.data import HeadMaskInfo
    from tui.render.head_grid import cell_formats, choose_format, geometry

    L, H = 12, 12
    counts = np.zeros((L, H, 3), np.int64)
    counts[..., 1] = 9
    counts[..., 0] = 1
    info = HeadMaskInfo("positional", np.zeros((L, H), np.int64), {},
                        {"offsets": np.array([-1, 0, 1]), "counts": counts})
    formats = cell_formats(info, (info,))
    assert [f.width for f in formats] == [8, 3, 0]
    assert formats[0].body(0, 0) == "   0 90%" and formats[1].body(0, 0) == " 90"
    assert geometry(formats[0], L, H).width == 3 + 12 * 10
    assert choose_format(formats, L, H, 200) is formats[0]
    assert choose_format(formats, L, H, 63) is formats[1]
    assert choose_format(formats, L, H, 62) is formats[2]
    assert choose_format(formats, L, H, 10) is formats[2]  # nothing fits: the narrowest, scrolled


def test_statistics_helpers():
    from tui.data import HeadMaskInfo
    from tui.render.head_grid import Positional, Syntactic, selected_by, sources

    counts = np.array([[[5, 80, 15], [40, 30, 30]]])  # 1 layer, 2 heads, offsets -1 0 +1
    pos = Positional(HeadMaskInfo("positional", np.array([[1, 0]]), {"n_queries": 100, "threshold": 0.8},
                                  {"offsets": np.array([-1, 0, 1]), "counts": counts}))
    assert pos.top(0, 0) == [(0, 0.8), (1, 0.15), (-1, 0.05)]
    assert pos.offset(0, 1) == -1 and pos.freq(0, 1) == 0.4
    rates = np.array([[[0.5, 0.9, np.nan, 0.1], [np.nan] * 4]])
    syn = Syntactic(HeadMaskInfo("syntactic", np.array([[1, 0]]), {"relations": ["nsubj", "obj", "amod", "advmod"]},
                                 {"rates": rates, "thresholds": np.array([0.3, 0.95, 0.5, 0.5])}))
    assert syn.best(0, 0) == (0, 0.5)  # 0.5 is 0.2 over its threshold; 0.9 is under its 0.95
    assert syn.best(0, 1) is None and syn.rate(0, 0, 2) is None
    p = HeadMaskInfo("positional", np.array([[1, 0]]), {}, {})
    s = HeadMaskInfo("syntactic", np.array([[1, 1]]), {}, {})
    c = HeadMaskInfo("mask_lrp", np.array([[2, 1]]), {"how": "sum"}, {})
    srcs = sources((p, s, c), c)
    assert [letter for letter, _ in srcs] == ["P", "S"]
    assert selected_by(srcs, 0, 0) == "PS" and selected_by(srcs, 0, 1) == "S"
    assert sources((p, s, c), p) == []


def test_mask_marks_readable_without_colour():
    from tui.colors import mask_mark, mask_style

    assert len({mask_mark(0), mask_mark(1), mask_mark(2)}) == 3
    assert mask_style(1, "mono").bgcolor is None and mask_style(1, "mono").bold
    assert mask_style(0, "mono") == mask_style(0, "truecolor")
    assert mask_style(1, "256").bgcolor is not None and mask_style(1, "truecolor") != mask_style(2, "truecolor")


def test_heads_modules_do_not_import_torch():
    import subprocess
    import sys
    from pathlib import Path

    code = ("import tui.screens.heads, tui.render.head_grid, tui.widgets.head_grid, sys; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------- SVG snapshots
def _run(*keys: str):
    async def run_before(pilot) -> None:
        await open_heads(pilot)
        for key in keys:
            await pilot.press(key)
            await pilot.pause()
        await settle(pilot)

    return run_before


def test_snapshot_heads_100x30(snap_compare, heads_store, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch)
    assert snap_compare(create_app(heads_store), terminal_size=(100, 30), run_before=_run("down", "right", "right"))


def test_snapshot_heads_small_model_100x30(snap_compare, sum_store, monkeypatch):
    """Room for the full cells ('-1 83%'); 256 colours as over SSH."""
    from tui.app import create_app

    set_color_env(monkeypatch, truecolor=False)
    assert snap_compare(create_app(sum_store), terminal_size=(100, 30), run_before=_run("down", "right"))


def test_snapshot_heads_80x24(snap_compare, heads_store, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch)
    assert snap_compare(create_app(heads_store), terminal_size=(80, 24), run_before=_run("m", "down", "down"))


def test_snapshot_heads_no_color(snap_compare, sum_store, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch, no_color=True)
    assert snap_compare(create_app(sum_store), terminal_size=(80, 24), run_before=_run("m", "m", "right"))


def test_snapshot_heads_empty(snap_compare, plain_store, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch, no_color=True)
    assert snap_compare(create_app(plain_store), terminal_size=(80, 24), run_before=_run())
