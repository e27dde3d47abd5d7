"""Widgets, one per file: they draw what a screen hands them and never read the store.

Browse screen: the example list, the example's info and text, the method bar, the layer strip, the colour bar and
the token view. Heads screen: the head grid. Metrics screen: the metric table and the curve chart (the other screens'
widgets are imported when first asked for: the app starts on the browse screen)."""

from .color_bar import ColorBarView
from .example_info import InfoPanel, TextPanel
from .example_list import ExampleList
from .layer_strip import LayerStrip
from .method_bar import MethodBar
from .token_view import TokenView

_LATER = {"HeadGrid": "head_grid", "MetricTable": "metric_table"}

__all__ = ["ColorBarView", "ExampleList", "HeadGrid", "InfoPanel", "LayerStrip", "MethodBar", "MetricTable",
           "TextPanel", "TokenView"]


def __getattr__(name: str):
    if name not in _LATER:
        raise AttributeError(f"module 'tui.widgets' has no attribute '{name}'")
    import importlib

    return getattr(importlib.import_module(f".{_LATER[name]}", __name__), name)
