"""The footer of every screen: Textual's, compact on narrow terminals so that every shown key fits 80 columns, and
without the memory that Textual's footer keeps on every change of screen.

Textual 8.2's Footer rebuilds its keys each time the bindings change (every screen switch) and binds each new key's
``compact`` to the footer with a watcher on the footer; the watchers of removed keys are dropped only when
``compact`` next changes, so the removed keys stayed alive (20 widgets, about 1 MB, per open and close of a
screen). :meth:`FittedFooter.compose` drops them before building the new keys."""

from __future__ import annotations

from textual.widgets import Footer

COMPACT_BELOW = 90  # columns: below this the footer drops its spacing


class FittedFooter(Footer):
    def compose(self):
        self._drop_closed_watchers()
        yield from super().compose()

    def _drop_closed_watchers(self) -> None:
        for watchers in getattr(self, "__watchers", {}).values():
            watchers[:] = [(node, callback) for node, callback in watchers
                           if not (getattr(node, "_closing", False) or getattr(node, "_closed", False))]

    def on_mount(self) -> None:
        self._fit()

    def on_resize(self, event) -> None:
        self._fit()

    def _fit(self) -> None:
        self.compact = self.app.size.width < COMPACT_BELOW
        # ^p stays bound (the help screen lists it); its footer entry makes room for the screen's keys
        self.show_command_palette = not self.compact
