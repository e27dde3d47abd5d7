"""Issue 38, item 10: nothing cut at 80x24 that fits at 120x40 without a way to see it. A store like the issue's
(six layer views, labels "positive"/"negative", long method descriptions), driven at both sizes."""

from __future__ import annotations

import numpy as np
import pytest
from test_tui import async_test, screen_text, set_color_env, settle

from store import ExampleData, MethodLayout, StoreWriter
from tui import finding

SIZES = [(80, 24), (120, 40)]
L = 6


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("cols80") / "sst2.h5"
    rng = np.random.default_rng(5)
    methods = [MethodLayout("alti", signed=False, n_layer_views=L,
                            description="ALTI: L1 proximity of each token's contribution, rolled out over layers"),
               MethodLayout("globenc", signed=False, n_layer_views=L,
                            description="GlobEnc: norms of the whole encoder layer, rolled out")]
    w = StoreWriter.create(str(path), n_layers=L, n_heads=2, labels={0: "negative", 1: "positive"}, methods=methods,
                           provenance={"model": "m"})
    words = "it 's a charming and often affecting journey".split()
    exs = []
    for i in range(8):
        toks = ["[CLS]"] + words[: 3 + i % 5] + ["[SEP]"]
        n = len(toks)
        exs.append(ExampleData(row=i, id=str(i), text=" ".join(toks[1:-1]), pair=None, token_ids=np.arange(n),
                               tokens=toks, spans=np.full((n, 2), -1), segment=np.r_[-1, np.zeros(n - 2), -1],
                               label=i % 2, pred=1, probs=np.array([.3, .7]), target=1, explain_pos=0,
                               n_orig_tokens=n, truncated=False,
                               results={m.name: {"scores": rng.random(n), "layer_scores": rng.random((L, n))}
                                        for m in methods}))
    w.append(exs)
    w.close(complete=True, summary={"examples": 8})
    return path


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "120x40"])
@async_test
async def test_the_browse_screen_cuts_nothing(store, monkeypatch, size):
    set_color_env(monkeypatch)
    from tui.app import create_app

    app = create_app(store)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        text = screen_text(app)
        flat = " ".join(" ".join(line.split("▕")[-1] for line in text.splitlines()).split())  # the right pane
        # the method bar: the whole description (wrapped where the line is short)
        assert "final ALTI: L1 proximity of each token's contribution, rolled out over layers" in flat, text
        # the layer strip: every layer view and the final scores, none scrolled away
        lines = text.splitlines()
        for k in range(1, L + 1):
            assert any(line.split("▕")[-1].strip().startswith((f"L{k} ", f"▶L{k} ")) or
                       line.split("▕")[-1].strip() in (f"L{k}", f"▶L{k}") for line in lines), (k, text)
        assert "▶final" in text and "↑" not in text and "↓" not in text


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "120x40"])
@async_test
async def test_the_lists_sort_filter_and_column_head_are_whole(store, monkeypatch, size):
    """The disagreement column's head was "1-…", the filtered count and the sort shown only at 120 columns."""
    set_color_env(monkeypatch)
    from tui.app import create_app

    app = create_app(store)
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        app.view.set_filter(finding.Filter(label=1))
        await settle(pilot)
        app.view.sort_by_disagreement("alti", "globenc")
        await settle(pilot)
        text = screen_text(app)
        flat = " ".join(" ".join(line.split("▕")[0] for line in text.splitlines()).split())  # the list's pane
        assert "1-ρ(alti, globenc) ↓ · label positive: 4 of 8" in flat, text
        head = next(line for line in text.splitlines() if line.lstrip().startswith("id "))
        assert " 1-ρ" in head.split("▕")[0] and "…" not in head.split("▕")[0], head


@async_test
async def test_the_footer_or_the_help_names_every_browse_key_at_80_columns(store, monkeypatch):
    """The 80-column footer has no room for x, a, e, / and . : ? (in the footer) opens the help, which lists them."""
    set_color_env(monkeypatch)
    from tui.app import create_app

    app = create_app(store)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        footer = screen_text(app).splitlines()[-1]
        assert "? help" in footer
        await pilot.press("question_mark")
        await settle(pilot)
        help_text = screen_text(app)
        for key, what in (("x", "token-to-token matrix"), ("h  a", "attention"), ("e", "figure"),
                          ("/  n N", "search"), (". ,", "token cursor")):
            line = next((line for line in help_text.splitlines() if what in line), "")
            assert key in line, (key, what, help_text)
