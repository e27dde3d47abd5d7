"""What is cut says so (issue 28, item 10): the example's text cut at three lines ends with "…", the layer strip
marks the layers it hides, and the palette finds an entry by its own text ("row: 17", "example: ex3")."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import make_store
from test_tui import async_test, screen_text, set_color_env, settle

from store import ExampleData, MethodLayout, StoreWriter

LONG = " ".join(f"word{i}" for i in range(80))


@pytest.fixture
def long_store(tmp_path):
    path = tmp_path / "long.h5"
    tokens = ["[CLS]"] + LONG.split()[:20] + ["[SEP]"]
    n = len(tokens)
    w = StoreWriter.create(str(path), n_layers=2, n_heads=2, labels={0: "neg", 1: "pos"},
                           methods=[MethodLayout("rollout", signed=False)], provenance={})
    w.append([ExampleData(row=0, id="long", text=LONG, pair=None, token_ids=np.arange(n), tokens=tokens,
                          spans=np.full((n, 2), -1), segment=np.zeros(n), label=1, pred=1,
                          probs=np.array([0.1, 0.9]), target=1, explain_pos=0, n_orig_tokens=n, truncated=False,
                          results={"rollout": {"scores": np.linspace(0, 1, n)}})])
    w.close(complete=True)
    return path


@async_test
async def test_a_text_cut_at_three_lines_ends_with_an_ellipsis(long_store, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch)
    for size in ((80, 24), (120, 40)):
        app = create_app(long_store)
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            lines = [line for line in screen_text(app).splitlines() if "word" in line and "long" not in line]
            panel = app.query_one("#text")
            assert panel.size.height == 3
            shown = [line for line in lines if "word1 " in line or "text word0" in line]
            assert shown, lines
            text = screen_text(app)
            assert "word79" not in text
            third = text.splitlines()[panel.region.y + 2][panel.region.x:panel.region.right].rstrip()
            assert third.endswith("…"), third


def test_the_layer_strip_marks_the_layers_it_hides():
    from tui.render.layer_strip import strip_text

    lines = np.random.default_rng(0).random((13, 5))
    labels = [f"L{i + 1}" for i in range(12)] + ["final"]
    middle = strip_text(lines, labels, 6, False, "mono", width=40, rows=4, label_w=7).plain.splitlines()
    assert len(middle) == 4 and middle[0][6] == "↑" and middle[-1][6] == "↓"
    assert middle[0].startswith(" L5") and "▶L7" in middle[2]
    first = strip_text(lines, labels, 0, False, "mono", width=40, rows=4, label_w=7).plain.splitlines()
    assert first[0][6] == " " and first[-1][6] == "↓" and first[0].startswith("▶L1")
    last = strip_text(lines, labels, 12, False, "mono", width=40, rows=4, label_w=7).plain.splitlines()
    assert last[0][6] == "↑" and last[-1][6] == " "
    every = strip_text(lines, labels, 3, False, "mono", width=40, rows=13, label_w=7).plain.splitlines()
    assert all(line[6] == " " for line in every)


@async_test
async def test_the_palette_finds_an_entry_by_its_own_text(tmp_path, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch)
    path = tmp_path / "s.h5"
    make_store(str(path), n_examples=20)
    app = create_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        for query, row in (("row: 17", 16), ("example: ex3", 3), ("row:5", 4), ("12", 11)):
            await pilot.press("ctrl+p")
            await pilot.pause()
            await pilot.press(*query)
            await pilot.pause(0.5)
            await pilot.press("enter")
            await settle(pilot)
            assert app.current == row, query
