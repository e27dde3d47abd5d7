"""The matrix screen (x): heatmap of the current layer, layer strip, cursor read-out, normalisations, cls rows."""

from __future__ import annotations

import re

import numpy as np
import pytest
from synthetic import make_store
from test_tui import async_test, open_modal, screen_text, set_color_env, settle

from store import ExampleData, MethodLayout, StoreWriter, open_store
from tui.colors import format_score


def one_example_store(path, layout: MethodLayout, tokens: list[str], results: dict) -> None:
    """A complete store of one example with these tokens and one method's results."""
    n = len(tokens)
    ex = ExampleData(row=0, id="only", text=" ".join(tokens[1:-1]), pair=None, token_ids=np.arange(n), tokens=tokens,
                     spans=np.full((n, 2), -1), segment=np.zeros(n), label=1, pred=1, probs=np.array([0.2, 0.8]),
                     target=1, explain_pos=0, n_orig_tokens=n, truncated=False, results={layout.name: results})
    w = StoreWriter.create(str(path), n_layers=2, n_heads=2, labels={0: "neg", 1: "pos"}, methods=[layout],
                           provenance={})
    w.append([ex])
    w.close(complete=True)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("mx") / "mx.h5"
    make_store(str(path), n_examples=6, L=3, seed=5)
    return path


async def open_matrix(pilot):
    from tui.screens.matrix import MatrixScreen

    return await open_modal(pilot, "x", MatrixScreen, "shown")


def status_line(app) -> str:
    return screen_text(app).splitlines()[-2]


@async_test
async def test_heatmap_cursor_layers_and_scales(store_path, monkeypatch):
    set_color_env(monkeypatch)
    from tui.app import create_app

    with open_store(store_path) as s:
        ex0, ex1 = s[0], s[1]
        m0, toks0, m1 = ex0.matrices("rollout"), ex0.tokens, ex1.matrices("rollout")
    app = create_app(store_path)
    async with app.run_test(size=(100, 40)) as pilot:
        screen = await open_matrix(pilot)
        n = len(toks0)
        text = screen_text(app)
        assert f"layer 1/3 · {n}×{n}" in text and "blocks" not in text  # fits: no averaging
        assert "▶L1" in text and "L3" in text
        assert status_line(app).strip().startswith(f"{toks0[0]} (1) ← {toks0[0]} (1)")
        assert format_score(float(m0[0, 0, 0])) in status_line(app)
        await pilot.press("down", "down", "right")
        await pilot.pause()
        line = status_line(app)
        assert f"{toks0[2]} (3) ← {toks0[1]} (2)" in line and format_score(float(m0[0, 2, 1])) in line, line
        await pilot.press("right_square_bracket")
        await pilot.pause()
        assert screen.view_layer == 1 and "layer 2/3" in screen_text(app) and "▶L2" in screen_text(app)
        assert format_score(float(m0[1, 2, 1])) in status_line(app)
        await pilot.press("left_square_bracket", "left_square_bracket")
        assert screen.view_layer == 2  # wraps
        for want in ("example", "global", "layer"):
            await pilot.press("s")
            await app.workers.wait_for_complete()
            await pilot.pause()
            await pilot.pause()
            assert screen.norm == want and f"scale: {want}" in screen_text(app)
        assert screen.global_scale is not None and "matrix 3" in screen.global_scale
        await pilot.press("j")
        for _ in range(30):
            await app.workers.wait_for_complete()
            await pilot.pause()
            if screen.loaded_key == (1, "rollout"):
                break
        assert screen.index == 1 and app.example_list.cursor == 1
        np.testing.assert_array_equal(screen.shown.cells, m1[screen.view_layer])  # its blocks: one token each
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, type(screen))


def rollout_matrices_store(path, n: int, L: int, seed: int):
    """One example of n tokens, rollout with every layer's random [n, n] matrix (--matrices all)."""
    rng = np.random.default_rng(seed)
    lay = MethodLayout("rollout", signed=False, n_layer_views=L, matrices="all", n_matrix_layers=L)
    toks = ["[CLS]"] + [f"w{i}" for i in range(n - 2)] + ["[SEP]"]
    one_example_store(path, lay, toks, {"scores": rng.random(n), "layer_scores": rng.random((L, n)),
                                        "matrices": rng.random((L, n, n))})
    return path


