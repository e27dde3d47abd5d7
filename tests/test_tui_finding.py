"""Finding examples (tui/finding.py) on stores with known answers: columns, filters, sorts, disagreement, search."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from store import ExampleData, MethodLayout, StoreWriter, open_store
from tui import finding
from tui.agreement import spearman

TEXTS = ["A fine film", "dull and LONG", "fine, fine acting", "no words", "the FINE print", "long live cinema"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Six examples: lengths 3..8, labels/preds chosen, method b = a reversed for example 0, equal for example 1."""
    path = tmp_path_factory.mktemp("find") / "f.h5"
    rng = np.random.default_rng(0)
    lays = [MethodLayout("a", signed=False), MethodLayout("b", signed=True)]
    w = StoreWriter.create(str(path), n_layers=2, n_heads=2, labels={0: "neg", 1: "pos"}, methods=lays,
                           provenance={})
    labels, preds = [0, 1, 1, -1, 0, 1], [0, 0, 1, 1, 1, 1]
    exs = []
    for i in range(6):
        n = 3 + i
        a = np.arange(n, dtype=float) + 1
        b = {0: a[::-1].copy(), 1: a * 2}.get(i, rng.normal(size=n))
        a[0] = 100.0  # the explained token: left out of the ranking
        exs.append(ExampleData(row=i, id=f"e{i}", text=TEXTS[i], pair="a pair with LONG words" if i == 3 else None,
                               token_ids=np.arange(n), tokens=[f"t{k}" for k in range(n)],
                               spans=np.full((n, 2), -1), segment=np.zeros(n), label=labels[i], pred=preds[i],
                               probs=np.array([0.5, 0.5]), target=preds[i], explain_pos=0, n_orig_tokens=n + (i == 5),
                               truncated=i == 5, results={"a": {"scores": a}, "b": {"scores": b}}))
    w.append(exs[:4])
    w.append(exs[4:])
    w.close(complete=True)
    with open_store(path) as s:
        yield s


def test_index_columns(store):
    cols = finding.index_columns(store)
    assert cols["length"].tolist() == [3, 4, 5, 6, 7, 8]
    assert cols["label"].tolist() == [0, 1, 1, -1, 0, 1] and cols["pred"].tolist() == [0, 0, 1, 1, 1, 1]
    assert np.array_equal(cols["correct"], [1, 0, 1, np.nan, 0, 1], equal_nan=True)
    assert cols["truncated"].tolist() == [False] * 5 + [True]


def test_filters_and_sorts(store):
    cols = finding.index_columns(store)
    f = finding.Filter(correct=False)
    assert np.flatnonzero(f.mask(cols)).tolist() == [1, 4]
    assert np.flatnonzero(finding.Filter(pred=1, length=(5, 7)).mask(cols)).tolist() == [2, 3, 4]
    assert np.flatnonzero(finding.Filter(truncated=True).mask(cols)).tolist() == [5]
    assert finding.Filter(label=1, correct=True).describe({0: "neg", 1: "pos"}) == "label pos, correct"
    assert finding.order(cols["length"], None, descending=True).tolist() == [5, 4, 3, 2, 1, 0]
    # NaN last in both directions, ties keep store order
    assert finding.order(cols["correct"], None).tolist() == [1, 4, 0, 2, 5, 3]
    assert finding.order(cols["correct"], None, descending=True).tolist() == [0, 2, 5, 1, 4, 3]
    assert finding.order(cols["length"], f.mask(cols), descending=True).tolist() == [4, 1]


def test_disagreement_is_one_minus_spearman_without_the_explained_token(store):
    d = finding.disagreement(store, "a", "b")
    assert d[0] == pytest.approx(2.0) and d[1] == pytest.approx(0.0)  # reversed, identical ranking
    for i in range(6):
        ex = store[i]
        assert d[i] == pytest.approx(1 - spearman(ex.scores("a"), ex.scores("b"), skip=0))


def test_grouped_spearman_with_ties():
    a = np.array([1, 2, 2, 3, 5, 5, 5.0])
    b = np.array([1, 2, 3, 4, 1, 2, 3.0])
    rho = finding.grouped_spearman(a, b, np.array([4, 3]))
    assert rho[0] == pytest.approx(spearman(a[:4], b[:4])) and np.isnan(rho[1])


def test_text_search_is_case_insensitive_and_covers_pair_texts(store):
    assert finding.text_matches(store, "fine").tolist() == [0, 2, 4]
    assert finding.text_matches(store, "long").tolist() == [1, 3, 5]  # 3 through its pair text
    assert finding.text_matches(store, "zzz").tolist() == []


def test_text_search_finds_a_generation_stores_continuation(tmp_path):
    """Issue 37's explorer: a generation store's text is its prompt; the continuation (its generated tokens) is searched
    too, read as the prompt's text goes on (GPT-2's Ġ a space), a match across the two included."""
    from generation_stores import write_generation_store

    path = tmp_path / "gen.h5"
    write_generation_store(path)
    with open_store(path) as s:
        assert s.continuations_range(0, 4) == [" the mat.", " France, and it is big", "", " bores and drags"]
        assert finding.text_matches(s, "MAT").tolist() == [0]  # generated
        assert finding.text_matches(s, "cat sat on the mat").tolist() == [0]  # prompt and continuation
        assert finding.text_matches(s, "france, and").tolist() == [1]
        assert finding.text_matches(s, "drags").tolist() == [3]
        assert finding.text_matches(s, "capital").tolist() == [1]  # the prompt, as before
        assert finding.text_matches(s, "hello").tolist() == [2]  # no continuation (EOS first)
        assert finding.text_matches(s, "Ġ").tolist() == []  # the marks are not text


