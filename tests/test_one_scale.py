"""Issue 38, item 8: one example reads the same in the TUI, the exported figures and the notebook: the same tokens
set the scale (the content tokens when a special or the explained token dominates this example, else all of them:
palette.scale_keep), and a token beyond the scale, drawn at its end, carries a mark (↑ above, ↓ below) that the
colour bar's legend explains."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
from test_render_html import _parse
from test_tui import async_test, screen_text, set_color_env, settle

from store import ExampleData, MethodLayout, StoreWriter, open_store
from store.palette import format_score

TOKENS = ["[CLS]", "a", "fine", "film", "[SEP]"]
SCORES = [np.array([0.5, 0.1, 0.9, 0.4, 0.3]),  # nothing dominates: every token sets the scale
          np.array([5.0, 0.3, 0.9, 0.4, 0.2])]  # [CLS] dominates: the words set it, [CLS] above, [SEP] below


def _store(path):
    w = StoreWriter.create(str(path), n_layers=1, n_heads=1, labels={0: "neg", 1: "pos"},
                           methods=[MethodLayout("rollout", signed=False)], provenance={"model": "m"})
    n = len(TOKENS)
    w.append([ExampleData(row=i, id=f"ex{i}", text="a fine film", pair=None, token_ids=np.arange(n), tokens=TOKENS,
                          spans=np.full((n, 2), -1), segment=np.array([-1, 0, 0, 0, -1]), label=1, pred=1,
                          probs=np.array([.2, .8]), target=1, explain_pos=0, n_orig_tokens=n, truncated=False,
                          results={"rollout": {"scores": s}}) for i, s in enumerate(SCORES)])
    w.close(complete=True, summary={"examples": 2})


def _expected(i):
    """(lo, hi) of example i's scale and the marks of its tokens."""
    if i == 0:
        return format_score(0.1), format_score(0.9), {}
    return format_score(0.3), format_score(0.9), {0: "↑", 4: "↓"}


@async_test
async def test_one_example_reads_the_same_in_every_face(tmp_path, monkeypatch):
    set_color_env(monkeypatch)
    from tui.app import create_app

    path = tmp_path / "s.h5"
    _store(path)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.chdir(out)
    app = create_app(path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        for i in range(2):  # the first example shown does not decide the next one's scale
            if i:
                await pilot.press("j")
                await settle(pilot)
            lo, hi, marks = _expected(i)
            # the TUI: the colour bar's ends, the tokens' marks, the legend
            bar = next(line for line in screen_text(app).splitlines() if f"{lo} " in line and f" {hi}" in line)
            assert ("↑↓ clipped" in bar) == bool(marks), bar
            cells = app.query_one("#tokens").layout_data.cells
            assert [c.text for c in cells] == [("▸" if k == 0 else "") + t + marks.get(k, "")
                                               for k, t in enumerate(TOKENS)]
            # the figure: the same numbers and marks
            paths = app.export_figure(app.cache.get(i), ["rollout"])
            svg = ET.parse(next(p for p in paths if p.endswith(".svg"))).getroot()
            texts = ["".join(t.itertext()) for t in svg.iter("{http://www.w3.org/2000/svg}text")]
            assert lo in texts and any(t.startswith(hi) for t in texts), texts
            assert ("▸[CLS]" + marks.get(0, "")) in texts and ("[SEP]" + marks.get(4, "")) in texts
            assert any("↑↓ clipped" in t for t in texts) == bool(marks)
            tex = open(next(p for p in paths if p.endswith(".tex"))).read()
            assert (r"[CLS]$\uparrow$" in tex and r"[SEP]$\downarrow$" in tex) == bool(marks)
            # the notebook: the same numbers and marks
            with open_store(path) as s:
                view = s[i]._repr_html_()
            p = _parse(view)
            assert [t for _, t in p.spans if t.strip()] == [("▸" if k == 0 else "") + t + marks.get(k, "")
                                                            for k, t in enumerate(TOKENS)]
            bar_cell = next(t for attrs, t in p.cells if attrs.get("class") == "bar")
            assert bar_cell.split()[0] == lo and bar_cell.split()[-1 - 2 * bool(marks)] == hi, bar_cell
            assert ("↑↓ clipped" in bar_cell) == bool(marks)
