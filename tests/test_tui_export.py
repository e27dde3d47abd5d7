"""Paper figures (tui/export.py) parse in their formats and escape token text; e and the screenshot write files."""

from __future__ import annotations

import html.parser
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from synthetic import make_store
from test_tui import async_test, set_color_env, settle

from tui.colors import format_score, normalize
from tui.export import Figure, tex_escape, to_html, to_latex, to_svg

TOKENS = ["[CLS]", "<b>&", "{50%}", "un", "##bel", "$x_1^2#~\\", "[SEP]"]


def figure():
    rng = np.random.default_rng(0)
    rows = [("rollout", normalize(rng.random(len(TOKENS)), False)),
            ("normxlogit", normalize(rng.normal(size=len(TOKENS)), True))]
    return Figure("ex<1>&", TOKENS, rows, explained=0, note="demo.h5")


def test_svg_parses_and_holds_every_token_literally():
    root = ET.fromstring(to_svg(figure()))
    texts = ["".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")]
    for tok in TOKENS[1:]:
        shown = tok[2:] if tok.startswith("##") else tok
        assert any(t == shown for t in texts), (shown, texts)
    assert "▸[CLS]" in texts and "rollout" in texts and "normxlogit" in texts
    rects = list(root.iter("{http://www.w3.org/2000/svg}rect"))
    assert len(rects) >= 2 * len(TOKENS) + 11  # token boxes of both rows and the colour bar


def test_html_parses_and_escapes():
    out = to_html(figure())

    class Collect(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.data, self.tags = [], []

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)

        def handle_data(self, data):
            self.data.append(data)

    p = Collect()
    p.feed(out)
    assert p.tags.count("b") == 1  # only the title's <b>: the token "<b>&" is text
    assert "<b>&" in "".join(p.data) and "{50%}" in "".join(p.data)
    assert out.count("<tr>") == 4  # two methods and their colour bars (one scale each)


_MARK = r"$\triangleright$"


def test_latex_structure():
    out = to_latex(figure())
    body = out.split("\\begin{tabular}", 1)[1]
    assert body.count("{") == body.count("}")  # every brace balanced (escaped ones are \{ \} pairs)
    rows = [line for line in body.splitlines() if "\\tabularnewline" in line]
    assert len(rows) == 4 and rows[0].startswith("\\textbf{rollout}") and rows[2].startswith("\\textbf{normxlogit}")
    used = set(re.findall(r"\\colorbox\{(attr\d+)\}", out))
    defined = set(re.findall(r"\\definecolor\{(attr\d+)\}\{HTML\}\{[0-9A-F]{6}\}", out))
    assert used and used == defined
    assert tex_escape("{50%}") == r"\{50\%\}" and r"\$x\_1\textasciicircum{}2\#\textasciitilde{}\textbackslash{}" in out
    # nothing special left once the commands, escapes and the column separators " & " are taken out
    plain = re.sub(r"\\[a-zA-Z]+|\\[{}$&#_%]", "", body.replace(" & ", " ").replace("@{}", "").replace(_MARK, ""))
    assert not re.search(r"[$&#_%^~]", plain), plain


@async_test
async def test_e_writes_the_figure_and_the_screenshot_avoids_a_missing_downloads(tmp_path, monkeypatch):
    set_color_env(monkeypatch)
    from tui.app import create_app

    store = tmp_path / "s.h5"
    make_store(str(store), n_examples=3)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.chdir(out)
    monkeypatch.setenv("HOME", str(tmp_path / "home-without-downloads"))
    app = create_app(store)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("e")
        await pilot.pause()
        names = sorted(p.name for p in out.iterdir())
        assert names == ["s-ex0-rollout.html", "s-ex0-rollout.svg", "s-ex0-rollout.tex"]
        ET.fromstring((out / "s-ex0-rollout.svg").read_text())
        assert any("s-ex0-rollout.svg" in n.message for n in app._notifications)
        app.deliver_screenshot()
        for _ in range(20):
            await pilot.pause(0.05)
            if len(list(out.glob("*.svg"))) == 2:
                break
        shots = [p for p in out.glob("*.svg") if p.name != "s-ex0-rollout.svg"]
        assert len(shots) == 1
        ET.fromstring(shots[0].read_text())


# Every control word the exported .tex may use: the LaTeX kernel's and xcolor's (\usepackage{xcolor}), nothing else.
TEX_DECLARED = {"definecolor", "colorbox", "textcolor", "textbf", "strut", "setlength", "fboxsep", "begingroup",
                "endgroup", "noindent", "begin", "end", "hspace", "dimexpr", "linewidth", "relax", "raggedright",
                "tabularnewline", "makebox", "small", "textbackslash", "textasciicircum", "textasciitilde",
                "triangleright", "triangleleft", "uparrow", "downarrow", "usepackage", "par", "i", "quad"}
TEX_ACCENTS = set("'`^\"~=.") | {",", "{", "}", "$", "&", "#", "_", "%", "\\"}


def long_figure(example_id="ex\n\\end{tabular}\\input{/etc/passwd}% evil"):
    """44 tokens (the issue's example length), non-ASCII pieces and the explained mark on [CLS]."""
    words = "the film 's élan , naïve charm and 🎬 moments make it a réussite ; un ##bel ##ievably {50%} fun".split()
    tokens = ["[CLS]"] + [words[i % len(words)] for i in range(42)] + ["[SEP]"]
    rng = np.random.default_rng(1)
    rows = [("rollout", normalize(rng.random(44), False)), ("normxlogit", normalize(rng.normal(size=44), True)),
            ("attcat", normalize(rng.normal(size=44), True))]
    return Figure(example_id, tokens, rows, explained=0, note="sst2.h5 · scale per method")


def test_latex_is_ascii_with_declared_commands_and_the_id_stays_in_its_comment():
    out = to_latex(long_figure())
    assert out.isascii()
    assert set(re.findall(r"\\([A-Za-z]+)", out)) <= TEX_DECLARED
    assert set(re.findall(r"\\([^A-Za-z])", out)) <= TEX_ACCENTS
    # the id's newline and commands cannot leave the header comment
    code = [line for line in out.splitlines() if not line.startswith("%")]
    assert not any("evil" in line or "passwd" in line for line in code)
    assert r"\'{e}lan" in out and r"na\"{\i}ve" in out and "[U+1F3AC]" in out
    assert r"$\triangleright$[CLS]" in out
    # tokens wrap: a paragraph column of the line's width, not one unbreakable line per method
    assert r"p{\dimexpr\linewidth" in out and r"\raggedright" in out


def test_latex_compiles_in_a_plain_article_without_overfull_lines(tmp_path):
    import shutil
    import subprocess

    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed")
    (tmp_path / "fig.tex").write_text(to_latex(long_figure()), encoding="utf-8")
    (tmp_path / "doc.tex").write_text("\\documentclass{article}\\usepackage{xcolor}\\begin{document}\n"
                                      "\\input{fig}\n\n\\input{fig}\nText after the figures.\n\\end{document}\n")
    run = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    log = (tmp_path / "doc.log").read_text(errors="replace")
    assert run.returncode == 0, log[-2000:]
    assert "Overfull" not in log and "Unicode character" not in log and (tmp_path / "doc.pdf").exists()


def _svg_texts(root):
    return ["".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")]


def test_svg_wraps_marks_fit_title_is_separated_and_control_characters_stay_out():
    """Issue 28, item 6: 44 tokens wrap within the figure's width; every method's scale has its own bar with its
    numbers; "▸[CLS]" fits its box; the title separates the id from the note; a control character in the id gives
    valid XML and never reaches the HTML title raw."""
    from tui.export import MAX_WIDTH, _CHAR_W

    fig = long_figure(example_id="17\x07\x1b[31m")
    svg = to_svg(fig)
    root = ET.fromstring(svg)  # valid XML despite the control characters
    assert float(root.get("width")) <= MAX_WIDTH
    texts = _svg_texts(root)
    assert texts[0].startswith("17\\u0007\\u001b[31m") and "·" in texts[0] and "17all" not in texts[0]
    # every token is there, in order, on more than one line per method
    for name, _ in fig.rows:
        assert texts.count(name) == 1  # its row (its colour bar follows the row, unnamed)
    ys = {float(r.get("y")) for r in root.iter("{http://www.w3.org/2000/svg}rect") if r.get("height") == "20"}
    assert len(ys) >= 2 * len(fig.rows)
    # the explained token's box holds its mark and text
    boxes = [r for r in root.iter("{http://www.w3.org/2000/svg}rect") if r.get("height") == "20"]
    assert float(boxes[0].get("width")) >= len("▸[CLS]") * _CHAR_W
    # one bar per method, each with its own ends
    for _, scale in fig.rows:
        lo, hi = format_score(scale.lo), format_score(scale.hi)
        assert any(t.strip() == lo for t in texts) and any(t.strip() in (hi, "+" + hi) for t in texts)
    out = to_html(fig)
    assert "\x07" not in out and "\x1b" not in out
    assert "<title>17\\u0007\\u001b[31m" in out
    assert out.count('class="bar"') == len(fig.rows)


def test_one_bar_when_the_scale_is_shared():
    from tui.render.compare import scales

    rng = np.random.default_rng(0)
    raw = {"a": rng.random(8), "b": rng.random(8)}
    sc = scales(raw, {"a": False, "b": False}, True)
    fig = Figure("x", [f"t{i}" for i in range(8)], [(m, sc[m]) for m in raw], note="shared scale")
    assert to_html(fig).count('class="bar"') == 1
    assert to_latex(fig).count(r"\makebox") == 1


# ---------------------------------------------------------------- issue 38: figures that print clean
_SVG = "{http://www.w3.org/2000/svg}"


def _text_boxes(root):
    """(text, x0, y0, x1, y1) of every SVG text: the monospace font's advance (about 0.6 of its size) per character,
    its ascent and descent around the baseline."""
    from tui.export import _CHAR_W, _FONT

    boxes = []
    for t in root.iter(_SVG + "text"):
        text = "".join(t.itertext())
        x, y = float(t.get("x")), float(t.get("y"))
        boxes.append((text, x, y - 0.8 * _FONT, x + len(text) * _CHAR_W, y + 0.2 * _FONT))
    return boxes


def _overlaps(a, b) -> bool:
    return a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]


@pytest.mark.parametrize("names", [("rollout", "normxlogit", "attcat"), ("al", "globenc_long_name", "c")])
def test_svg_text_boxes_never_overlap(names):
    """Issue 38, item 1: the colour bars' numbers were drawn over the method names ("rol0.017")."""
    fig = long_figure()
    fig = Figure(fig.example_id, fig.tokens, [(n, sc) for n, (_, sc) in zip(names, fig.rows)], fig.explained,
                 fig.note)
    root = ET.fromstring(to_svg(fig))
    boxes = _text_boxes(root)
    assert len(boxes) > len(fig.tokens) * len(fig.rows)
    bars = [(None, float(r.get("x")), float(r.get("y")), float(r.get("x")) + float(r.get("width")),
             float(r.get("y")) + float(r.get("height"))) for r in root.iter(_SVG + "rect") if r.get("height") == "14"]
    assert len(bars) == len(fig.rows) * 11
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:] + bars:
            assert not _overlaps(a, b), (a, b)
    # every bar's steps start at one x (the bars line up), and each bar follows its method's tokens
    starts = sorted({b[1] for b in bars})
    assert len(starts) == 11
    rows_y = {name: min(b[2] for b in boxes if b[0] == name) for name in names}
    bar_y = sorted({b[2] for b in bars})
    assert [rows_y[n] < y for n, y in zip(names, bar_y)] == [True] * 3
    assert rows_y[names[1]] > bar_y[0] and rows_y[names[2]] > bar_y[1]


