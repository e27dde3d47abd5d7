"""What the heads screen draws, as pure functions of the loaded head masks (no Textual, no HDF5).

A head mask (Mask-LRP, METHODS.md 6.1) is an [L, H] array: 1 where a head is selected (0..2 for a mask combined by
"sum"). Beside it the store keeps the statistics it came from; every one of them is optional here, and a statistic
whose shape does not fit the mask is ignored rather than trusted:

- positional: ``offsets`` [W], ``counts`` [L, H, W], ``freq_max`` [L, H], ``argmax_offset`` [L, H]
- syntactic: ``hits``, ``totals``, ``rates`` [L, H, K] (NaN where nothing was counted), ``thresholds``,
  ``lambda_max`` [K], with the relation names in ``attrs["relations"]``
- combined ("mask_lrp"): ``attrs["how"]``; its sources are the other masks of the same shape

The grid shows one cell per head: a mark (:func:`colors.mask_mark`, so that selection reads without colour) and, when
the width allows, the head's number for this mask (:func:`cell_formats` lists the layouts, widest first).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from rich.style import Style
from rich.text import Text

from ..colors import Mode, mask_mark, mask_style
from ..data import HeadMaskInfo
from .tokens import printable

DEFAULT_RELATIONS = ("nsubj", "obj", "amod", "advmod")
SOURCE_MASKS = ("positional", "syntactic")  # what Mask-LRP combines
_REL_ABBR = {"nsubj": "sbj", "obj": "obj", "dobj": "obj", "amod": "amd", "advmod": "adv"}
EMPTY_MESSAGE = "no head masks in this store: run attr-compute with --methods mask_lrp"

_DIM = Style(dim=True)
_BOLD = Style(bold=True)
_HEAD = Style(bold=True, underline=True)
_CURSOR = Style(reverse=True, bold=True)
_CURSOR_AXIS = Style(bold=True, underline=True)
_SETTING_CHARS = 48  # a setting's value is cut here: the list stays short


# ---------------------------------------------------------------- small formatters
def _finite(x) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def percent(v: float | None, digits: int = 0) -> str:
    """0.832 -> '83' (digits=0) or '83.2' (digits=1); None -> '—'."""
    if v is None:
        return "—"
    return f"{v * 100:.{digits}f}"


def offset_text(o: int | None) -> str:
    """A signed relative offset (key − query): '-1', '+2', '0'."""
    if o is None:
        return "—"
    return f"{o:+d}" if o else "0"


def rel_abbr(name: str) -> str:
    """Three letters for a dependency relation in a grid cell (nsubj -> sbj, advmod -> adv)."""
    return _REL_ABBR.get(name, printable(name)[:3])


def _array(stats: dict, key: str, prefix: tuple[int, ...], ndim: int) -> np.ndarray | None:
    """A statistic if it is numeric with ``ndim`` dimensions starting with ``prefix``; None otherwise."""
    a = stats.get(key)
    if a is None:
        return None
    a = np.asarray(a)
    if a.ndim != ndim or tuple(a.shape[:len(prefix)]) != tuple(prefix):
        return None
    if not (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_):
        return None
    return a


def _in_range(info: HeadMaskInfo, layer: int, head: int) -> bool:
    n_layers, n_heads = info.shape
    return 0 <= layer < n_layers and 0 <= head < n_heads


# ---------------------------------------------------------------- the statistics, read defensively
class Positional:
    """Positional statistics of a mask: per head, how often each relative offset (argmax key − query) wins."""

    def __init__(self, info: HeadMaskInfo):
        n_layers, n_heads = info.shape
        st = info.stats
        self.counts = _array(st, "counts", (n_layers, n_heads), 3)
        offsets = _array(st, "offsets", (), 1)
        if offsets is not None and self.counts is not None and len(offsets) != self.counts.shape[2]:
            offsets = None  # offsets that do not label the counts' last axis name nothing
        self.offsets = offsets
        self.freq_max = _array(st, "freq_max", (n_layers, n_heads), 2)
        self.argmax_offset = _array(st, "argmax_offset", (n_layers, n_heads), 2)
        self.threshold = _finite(info.attrs.get("threshold"))
        self.n_queries = _finite(info.attrs.get("n_queries"))

    @classmethod
    def of(cls, info: HeadMaskInfo) -> Positional | None:
        p = cls(info)
        return p if p.counts is not None or p.freq_max is not None or p.argmax_offset is not None else None

    def _total(self, layer: int, head: int) -> float:
        """Queries of one head: n_queries of the settings (with exclude_self the counts miss the self offset),
        unless the counts hold more than that."""
        counted = float(self.counts[layer, head].sum())
        if self.n_queries is not None and self.n_queries >= counted:
            return self.n_queries
        return counted

    def freq(self, layer: int, head: int) -> float | None:
        """Share of queries whose argmax is the head's most frequent offset."""
        if self.freq_max is not None:
            return _finite(self.freq_max[layer, head])
        if self.counts is not None:
            total = self._total(layer, head)
            return float(self.counts[layer, head].max()) / total if total > 0 else None
        return None

    def offset(self, layer: int, head: int) -> int | None:
        if self.argmax_offset is not None:
            v = _finite(self.argmax_offset[layer, head])
            return None if v is None else int(v)
        if self.counts is not None and self.offsets is not None and self.counts[layer, head].sum() > 0:
            return int(self.offsets[int(np.argmax(self.counts[layer, head]))])
        return None

    def top(self, layer: int, head: int, k: int = 3) -> list[tuple[int | None, float | None]]:
        """The k most frequent offsets of a head with their share of queries (from the counts when stored)."""
        if self.counts is not None and self.offsets is not None:
            c = self.counts[layer, head].astype(np.float64)
            total = self._total(layer, head)
            if total <= 0:
                return []
            order = np.argsort(-c, kind="stable")[:k]
            return [(int(self.offsets[i]), float(c[i]) / total) for i in order if c[i] > 0]
        o, f = self.offset(layer, head), self.freq(layer, head)
        return [] if o is None and f is None else [(o, f)]


