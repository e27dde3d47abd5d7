"""One layout per change: a mixin for the browse screen's panels whose height follows their content.

Textual 8.2 (pinned) places a widget whose size changed in a layout and then sets its new virtual size as a
reactive that asks for a second layout of the whole screen, which places nothing anew: the first already did. On the
100k benchmark store that second layout was a third of "next example" (issue 38). A size change that moves other
widgets is a layout already under way; a scroll bar that appears or goes is a reactive of its own and still asks.

The panels drawn by the line API (rendered_lines.py) ask for a layout only when their number of lines changes:
Static.update laid the whole screen out at every update, and the next example (another text, label, strip of the
same height) moved nothing."""

from __future__ import annotations


class PlacedOnce:
    """A panel that does not ask for a second layout when the first changed its size (its virtual size)."""

    def _size_updated(self, size, virtual_size, container_size, layout: bool = True) -> bool:
        return super()._size_updated(size, virtual_size, container_size, layout=False)


class ScrollSizedOnce:
    """For a line-API scrolling pane (a ScrollView: the example list, the token view): its scroll bars updated when
    its size or its own virtual size changed, not at every layout of the screen. Textual 8.2 compares the virtual
    size the layout computes for a ScrollView (its region's, which such a pane never takes) with the pane's own, finds
    them different at every layout, and repaints the pane's scroll bars: the example list's 22 lines at each j whose
    example changed a panel's height (issue 38)."""

    _sized_as: tuple | None = None  # (size, own virtual size, container size) of the last update

    def _size_updated(self, size, virtual_size, container_size, layout: bool = True) -> bool:
        key = (size, self.virtual_size, container_size)
        if key == self._sized_as:
            return False  # nothing to send a Resize for either: neither its size nor its container's changed
        self._sized_as = key
        return super()._size_updated(size, virtual_size, container_size, layout=layout)
