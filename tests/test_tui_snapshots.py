"""SVG snapshots of attr-tui (pytest-textual-snapshot) at 80x24: colour, 256 colours, NO_COLOR, help.

The store is synthetic with a fixed seed; the UI shows neither timestamps nor paths (only the file name), so the
snapshots do not depend on when or where the store was written. Update with ``pytest --snapshot-update``.
"""

from __future__ import annotations

import pytest
from synthetic import make_store
from test_tui import set_color_env, settle


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("snap") / "demo.h5"
    make_store(str(path), n_examples=12, L=3, seed=0)
    return path


def _run(*keys: str):
    async def run_before(pilot) -> None:
        await settle(pilot)
        for key in keys:
            await pilot.press(key)
            await settle(pilot)

    return run_before


def test_browse_truecolor(snap_compare, demo_store, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch)
    assert snap_compare(create_app(demo_store), terminal_size=(80, 24), run_before=_run("j"))


def test_browse_256_signed_layer(snap_compare, demo_store, monkeypatch):
    """256 colours (no COLORTERM, as over SSH): a signed method's layer view."""
    from tui.app import create_app

    set_color_env(monkeypatch, truecolor=False)
    app = create_app(demo_store)
    assert snap_compare(app, terminal_size=(80, 24), run_before=_run("m", "right_square_bracket"))


def test_browse_no_color(snap_compare, demo_store, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch, no_color=True)
    assert snap_compare(create_app(demo_store), terminal_size=(80, 24), run_before=_run("m"))


def test_help_no_color(snap_compare, demo_store, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch, no_color=True)
    assert snap_compare(create_app(demo_store), terminal_size=(80, 24), run_before=_run("question_mark"))


# every screen at 80x24 and 120x40, in colour and with NO_COLOR
SCREENS = {"browse": (), "compare": ("c",), "compare-difference": ("c", "d"), "matrix": ("x", "down", "right"),
           "help": ("question_mark",), "heads": ("h",), "metrics": ("f",)}


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
@pytest.mark.parametrize("no_color", [False, True], ids=["color", "no_color"])
@pytest.mark.parametrize("screen", list(SCREENS))
def test_every_screen(snap_compare, demo_store, monkeypatch, screen, no_color, size):
    from tui.app import create_app

    set_color_env(monkeypatch, no_color=no_color)
    assert snap_compare(create_app(demo_store), terminal_size=size, run_before=_run(*SCREENS[screen]))


def test_browse_light_colormap_256(snap_compare, demo_store, monkeypatch):
    """--colormap light: white at zero, to red (+) and to blue (-), on a signed layer view."""
    from tui.app import create_app

    set_color_env(monkeypatch)
    assert snap_compare(create_app(demo_store, color_mode="256", colormap="light"), terminal_size=(80, 24),
                        run_before=_run("m", "right_square_bracket"))