class Syntactic:
    """Syntactic statistics of a mask: per head and relation, how often the head's argmax lands on the word's
    syntactic head (hits / totals = rate), against the relation's threshold."""

    def __init__(self, info: HeadMaskInfo):
        n_layers, n_heads = info.shape
        st = info.stats
        k = None
        for key in ("rates", "hits", "totals"):
            a = _array(st, key, (n_layers, n_heads), 3)
            if a is not None:
                k = a.shape[2]
                break
        self.k = k
        lead = (n_layers, n_heads, k) if k is not None else (n_layers, n_heads, -1)
        self.rates = _array(st, "rates", lead, 3)
        self.hits = _array(st, "hits", lead, 3)
        self.totals = _array(st, "totals", lead, 3)
        self.thresholds = _array(st, "thresholds", (k,), 1) if k is not None else None
        self.lambda_max = _array(st, "lambda_max", (k,), 1) if k is not None else None
        if self.thresholds is None and self.lambda_max is not None and _finite(info.attrs.get("margin")) is not None:
            self.thresholds = self.lambda_max + float(info.attrs["margin"])  # thr_k = max lambda_k + xi_synt
        names = info.attrs.get("relations")
        if isinstance(names, (list, tuple)) and k is not None and len(names) == k:
            self.relations = tuple(printable(str(n)) for n in names)
        elif k == len(DEFAULT_RELATIONS):
            self.relations = DEFAULT_RELATIONS
        else:
            self.relations = tuple(f"rel{i + 1}" for i in range(k or 0))

    @classmethod
    def of(cls, info: HeadMaskInfo) -> Syntactic | None:
        s = cls(info)
        return s if s.k else None

    def rate(self, layer: int, head: int, k: int) -> float | None:
        if self.rates is not None:
            return _finite(self.rates[layer, head, k])
        if self.hits is not None and self.totals is not None and self.totals[layer, head, k] > 0:
            return float(self.hits[layer, head, k]) / float(self.totals[layer, head, k])
        return None

    def threshold(self, k: int) -> float | None:
        return None if self.thresholds is None else _finite(self.thresholds[k])

    def best(self, layer: int, head: int) -> tuple[int, float] | None:
        """The relation that comes closest to (or furthest over) its threshold, with its rate; the highest rate
        when there are no thresholds. None when no relation was counted for this head."""
        best, key = None, -math.inf
        for k in range(self.k):
            r = self.rate(layer, head, k)
            if r is None:
                continue
            thr = self.threshold(k)
            margin = r - thr if thr is not None else r
            if margin > key:
                best, key = (k, r), margin
        return best