@async_test
async def test_large_matrix_is_block_averaged(tmp_path, monkeypatch):
    set_color_env(monkeypatch)
    from tui.app import create_app

    path = rollout_matrices_store(tmp_path / "long.h5", n=150, L=2, seed=1)
    app = create_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_matrix(pilot)
        text = screen_text(app)
        assert "blocks" in text and "averaged" in text
        line = status_line(app)
        assert "(block mean)" in line and "(1-" in line


@async_test
async def test_a_large_matrix_is_read_by_bands_of_the_layer_shown(tmp_path, monkeypatch):
    """Issue 36.6 under --matrices all: the screen reads the layer it shows, a band of rows at a time (each within
    data.MATRIX_BAND_BYTES), never the example's [L, n, n] (at 4,096 tokens 64 MB a layer); its blocks are the means
    of the whole layer's; another layer is read when shown and kept; the per-example scale reads every layer once,
    by bands. Before, the screen read and held all L layers in one read."""
    set_color_env(monkeypatch)
    import tui.data
    from test_tui_open_cost import _count_reads
    from tui.app import create_app
    from tui.render.heatmap import block_mean

    n, L = 640, 3
    path = rollout_matrices_store(tmp_path / "big.h5", n=n, L=L, seed=3)
    with open_store(path) as s:
        full = s[0].matrices("rollout").astype(np.float64)
    monkeypatch.setattr(tui.data, "MATRIX_BAND_BYTES", 1 << 18)
    reads = _count_reads(monkeypatch)
    app = create_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        reads.clear()
        screen = await open_matrix(pilot)
        g = screen.geometry
        band = max(1, (1 << 18) // (8 * n * g.fr)) * g.fr  # rows of a band: whole blocks within the bound
        assert g.fr > 1 and band < n

        def matrix_reads():
            got = [k for name, k in reads if name.endswith("matrices")]
            reads.clear()
            return got

        got = matrix_reads()
        assert sum(got) == n * n and max(got) <= band * n and len(got) == -(-n // band), got  # layer 1, by bands
        np.testing.assert_allclose(screen.shown.cells, block_mean(full[0], g.fr, g.fc)[0], rtol=1e-6)
        r, c = screen.cell
        assert format_score(float(screen.shown.cells[r, c])) in status_line(app)
        await pilot.press("right_square_bracket")
        await settle(pilot)
        got = matrix_reads()
        assert screen.view_layer == 1 and sum(got) == n * n and max(got) <= band * n, got
        np.testing.assert_allclose(screen.shown.cells, block_mean(full[1], g.fr, g.fc)[0], rtol=1e-6)
        await pilot.press("left_square_bracket")
        await settle(pilot)
        assert screen.view_layer == 0 and matrix_reads() == []  # kept
        await pilot.press("s")  # the per-example scale: every layer's min and max
        await settle(pilot)
        got = matrix_reads()
        assert screen.norm == "example" and sum(got) == L * n * n and max(got) <= n * max(1, (1 << 18) // (8 * n)), got
        assert f"{format_score(full.min())} " in screen_text(app) and f" {format_score(full.max())}" in screen_text(app)


@async_test
async def test_cls_matrices_show_the_row_and_say_why(tmp_path, monkeypatch):
    set_color_env(monkeypatch, no_color=True)
    from tui.app import create_app

    n, L = 6, 2
    rng = np.random.default_rng(2)
    lay = MethodLayout("alti", signed=False, n_layer_views=L, matrices="cls", n_matrix_layers=L)
    path = tmp_path / "cls.h5"
    one_example_store(path, lay, ["[CLS]", "a", "fine", "film", "!", "[SEP]"],
                      {"scores": rng.random(n), "layer_scores": rng.random((L, n)), "matrices": rng.random((L, 1, n))})
    app = create_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_matrix(pilot)
        text = screen_text(app)
        assert screen.matrices.shape == (L, 1, n)
        assert "only the explained token's row is stored (--matrices cls)" in text and "--matrices all" in text
        assert f"1×{n}" in text


@async_test
async def test_store_without_matrices_says_so(tmp_path, monkeypatch):
    set_color_env(monkeypatch)
    from tui.app import create_app

    path = tmp_path / "none.h5"
    one_example_store(path, MethodLayout("norm", signed=False), ["[CLS]", "a", "b", "[SEP]"],
                      {"scores": np.arange(4, dtype=float)})
    app = create_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("x")
        await pilot.pause()
        assert any("--matrices all" in n.message for n in app._notifications)


# ---------------------------------------------------------------- labels: every row, every column, where they belong
# The expectations below are written out here (not taken from the code under test): a label is the token made
# printable, cut to its room with "…"; a block is named by its 1-based range of positions and its first token; two
# rows drawn on one line (colour, half blocks) are both named, "upper/lower".

SIZES = [(80, 24), (120, 40)]
CUT = "…"


def cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` cells (one-cell characters), the last one a cut mark when it is cut."""
    return text if len(text) <= width else text[:width - 1] + CUT


def screen_cells(app) -> list[list[tuple[str, object]]]:
    """The screen as cells: for each line, one (text, style) per terminal cell. A wide character takes two cells
    (the second one ""), a zero-width one joins the cell before it, so a cell's index is its terminal column."""
    from rich.cells import cell_len

    update = app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    grid = []
    for line in update.strips:
        cells: list[tuple[str, object]] = []
        for strip in line:
            for seg in strip:
                if seg.control:
                    continue
                for ch in seg.text:
                    w = cell_len(ch)
                    if w == 0 and cells:
                        cells[-1] = (cells[-1][0] + ch, cells[-1][1])
                        continue
                    cells.append((ch, seg.style))
                    if w == 2:
                        cells.append(("", seg.style))
        grid.append(cells)
    return grid


def line_text(cells, x0: int = 0, x1: int | None = None) -> str:
    return "".join(ch for ch, _ in cells[x0:x1])


def reversed_at(cells, x0: int, x1: int) -> bool:
    return all(style is not None and style.reverse for _, style in cells[x0:x1])


def make_matrix_store(path, tokens: list[str], *, L: int = 2, seed: int = 3, cls: bool = False) -> np.ndarray:
    """One example with these tokens; rollout (non-negative) keeps its matrices (all, or the cls row). Returns them
    as the store gives them back."""
    n = len(tokens)
    rng = np.random.default_rng(seed)
    lay = MethodLayout("rollout", signed=False, n_layer_views=L, matrices="cls" if cls else "all", n_matrix_layers=L)
    m = rng.random((L, 1 if cls else n, n))
    one_example_store(path, lay, tokens, {"scores": rng.random(n), "layer_scores": rng.random((L, n)), "matrices": m})
    with open_store(path) as s:
        return s[0].matrices("rollout"), s[0].layer_scores("rollout")


def expected_cells(lm: np.ndarray, fr: int, fc: int) -> np.ndarray:
    """The normalised cells the screen draws for one layer with the layer scale (non-negative method)."""
    from tui.colors import normalize_within
    from tui.render.heatmap import block_mean

    cells, _ = block_mean(lm, fr, fc)
    return normalize_within(cells, False).values.reshape(cells.shape)


def map_top(grid, first_label: str) -> int:
    """The line of the heatmap's first row: the first line that starts with its label (the status line, which also
    starts with a token, is the last but one)."""
    for y, cells in enumerate(grid[:-2]):
        if line_text(cells, 1).startswith(first_label + " "):
            return y
    raise AssertionError(f"no line starts with {first_label!r}:\n" + "\n".join(line_text(c) for c in grid))


def check_heatmap_line(cells, x0: int, values: np.ndarray, cw: int, mono: bool, cursor_col: int | None,
                       lower: np.ndarray | None = None) -> None:
    """One line of the heatmap: cell j's ``cw`` terminal cells start at x0 + j*cw and show values[j] (colour: its
    background; half blocks: upper row the foreground, lower row the background; mono: its glyph)."""
    from tui.colors import background, glyph

    C = len(values)
    blank = cells[0][1].bgcolor  # the screen's own background (the padding cell left of the gutter)
    if mono:  # each cell's glyph; the cursor's cell the mark, reversed
        from tui.render.heatmap import CURSOR_MARK

        want = "".join(CURSOR_MARK.center(cw) if j == cursor_col else glyph(v) * cw for j, v in enumerate(values))
        assert line_text(cells, x0, x0 + C * cw) == want
        assert line_text(cells, x0 + C * cw).strip() == ""
        if cursor_col is not None:
            assert reversed_at(cells, x0 + cursor_col * cw, x0 + (cursor_col + 1) * cw)
        return
    for j, v in enumerate(values):
        if j == cursor_col:
            continue
        for t in range(cw):
            ch, style = cells[x0 + j * cw + t]
            if lower is None:
                assert style.bgcolor == background(v, "truecolor"), (j, t)
            else:
                assert ch == "▀" and style.color == background(v, "truecolor"), (j, t)
                assert style.bgcolor == (background(lower[j], "truecolor") if not np.isnan(lower[j]) else blank)
    assert cells[x0 - 1][1].bgcolor == blank  # nothing of the map in the gutter
    assert x0 + C * cw == len(cells) or cells[x0 + C * cw][1].bgcolor == blank  # nor after its last column


def check_header(grid, top: int, x0: int, labels: list[str], cw: int, lines: int, cursor_col: int,
                 ruler: dict[int, str] | None = None) -> None:
    """The column header: the ``lines`` lines above the heatmap; column j's label written top to bottom in the first
    cell of the column (x0 + j*cw), cut with "…" on its last line; a ruler line first when ``ruler`` (column: the
    number written from that column on). The cursor's column is reversed on every label line."""
    first = top - lines
    label_lines = range(first + (1 if ruler else 0), top)
    k = len(label_lines)
    for j, label in enumerate(labels):
        x = x0 + j * cw
        down = "".join(grid[y][x][0] or "" for y in label_lines)
        want = (label if len(label) <= k else label[:k - 1] + CUT).ljust(k)
        assert down == want, (j, label, down)
        for y in label_lines:
            assert line_text(grid[y], x + 1, x + cw).strip() == ""  # the rest of a wide column stays blank
            assert reversed_at(grid[y], x, x + cw) == (j == cursor_col), (j, y)
    for y in range(first, top):
        assert line_text(grid[y], x0 + len(labels) * cw).strip() == ""  # nothing past the last column
    if ruler:
        text = line_text(grid[first])
        for col, number in ruler.items():
            assert text[x0 + col * cw:].startswith(number + " ") or text[x0 + col * cw:] == number, (col, number)


def check_strip(grid, x0: int, n_cols: int, cw: int, mono: bool, views: np.ndarray, fc: int) -> None:
    """The layer strip's cells lie over the heatmap's columns: its lines (▶L1, L2, ...) start their cells at x0."""
    from tui.colors import background, glyph, normalize_within
    from tui.render.heatmap import block_mean

    cells, _ = block_mean(views, 1, fc)
    vals = normalize_within(cells, False).values.reshape(cells.shape)
    strip = [y for y, c in enumerate(grid) if re.match(r"^ [▶ ]L\d", line_text(c))]
    assert len(strip) == len(views)
    for v, y in enumerate(strip):
        if mono:
            assert line_text(grid[y], x0, x0 + n_cols * cw) == "".join(glyph(x) * cw for x in vals[v])
        else:
            got = [grid[y][x][1].bgcolor for x in range(x0, x0 + n_cols * cw)]
            assert got == [background(x, "truecolor") for x in vals[v] for _ in range(cw)]
            assert grid[y][x0 - 1][1].bgcolor == grid[y][0][1].bgcolor


def status_of(grid) -> str:
    return line_text(grid[-2]).strip()


WORDS = ["[CLS]", "the", "film", "is", "a", "quiet", "##ly", "affecting", "!", "[SEP]"]
COLUMN_WORDS = ["[CLS]", "the", "film", "is", "a", "quiet", "·ly", "affecting", "!", "[SEP]"]  # "##" as the join mark


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "120x40"])
@pytest.mark.parametrize("no_color", [False, True], ids=["color", "no_color"])
@async_test
async def test_rows_that_fit_are_one_a_line_each_labelled_and_the_columns_labelled_above(tmp_path, monkeypatch,
                                                                                       size, no_color):
    set_color_env(monkeypatch, no_color=no_color)
    from tui.app import create_app

    m, views = make_matrix_store(tmp_path / "fit.h5", WORDS)
    n = len(WORDS)
    app = create_app(tmp_path / "fit.h5")
    async with app.run_test(size=size) as pilot:
        screen = await open_matrix(pilot)
        g = screen.geometry
        assert (g.fr, g.fc, g.per_line) == (1, 1, 1)
        for r, c in [(0, 0), (2, 3), (9, 9)]:
            while screen.cell != (r, c):
                await pilot.press("down" if screen.cell[0] < r else "right")
            await pilot.pause()
            grid = screen_cells(app)
            assert all(len(cells) == size[0] for cells in grid)
            top = map_top(grid, WORDS[0])
            x0 = 1 + g.gutter
            vals = expected_cells(m[0], 1, 1)
            for i, tok in enumerate(WORDS):
                cells = grid[top + i]
                assert line_text(cells, 1, x0).rstrip() == tok  # the row's own label, at the row's line
                assert reversed_at(cells, 1, 1 + len(tok)) == (i == r)
                check_heatmap_line(cells, x0, vals[i], g.cw, no_color, c if i == r else None)
            assert top + n == len(grid) - 2 or line_text(grid[top + n], 1).strip() == ""  # no row past the last
            check_header(grid, top, x0, COLUMN_WORDS, g.cw, g.header, c)
            check_strip(grid, x0, n, g.cw, no_color, views, 1)
            assert status_of(grid) == f"{WORDS[r]} ({r + 1}) ← {WORDS[c]} ({c + 1})  {format_score(float(m[0, r, c]))}"
            assert line_text(grid[1]).strip() == f"only  rollout · layer 1/2 · {n}×{n} · scale: layer"


SHORT = ["[CLS]"] + [f"w{i}" for i in range(1, 21)] + ["[SEP]"]  # 22 rows: more than the lines at 80x24


@async_test
async def test_two_rows_a_line_name_both_rows(tmp_path, monkeypatch):
    """Colour, 80x24: 22 rows do not fit one a line; each line draws two (half blocks) and its label names both."""
    set_color_env(monkeypatch)
    from tui.app import create_app

    m, views = make_matrix_store(tmp_path / "two.h5", SHORT)
    n = len(SHORT)
    app = create_app(tmp_path / "two.h5")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_matrix(pilot)
        await pilot.press("down", "right", "right")
        await pilot.pause()
        g = screen.geometry
        assert (g.fr, g.fc, g.per_line) == (1, 1, 2)
        grid = screen_cells(app)
        top = map_top(grid, "[CLS]/w1")
        x0 = 1 + g.gutter
        vals = expected_cells(m[0], 1, 1)
        for k in range(n // 2):
            cells = grid[top + k]
            label = f"{SHORT[2 * k]}/{SHORT[2 * k + 1]}"
            assert line_text(cells, 1, x0).rstrip() == label
            if k == 0:  # the cursor is on row 2 (w1): its name is reversed, the other row's is not
                assert reversed_at(cells, 7, 9) and not reversed_at(cells, 1, 6)
            check_heatmap_line(cells, x0, vals[2 * k], g.cw, False, 2 if k == 0 else None, lower=vals[2 * k + 1])
        assert top + n // 2 == len(grid) - 2 or line_text(grid[top + n // 2], 1).strip() == ""
        check_header(grid, top, x0, SHORT, g.cw, g.header, 2)
        check_strip(grid, x0, n, g.cw, False, views, 1)
        assert status_of(grid) == f"w1 (2) ← w2 (3)  {format_score(float(m[0, 1, 2]))}"
        assert line_text(grid[top - 1], 1, x0).rstrip() == "▀/▄ rows"  # over the labels: upper/lower
        # the same matrix at 120x40 fits one row a line: the screen follows the terminal's size
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        await pilot.pause()
        g = screen.geometry
        assert g.per_line == 1
        grid = screen_cells(app)
        top = map_top(grid, "[CLS]")
        assert [line_text(grid[top + i], 1, 1 + g.gutter).rstrip() for i in range(n)] == SHORT


def block_name(a: int, b: int, tok: str) -> str:
    return f"{a + 1}-{b}" if b > a + 1 else f"{a + 1}"


@pytest.mark.parametrize("size", SIZES, ids=["80x24", "120x40"])
@pytest.mark.parametrize("no_color", [False, True], ids=["color", "no_color"])
@async_test
async def test_blocks_are_named_by_their_range_and_first_token(tmp_path, monkeypatch, size, no_color):
    set_color_env(monkeypatch, no_color=no_color)
    from tui.app import create_app

    n = 150
    toks = ["[CLS]"] + [f"w{i}" for i in range(1, n - 1)] + ["[SEP]"]
    m, views = make_matrix_store(tmp_path / "long.h5", toks)
    app = create_app(tmp_path / "long.h5")
    async with app.run_test(size=size) as pilot:
        screen = await open_matrix(pilot)
        await pilot.press("down", "down", "down", "right", "right")
        await pilot.pause()
        g = screen.geometry
        fr, fc, per = g.fr, g.fc, g.per_line
        assert fr > 1 and fc > 1 and per == (1 if no_color else 2) and g.cw == 1
        assert f"blocks {fr}×{fc} averaged" in screen_text(app)
        grid = screen_cells(app)
        x0 = 1 + g.gutter
        R = -(-n // fr)
        lines = -(-R // per)
        top = map_top(grid, cut(f"1-{per * fr} [CLS]", g.gutter - 1))
        vals = expected_cells(m[0], fr, fc)
        for k in range(lines):
            a, b = k * per * fr, min((k + 1) * per * fr, n)  # the rows the line draws
            cells = grid[top + k]
            assert line_text(cells, 1, x0).rstrip() == cut(f"{block_name(a, b, toks[a])} {toks[a]}", g.gutter - 1)
            assert reversed_at(cells, 1, 3) == (a <= 3 * fr < b)  # the cursor's block row is in this line's
            lower = vals[per * k + 1] if per == 2 and per * k + 1 < R else (np.full(vals.shape[1], np.nan)
                                                                           if per == 2 else None)
            cur = 2 if a <= 3 * fr < b else None
            check_heatmap_line(cells, x0, vals[per * k], 1, no_color, cur, lower=lower)
        C = -(-n // fc)
        ruler = {j: str(j * fc + 1) for j in range(0, C, 10)} if g.header >= 4 else None
        check_header(grid, top, x0, [toks[j * fc] for j in range(C)], 1, g.header, 2, ruler)
        check_strip(grid, x0, C, 1, no_color, views, fc)
        status = status_of(grid)
        assert status == (f"w{3 * fr} ({3 * fr + 1}-{4 * fr}) ← w{2 * fc} ({2 * fc + 1}-{3 * fc})  "
                          f"{format_score(float(np.asarray(m[0], np.float64)[3 * fr:4 * fr, 2 * fc:3 * fc].mean()))}"
                          " (block mean)")


HOSTILE = ["[CLS]", "\x1b[31mred", "\u202eevil", "漢字", "e\u0301té", "[bold]x", "a\tb", "\u200b", "\x07", "[SEP]"]


@pytest.mark.parametrize("no_color", [False, True], ids=["color", "no_color"])
@async_test
async def test_hostile_and_wide_tokens_keep_the_labels_aligned(tmp_path, monkeypatch, no_color):
    set_color_env(monkeypatch, no_color=no_color)
    from rich.cells import cell_len

    from tui.app import create_app
    from tui.render.tokens import printable

    m, views = make_matrix_store(tmp_path / "hostile.h5", HOSTILE)
    n = len(HOSTILE)
    app = create_app(tmp_path / "hostile.h5")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_matrix(pilot)
        await pilot.press(*["down"] * 3, *["right"] * 3)  # the cursor on 漢字 both ways
        await pilot.pause()
        g = screen.geometry
        grid = screen_cells(app)
        raw = "".join(ch for cells in grid for ch, _ in cells)
        assert not any(c in raw for c in "\x1b\u202e\u200b\x07\t")
        assert all(len(cells) == 80 for cells in grid)
        top = map_top(grid, "[CLS]")
        x0 = 1 + g.gutter
        vals = expected_cells(m[0], 1, 1)
        shown = [printable(t) for t in HOSTILE]
        for i, label in enumerate(shown):
            cells = grid[top + i]
            got = line_text(cells, 1, x0).rstrip()
            assert got == (label if cell_len(label) < g.gutter else got) and got.startswith(label[:4]), (i, got)
            if cell_len(label) >= g.gutter:
                assert got.endswith(CUT) and cell_len(got) <= g.gutter - 1
            check_heatmap_line(cells, x0, vals[i], g.cw, no_color, 3 if i == 3 else None)
        # the wide column: 漢 takes two of its cells (its cells are 2 or 3 wide here), 字 below it
        assert g.cw >= 2
        x = x0 + 3 * g.cw
        assert [grid[y][x][0] for y in range(top - g.header, top - g.header + 2)] == ["漢", "字"]
        assert reversed_at(grid[top - 1], x, x + g.cw)
        assert status_of(grid).startswith("漢字 (4) ← 漢字 (4)  ")


@async_test
async def test_cls_row_is_labelled_by_the_explained_token(tmp_path, monkeypatch):
    set_color_env(monkeypatch)
    from tui.app import create_app

    toks = ["[CLS]", "a", "fine", "film", "!", "[SEP]"]
    m, views = make_matrix_store(tmp_path / "cls.h5", toks, cls=True)
    app = create_app(tmp_path / "cls.h5")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_matrix(pilot)
        await pilot.press("right")
        await pilot.pause()
        g = screen.geometry
        grid = screen_cells(app)
        top = map_top(grid, "[CLS]")
        x0 = 1 + g.gutter
        assert line_text(grid[top], 1, x0).rstrip() == "[CLS]" and reversed_at(grid[top], 1, 6)
        check_heatmap_line(grid[top], x0, expected_cells(m[0], 1, 1)[0], g.cw, False, 1)
        check_header(grid, top, x0, toks, g.cw, g.header, 1)
        assert "only the explained token's row is stored" in line_text(grid[top + 2])
        assert status_of(grid) == f"[CLS] (1) ← a (2)  {format_score(float(m[0, 0, 1]))}"


def test_label_cuts_and_vertical_columns():
    """The pure helpers: a label fits its cells with a cut mark; a column label goes down in graphemes, a wide
    character too wide for a one-cell column is replaced, a combining mark stays with its letter."""
    from rich.cells import cell_len

    from tui.render.matrix_axes import column_cells, fit, label_text, row_labels

    assert fit("affecting", 9) == "affecting" and fit("affecting", 6) == "affec…" and fit("", 3) == ""
    assert cell_len(fit("漢字漢字", 5)) <= 5 and fit("漢字漢字", 5).endswith("…")
    assert column_cells("film", 3, 1) == ["f", "i", "…"]
    assert column_cells("e\u0301t", 3, 1) == ["e\u0301", "t", " "]
    assert column_cells("漢字", 2, 1) == ["▯", "▯"] and column_cells("漢字", 2, 2) == ["漢", "字"]
    assert column_cells("ab", 3, 3) == ["a  ", "b  ", "   "]
    assert column_cells("film", 1, 1) == ["f"]  # one line: no room for the cut mark
    # two rows a line, an odd count: the last line names its one row; a pair shares the label's cells
    pairs = row_labels(["a", "affecting", "portrait", "c"][1:], 3, 1, 2)
    assert [[t for t, _ in parts] for parts in pairs] == [["affecting", "/", "portrait"], ["c"]]
    assert label_text(pairs[0], 12, 1).plain == "affe…/port… " and label_text(pairs[1], 12, 2).plain == "c" + " " * 11
    assert [s.style.reverse for s in label_text(pairs[0], 12, 1).spans] == [None, None, True]
    # blocks: the line's positions (1-based, both blocks of a line) and its first token
    assert [parts[0][0] for parts in row_labels([f"w{i}" for i in range(11)], 11, 3, 2)] == ["1-6 w0", "7-11 w6"]
    assert [parts[0][0] for parts in row_labels([f"w{i}" for i in range(7)], 7, 3, 1)] == ["1-3 w0", "4-6 w3", "7 w6"]


def status_ranges(grid) -> tuple[range, range]:
    """The rows and the columns (0-based) of the cursor's block, as the status line names them."""
    import re

    m = re.search(r"\((\d+)(?:-(\d+))?\) ← .*\((\d+)(?:-(\d+))?\)", status_of(grid))
    a, b, c, d = (int(x) if x else None for x in m.groups())
    return range(a - 1, b or a), range(c - 1, d or c)


@async_test
async def test_the_cursor_stays_on_its_tokens_when_the_blocks_change(tmp_path, monkeypatch):
    """The cursor is kept in token positions: a resize that changes the block factor keeps it on the block holding
    the same tokens, and resizing back returns it to the same cell."""
    set_color_env(monkeypatch)
    from tui.app import create_app

    n = 90
    toks = ["[CLS]"] + [f"w{i}" for i in range(1, n - 1)] + ["[SEP]"]
    make_matrix_store(tmp_path / "resize.h5", toks)
    app = create_app(tmp_path / "resize.h5")
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_matrix(pilot)
        await pilot.press(*["down"] * 12, *["right"] * 12)
        await pilot.pause()
        big = screen.geometry
        rows0, cols0 = status_ranges(screen_cells(app))
        assert rows0 == range(12 * big.fr, 13 * big.fr) and cols0 == range(12 * big.fc, 13 * big.fc)
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        await pilot.pause()
        small = screen.geometry
        assert (small.fr, small.fc) != (big.fr, big.fc)  # the blocks did change
        rows1, cols1 = status_ranges(screen_cells(app))
        assert rows0[0] in rows1 and cols0[0] in cols1, (rows0, cols0, rows1, cols1)
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        await pilot.pause()
        assert status_ranges(screen_cells(app)) == (rows0, cols0)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
@async_test
async def test_the_matrix_screen_says_which_matrix_and_what_the_strip_shows(store_path, monkeypatch, size):
    """Issue 38, item 7: the heatmap showed one layer's matrix under a strip of the method's (rolled-out) layer
    views; neither said which. The colour bar above the heatmap names the matrix as that layer's own, a caption the
    strip's views."""
    set_color_env(monkeypatch)
    from tui.app import create_app

    app = create_app(store_path)
    async with app.run_test(size=size) as pilot:
        screen = await open_matrix(pilot)
        lines = screen_text(app).splitlines()
        bar = next(line for line in lines if "own matrix" in line)
        assert "layer 1's own matrix (not rolled out)" in bar, bar
        caption = next(k for k, line in enumerate(lines) if "layer views" in line)
        assert "rollout's scores at each layer, as on the browse screen" in lines[caption], lines[caption]
        assert lines[caption + 1].lstrip().startswith("▶L1")  # the strip right under its caption
        await pilot.press("right_square_bracket")
        await pilot.pause()
        assert screen.view_layer == 1 and "layer 2's own matrix (not rolled out)" in screen_text(app)
