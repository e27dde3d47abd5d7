"""The tokens of the current view, coloured, in a scrollable pane that draws only the lines it shows.

A line-API widget (like the example list): the lines' breaks come from the cells' widths (TokenLayout.breaks), and
a line is drawn when it is on screen, so a 4,096-token example opens and scrolls at the cost of the lines shown
(as a Static in a scroll container every line was drawn, and drawn again to measure the Static's height)."""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from ..render.tokens import TokenLayout
from .laid_out_once import ScrollSizedOnce
from .paint_style import PaintStyle

_DIM = Style(dim=True)


class TokenView(PaintStyle, ScrollSizedOnce, ScrollView):
    """Scrollable token text (tab focuses it; arrows then scroll)."""

    DEFAULT_CSS = """
    TokenView { height: 1fr; border-top: solid $primary 40%; overflow-x: hidden; overflow-y: auto; }
    """

    layout_data: TokenLayout | None = None  # the tokens shown (None: a message)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._message = Text("")
        self._lines: list[tuple[int, int]] = []  # the cells of each line of tokens
        self._message_lines: list[Text] = []  # or the message's lines
        self._strips: dict[int, Strip] = {}  # the lines drawn for the current content, width and style
        self._strip_style = None

    def show_tokens(self, layout: TokenLayout) -> None:
        self.layout_data, self._message = layout, None
        self._wrap()

    def show_message(self, message: str) -> None:
        self.layout_data, self._message = None, Text(message, style=_DIM)
        self._wrap()

    def on_resize(self, event: events.Resize) -> None:
        self._wrap(resized=True)

    def _wrap(self, resized: bool = False) -> None:
        """The lines at the pane's width (narrower by the scroll bar when they overflow its height); a new virtual
        size only when the line count or width changed (no layout of the screen otherwise). ``resized``: the same
        content in a pane of another size, drawn again only when its lines changed (a layout that only moved the pane,
        as another example's panels above it do, repainted it a second time, a frame of its own)."""
        before = (self._lines, self._message_lines, self.virtual_size)
        region = self.content_region
        width, height = max(region.width, 1), region.height
        for w in (width, width - self.styles.scrollbar_size_vertical):
            w = max(w, 1)
            if self.layout_data is not None:
                self._lines = self.layout_data.breaks(w)
                count = len(self._lines)
            else:
                self._message_lines = list(self._message.wrap(self.app.console, w))
                count = len(self._message_lines)
            if count <= height or w < width:
                break
        if resized and before == (self._lines, self._message_lines, Size(w, count)):
            return
        self._strips.clear()
        self._set_virtual_size(Size(w, count))
        self.refresh()

    def _set_virtual_size(self, size: Size) -> None:
        """The scrollable size without a layout of the screen (the reactive asks for one at each change: another
        example's line count): the pane's own size does not change, only a scroll bar that appears or goes moves
        its lines, and that change asks for its layout itself (Widget._refresh_scrollbars)."""
        if size != self.virtual_size:
            self.set_reactive(TokenView.virtual_size, size)
            self._scroll_update(size)

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        style = self.paint_style
        if style != self._strip_style:  # another theme, or focus: drawn again
            self._strips.clear()
            self._strip_style = style
        i = int(self.scroll_offset.y) + y
        strip = self._strips.get(i)
        if strip is not None:
            return strip
        count = len(self._lines) if self.layout_data is not None else len(self._message_lines)
        if i >= count:
            return Strip.blank(width, style.background_style)  # as the scroll container below a Static
        if self.layout_data is not None:
            text = self.layout_data.line(*self._lines[i])
        else:
            text = self._message_lines[i]
        segments = list(Segment.split_and_crop_lines(text.render(self.app.console), width, include_new_lines=False,
                                                     pad=False))
        strip = Strip(segments[0] if segments else []).apply_style(style)
        self._strips[i] = strip
        return strip
