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
    _shown: tuple | None = None  # what the keys were last built from (_keys_shown)
    _building = False  # a build is scheduled: it reads the bindings when it runs

    def compose(self):
        self._building = False
        self._drop_closed_watchers()
        self._shown = self._keys_shown() if self._bindings_ready else None
        yield from super().compose()

    def bindings_changed(self, screen) -> None:
        """Footer.bindings_changed, but the keys are built again only when what they show changed, and once for
        changes that come together: Textual rebuilt all of them (20 widgets) at each refresh_bindings, four times
        while attr-tui opens."""
        self._bindings_ready = True
        if not screen.app.app_focus or not (self.is_attached and screen is self.screen):
            return
        if not getattr(screen, "bindings_settled", True):
            return  # keys that wait for the store's header: built once it has come (it refreshes the bindings)
        if self._building or self._keys_shown() == self._shown:
            return
        self._building = True
        self.call_after_refresh(self.recompose)

    def _keys_shown(self) -> tuple:
        """What the keys are built from (Footer.compose): each shown binding, whether it is enabled, its tooltip;
        the palette's key; the footer's own settings."""
        keys = tuple((b.key, b.key_display, b.description, b.action, b.group, enabled, tooltip)
                     for _, b, enabled, tooltip in self.screen.active_bindings.values()
                     if b.show or b.action == "command_palette")
        return keys, self.compact, self.show_command_palette

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