def sources(masks: tuple[HeadMaskInfo, ...], info: HeadMaskInfo) -> list[tuple[str, HeadMaskInfo]]:
    """The masks a combined mask is made of, each with a letter: those its settings name (``sources``), else the
    positional and syntactic masks, else every other uncombined mask of its shape."""
    if not info.combined:
        return []
    usable = [m for m in masks if m is not info and not m.combined and m.shape == info.shape]
    named = info.attrs.get("sources")
    if isinstance(named, (list, tuple)) and named:
        chosen = [m for m in usable if m.name in {str(n) for n in named}]
    else:
        chosen = [m for m in usable if m.name in SOURCE_MASKS] or usable
    out, used = [], set()
    for m in chosen:
        letter = m.name[:1].upper() or "?"
        if letter in used:
            letter = m.name[:2].capitalize()
        used.add(letter)
        out.append((printable(letter), m))
    return out


def selected_by(srcs: list[tuple[str, HeadMaskInfo]], layer: int, head: int) -> str:
    """'PS', 'P', 'S' or '' : the letters of the sources that selected a head."""
    return "".join(letter for letter, m in srcs if m.mask[layer, head] > 0)


# ---------------------------------------------------------------- grid cells
@dataclass(frozen=True)
class CellFormat:
    """One way to draw the grid cells of a mask: the mark, then ``width`` cells of ``body(layer, head)``."""

    width: int
    body: Callable[[int, int], str]
    describes: str  # what the body shows (the legend line)


def _mark_only(_layer: int, _head: int) -> str:
    return ""


MARK_ONLY = CellFormat(0, _mark_only, "")


def cell_formats(info: HeadMaskInfo, masks: tuple[HeadMaskInfo, ...]) -> list[CellFormat]:
    """The layouts of a mask's cells, widest first; the last one is the mark alone."""
    srcs = sources(masks, info)
    if srcs:
        width = sum(len(letter) for letter, _ in srcs)
        names = ", ".join(f"{letter} {printable(m.name)}" for letter, m in srcs)
        def letters(layer: int, head: int) -> str:
            return selected_by(srcs, layer, head).rjust(width)

        return [CellFormat(width, letters, f"selected by {names}"), MARK_ONLY]
    pos = Positional.of(info)
    if pos is not None:
        def full(layer: int, head: int) -> str:
            f, o = pos.freq(layer, head), pos.offset(layer, head)
            pct = percent(f) + ("%" if f is not None else "")
            return (pct if o is None else f"{offset_text(o)} {pct}").rjust(8)

        def compact(layer: int, head: int) -> str:
            return percent(pos.freq(layer, head)).rjust(3)

        return [CellFormat(8, full, "most frequent offset (key − query), % of queries"),
                CellFormat(3, compact, "% of queries at the most frequent offset"), MARK_ONLY]
    syn = Syntactic.of(info)
    if syn is not None:
        def full_s(layer: int, head: int) -> str:
            b = syn.best(layer, head)
            return ("—" if b is None else f"{rel_abbr(syn.relations[b[0]])} {percent(b[1])}%").rjust(8)

        def compact_s(layer: int, head: int) -> str:
            b = syn.best(layer, head)
            return ("—" if b is None else percent(b[1])).rjust(3)

        what = "relation nearest its threshold" if syn.thresholds is not None else "relation with the best rate"
        return [CellFormat(8, full_s, f"{what}, its hit rate"),
                CellFormat(3, compact_s, f"hit rate (%) of the {what}"), MARK_ONLY]
    return [MARK_ONLY]


