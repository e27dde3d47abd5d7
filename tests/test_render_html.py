"""The HTML views (store/render_html.py): the notebooks' ``Example._repr_html_`` and ``Store._repr_html_`` and the
figure export's HTML, one renderer. Hostile ids, tokens and method names (markup, control characters) come out as
text; the colours are the TUI's; each method's colour bar carries its own numbers."""

from __future__ import annotations

import html.parser
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from synthetic import make_store

from store import ExampleData, MethodLayout, StoreWriter, open_store
from store.figure import BAR_STEPS, Figure
from store.palette import COLORMAPS, format_score, normalize, rgb, xterm_rgb
from store.render_html import figure_fragment, to_html
from store.text import printable

HOSTILE_ID = "<script>alert(1)</script>\x1b[31m\nx\x00"
TOKENS = ["[CLS]", "<script>", "a\x07b", "&amp;", "\u202eevil", "un", "##bel", "[SEP]"]
TAGS = {"div", "p", "b", "table", "tr", "th", "td", "span"}  # all the renderer writes


class _Parse(html.parser.HTMLParser):
    """Tags, and the text of every <td>'s token spans and <th>s, as a browser would see them."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.data, self.spans, self.cells = [], [], [], []
        self._in = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self._in.append((tag, dict(attrs)))
        if tag in ("span", "th", "td"):
            (self.spans if tag == "span" else self.cells).append([dict(attrs), ""])

    def handle_endtag(self, tag):
        self._in.pop()

    def handle_data(self, data):
        self.data.append(data)
        if self._in and self._in[-1][0] == "span":
            self.spans[-1][1] += data
        elif self._in and self._in[-1][0] in ("th", "td"):
            self.cells[-1][1] += data


def _parse(text: str) -> _Parse:
    p = _Parse()
    p.feed(text)
    p.close()
    return p


def hostile_store(path, n_examples=1):
    rng = np.random.default_rng(3)
    methods = [MethodLayout("rollout", signed=False, description="attention rollout"),
               MethodLayout("<i>signed</i>\x1b", signed=True, description="hostile name")]
    w = StoreWriter.create(str(path), n_layers=2, n_heads=2, labels={0: "neg", 1: "<u>pos</u>\x07"}, methods=methods,
                           provenance={"model": "synthetic"}, attrs={"model_id": "<b>model</b>"})
    n = len(TOKENS)
    exs = []
    for i in range(n_examples):
        exs.append(ExampleData(
            row=i, id=HOSTILE_ID if i == 0 else f"ex{i}", text="t", pair=None, token_ids=np.arange(n),
            tokens=TOKENS, spans=np.full((n, 2), -1), segment=np.zeros(n), label=1, pred=1, probs=np.array([.2, .8]),
            target=1, explain_pos=0, n_orig_tokens=n, truncated=False,
            results={"rollout": {"scores": rng.random(n)}, "<i>signed</i>\x1b": {"scores": rng.normal(size=n)}}))
    w.append(exs)
    w.close(complete=True, summary={"examples": n_examples})


def test_palette_is_the_tui_colours():
    """The colours moved out of tui/colors.py (rich) into store/palette.py (numpy) are the same, value for value."""
    from rich.color import Color

    from tui.colors import background

    assert all(xterm_rgb(i) == tuple(Color.from_ansi(i).get_truecolor()) for i in range(16, 256))
    for cmap in COLORMAPS:
        for v in np.linspace(-1, 1, 41):
            assert rgb(v, cmap) == tuple(background(v, "truecolor", cmap).get_truecolor()), (cmap, v)
    with pytest.raises(ValueError):
        xterm_rgb(3)


def test_example_repr_html_escapes_and_colours_as_the_tui(tmp_path):
    hostile_store(tmp_path / "s.h5")
    with open_store(tmp_path / "s.h5") as s:
        ex = s[0]
        out = ex._repr_html_()
        scores = {m: ex.scores(m) for m in s.methods}
        signed = {m: s.is_signed(m) for m in s.methods}
    ET.fromstring(out)  # well-formed XML: no raw control character, no stray markup
    assert "\x1b" not in out and "\x00" not in out and "\x07" not in out and "\u202e" not in out
    p = _parse(out)
    assert set(p.tags) <= TAGS and p.tags.count("b") == 1  # the id's <script> and the names' <i>/<b> are text
    title = next(d for d in p.data if "alert" in d)
    assert title == printable(HOSTILE_ID)  # '<script>alert(1)</script>\\u001b[31m\\nx\\u0000'
    assert "s.h5 · example 0 · label <u>pos</u>\\u0007 · pred <u>pos</u>\\u0007" in "".join(p.data)
    rows = [_parse(r) for r in re.findall(r"<tr>.*?</tr>", out)]
    assert len(rows) == 4  # each method's row, then its colour bar: their scales differ
    shown = ["▸[CLS]", "<script>", "a\\u0007b", "&amp;", "\\u202eevil", "un", "bel", "[SEP]"]
    for r, m in enumerate(["rollout", "<i>signed</i>\x1b"]):
        scale = normalize(scores[m], signed[m])
        tokens, bar = rows[2 * r], rows[2 * r + 1]
        assert tokens.cells[0][1] == printable(m)  # the method's name, as text
        assert [t for _, t in tokens.spans] == shown
        colours = ["#%02x%02x%02x" % rgb(v) for v in scale.values]
        assert [a["style"].split(";")[0] for a, _ in tokens.spans] == [f"background:{c}" for c in colours]
        assert bar.cells[0][1] == "" and len(bar.spans) == BAR_STEPS
        assert bar.cells[1][1].split() == [format_score(scale.lo), format_score(scale.hi)]
        assert [a["style"] for a, _ in bar.spans] == ["background:#%02x%02x%02x" % rgb(v) for v in
                                                    np.linspace(-1.0 if signed[m] else 0.0, 1.0, BAR_STEPS)]
    assert "bel" in out and out.count(">un</span><span") == 2  # "##bel" joined to "un": no space between them


def test_store_repr_html_shows_its_facts_and_first_examples(tmp_path):
    hostile_store(tmp_path / "h.h5", n_examples=5)
    with open_store(tmp_path / "h.h5") as s:
        out = s._repr_html_()
    ET.fromstring(out)
    p = _parse(out)
    text = "".join(p.data)
    assert set(p.tags) <= TAGS and "<b>model</b>" in text and "<i>signed</i>\\u001b (signed)" in text
    assert "5 examples · complete · classification" in text and "the first 3 of 5 examples" in text
    assert printable(HOSTILE_ID) in text and "ex1" in text and "ex2" in text and "ex3" not in text
    make_store(str(tmp_path / "two.h5"), n_examples=2)
    with open_store(tmp_path / "two.h5") as s:
        out = s._repr_html_()
        ids = s.ids()
    assert "the first 2 of 2 examples" in out and all(f"<b>{i}</b>" in out for i in ids)


def test_one_bar_for_one_scale_and_the_page_escapes_its_title():
    values = np.array([0.0, 0.5, 1.0])
    fig = Figure(HOSTILE_ID, ["a", "b", "c"], [("m1", normalize(values, False)), ("m2", normalize(values * 1, False))],
                 note="n<o>te")
    frag = figure_fragment(fig)
    assert frag.count("<tr>") == 3  # two methods, one shared bar
    page = to_html(fig)
    ET.fromstring(page.split("\n", 1)[1])  # after the doctype: a well-formed document
    assert "<title>" + "&lt;script&gt;alert(1)&lt;/script&gt;\\u001b[31m\\nx\\u0000</title>" in page
    assert "n&lt;o&gt;te" in page


def test_ipython_displays_them_as_html(tmp_path):
    """Jupyter's kernel asks IPython's display formatter for a cell's value: it finds the HTML views."""
    pytest.importorskip("IPython", reason="needs IPython (pip install 'attrscope[test]')")
    from IPython.core.formatters import DisplayFormatter

    hostile_store(tmp_path / "s.h5", n_examples=2)
    with open_store(tmp_path / "s.h5") as s:
        fmt = DisplayFormatter()
        for value, view in ((s, s._repr_html_()), (s[1], s[1]._repr_html_())):
            data, _ = fmt.format(value)
            assert data["text/html"] == view and data["text/plain"] == repr(value)


