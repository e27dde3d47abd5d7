"""HTML of a figure (store/figure.py): a fragment for notebooks (``Example._repr_html_``, ``Store._repr_html_``)
and a whole page for the TUI's figure export (tui/export.py), from one renderer.

Every string from the data (ids, tokens, method names, the note) is shown through :func:`text.printable` (control
characters escaped) and then :func:`html.escape`: it is text, never markup. Styles are inline (a notebook keeps no
page-wide ``<style>``); a row's colour bar follows it when the methods' scales differ, else one bar ends the table.
"""

from __future__ import annotations

import html
import os

import numpy as np

from .figure import EXPLAINED_MARK, Figure
from .palette import DEFAULT_COLORMAP, Scale, content_tokens, cut_after, format_score, normalize, scale_keep
from .text import printable

#: Examples a store's notebook view draws (the first ones: the view reads nothing else of the store).
STORE_VIEW_EXAMPLES = 3

_TH = 'style="text-align:left;padding-right:1em;vertical-align:top"'
# every cell sets its alignment: a notebook's table styles right-align a cell that does not (JupyterLab's do)
_TD = 'style="text-align:left"'
_TOKEN = "padding:1px 2px;line-height:1.9"


def _text(value) -> str:
    return html.escape(printable(str(value)))


def _bar_row(fig: Figure, scale: Scale) -> str:
    steps = "".join(f'<span style="background:{c}">&#160;&#160;</span>' for _, c in fig.bar(scale))
    legend = fig.legend(scale)
    return (f"<tr><th {_TH}></th><td class=\"bar\" {_TD}>{_text(format_score(scale.lo))} {steps} "
            f"{_text(format_score(scale.hi))}{' ' + _text(legend) if legend else ''}</td></tr>")


def figure_fragment(fig: Figure) -> str:
    """The figure as a ``<div>``: its id and note, one row of coloured tokens per method, the colour bars."""
    scales = [scale for _, scale in fig.rows]
    shared = all((s.lo, s.hi, s.signed) == (scales[0].lo, scales[0].hi, scales[0].signed) for s in scales)
    rows = []
    for (name, row), scale in zip(fig.cells(), scales):
        spans = []
        for k, (text, joined, colour, dark) in enumerate(row):
            sep = "" if joined or not spans else " "
            mark = EXPLAINED_MARK if k == fig.explained else ""
            spans.append(f'{sep}<span style="background:{colour};color:{"#000" if dark else "#fff"};{_TOKEN}">'
                         f"{html.escape(mark + text)}</span>")  # cells() made the text printable
        rows.append(f"<tr><th {_TH}>{_text(name)}</th><td {_TD}>{''.join(spans)}</td></tr>")
        if not shared:
            rows.append(_bar_row(fig, scale))
    if shared and scales:
        rows.append(_bar_row(fig, scales[0]))
    if not scales:  # no method: the tokens alone
        rows.append(f"<tr><td {_TD}>{' '.join(_text(t) for t in fig.tokens)}</td></tr>")
    return (f'<div style="font-family:monospace"><p><b>{_text(fig.example_id)}</b> {_text(fig.note)}</p>\n'
            f"<table>\n" + "\n".join(rows) + "\n</table></div>")


def to_html(fig: Figure) -> str:
    """The figure as one self-contained HTML page."""
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"/><title>" + _text(fig.example_id)
            + "</title></head><body>\n" + figure_fragment(fig) + "\n</body></html>\n")


def example_figure(example, methods: list[str] | None = None, cmap: str = DEFAULT_COLORMAP,
                   step: int | None = None) -> Figure:
    """An example of a store as a figure: every method's final scores (or ``methods``'), each on its own scale
    (per view, over the tokens palette.scale_keep chooses: as the TUI's default), the explained token marked. A
    generation store's example at generated token ``step`` (default: its last), its target marked and the tokens from
    it on without colour; one without generated tokens as its prompt, uncoloured."""
    store = example._s
    names = list(store.methods if methods is None else methods)
    explained, upto, where = example.explain_pos, -1, ""
    if store.generation:
        T = example.n_steps
        step = T - 1 if step is None else step
        explained = upto = example.step_position(step) if T else -1
        where = f" · step {step + 1}/{T}: {example.tokens[upto]}" if T else " · no generated tokens"
    content = content_tokens(np.asarray(example.segment) < 0, explained, len(example.tokens))
    rows = []
    for m in names:  # the tokens that set each scale as in the TUI and its figures (palette.scale_keep)
        if store.generation and not example.n_steps:
            scores = np.full(len(example.tokens), np.nan)
            upto = 0
        else:
            scores = example.scores(m, step=step) if store.generation else example.scores(m)
        rows.append((m, cut_after(normalize(scores, store.is_signed(m), scale_keep(scores, content)), upto)))
    note = f"{os.path.basename(store.path)} · example {example.index}{where}"
    if store.task_name == "classification":
        names = store.labels
        if example.label is not None:
            note += f" · label {names.get(example.label, example.label)}"
        note += f" · pred {names.get(example.pred, example.pred)}"
    return Figure(example.id, example.tokens, rows, explained, note, cmap)


def example_html(example, methods: list[str] | None = None, cmap: str = DEFAULT_COLORMAP,
                 step: int | None = None) -> str:
    """An example's notebook view: :func:`example_figure` as a fragment (a generation store's at ``step``)."""
    return figure_fragment(example_figure(example, methods, cmap, step))


def store_html(store, examples: int = STORE_VIEW_EXAMPLES, cmap: str = DEFAULT_COLORMAP) -> str:
    """A store's notebook view: its name, size, state, task, model and methods, then its first examples."""
    info = store.model_info
    model = info.get("model_id") or info.get("model") or ""
    state = "complete" if store.complete else "incomplete (being written, or stopped)"
    facts = [f"{len(store)} examples", state, store.task_name] + ([str(model)] if model else [])
    methods = ", ".join(f"{m} ({'signed' if store.is_signed(m) else 'non-negative'})" for m in store.methods)
    shown = min(len(store), max(examples, 0))
    head = (f'<div style="font-family:monospace"><p><b>{_text(os.path.basename(store.path))}</b> '
            f"{_text(' · '.join(facts))}</p>\n<p>methods: {_text(methods or 'none')}</p>\n"
            + (f"<p>the first {shown} of {len(store)} examples:</p>\n" if shown else "<p>no examples yet</p>\n"))
    return head + "\n".join(example_html(store[i], cmap=cmap) for i in range(shown)) + "\n</div>"
