"""What the metrics screen (and the browse screen's metric line) draws, as pure functions of the loaded metrics (no
Textual, no HDF5).

The table has one row per method and one column per metric (the mean over the examples), an arrow in every header
for the metric's better direction (↑ higher is better, ↓ lower), and :data:`BEST_MARK` plus bold on the best value
of each column, so that the best reads without colour. The sort column carries :data:`SORT_MARKS` (▼ high to low,
▲ low to high); methods without a value sort last whatever the direction. Long names are shortened in the table
(:func:`short_name`: ``comprehensiveness`` -> ``comp``); a preset suffix stays (``aopc@attcat``).
"""

from __future__ import annotations

import json
import math

import numpy as np
from rich.console import Console, ConsoleOptions, RenderResult
from rich.style import Style
from rich.text import Text

from ..colors import Mode
from ..data import MetricInfo, MetricsData
from .tokens import printable

EMPTY_MESSAGE = "no metrics in this store: run attr-compute eval STORE --metrics ..."
BEST_MARK = "★"
SORT_MARKS = {True: "▼", False: "▲"}  # descending (high to low), ascending
CURSOR_MARK = "▶"
SPARK = "▁▂▃▄▅▆▇█"

#: Table headers and the compact line: the long metric names, shortened.
SHORT = {"comprehensiveness": "comp", "sufficiency": "suff", "accuracy": "acc", "spearman": "spear",
         "precision_at_k": "prec@k", "dot_product": "dot", "average_precision": "ap", "jaccard_25": "jacc25",
         "seed_spearman": "seed_sp"}
#: Settings shown first, in this order (the rest follow alphabetically); the ones never shown (the metric's own name,
#: token ids) are in _HIDDEN_SETTINGS.
SETTING_ORDER = ("preset", "variant", "perturbation", "levels", "cls", "side", "protect", "absolute", "attend",
                 "skip_last", "k", "saliency", "form", "random", "exclude", "signed")
_HIDDEN_SETTINGS = {"metric", "pad_id", "mask_id"}
_SUMMARY_SHOWN = ("mean", "std", "n")
_MAX_EXTRA_STATS = 4
_METHOD_W = 24  # the method column is cut here

_DIM = Style(dim=True)
_BOLD = Style(bold=True)
_HEAD = Style(bold=True, underline=True)
_SORT = Style(bold=True, underline=True)
_CURSOR = Style(reverse=True)


# ---------------------------------------------------------------- small formatters
def short_name(name: str) -> str:
    """'comprehensiveness' -> 'comp', 'aopc@attcat' -> 'aopc@attcat' (the base name shortened, the preset kept)."""
    base, _, preset = name.partition("@")
    return printable(SHORT.get(base, base) + (f"@{preset}" if preset else ""))


def arrow(higher_is_better: bool) -> str:
    return "↑" if higher_is_better else "↓"


def fmt(v: float | None, digits: int = 3) -> str:
    """A metric value: ``digits`` decimals below 10, fewer above; '—' for None or NaN."""
    if v is None or not math.isfinite(v):
        return "—"
    a = abs(v)
    if a and a < 0.5 * 10.0 ** -digits:
        return f"{v:.{max(digits - 2, 0)}e}"
    if a < 10:
        return f"{v:.{digits}f}"
    if a < 100:
        return f"{v:.{max(digits - 1, 0)}f}"
    if a < 1e6:
        return f"{v:.0f}"
    return f"{v:.2e}"


def best_style(mode: Mode) -> Style:
    """Bold everywhere; green as well where there is colour (the ★ carries it without)."""
    return _BOLD if mode == "mono" else Style(bold=True, color="green")