@dataclass(frozen=True)
class GridGeometry:
    """Column widths of the grid: ``label`` cells of row labels (L1..L12), then ``n_heads`` columns of ``col``
    cells each (a space, then the cell right-aligned)."""

    label: int
    col: int
    n_heads: int
    head_labels: tuple[str, ...]

    @property
    def width(self) -> int:
        return self.label + self.n_heads * self.col


def geometry(fmt: CellFormat, n_layers: int, n_heads: int) -> GridGeometry:
    cell = 1 + fmt.width
    long_labels = len(f"H{n_heads}") <= cell
    labels = tuple(f"H{h + 1}" if long_labels else str(h + 1) for h in range(n_heads))
    return GridGeometry(len(f"L{n_layers}"), 1 + max(cell, len(str(n_heads))), n_heads, labels)


def choose_format(formats: list[CellFormat], n_layers: int, n_heads: int, width: int) -> CellFormat:
    """The widest layout whose grid fits ``width`` cells (the narrowest when none does)."""
    for fmt in formats:
        if geometry(fmt, n_layers, n_heads).width <= width:
            return fmt
    return formats[-1]


def header_cells(geo: GridGeometry, cursor_head: int | None) -> Text:
    """The column header (head numbers), without the row-label column."""
    t = Text(no_wrap=True)
    for h, label in enumerate(geo.head_labels):
        t.append(" " * (geo.col - len(label)))
        t.append(label, _CURSOR_AXIS if h == cursor_head else _DIM)
    return t


def row_label(layer: int, geo: GridGeometry, cursor: bool) -> Text:
    label = f"L{layer + 1}"
    t = Text(" " * (geo.label - len(label)), no_wrap=True)
    t.append(label, _CURSOR_AXIS if cursor else _DIM)  # a span: the grid renders these lines segment by segment
    return t


def row_cells(info: HeadMaskInfo, fmt: CellFormat, geo: GridGeometry, layer: int, mode: Mode,
              cursor_head: int | None) -> Text:
    """One row of cells: per head a space, the mark and the body, styled by the head's mask value."""
    t = Text(no_wrap=True)
    for h in range(geo.n_heads):
        v = int(info.mask[layer, h])
        body = fmt.body(layer, h)
        if len(body) > fmt.width:  # e.g. an offset of -1000: keep the columns straight
            body = "…" + body[len(body) - fmt.width + 1:] if fmt.width > 1 else body[:fmt.width]
        cell = (mask_mark(v) + body).rjust(geo.col - 1)
        t.append(" ")
        # The cursor looks the same on every cell (reversed, whatever the selection colour); the mark still tells.
        style = _CURSOR if h == cursor_head else mask_style(v, mode)
        if v <= 0 and h != cursor_head:  # the unselected mark is quiet, its number stays readable
            pad = len(cell) - len(body) - 1
            t.append(cell[:pad])
            t.append(cell[pad], _DIM)
            t.append(body)
        else:
            t.append(cell, style)
    return t


