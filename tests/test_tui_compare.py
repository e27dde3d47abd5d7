"""The compare screen (c): aligned rows, agreement with the first method, scales, difference, k, method choice."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import make_store
from test_tui import async_test, open_modal, screen_text, set_color_env, settle

from store import open_store
from tui.agreement import spearman, top_k_overlap
from tui.render.compare import Row, aligned_blocks, difference, scales


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("cmp") / "cmp.h5"
    make_store(str(path), n_examples=8, L=3, seed=3)
    return path


async def open_compare(pilot):
    from tui.screens.compare import CompareScreen

    return await open_modal(pilot, "c", CompareScreen, "example")


@async_test
async def test_compare_shows_every_method_aligned_with_its_agreement(store_path, monkeypatch):
    set_color_env(monkeypatch)
    from tui.app import create_app

    with open_store(store_path) as s:
        ex = s[0]
        scores = {m: ex.scores(m) for m in s.methods}
        tokens = ex.tokens
    app = create_app(store_path)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_compare(pilot)
        assert screen.methods == ["rollout", "normxlogit", "norm"]
        text = screen_text(app)
        k = screen.top
        for m in screen.methods[1:]:
            rho = spearman(scores["rollout"], scores[m], skip=0)
            ov = top_k_overlap(scores["rollout"], scores[m], k, skip=0, signed=(False, m == "normxlogit"))
            line = next(line for line in text.splitlines() if line.strip().startswith(m + " ") and "." in line)
            assert f"{rho:.2f}" in line and f"{ov:.2f}" in line, (line, rho, ov)
        # one token row per method; the explained token is marked
        rows = [line for line in text.splitlines() if line.strip().startswith(("rollout ", "normxlogit ", "norm "))]
        assert sum("▸[CLS]" in line for line in rows) == 3, rows
        for tok in tokens[1:]:
            assert tok in text
        # j follows the browse list; the method choice stays
        await pilot.press("j")
        await settle(pilot)
        await pilot.pause()
        assert screen.index == 1 and app.example_list.cursor == 1 and screen.example.index == 1
        # s, d, +/- change what they say
        before = screen.shared
        await pilot.press("s")
        assert screen.shared is not before
        await pilot.press("d")
        text = screen_text(app)
        assert screen.difference and "A−B = rollout − normxlogit" in text
        assert any(line.strip().startswith("A−B ") for line in text.splitlines())
        k0 = screen.top
        await pilot.press("plus")
        assert screen.top == k0 + 1 and f"top-{k0 + 1}" in screen_text(app)
        await pilot.press("minus")
        assert screen.top == k0
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, type(screen))


@async_test
async def test_choosing_methods_persists(store_path, monkeypatch):
    set_color_env(monkeypatch)
    from tui.app import create_app

    app = create_app(store_path)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_compare(pilot)
        await pilot.press("a")
        await pilot.pause()
        chooser = screen.query_one("SelectionList")
        chooser.deselect("rollout")
        await pilot.press("enter")
        await pilot.pause()
        assert screen.methods == ["normxlogit", "norm"] and app.compare_methods == ["normxlogit", "norm"]
        # fewer than two: refused, the choice unchanged
        await pilot.press("a")
        await pilot.pause()
        screen.query_one("SelectionList").deselect("norm")
        await pilot.press("enter")
        await pilot.pause()
        assert screen.methods == ["normxlogit", "norm"]
        await pilot.press("escape")
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("c")
        await pilot.pause()
        await pilot.pause()
        assert app.screen.methods == ["normxlogit", "norm"]


def test_shared_scale_and_difference():
    rows = {"a": np.array([0.0, 2.0, -1.0]), "b": np.array([0.0, 1.0, 4.0])}
    per = scales(rows, {"a": True, "b": True}, shared=False)
    np.testing.assert_allclose(per["a"].values, [0, 1, -0.5])
    np.testing.assert_allclose(per["b"].values, [0, 0.25, 1])
    shared = scales(rows, {"a": True, "b": True}, shared=True)
    np.testing.assert_allclose(shared["a"].values, [0, 0.5, -0.25])
    assert shared["a"].hi == shared["b"].hi == 4.0
    d = difference(per["a"], per["b"])
    np.testing.assert_allclose(d.values * d.hi, [0, 0.75, -1.5])
    assert d.signed and d.hi == pytest.approx(1.5)


def test_aligned_blocks_keep_columns_under_each_other():
    from tui.colors import normalize

    tokens = ["[CLS]", "un", "##believ", "##able", "film", "[SEP]"] * 3
    a = normalize(np.linspace(0, 1, len(tokens)), False)
    b = normalize(np.linspace(1, 0, len(tokens)), False)
    lines = aligned_blocks(tokens, [Row("first", a, a.values), Row("second", b, b.values)], 40, "truecolor",
                           glyphs=False, k=2)
    assert all(line.cell_len <= 40 for line in lines)
    blocks = [lines[i:i + 2] for i in range(0, len(lines), 3)]
    assert len(blocks) > 1
    for top, bottom in blocks:
        # token columns start at the same cells in both rows
        starts = [i for i, ch in enumerate(top.plain) if i and top.plain[i - 1] == " " and ch != " "]
        starts_b = [i for i, ch in enumerate(bottom.plain) if i and bottom.plain[i - 1] == " " and ch != " "]
        assert starts == starts_b and top.cell_len == bottom.cell_len
    assert "·" in "".join(line.plain for line in lines)  # the pieces of "unbelievable" joined


@async_test
async def test_per_example_metrics_keep_small_values_visible(tmp_path, monkeypatch):
    """Each method's row shows this example's stored metrics; 4e-05 and -2e-04 are not printed as 0.000 / -0.000."""
    set_color_env(monkeypatch)
    from store import MetricData, add_metrics
    from tui.app import create_app
    from tui.render.metric_table import fmt

    path = tmp_path / "small.h5"
    make_store(str(path), n_examples=4, L=3, seed=3)
    values = {"rollout": [4.1e-05, 0.5, 0.25, 0.125], "normxlogit": [-2.0e-04, 0.1, 0.2, 0.3],
              "norm": [0.333, np.nan, 0.0, 1.0]}
    add_metrics(str(path), [MetricData(m, "comprehensiveness", np.array(v), {}, {"mean": 0.0, "std": 0.0, "n": 4}, True,
                                       "comp") for m, v in values.items()])
    app = create_app(path)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_compare(pilot)
        for i in range(2):
            text = screen_text(app)
            for m in screen.methods:
                line = next(line for line in text.splitlines() if line.strip().startswith(m + " ") and "." in line)
                assert line.split()[-1] == fmt(values[m][i]), (line, m, i)
            await pilot.press("j")
            await settle(pilot)
            await pilot.pause()
    assert fmt(4.1e-05) == "4.1e-05" and fmt(-2.0e-04) == "-2.0e-04" and fmt(np.nan) == "—"


@pytest.fixture
def long_store(tmp_path):
    """One example of 70 tokens, three methods (one signed) of different ranges."""
    from store import ExampleData, MethodLayout, StoreWriter

    path = tmp_path / "long.h5"
    words = "quiet charm craft films moves".split()  # five letters each: a block fills the line to its last cell
    tokens = ["[CLS]"] + [words[i % len(words)] for i in range(68)] + ["[SEP]"]
    n = len(tokens)
    rng = np.random.default_rng(5)
    res = {"alpha": {"scores": rng.random(n)}, "beta": {"scores": 10 + 5 * rng.random(n)},
           "gamma": {"scores": rng.normal(size=n)}}
    w = StoreWriter.create(str(path), n_layers=2, n_heads=2, labels={0: "neg", 1: "pos"},
                           methods=[MethodLayout("alpha", signed=False), MethodLayout("beta", signed=False),
                                    MethodLayout("gamma", signed=True)], provenance={})
    w.append([ExampleData(row=0, id="long", text=" ".join(tokens[1:-1]), pair=None, token_ids=np.arange(n),
                          tokens=tokens, spans=np.full((n, 2), -1), segment=np.zeros(n), label=1, pred=1,
                          probs=np.array([0.1, 0.9]), target=1, explain_pos=0, n_orig_tokens=n, truncated=False,
                          results=res)])
    w.close(complete=True)
    return path, res


@async_test
async def test_compare_at_80x24_labels_every_token_line_and_shows_every_methods_scale(long_store, monkeypatch):
    """Issue 28, item 7: no token line without its method label (a long example at 80 columns), and under
    "scale per method" every method's ends are shown, not only the first one's."""
    from tui.colors import format_score
    from tui.render.compare import scales

    set_color_env(monkeypatch)
    from tui.app import create_app

    path, res = long_store
    app = create_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_compare(pilot)
        assert screen.methods == ["alpha", "beta", "gamma"]
        rows = screen.query_one("#compare-rows")
        lines = [line for line in screen_text(app).splitlines()[rows.region.y:rows.region.bottom]]
        body = [line[rows.region.x:rows.region.right].strip() for line in lines]
        body = [line for line in body if line and line[0] not in "▁▂▃▄▅▆▇█"]
        assert len(body) >= 6  # the 70 tokens take more blocks than the screen shows of three lines
        assert all(line.split()[0] in ("alpha", "beta", "gamma") for line in body), body
        sc = scales({m: r["scores"] for m, r in res.items()}, {"alpha": False, "beta": False, "gamma": True}, False)
        text = screen_text(app)
        for m in screen.methods:
            line = next(line for line in text.splitlines() if line.strip().startswith(m + " ") and "…" in line)
            lo = format_score(sc[m].lo)
            hi = ("+" if sc[m].signed else "") + format_score(sc[m].hi)
            assert f"{lo}…{hi}" in line, (m, line)


def _underlined(line) -> set[str]:
    """The texts of a rich Text line drawn underlined (the top-k marks)."""
    return {line.plain[s.start:s.end].strip() for s in line.spans
            if getattr(s.style, "underline", False) and line.plain[s.start:s.end].strip()}


def test_one_top_k_set_for_the_marks_and_the_overlap():
    """Issue 38, item 6: the underlined top-k took in the explained [CLS] while the top-k overlap column left it out.
    Both leave it out (its score is the model's own output for several methods), and the overlap is that of the
    underlined sets (a signed method's by |score|)."""
    from tui.colors import normalize

    tokens = ["t0", "t1", "t2", "t3", "t4", "t5"]
    a = np.array([9.0, 1, 5, 3, 4, 2])  # the explained token (0) has the largest score
    b = np.array([-9.0, -6, 1, 2, 5, 0.5])  # signed: ranked by |score|
    rows = [Row("a", normalize(a, False), a), Row("b", normalize(b, True), b)]
    lines = aligned_blocks(tokens, rows, 200, "truecolor", glyphs=False, k=2, explained=0)
    assert _underlined(lines[0]) == {"t2", "t4"} and _underlined(lines[1]) == {"t1", "t4"}
    assert top_k_overlap(a, b, 2, skip=0, signed=(False, True)) == pytest.approx(0.5)  # {2, 4} ∩ {1, 4}


@async_test
async def test_the_browse_screen_underlines_the_top_k_without_the_explained_token(monkeypatch, tmp_path):
    set_color_env(monkeypatch)
    from test_tui import token_cells
    from tui.app import create_app

    path = tmp_path / "s.h5"
    make_store(str(path), n_examples=3, seed=0)
    with open_store(path) as s:
        scores = s[0].scores("rollout")
    assert 0 in np.argsort(-scores)[:2]  # [CLS] is among the 2 largest
    app = create_app(path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        cells = token_cells(app)
        marked = {i for i, c in enumerate(cells) if c.style.underline}
        expected = set(np.argsort(-np.where(np.arange(len(scores)) == 0, -np.inf, scores), kind="stable")[:2].tolist())
        assert marked == expected


@async_test
async def test_the_compare_legend_has_a_bar_per_sign(store_path, monkeypatch):
    """Issue 38, item 5: one sequential min..max bar while a signed method is drawn on the diverging ramp. A bar per
    ramp drawn, labelled with its methods: the signed one from -max through 0 to +max."""
    set_color_env(monkeypatch)
    from tui.app import create_app

    app = create_app(store_path)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_compare(pilot)
        assert screen.methods == ["rollout", "normxlogit", "norm"]
        lines = screen_text(app).splitlines()
        seq = [line for line in lines if line.strip().startswith("rollout, norm ")]
        div = [line for line in lines if line.strip().startswith("normxlogit ") and "+" in line and " 0 " in line]
        assert len(seq) == 1 and " min " in seq[0] and " max" in seq[0] and "top-" in seq[0], lines
        assert len(div) == 1 and "-" in div[0].split()[1], div
        # the signed bar's left half is the cold ramp (blue), its right half the warm one; the other bar has no blue
        from tui.colors import normalize
        from tui.render.compare import Row, legend_lines

        a, b = np.array([0.1, 0.5, 0.9]), np.array([-1.0, 0.2, 0.6])
        legend = legend_lines([Row("a", normalize(a, False), a), Row("b", normalize(b, True), b)], 80, "truecolor",
                              glyphs=False, k=1)
        assert [line.plain.split()[0] for line in legend] == ["a", "b"]

        def blues(line):
            return sum(1 for span in line.spans if span.style.bgcolor is not None
                       and (lambda c: c.blue > c.red)(span.style.bgcolor.get_truecolor()))

        assert blues(legend[0]) == 0 and blues(legend[1]) >= 5