def _setting_value(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ",".join(_setting_value(v) for v in value) or "—"
    if isinstance(value, dict):
        return json.dumps(value, default=str, separators=(",", ":"))
    return str(value)


def settings_items(settings: dict) -> list[tuple[str, str]]:
    """(key, value) of a metric's settings, compact: known keys first (preset, perturbation, levels, cls ...),
    None values and the ones that say nothing to a reader (token ids, the metric's own name) left out."""
    keys = [k for k in SETTING_ORDER if k in settings]
    keys += sorted(k for k in settings if k not in SETTING_ORDER and k not in _HIDDEN_SETTINGS)
    out = []
    for k in keys:
        v = settings[k]
        if v is None or v == "":
            continue
        out.append((printable(str(k)), printable(_setting_value(v))[:40]))
    return out


def extra_stats(summary: dict) -> list[tuple[str, str]]:
    """Numbers of a summary beyond mean, std and n (a random baseline, precision ...), at most a few."""
    out = []
    for k, v in summary.items():
        if k in _SUMMARY_SHOWN or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        out.append((printable(str(k)), fmt(float(v)) if isinstance(v, float) else str(v)))
        if len(out) >= _MAX_EXTRA_STATS:
            break
    return out


def sparkline(values: np.ndarray) -> str:
    """One block per point, scaled between the curve's min and max (a flat curve is a row of middle blocks)."""
    v = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(v)
    if not finite.any():
        return " " * len(v)
    lo, hi = float(v[finite].min()), float(v[finite].max())
    out = []
    for x, ok in zip(v, finite):
        if not ok:
            out.append(" ")
        elif hi > lo:
            out.append(SPARK[min(len(SPARK) - 1, int((x - lo) / (hi - lo) * (len(SPARK) - 1) + 0.5))])
        else:
            out.append(SPARK[len(SPARK) // 2])
    return "".join(out)


# ---------------------------------------------------------------- the table's logic
def higher_is_better(data: MetricsData, name: str) -> bool:
    for method in data.methods:
        info = data.get(method, name)
        if info is not None:
            return info.higher_is_better
    return True


def mean_of(data: MetricsData, method: str, name: str) -> float | None:
    info = data.get(method, name)
    return None if info is None else info.mean


def sorted_methods(data: MetricsData, name: str | None, descending: bool) -> list[str]:
    """The methods ordered by their mean of metric ``name``; methods without one last (store order among them)."""
    methods = list(data.methods)
    if name is None:
        return methods
    with_value = [m for m in methods if mean_of(data, m, name) is not None]
    without = [m for m in methods if mean_of(data, m, name) is None]
    with_value.sort(key=lambda m: mean_of(data, m, name), reverse=descending)  # stable: ties keep store order
    return with_value + without


def best_methods(data: MetricsData, name: str) -> set[str]:
    """The method(s) with the best mean of metric ``name`` (its better direction); empty when no method has one."""
    means = {m: v for m in data.methods if (v := mean_of(data, m, name)) is not None}
    if not means:
        return set()
    best = max(means.values()) if higher_is_better(data, name) else min(means.values())
    return {m for m, v in means.items() if v == best}


# ---------------------------------------------------------------- the table
def _cell(text: str, width: int) -> str:
    return text.rjust(width)


def table_lines(data: MetricsData, rows: list[str], sort: int, descending: bool, cursor: str | None, width: int,
                height: int, mode: Mode) -> tuple[list[Text], int]:
    """The table fitted to ``width`` x ``height`` cells: a header line, then one line per method. Columns that do
    not fit are left out around the sort column (always shown), marked '‹' / '›'; rows scroll with the cursor.
    Returns the lines and the index (in ``rows``) of the first method drawn."""
    names = list(data.names)
    if not names or not rows:
        return [Text("")], 0
    method_w = min(_METHOD_W, max(6, *(len(printable(m)) for m in rows)))
    best = {n: best_methods(data, n) for n in names}
    headers, cells, widths = [], [], []
    for i, n in enumerate(names):
        mark = SORT_MARKS[descending] if i == sort else " "
        head = f"{mark}{short_name(n)} {arrow(higher_is_better(data, n))}"
        col = [fmt(mean_of(data, m, n)) + (BEST_MARK if m in best[n] else " ") for m in rows]
        headers.append(head)
        cells.append(col)
        widths.append(max(len(head), *(len(c) for c in col)))
    # the columns shown: from `start` to `end` (exclusive), the sort column always among them
    room = max(1, width - 2 - method_w)
    sort = max(0, min(sort, len(names) - 1))

    def span(a: int, b: int) -> int:
        return sum(2 + widths[i] for i in range(a, b))

    start = 0
    while start < sort and span(start, sort + 1) > room - 1:
        start += 1
    end = start + 1
    while end < len(names) and span(start, end + 1) + (1 if end + 1 < len(names) else 0) <= room:
        end += 1
    lines = []
    head = Text(no_wrap=True, overflow="crop")
    head.append("‹ " if start else "  ", _DIM)
    head.append("method".ljust(method_w), _DIM)
    for i in range(start, end):
        head.append("  ")
        head.append(_cell(headers[i], widths[i]), _SORT if i == sort else _BOLD)
    if end < len(names):
        head.append(" ›", _DIM)
    lines.append(head)
    visible = max(1, height - 1)
    cur = rows.index(cursor) if cursor in rows else 0
    top = 0 if len(rows) <= visible else max(0, min(cur - visible // 2, len(rows) - visible))
    good = best_style(mode)
    for r in range(top, min(len(rows), top + visible)):
        m = rows[r]
        t = Text(no_wrap=True, overflow="crop")
        at_cursor = r == cur
        t.append(f"{CURSOR_MARK} " if at_cursor else "  ", _BOLD)
        name = printable(m)
        if len(name) > method_w:
            name = name[:method_w - 1] + "…"
        t.append(name.ljust(method_w), _BOLD if at_cursor else Style())
        for i in range(start, end):
            t.append("  ")
            text = _cell(cells[i][r], widths[i])
            if m in best[names[i]]:
                t.append(text, good)
            elif cells[i][r].startswith("—"):
                t.append(text, _DIM)
            else:
                t.append(text)
        if at_cursor:
            t.stylize(_CURSOR, 2)
        lines.append(t)
    return lines, top


class Legend:
    """The line above the table: what it is sorted by and how, then what the marks mean where there is room."""

    def __init__(self, data: MetricsData, sort: int, descending: bool):
        self.data, self.sort, self.descending = data, sort, descending

    def parts(self) -> list[Text]:
        if not self.data.names:
            return []
        name = self.data.names[max(0, min(self.sort, len(self.data.names) - 1))]
        hib = higher_is_better(self.data, name)
        core = Text()
        core.append("sort ", _DIM)
        core.append(f"{SORT_MARKS[self.descending]} {short_name(name)}", _SORT)
        core.append(" high → low" if self.descending else " low → high")
        core.append(" (best first)" if self.descending == hib else " (worst first)", _DIM)
        best = Text("   ")
        best.append(BEST_MARK, _BOLD)
        best.append(" best", _DIM)
        arrows = Text("   ↑ higher / ↓ lower is better", _DIM)
        return [core, best, arrows]

    def fit(self, width: int) -> Text:
        """The sort part always; each further part only if it fits whole."""
        t = Text(no_wrap=True, overflow="ellipsis")
        for k, part in enumerate(self.parts()):
            if k and t.cell_len + part.cell_len > width:
                break
            t.append_text(part)
        return t

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.fit(options.max_width)


# ---------------------------------------------------------------- lines of entries (wrapped or cut at entries)
def pack(entries: list[Text], width: int, *, first: Text | None = None, indent: int = 2, sep: str = "  ",
         max_lines: int | None = None) -> list[Text]:
    """Entries laid out in lines of ``width`` cells, breaking only between entries (after ``first``, on the first
    line). With ``max_lines`` the entries that do not fit are dropped and counted: '…+3'."""
    width = max(width, 8)
    lines: list[Text] = []
    line = first.copy() if first is not None else Text()
    for k, e in enumerate(entries):
        gap = sep if line.plain.strip() else ""
        if gap and line.cell_len + len(gap) + e.cell_len > width:
            if max_lines is not None and len(lines) + 1 >= max_lines:
                return lines + [_cut(line, len(entries) - k, width)]
            lines.append(line)
            line = Text(" " * indent)
            gap = ""
        line.append(gap)
        line.append_text(e)
    lines.append(line)
    return lines


def _cut(line: Text, dropped: int, width: int) -> Text:
    """A line that ends with '…+N' (N entries did not fit); cut further if even that does not fit."""
    more = Text(f"  …+{dropped}", _DIM)
    if line.cell_len + more.cell_len > width:
        line = line.copy()
        line.truncate(max(0, width - more.cell_len))
        line.rstrip()
    line = line.copy()
    line.append_text(more)
    return line


def value_entries(metrics: list[MetricInfo], index: int | None, digits: int,
                  known: dict[tuple[str, str], float] | None = None,
                  at_step: dict[tuple[str, str], float] | None = None) -> list[Text]:
    """'comp 0.21', 'aopc@attcat 0.33': one entry per metric, its value for example ``index`` (from ``known``, the
    example's own values, where given). ``at_step``: a generation example's values at the shown step, where the
    store keeps them: 'comp 0.52 μ0.21', the step's value, then the example's mean over its steps."""
    out = []
    for info in metrics:
        t = Text(no_wrap=True)
        t.append(short_name(info.name), _DIM)
        v = info.value(index)
        if known is not None:
            v = known.get((info.method, info.name))
            v = v if v is not None and math.isfinite(v) else None
        step = None if at_step is None else at_step.get((info.method, info.name))
        if step is not None:
            s = step if math.isfinite(step) else None
            t.append(" " + fmt(s, digits), _DIM if s is None else Style())
            t.append(" μ" + fmt(v, digits), _DIM)
        else:
            t.append(" " + fmt(v, digits), _DIM if v is None else Style())
        out.append(t)
    return out


class MetricLine:
    """The browse screen's metric line: the current example's metrics for the current method, one line, cut at
    whole entries ('…+N') when they do not fit."""

    def __init__(self, metrics: list[MetricInfo], index: int | None, method: str,
                 known: dict[tuple[str, str], float] | None = None,
                 at_step: dict[tuple[str, str], float] | None = None):
        self.metrics, self.index, self.method, self.known, self.at_step = metrics, index, method, known, at_step

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.metrics:
            t = Text(f"no metrics for {printable(self.method)}", _DIM, no_wrap=True, overflow="ellipsis")
        else:
            t = pack(value_entries(self.metrics, self.index, 2, self.known, self.at_step), options.max_width,
                     max_lines=1)[0]
            t.no_wrap, t.overflow = True, "crop"
        yield t


class ExampleValues:
    """Below the table: the browse screen's current example and its value of every metric of the method under the
    cursor (wrapped at whole entries)."""

    def __init__(self, metrics: list[MetricInfo], method: str | None, index: int | None, ex_id: str | None,
                 total: int, known: dict[tuple[str, str], float] | None = None,
                 at_step: dict[tuple[str, str], float] | None = None, step: str = ""):
        self.metrics, self.method, self.index, self.ex_id, self.total = metrics, method, index, ex_id, total
        self.known, self.at_step, self.step = known, at_step, step  # step: 'step 3/6' (a generation example's)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        first = Text(no_wrap=True)
        if self.index is None:
            first.append("no example selected on the browse screen", _DIM)
            yield first
            return
        first.append("example ", _DIM)
        first.append(printable(self.ex_id) if self.ex_id else str(self.index + 1), _BOLD)
        first.append(f" {self.index + 1}/{self.total}", _DIM)
        if self.method is not None:
            first.append(" · ", _DIM)
            first.append(printable(self.method), _BOLD)
        if self.step:
            first.append(f" · {self.step} (μ: the mean over its steps)", _DIM)
        first.append(":" if self.metrics else "  (no metrics)", _DIM)
        lines = pack(value_entries(self.metrics, self.index, 3, self.known, self.at_step), options.max_width,
                     first=first, indent=2)
        text = Text("\n").join(lines)
        text.no_wrap, text.overflow = True, "crop"
        yield text


# ---------------------------------------------------------------- the detail panel
def curve_lines(info: MetricInfo, width: int) -> list[Text]:
    """The mean curve over the examples: a sparkline, then the mean level and the mean value of each point."""
    if info.curve is None or not len(info.curve):
        return []
    curve = info.curve
    levels = info.curve_levels
    lv = [("—" if levels is None or not math.isfinite(x) else f"{x:.1f}") for x in
          (levels if levels is not None else np.full(len(curve), np.nan))]
    if levels is None:
        lv = [str(i + 1) for i in range(len(curve))]
    vals = [fmt(float(x)) for x in curve]
    cw = max(max(map(len, lv)), max(map(len, vals)))
    head = Text(no_wrap=True, overflow="ellipsis")
    head.append("  curve  ", _DIM)
    head.append(sparkline(curve))
    finite = [float(x) for x in curve if math.isfinite(x)]
    if finite:
        head.append(f"  {fmt(finite[0])} → {fmt(finite[-1])}", _DIM)
    head.append(f"  ({len(curve)} levels, mean over examples)", _DIM)
    row_l = Text(no_wrap=True, overflow="ellipsis")
    row_l.append("  level  " if levels is not None else "  point  ", _DIM)
    row_l.append(" ".join(x.rjust(cw) for x in lv), _DIM)
    row_v = Text(no_wrap=True, overflow="ellipsis")
    row_v.append("  mean   ", _DIM)
    row_v.append(" ".join(x.rjust(cw) for x in vals))
    return [head, row_l, row_v]


def metric_lines(data: MetricsData, info: MetricInfo, mode: Mode, width: int) -> list[Text]:
    """One metric of the detail panel: name, direction, best mark and description; mean ± std, n and the other
    summary numbers; the settings (wrapped at whole settings); the mean curve when there is one."""
    head = Text(no_wrap=True, overflow="ellipsis")
    head.append(printable(info.name), _BOLD)
    head.append(f" {arrow(info.higher_is_better)}")
    if short_name(info.name) != printable(info.name):
        head.append(f" ({short_name(info.name)})", _DIM)
    if info.method in best_methods(data, info.name):
        head.append(f"  {BEST_MARK} best", best_style(mode))
    if info.description:
        head.append(f"  {printable(info.description)}", _DIM)
    stats = Text(no_wrap=True, overflow="ellipsis")
    stats.append("  mean ", _DIM)
    stats.append(fmt(info.mean), _BOLD)
    stats.append(" ± ", _DIM)
    stats.append(fmt(info.std))
    stats.append("  n ", _DIM)
    stats.append(str(info.n))
    for k, v in extra_stats(info.summary):
        stats.append(f"  {k} ", _DIM)
        stats.append(v)
    lines = [head, stats]
    items = settings_items(info.settings)
    if items:
        entries = []
        for k, v in items:
            e = Text(no_wrap=True)
            e.append(k + " ", _DIM)
            e.append(v)
            entries.append(e)
        lines += pack(entries, width, first=Text("  "), indent=2)
    lines += curve_lines(info, width)
    return lines


class MetricDetail:
    """The detail panel for one method: every metric with mean ± std, n, its settings and mean curve."""

    def __init__(self, data: MetricsData, method: str | None, mode: Mode):
        self.data, self.method, self.mode = data, method, mode

    def lines(self, width: int) -> list[Text]:
        metrics = self.data.of(self.method)
        head = Text(no_wrap=True, overflow="ellipsis")
        if self.method is None:
            return [head]
        head.append(printable(self.method), _HEAD)
        n_best = sum(1 for info in metrics if self.method in best_methods(self.data, info.name))
        head.append(f"  {len(metrics)} metric{'s' if len(metrics) != 1 else ''}", _DIM)
        if n_best:
            head.append(f" · best in {n_best}", _DIM)
        lines = [head]
        missing = [n for n in self.data.names if self.data.get(self.method, n) is None]
        for info in metrics:
            lines += metric_lines(self.data, info, self.mode, width)
        if missing:
            t = Text(no_wrap=True, overflow="ellipsis")
            t.append("not computed for this method: ", _DIM)
            t.append(", ".join(printable(n) for n in missing), _DIM)
            lines.append(t)
        return lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        text = Text("\n").join(self.lines(options.max_width))
        text.no_wrap, text.overflow = True, "ellipsis"
        yield text
