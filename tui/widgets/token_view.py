"""The tokens of the current view, coloured, in a scrollable pane."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from ..render.tokens import TokenLayout
from .laid_out_once import LaidOutOnce

_DIM = Style(dim=True)


class _TokenText(LaidOutOnce, Static):
    pass


class TokenView(LaidOutOnce, VerticalScroll):
    """Scrollable token text (tab focuses it; arrows then scroll)."""

    DEFAULT_CSS = """
    TokenView { height: 1fr; border-top: solid $primary 40%; }
    TokenView > Static { width: 100%; }
    """

    def compose(self):
        yield _TokenText(id="token-text")

    @property
    def body(self) -> Static:
        return self.query_one("#token-text", Static)

    def show_tokens(self, layout: TokenLayout) -> None:
        self.layout_data = layout
        self.body.update(layout)

    def show_message(self, message: str) -> None:
        self.layout_data = None
        self.body.update(Text(message, style=_DIM))
