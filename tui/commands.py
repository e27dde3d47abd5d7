"""Command palette (ctrl+p): only commands that make sense for the current state (method, layers, examples)."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.content import Content
from textual.markup import escape

from .render import printable

_MAX_ID_HITS = 20


class BrowseCommands(Provider):
    """Switch method, jump to a layer or the final view, go to an example by id, toggle glyphs."""

    def _commands(self) -> list[tuple[str, object, str]]:
        app = self.app
        meta = app.meta
        if meta is None:
            return []
        out = []
        for i, m in enumerate(meta.methods):
            if i != app.method_index:
                kind = "signed" if m.signed else "non-negative"
                help_text = f"{kind}; {printable(m.description)}" if m.description else kind
                out.append((f"method: {printable(m.name)}", partial(app.set_method, i), help_text))
        info = app.method
        if info is not None and info.n_layer_views:
            if app.layer is not None:
                out.append(("layer: final", partial(app.set_layer, None), "the method's final scores"))
            for layer in range(info.n_layer_views):
                if layer != app.layer:
                    out.append((f"layer: {layer + 1}/{info.n_layer_views}", partial(app.set_layer, layer),
                                f"{printable(info.name)}, layer view {layer + 1}"))
        if app.color_mode != "mono":
            out.append(("glyphs: " + ("off" if app.glyphs else "on"), app.action_toggle_glyphs,
                        "sign marks and the ' ░▒▓█' ramp before every token"))
        return out

    async def discover(self) -> Hits:
        for text, command, help_text in self._commands():
            yield DiscoveryHit(Content(text), command, text=text, help=escape(help_text))

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for text, command, help_text in self._commands():
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, matcher.highlight(text), command, text=text, help=escape(help_text))
        ids = self.app.example_list.ids
        q = query.strip()
        if not q or not ids:
            return
        found = 0
        for i, ex_id in enumerate(ids):  # a plain scan: 100k ids take a few milliseconds
            if q in ex_id:
                text = f"example: {printable(ex_id)}"
                go = partial(self.app.example_list.move_to, i)
                yield Hit(0.9 if ex_id == q else 0.5, Content(text), go, text=text, help=f"example {i + 1}")
                found += 1
                if found >= _MAX_ID_HITS:
                    return
