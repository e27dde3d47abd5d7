"""Issue 36, point 6 (the explorer's part): a 4,096-token example opens, scrolls to its end and exports at 80x24, and
what the app reads for it is bounded by what it draws: the example's own runs (n values per score, L x n per layer
view, the explained row of each matrix layer, never an n x n), each read once, and nothing more while it scrolls,
exports or steps through the layers of its matrix."""

from __future__ import annotations

import numpy as np
import pytest

from store import ExampleData, MethodLayout, StoreWriter
from test_tui import async_test, screen_text, set_color_env, settle
from test_tui_open_cost import _count_reads

N = 4096  # tokens of the long example
L = 2


@pytest.fixture(scope="module")
def long_store(tmp_path_factory):
    """Example 0: N tokens; example 1: a short one (the read-ahead's neighbour)."""
    path = tmp_path_factory.mktemp("long") / "long.h5"
    methods = [MethodLayout("rollout", signed=False, n_layer_views=L, matrices="cls", n_matrix_layers=L,
                            description="attention rollout"),
               MethodLayout("normxlogit", signed=True, n_layer_views=L, description="norm x logit")]
    rng = np.random.default_rng(36)
    exs = []
    for i, n in enumerate((N, 7)):
        toks = ["[CLS]"] + [f"w{k}" for k in range(1, n - 1)] + ["[SEP]"]
        exs.append(ExampleData(
            row=i, id=f"doc{i}", text=" ".join(toks[1:-1]), pair=None, token_ids=np.arange(n), tokens=toks,
            spans=np.full((n, 2), -1), segment=np.zeros(n), label=1, pred=1, probs=np.array([.2, .8]), target=1,
            explain_pos=0, n_orig_tokens=n, truncated=False,
            results={"rollout": {"scores": rng.random(n), "layer_scores": rng.random((L, n)),
                                 "matrices": rng.random((L, 1, n))},
                     "normxlogit": {"scores": rng.normal(size=n), "layer_scores": rng.normal(size=(L, n))}}))
    w = StoreWriter.create(str(path), n_layers=L, n_heads=2, labels={0: "negative", 1: "positive"}, methods=methods,
                           provenance={"model": "long"})
    w.append(exs)
    w.close(complete=True, summary={"examples": 2})
    return path


def _bounded(reads: list[tuple[str, int]]) -> None:
    """No read larger than one example's own: its layer views of a method (L x N values), its text and its tokens'
    bytes (the long example's: about 23 kB, 19 kB); no n x n, no whole dataset."""
    text_bytes = len(" ".join(f"w{k}" for k in range(1, N - 1)).encode())
    for name, k in reads:
        assert k <= (text_bytes if name.endswith("strings") else L * N), (name, k)


@async_test
async def test_a_long_example_opens_scrolls_and_exports_reading_what_it_draws(long_store, tmp_path, monkeypatch):
    set_color_env(monkeypatch)
    monkeypatch.chdir(tmp_path)  # the export's directory
    from tui.app import create_app

    reads = _count_reads(monkeypatch)
    app = create_app(long_store)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert f"doc0  1/2  {N} tokens" in text, text
        assert "w1" in text and f"w{N - 2}" not in text  # the first tokens; the last are below the view
        _bounded(reads)
        # each of the long example's runs read once (the list's blocks and the short neighbour aside)
        big = [name for name, k in reads if k >= N]
        assert len(big) == len(set(big)), big
        per_method = {name.split("/")[1] for name in big if name.startswith("methods/")}
        assert per_method == {"rollout", "normxlogit"}

        reads.clear()
        view = app.browse.query_one("#tokens")
        view.focus()
        await pilot.press("end")
        await pilot.wait_for_scheduled_animations()  # the scroll is animated (drawing no longer outlasts it)
        await settle(pilot)
        assert view.scroll_y == view.max_scroll_y > 0
        text = screen_text(app)
        assert f"w{N - 2}" in text and "[SEP]" in text, text  # the end of the example is drawn
        await pilot.press("right_square_bracket")  # a layer view
        await settle(pilot)
        assert app.layer == 0
        assert reads == []  # scrolling and the views draw what was read

        await pilot.press("e")
        await settle(pilot)
        assert reads == []
        svg = next(tmp_path.glob("*.svg")).read_text(encoding="utf-8")
        assert f">w{N - 2}<" in svg and ">w1<" in svg  # every token of the example in the figure

        await pilot.press("x")  # the matrix screen: the explained row of each layer (--matrices cls)
        await settle(pilot)
        assert "rollout" in screen_text(app)
        matrix_reads = [(name, k) for name, k in reads if name.endswith("matrices")]
        assert matrix_reads == [("methods/rollout/matrices", L * N)], reads
        await pilot.press("right_square_bracket")
        await settle(pilot)
        assert [r for r in reads if r[0].endswith("matrices")] == matrix_reads  # the other layer: read already


