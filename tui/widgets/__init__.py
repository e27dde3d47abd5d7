"""Widgets of the browse screen."""

from .example_list import ExampleList
from .example_view import ColorBarView, InfoPanel, MethodBar, TextPanel, TokenView

__all__ = ["ExampleList", "InfoPanel", "MethodBar", "ColorBarView", "TextPanel", "TokenView"]
