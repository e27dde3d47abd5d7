"""CurveChart: the stored per-level curves of one metric (deletion / insertion, comprehensiveness, sufficiency ...)
for chosen methods, mean over the examples, as a terminal line chart drawn by plotext (textual-plotext).

The curves come from the metrics screen's data (``MetricsData``: ``MetricInfo.curve`` and ``curve_levels``, read in
a worker); this widget only draws. Each method gets its own numbered marker as well as its own colour, named by
:func:`legend_text` (the screen shows it under the chart, wrapped: every name whole at 80 columns), so the chart
stays readable with NO_COLOR and no legend covers the curves. The first method (the one selected) is drawn last: on
top where the curves meet.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rich.text import Text
from textual_plotext import PlotextPlot

# One per method (the metrics screen shows at most six): digits, which the legend names ("1 rollout"), tell the
# curves apart where they cross and without colour; plotext's own legend would be a box over the curves.
MARKERS = ("1", "2", "3", "4", "5", "6")


@dataclass(frozen=True)
class Series:
    """One method's mean curve: ``y`` at ``x`` (mean perturbed tokens of each level, or the point number)."""

    method: str
    x: np.ndarray
    y: np.ndarray


def curve_series(data, metric: str, methods: list[str]) -> list[Series]:
    """The series of ``metric`` for ``methods`` from a ``MetricsData`` (methods without the metric or without
    stored curves are left out). x: the curve's mean levels where every point has one, else 1..K."""
    out = []
    for m in methods:
        info = data.get(m, metric)
        if info is None or info.curve is None:
            continue
        y = np.asarray(info.curve, dtype=np.float64)
        lv = info.curve_levels
        x = np.asarray(lv, dtype=np.float64) if lv is not None and np.isfinite(lv).all() else np.arange(1, len(y) + 1.0)
        keep = np.isfinite(y)
        if keep.any():
            out.append(Series(m, x[keep], y[keep]))
    return out


def legend_text(series: list[Series], width: int) -> Text:
    """"1 rollout  2 attcat ...": each marker and its method, in lines of ``width`` that break between them."""
    lines, line = [], ""
    for k, s in enumerate(series):
        entry = f"{MARKERS[k % len(MARKERS)]} {s.method}"
        if line and len(line) + 2 + len(entry) > width:
            lines.append(line)
            line = ""
        line += ("  " if line else "") + entry
    return Text("\n".join(lines + [line]), no_wrap=True, overflow="ellipsis")


class CurveChart(PlotextPlot):
    """Line chart of per-level curves; call :meth:`show` with the series to draw."""

    DEFAULT_CSS = """
    CurveChart {
        width: 1fr;
        height: 1fr;
        min-height: 8;
    }
    """

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None):
        super().__init__(name=name, id=id, classes=classes)
        self.series: list[Series] = []
        self.metric = ""
        self.x_label = ""

    def show(self, metric: str, series: list[Series], *, x_label: str | None = None) -> None:
        """Draw ``series`` (replacing what was drawn) under the title ``metric``."""
        self.metric = metric
        self.series = list(series)
        self.x_label = x_label or "tokens perturbed (mean over examples)"
        plt = self.plt
        plt.clear_figure()
        if not self.series:
            plt.title(f"{metric}: no per-level curves stored")
        else:
            title = f"{metric}: mean curve over the examples"
            plt.title(title if len(title) <= max(self.size.width, 1) - 2 else metric)
            # the selected method's curve (the first) drawn last: on top of the others where they meet
            for k, s in reversed(list(enumerate(self.series))):
                plt.plot(s.x.tolist(), s.y.tolist(), marker=MARKERS[k % len(MARKERS)])
            plt.xlabel(self.x_label)
        self.refresh()