def _store_of_lengths(path, lengths: list[int]):
    """Examples of the given lengths, tokens w1, w2, ... between [CLS] and [SEP]; one method with layer views."""
    rng = np.random.default_rng(6)
    exs = []
    for i, n in enumerate(lengths):
        toks = ["[CLS]"] + [f"w{k}" for k in range(1, n - 1)] + ["[SEP]"]
        exs.append(ExampleData(
            row=i, id=f"doc{i}", text=f"document {i}", pair=None, token_ids=np.arange(n), tokens=toks,
            spans=np.full((n, 2), -1), segment=np.zeros(n), label=1, pred=1, probs=np.array([.2, .8]), target=1,
            explain_pos=0, n_orig_tokens=n, truncated=False,
            results={"rollout": {"scores": rng.random(n), "layer_scores": rng.random((L, n))}}))
    w = StoreWriter.create(str(path), n_layers=L, n_heads=2, labels={0: "negative", 1: "positive"},
                           methods=[MethodLayout("rollout", signed=False, n_layer_views=L, description="rollout")],
                           provenance={"model": "long"})
    w.append(exs)
    w.close(complete=True, summary={"examples": len(exs)})


@async_test
async def test_a_keys_drawing_of_tokens_does_not_grow_with_the_example(tmp_path, monkeypatch):
    """Issue 36.6 and 38.15: the token view draws the lines it shows. The tokens drawn (rich segments of a token's
    text) by j onto a 4,096-token example, by a layer key on it and by a page of scrolling are as many as for a
    64-token example: at most the view's lines' worth. As a Static in a scroll container every token was drawn,
    four times over (16,376 per key on the long one)."""
    import re

    from rich.text import Text

    set_color_env(monkeypatch)
    from tui.app import create_app

    path = tmp_path / "lengths.h5"
    _store_of_lengths(path, [64, 64, N, 64, N])
    token = re.compile(r"w\d+")
    drawn: list[str] = []
    render = Text.render

    def counted(self, console, end=""):
        for seg in render(self, console, end):
            if token.fullmatch(seg.text):
                drawn.append(seg.text)
            yield seg

    monkeypatch.setattr(Text, "render", counted)
    app = create_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        view = app.browse.query_one("#tokens")
        shown = view.scrollable_content_region.height
        bound = shown * 80 // 3  # the view's lines, a token ("wK" and a space) at least 3 cells
        work = {}
        for i, n in ((1, 64), (2, N), (3, 64), (4, N)):
            drawn.clear()
            await pilot.press("j")
            await settle(pilot)
            assert app.current == i and f"doc{i}  {i + 1}/5  {n} tokens" in screen_text(app)
            work[i] = len(drawn)
        assert 0 < work[2] <= bound and 0 < work[4] <= bound, (work, bound)
        assert max(work[2], work[4]) <= 2 * min(work[1], work[3]), work
        drawn.clear()
        await pilot.press("right_square_bracket")  # a layer view of the long example
        await settle(pilot)
        assert app.layer == 0 and 0 < len(drawn) <= bound, (len(drawn), bound)
        view.focus()
        app.animation_level = "none"  # a scroll's own frames aside: the lines of the position it reaches
        for key in ("pagedown", "end"):
            drawn.clear()
            await pilot.press(key)
            await settle(pilot)
            assert 0 < len(drawn) <= bound, (key, len(drawn), bound)
        assert f"w{N - 2}" in screen_text(app)
