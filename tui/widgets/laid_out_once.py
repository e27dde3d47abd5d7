"""One layout per change: a mixin for the browse screen's panels whose height follows their content.

Textual 8.2 (pinned) places a widget whose size changed in a layout and then sets its new virtual size as a
reactive that asks for a second layout of the whole screen, which places nothing anew: the first already did. On the
100k benchmark store that second layout was a third of "next example" (issue 38). A size change that moves other
widgets is a layout already under way; a scroll bar that appears or goes is a reactive of its own and still asks."""

from __future__ import annotations


class LaidOutOnce:
    def _size_updated(self, size, virtual_size, container_size, layout: bool = True) -> bool:
        return super()._size_updated(size, virtual_size, container_size, layout=False)
