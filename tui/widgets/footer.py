"""The footer of every screen: Textual's, compact on narrow terminals so that every shown key fits 80 columns."""

from __future__ import annotations

from textual.widgets import Footer

COMPACT_BELOW = 90  # columns: below this the footer drops its spacing


class FittedFooter(Footer):
    def on_mount(self) -> None:
        self._fit()

    def on_resize(self, event) -> None:
        self._fit()

    def _fit(self) -> None:
        self.compact = self.app.size.width < COMPACT_BELOW
        # ^p stays bound (the help screen lists it); its footer entry makes room for the screen's keys
        self.show_command_palette = not self.compact
