"""Widgets of the browse screen and of the heads screen (HeadGrid)."""

from .example_list import ExampleList
from .example_view import ColorBarView, InfoPanel, MethodBar, TextPanel, TokenView
from .heads import HeadGrid

__all__ = ["ExampleList", "InfoPanel", "MethodBar", "ColorBarView", "TextPanel", "TokenView", "HeadGrid"]
