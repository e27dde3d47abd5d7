"""Widgets, one per file: they draw what a screen hands them and never read the store.

Browse screen: the example list, the example's info and text, the method bar, the layer strip, the colour bar and
the token view. Heads screen: the head grid. Metrics screen: the metric table and the curve chart."""

from .color_bar import ColorBarView
from .example_info import InfoPanel, TextPanel
from .example_list import ExampleList
from .head_grid import HeadGrid
from .layer_strip import LayerStrip
from .method_bar import MethodBar
from .metric_table import MetricTable
from .token_view import TokenView

__all__ = ["ColorBarView", "ExampleList", "HeadGrid", "InfoPanel", "LayerStrip", "MethodBar", "MetricTable",
           "TextPanel", "TokenView"]