# ---------------------------------------------------------------- the lines around the grid
def tabs_text(masks: tuple[HeadMaskInfo, ...], current: int) -> Text:
    """The mask selector: every mask with its count of selected heads, the current one reversed."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append("mask ", _DIM)
    for i, m in enumerate(masks):
        t.append(" ")
        label = f" {printable(m.name)} {m.n_selected} "
        t.append(label, Style(reverse=True, bold=True) if i == current else Style())
    if masks:
        n_layers, n_heads = masks[current].shape
        t.append(f"  of {n_layers * n_heads} heads ({n_layers}×{n_heads})", _DIM)
    return t


def legend_text(info: HeadMaskInfo, fmt: CellFormat, formats: list[CellFormat], mode: Mode) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(mask_mark(1), mask_style(1, mode))
    t.append(" selected  ")
    if int(info.mask.max(initial=0)) >= 2:
        t.append(mask_mark(2), mask_style(2, mode))
        t.append(" twice  ")
    t.append(mask_mark(0), _DIM)
    t.append(" not", Style())
    if fmt.describes:
        t.append("   cells: ", _DIM)
        t.append(fmt.describes, _DIM)
    elif len(formats) > 1:
        t.append("   per-head numbers: in the panel (too narrow here)", _DIM)
    return t


def _selection_words(v: int) -> str:
    return "not selected" if v <= 0 else "selected" if v == 1 else f"selected ×{v}"


def detail_text(masks: tuple[HeadMaskInfo, ...], layer: int, head: int, mode: Mode) -> Text:
    """Everything every mask knows about one head: selection, top offsets, relation rates vs thresholds."""
    t = Text()
    t.append(f"layer {layer + 1} · head {head + 1}", _HEAD)
    for m in masks:
        t.append("\n")
        t.append(printable(m.name), _BOLD)
        if not _in_range(m, layer, head):
            t.append("  (no such head in this mask)", _DIM)
            continue
        v = int(m.mask[layer, head])
        t.append("  ")
        t.append(mask_mark(v), mask_style(v, mode))
        t.append(" " + _selection_words(v))
        srcs = sources(masks, m)
        by = [printable(s.name) for _, s in srcs if s.mask[layer, head] > 0]
        if by:
            t.append(f"\n  by {' + '.join(by)}")
        pos = Positional.of(m)
        if pos is not None:
            top = pos.top(layer, head, 3)
            thr = pos.threshold
            t.append("\n  offset   share" + (f"  selects > {percent(thr)}%" if thr is not None else ""), _DIM)
            if not top:
                t.append("\n  —", _DIM)
            for o, f in top:
                over = thr is not None and f is not None and f > thr
                t.append(f"\n  {offset_text(o):>6}  ")
                t.append(f"{percent(f, 1) + '%' if f is not None else '—':>6}", _BOLD if over else Style())
                if over:
                    t.append(" ✓", _BOLD)
                if o == 0:
                    t.append("  self", _DIM)
        syn = Syntactic.of(m)
        if syn is not None:
            t.append("\n  rel      rate     thr  hits/n", _DIM)
            for k, rel in enumerate(syn.relations):
                r, thr = syn.rate(layer, head, k), syn.threshold(k)
                over = r is not None and thr is not None and r > thr
                cmp = " " if r is None or thr is None else ">" if over else "≤"
                t.append(f"\n  {rel:<6} ")
                t.append(f"{percent(r, 1) + '%' if r is not None else '—':>6}", _BOLD if over else Style())
                t.append(f" {cmp} {percent(thr, 1) + '%' if thr is not None else '—':>5}")
                if syn.hits is not None or syn.totals is not None:
                    hits = "?" if syn.hits is None else str(int(syn.hits[layer, head, k]))
                    tot = "?" if syn.totals is None else str(int(syn.totals[layer, head, k]))
                    t.append(f"  {hits}/{tot}", _DIM)
    return t


def _value_text(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_value_text(v) for v in value) or "—"
    if isinstance(value, dict):
        return json.dumps(value, default=str, separators=(",", ":"))
    if value is None:
        return "—"
    return str(value)


def _stat_summary(a: np.ndarray) -> str | None:
    """Scalars and short vectors (thresholds, lambda_max) as numbers; long vectors (offsets) as a range."""
    if a.ndim == 0:
        return _value_text(a.item())
    if a.ndim != 1 or not a.size or not np.issubdtype(a.dtype, np.number):
        return None
    if a.size <= 6:
        return " ".join(f"{x:.3g}" if isinstance(x, float) else str(x) for x in a.tolist())
    return f"{a.min()} … {a.max()} ({a.size})"


def settings_text(info: HeadMaskInfo) -> Text:
    """The mask's settings (``attrs``) and its small statistics (thresholds), one short line each."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"settings of {printable(info.name)}", _HEAD)
    rows = [(str(k), _value_text(v)) for k, v in info.attrs.items()]
    rows += [(k, s) for k, a in info.stats.items() if (s := _stat_summary(np.asarray(a))) is not None]
    if not rows:
        t.append("\n  (none stored)", _DIM)
    width = min(14, max((len(printable(k)) for k, _ in rows), default=0))
    for key, value in rows:
        value = printable(value)
        if len(value) > _SETTING_CHARS:
            value = value[:_SETTING_CHARS - 1] + "…"
        t.append("\n  ")
        t.append(printable(key).ljust(width), _DIM)
        t.append("  " + value)
    return t