def test_tokens_read_as_text():
    from store.text import tokens_text

    assert tokens_text(["Ġthe", "Ġmat", "."]) == " the mat."
    assert tokens_text(["▁Le", "▁chat", "Ċ", "ok"]) == " Le chat\nok"
    assert tokens_text(["un", "##believ", "##able", "film"]) == "unbelievable film"
    assert tokens_text([]) == ""


def test_progress_cancel_and_cache(store, monkeypatch):
    monkeypatch.setattr(finding, "CHUNK", 2)
    seen = []
    finding.index_columns(store, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(2, 6), (4, 6), (6, 6)]
    stop = threading.Event()

    def cancel_after_first(done, total):
        stop.set()

    with pytest.raises(finding.Cancelled):
        finding.disagreement(store, "a", "b", progress=cancel_after_first, cancel=stop)
    cache = finding.Cache()
    cache.put(6, "x", 1)
    assert cache.get(6, "x") == 1 and cache.get(7, "x") is None
    cache.put(7, "y", 2)
    assert cache.get(6, "x") is None  # a grown store drops older answers


def test_parse_length():
    assert finding.parse_length("10-40") == (10, 40) and finding.parse_length("25") == (25, 25)
    assert finding.parse_length("10-")[0] == 10 and finding.parse_length("-7") == (0, 7)
    for bad in ("", "x", "9-3"):
        with pytest.raises(ValueError):
            finding.parse_length(bad)


# ---------------------------------------------------------------- in the app
async def _idle(pilot, rounds=20):
    for _ in range(rounds):
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()


def test_sort_filter_search_in_the_app(store, monkeypatch):
    import asyncio

    from test_tui import screen_text, set_color_env

    from tui.app import create_app

    set_color_env(monkeypatch)

    async def run():
        app = create_app(store.path)
        async with app.run_test(size=(100, 30)) as pilot:
            await _idle(pilot)
            lst = app.example_list
            app.view.sort_by_column("length", True)
            await _idle(pilot)
            assert [lst.row_at(i) for i in range(lst.row_count)] == [5, 4, 3, 2, 1, 0]
            assert "length ↓" in screen_text(app)
            app.view.set_filter(finding.Filter(correct=False))
            await _idle(pilot)
            assert [lst.row_at(i) for i in range(lst.row_count)] == [4, 1]
            assert "wrong: 2 of 6" in screen_text(app)
            assert app.current == 4  # the cursor's example was filtered out: the first one shown
            # / searches, n / N move through the matches in the view's order, r resets
            await pilot.press("r")
            await _idle(pilot)
            assert lst.row_count == 6 and lst.row_at(0) == 0 and app.current == 4
            await pilot.press("slash")
            await pilot.pause()
            for ch in "FINE":
                await pilot.press(ch)
            await pilot.press("enter")
            await _idle(pilot)
            assert app.view.matches.tolist() == [0, 2, 4] and "/FINE: 3" in screen_text(app)
            assert app.current == 4  # the first match at or after the cursor, which stayed on example 4
            await pilot.press("n")
            await _idle(pilot)
            assert app.current == 0  # wraps
            await pilot.press("n", "n")
            await _idle(pilot)
            assert app.current == 4
            await pilot.press("N")
            await _idle(pilot)
            assert app.current == 2
            # disagreement: example 0 (reversed ranking) first
            app.view.sort_by_disagreement("a", "b")
            await _idle(pilot)
            assert lst.row_at(0) == 0 and lst.row_at(lst.row_count - 1) in (1, 3)
            # a metric column sort on a store without metrics is not offered; escape with nothing running is harmless
            await pilot.press("escape")
            await pilot.pause()

    asyncio.run(run())


def test_disagreement_sort_shows_one_minus_spearman_in_the_list(store, monkeypatch):
    """The list's value column under a disagreement sort is 1-ρ of that row, as scipy computes it with the
    explained token left out (not the length, nor a metric)."""
    import asyncio

    from scipy.stats import spearmanr
    from test_tui import screen_text, set_color_env

    from tui.app import create_app
    from tui.widgets.example_list import metric_cell

    set_color_env(monkeypatch)

    async def run():
        app = create_app(store.path)
        async with app.run_test(size=(100, 30)) as pilot:
            await _idle(pilot)
            app.view.sort_by_disagreement("a", "b")
            await _idle(pilot)
            lst = app.example_list
            header = lst.header_text(60)
            assert header.split()[-3:] == ["1-ρ(a,", "b)", "↓"] and "1-ρ " in header
            expected = {}
            for row in range(6):
                ex = store[row]
                expected[row] = 1.0 - spearmanr(np.delete(ex.scores("a"), 0), np.delete(ex.scores("b"), 0))[0]
            text = screen_text(app)
            for pos in range(lst.row_count):
                row = lst.row_at(pos)
                line, _ = lst._row_text(pos, 60)
                assert line.split()[-1] == metric_cell(expected[row]).strip()
                assert f"e{row} " in text and line.split()[0] == f"e{row}"
            assert [lst.row_at(p) for p in range(6)] == sorted(range(6), key=lambda r: -expected[r])

    asyncio.run(run())