def test_store_repr_html_of_a_store_being_written(tmp_path):
    w = StoreWriter.create(str(tmp_path / "w.h5"), n_layers=2, n_heads=2, labels={0: "neg", 1: "pos"},
                           methods=[MethodLayout("rollout", signed=False)], provenance={"model": "m"})
    try:
        with open_store(tmp_path / "w.h5") as s:
            out = s._repr_html_()
    finally:
        w.close(complete=False)
    ET.fromstring(out)
    text = "".join(_parse(out).data)
    assert "0 examples · incomplete (being written, or stopped) · classification" in text
    assert "methods: rollout (non-negative)" in text and "no examples yet" in text


def _cells_not_left_aligned(page: str) -> list[str]:
    """The <td>s of the figures in ``page`` whose own style does not left-align them (Jupyter's table styles right-
    align every cell that does not say otherwise)."""
    p = _parse(page)
    return [text for attrs, text in p.cells
            if "text-align:left" not in attrs.get("style", "").replace(" ", "")]


def test_notebook_views_left_align_every_cell(tmp_path):
    """Issue 38, item 2: in Jupyter every colour bar and wrapped token line was right-aligned (the notebook's table
    styles apply to the views' cells, which set no alignment). The views executed in a notebook (nbclient) and
    exported by nbconvert: every cell of their tables says text-align:left."""
    nbformat = pytest.importorskip("nbformat", reason="needs nbformat, nbclient, nbconvert and ipykernel")
    nbclient = pytest.importorskip("nbclient", reason="needs nbclient")
    nbconvert = pytest.importorskip("nbconvert", reason="needs nbconvert")
    pytest.importorskip("ipykernel", reason="needs ipykernel")
    import os

    make_store(str(tmp_path / "s.h5"), n_examples=3)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"import sys; sys.path.insert(0, {root!r})\n"
                                          f"from store import open_store\ns = open_store({str(tmp_path / 's.h5')!r})"),
                nbformat.v4.new_code_cell("s"), nbformat.v4.new_code_cell("s[1]")]
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                            ).execute()
    outputs = [cell.outputs[0]["data"]["text/html"] for cell in nb.cells[1:]]
    assert "ex0" in outputs[0] and "ex1" in outputs[1]
    page, _ = nbconvert.HTMLExporter().from_notebook_node(nb)
    assert "text-align: right" in page  # the notebook's own table styles: what the cells must override
    for html_out in outputs + [page]:
        cells = _parse(html_out).cells
        assert len(cells) >= 2 * 3  # every method's tokens and the colour bar
        assert _cells_not_left_aligned(html_out) == []
