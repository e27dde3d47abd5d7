"""The base style of a line-API widget, looked up once per paint instead of once per line.

Widget.rich_style walks the widget's ancestors and their CSS rules; asked in render_line it was most of a paint of
the browse screen's line-API panes (the layer strip's seven lines: 2.2 ms, a third of it that lookup; issue 38)."""

from __future__ import annotations


class PaintStyle:
    _paint_style = None  # the widget's rich_style during the paint under way

    def render_lines(self, crop):
        self._paint_style = self.rich_style
        try:
            return super().render_lines(crop)
        finally:
            self._paint_style = None

    @property
    def paint_style(self):
        """The widget's rich_style, as looked up for the paint under way (outside a paint: looked up now)."""
        style = self._paint_style
        return self.rich_style if style is None else style
