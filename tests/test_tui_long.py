"""Issue 36, point 6 (the explorer's part): a 4,096-token example opens, scrolls to its end and exports at 80x24, and
what the app reads for it is bounded by what it draws: the example's own runs (n values per score, L x n per layer
view, the explained row of each matrix layer, never an n x n), each read once, and nothing more while it scrolls,
exports or steps through the layers of its matrix."""

from __future__ import annotations

import numpy as np
import pytest

from store import ExampleData, MethodLayout, StoreWriter
from test_tui import async_test, screen_text, set_color_env, settle

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


def _count_reads(monkeypatch) -> list[tuple[str, int]]:
    """Every read of the store through the reader: (dataset, elements read)."""
    from store.reader import Store

    seen: list[tuple[str, int]] = []
    read = Store._read

    def counted(self, name, sel, expect=None):
        out = read(self, name, sel, expect)
        seen.append((name, int(out.size)))
        return out

    monkeypatch.setattr(Store, "_read", counted)
    return seen


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
