"""Widgets of the browse screen, of the heads screen (HeadGrid) and of the metrics screen (MetricTable)."""

from .example_list import ExampleList
from .example_view import ColorBarView, InfoPanel, MethodBar, TextPanel, TokenView
from .heads import HeadGrid
from .metrics import MetricTable

__all__ = ["ExampleList", "InfoPanel", "MethodBar", "ColorBarView", "TextPanel", "TokenView", "HeadGrid",
           "MetricTable"]