def test_latex_bars_line_up_and_method_blocks_are_apart():
    """Issue 38, item 1: the TeX figure's bars started where each name and number ended; no gap between methods."""
    out = to_latex(long_figure())
    body = out.split("\\begin{tabular}", 1)[1].split("\\end{tabular}", 1)[0]
    rows = [line for line in body.splitlines() if "\\tabularnewline" in line]
    bars = [line for line in rows if "\\hspace{0.6em}" in line]
    assert len(bars) == 3
    # every bar in the second column, its low end in a box of one width: the ramps start at one x
    boxes = {re.match(r"^ *& \\makebox\[([0-9.]+em)\]\[r\]\{", line).group(1) for line in bars}
    assert len(boxes) == 1
    # each method's block (its tokens, then its bar) ends with a gap, the last one too (the table's end)
    methods = [line for line in rows if line.startswith("\\textbf{")]
    assert [rows.index(b) - rows.index(m) for m, b in zip(methods, bars)] == [1, 1, 1]
    assert all(b.rstrip().endswith("\\tabularnewline[0.8ex]") for b in bars[:-1])


@async_test
async def test_export_never_overwrites_a_different_figure(tmp_path, monkeypatch):
    """Issue 38, item 3: e, another method, e rewrote the same ID.svg/.tex/.html without a word. The file names the
    methods (and a shared scale); the same figure again writes the same files, a different one under that name (the
    colormap changed) gets the next free number."""
    set_color_env(monkeypatch)
    from tui.app import create_app

    store = tmp_path / "s.h5"
    make_store(str(store), n_examples=3)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.chdir(out)
    app = create_app(store)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("e")
        await pilot.pause()
        first = {p.name: p.read_text() for p in out.iterdir()}
        assert sorted(first) == ["s-ex0-rollout.html", "s-ex0-rollout.svg", "s-ex0-rollout.tex"]
        await pilot.press("m")
        await settle(pilot)
        await pilot.press("e")
        await pilot.pause()
        await pilot.press("e")  # the same figure again: the same files
        await pilot.pause()
        names = sorted(p.name for p in out.iterdir())
        assert names == sorted(list(first) + ["s-ex0-normxlogit.html", "s-ex0-normxlogit.svg",
                                              "s-ex0-normxlogit.tex"])
        assert all((out / n).read_text() == text for n, text in first.items())  # rollout's figure is untouched
        app.colormap = "light"  # another figure of the same methods: a file of its own
        await pilot.press("e")
        await pilot.pause()
        assert sorted(p.name for p in out.iterdir()) == sorted(names + ["s-ex0-normxlogit-2.html",
                                                                        "s-ex0-normxlogit-2.svg",
                                                                        "s-ex0-normxlogit-2.tex"])
        assert any("s-ex0-normxlogit-2.svg" in n.message for n in app._notifications)


def test_the_compare_screens_figure_names_its_methods_and_a_shared_scale(tmp_path):
    from tui.export import figure_stem

    assert figure_stem("sst2.h5", "ex 1", ["rollout", "mask_lrp"], shared=False) == "sst2-ex_1-rollout+mask_lrp"
    assert figure_stem("sst2.h5", "ex 1", ["rollout", "mask_lrp"], shared=True) == "sst2-ex_1-rollout+mask_lrp-shared"
