"""The open app follows its store (issue 28, item 8): metrics that `attr-compute eval` adds meanwhile appear, and a
live run whose window takes longer than the stall time is still "writing", while a killed one is "incomplete"."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from synthetic import make_store
from test_tui import async_test, screen_text, set_color_env, settle

ROOT = Path(__file__).resolve().parents[1]

_EVAL = """
import sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
from store import add_metrics
from test_tui_metrics import metric_data
add_metrics(sys.argv[2], metric_data())
"""

_SLOW_WRITER = """
import sys, time
from pathlib import Path
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
from synthetic import make_store
from store import MethodLayout, StoreWriter, open_store
src, live = Path(sys.argv[2]), sys.argv[3]
exs = make_store(str(src), n_examples=4)
with open_store(src) as s:
    layouts = [MethodLayout(**m) for m in s._method_layouts.values()]
w = StoreWriter.create(live, n_layers=3, n_heads=4, labels={0: "negative", 1: "positive"}, methods=layouts,
                       provenance={})
w.append(exs[:2])
print("ready", flush=True)
time.sleep(120)  # a window that takes long: the writer is alive and holds the file
"""


async def _until(pilot, predicate, seconds: float = 20.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await settle(pilot, rounds=2)
        if predicate():
            return True
        await pilot.pause(0.1)
    return False


@async_test
async def test_metrics_added_by_eval_reach_the_open_app(tmp_path, monkeypatch):
    from test_tui_metrics import N

    from tui.app import create_app

    set_color_env(monkeypatch)
    path = tmp_path / "s.h5"
    make_store(str(path), n_examples=N, L=3, seed=0)
    app = create_app(path, poll_seconds=0.1)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        assert not app.metrics.names
        env = dict(os.environ, HDF5_USE_FILE_LOCKING="FALSE")
        subprocess.run([sys.executable, "-c", _EVAL, str(ROOT), str(path)], env=env, check=True, timeout=120)
        assert await _until(pilot, lambda: bool(app.metrics.names)), "the metrics never reached the app"
        assert "comprehensiveness" in app.metrics.names
        # the list's metric column and the method bar show them for the current example
        assert await _until(pilot, lambda: "comp" in screen_text(app))
        assert app.example_list.metric_key == ("rollout", "comprehensiveness")
        # the metrics screen reads them too
        await pilot.press("f")
        assert await _until(pilot, lambda: getattr(app.screen, "data", None) is not None
                            and "comprehensiveness" in app.screen.data.names)


@async_test
async def test_a_live_run_with_a_long_window_is_writing_and_a_killed_one_incomplete(tmp_path, monkeypatch):
    import tui.app
    from tui.app import create_app

    set_color_env(monkeypatch)
    monkeypatch.setattr(tui.app, "STALL_SECONDS", 0.3)  # a window that takes longer than the stall time
    monkeypatch.setattr(tui.app, "ALIVE_SECONDS", 0.2)
    live = tmp_path / "live.h5"
    env = dict(os.environ, HDF5_USE_FILE_LOCKING="FALSE")
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_WRITER, str(ROOT), str(tmp_path / "src.h5"), str(live)],
                            env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        app = create_app(live, poll_seconds=0.1)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            assert await _until(pilot, lambda: "2 examples" in app.sub_title)
            await pilot.pause(1.0)  # past the stall time, with no new window
            await settle(pilot, rounds=5)
            await pilot.pause(0.3)
            assert app.sub_title.startswith("writing… 2 examples"), app.sub_title
            proc.kill()
            proc.wait(timeout=10)
            assert await _until(pilot, lambda: "incomplete" in app.sub_title), app.sub_title
            assert app.sub_title.startswith("2 examples, incomplete")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
