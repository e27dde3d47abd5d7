"""Command palette (ctrl+p) providers, one or two per screen; each screen names its own in ``COMMANDS`` (the app adds
Textual's system commands). A provider lists what makes sense in the current state of its screen, which it reaches
as ``self.screen`` (this module imports no screen, so screens can import it)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.content import Content
from textual.markup import escape

from .colors import COLORMAPS, NORMALISATION_NAMES, SCALE_TOKEN_NAMES

from .render.metric_table import SORT_MARKS, arrow, higher_is_better, short_name
from .render.tokens import printable

def export_dir_hint(app) -> str:
    from .export import export_directory

    return export_directory(getattr(app.store, "path", None))


class _ListedCommands(Provider):
    """A provider whose commands are a list of (text, callable, help) built for the current state."""

    weight = 1.0  # below 1: its hits rank after equally good ones of the other providers

    def _commands(self) -> list[tuple[str, object, str]]:
        raise NotImplementedError

    async def discover(self) -> Hits:
        for text, command, help_text in self._commands():
            yield DiscoveryHit(Content(text), command, text=text, help=escape(help_text))

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for text, command, help_text in self._commands():
            score = matcher.match(text) * self.weight
            if score > 0:
                yield Hit(score, matcher.highlight(text), command, text=text, help=escape(help_text))


class BrowseCommands(_ListedCommands):
    """The browse screen: method, layer, scale, glyphs, layer strip, compare set, the other screens, export, and an
    example by id or row."""

    def _commands(self) -> list[tuple[str, object, str]]:
        app = self.app
        meta = app.meta
        screen = self.screen
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
        out += colormap_commands(app)
        for norm, what in NORMALISATION_NAMES.items():
            if norm != app.norm:
                out.append((f"scale: {norm}", partial(screen.set_normalisation, norm), f"colours scaled {what} (s)"))
        if info is not None:
            for tokens, what in SCALE_TOKEN_NAMES.items():
                if app.scale_tokens.get(info.name) != tokens:
                    out.append((f"scale: {what}", partial(app.set_scale_tokens, info.name, tokens),
                                "the colour scale set by " + ("every token" if tokens == "all" else
                                                              "the tokens but the special and explained ones") + " (t)"))
        if app.color_mode != "mono":
            out.append(("glyphs: " + ("off" if app.glyphs else "on"), screen.action_toggle_glyphs,
                        "sign marks and the ' ░▒▓█' ramp before every token (g)"))
        if info is not None and info.n_layer_views:
            out.append(("layer strip: " + ("off" if app.show_strip else "on"), screen.action_toggle_strip,
                        "layers × tokens above the tokens (l)"))
        if len(meta.methods) > 1:
            chosen = app.compare_set()
            out.append(("compare: methods side by side", app.action_compare,
                        f"{', '.join(printable(m) for m in chosen)}: aligned, with their rank agreement (c)"))
            for m in meta.methods:
                if m.name in chosen and len(chosen) > 2:
                    out.append((f"compare set: remove {printable(m.name)}", partial(app.set_compare_set,
                                [c for c in chosen if c != m.name]), f"compare {len(chosen) - 1} methods"))
                elif m.name not in chosen and len(chosen) < 6:
                    out.append((f"compare set: add {printable(m.name)}", partial(app.set_compare_set,
                                chosen + [m.name]), f"compare {len(chosen) + 1} methods"))
        if any(m.matrices != "none" for m in meta.methods):
            out.append(("matrix: token-to-token heatmap", app.action_matrix, "the current layer's matrix (x)"))
        chosen = ", ".join(app.compare_methods or ([info.name] if info else []))
        out.append(("export: figure (SVG, LaTeX, HTML)", app.action_export,
                    f"this example with {chosen} into {export_dir_hint(app)} (e)"))
        out.append(("export: screenshot (SVG)", app.deliver_screenshot, f"this screen into {export_dir_hint(app)}"))
        names = ", ".join(printable(n) for n in meta.head_masks) or "none in this store"
        out.append(("heads: head masks", app.action_heads, f"layers × heads grid of the head masks ({names}) (h)"))
        if meta.heads != "none":
            out.append(("attention: every head of this example", app.action_attention,
                        "layers × heads grid of the explained token's attention row (a)"))
        found = app.metrics.methods
        what = (f"{len(found)} method{'s' if len(found) != 1 else ''} × {len(app.metrics.names)} metrics" if found
                else "none in this store")
        out.append(("metrics: faithfulness metrics", app.action_metrics, f"methods × metrics, curves ({what}) (f)"))
        return out

    async def search(self, query: str) -> Hits:
        async for hit in super().search(query):
            yield hit
        q = query.strip()
        kind = None  # a query may be a hit's own text: "example: ID" or "row: N"
        for prefix in ("example:", "row:"):
            if q.casefold().startswith(prefix):
                kind, q = prefix[:-1], q[len(prefix):].strip()
        if not q:
            return
        app = self.app
        row = await asyncio.to_thread(_find_row, app, q) if kind != "row" else None  # never HDF5 on the UI thread
        if row is not None:
            text = f"example: {printable(q)}"
            yield Hit(1.0, Content(text), partial(app.example_list.move_to_row, row), text=text,
                      help=f"example {row + 1}")
        if kind != "example" and q.isdigit() and 1 <= int(q) <= app.example_list.store_rows:
            text = f"row: {int(q)}"
            yield Hit(0.8, Content(text), partial(app.example_list.move_to_row, int(q) - 1), text=text,
                      help=f"the {int(q)}th example of the store")


def colormap_commands(app) -> list[tuple[str, object, str]]:
    """The colormaps not in use (every screen that colours scores offers them)."""
    return [(f"colormap: {name}", partial(app.set_colormap, name), c.description)
            for name, c in COLORMAPS.items() if name != app.colormap]


def _find_row(app, example_id: str) -> int | None:
    """The store row of an example id (the store builds its id table once, on the first search)."""
    try:
        with app.store_lock:
            return app.store.find_id(example_id)
    except Exception:  # noqa: BLE001 - a damaged store: no hit (the browse screen reports damage)
        return None


class HeadsCommands(_ListedCommands):
    """The heads screen: switch to another mask, or close it."""

    def _commands(self) -> list[tuple[str, object, str]]:
        screen = self.screen
        out = []
        for i, m in enumerate(screen.masks or ()):
            if i != screen.current:
                n_layers, n_heads = m.shape
                out.append((f"mask: {printable(m.name)}", partial(screen.set_mask, i),
                            f"{m.n_selected} of {n_layers * n_heads} heads selected"))
        if getattr(self.app.meta, "heads", "none") == "all":  # a store with every head's full matrix
            out.append((f"head matrix: L{screen.cursor_layer + 1} H{screen.cursor_head + 1}",
                        screen.action_head_matrix, "the current example's matrix of the head under the cursor (enter)"))
        out.append(("heads: close", screen.action_close, "back to the examples"))
        return out


class MetricsCommands(_ListedCommands):
    """The metrics screen: sort by another metric, flip the order, go to a method, sort the examples, close it."""

    def _commands(self) -> list[tuple[str, object, str]]:
        screen = self.screen
        out = []
        data = screen.data
        if screen.has_metrics:
            for i, name in enumerate(data.names):
                if i != screen.sort:
                    best = "high → low" if higher_is_better(data, name) else "low → high"
                    out.append((f"sort: {printable(name)}", partial(screen.set_sort, i),
                                f"{short_name(name)} {arrow(higher_is_better(data, name))}, {best} (best first)"))
            other = not screen.descending
            how = f"{SORT_MARKS[other]} {'high → low' if other else 'low → high'} by {short_name(screen.sort_name)}"
            out.append((f"order: {'descending' if other else 'ascending'}", screen.action_toggle_order, how))
            for m in data.methods:
                if m != screen.cursor:
                    n = len(data.of(m))
                    out.append((f"method: {printable(m)}", partial(screen.set_cursor, m),
                                f"its {n} metric{'s' if n != 1 else ''} in the panel"))
            out.append(("examples: sort by this metric", screen.action_sort_examples,
                        f"the example list by {short_name(screen.sort_name)} of {printable(screen.cursor or '')} "
                        "(enter)"))
        out.append(("metrics: close", screen.action_close, "back to the examples"))
        return out


class ViewCommands(_ListedCommands):
    """Sort and filter the example list, search its texts (browse screen only)."""

    weight = 0.7  # "normxlogit" should find the method before "sort: disagreement rollout vs normxlogit"

    def _commands(self) -> list[tuple[str, object, str]]:
        from .finding import Filter

        app = self.app
        meta = app.meta
        if meta is None:
            return []
        view = app.view
        out = []
        for column, what, desc in (("length", "length", True), ("correct", "wrong first", False),
                                   ("label", "label", False), ("pred", "prediction", False)):
            out.append((f"sort: {what}", partial(view.sort_by_column, column, desc), "a pass over the index"))
        info = app.method
        if info is not None:
            for name in app.metrics.names:
                if app.metrics.get(info.name, name) is not None:
                    best_first = app.metrics.get(info.name, name).higher_is_better
                    out.append((f"sort: {printable(name)} of {printable(info.name)}",
                                partial(view.sort_by_metric, info.name, name, best_first),
                                "the per-example metric, best first"))
            for other in meta.methods:
                if other.name != info.name:
                    out.append((f"sort: disagreement {printable(info.name)} vs {printable(other.name)}",
                                partial(view.sort_by_disagreement, info.name, other.name),
                                "1 - Spearman of their scores per example, most different first"))
        out.append(("sort: store order", view.sort_by_store_order, "as attr-compute wrote them"))
        f = view.filter
        out.append(("filter: wrong predictions", partial(view.set_filter, Filter(correct=False)), "label != pred"))
        out.append(("filter: correct predictions", partial(view.set_filter, Filter(correct=True)), "label == pred"))
        for k, name in sorted(meta.labels.items()):
            out.append((f"filter: label {printable(name)}", partial(view.set_filter, replace(f, label=k)), ""))
            out.append((f"filter: prediction {printable(name)}", partial(view.set_filter, replace(f, pred=k)), ""))
        out.append(("filter: truncated", partial(view.set_filter, replace(f, truncated=True)), "cut at --max-length"))
        out.append(("filter: length range…", self.screen.filter_length, "low-high tokens"))
        out.append(("filter: none", partial(view.set_filter, Filter()), "every example"))
        out.append(("search: texts…", self.screen.action_search, "/ then n / N"))
        out.append(("view: reset", view.reset, "store order, no filter, no search (r)"))
        return out


class CompareCommands(_ListedCommands):
    """The compare screen: the compare set, the scale, the difference view, top-k, export, close."""

    def _commands(self) -> list[tuple[str, object, str]]:
        screen, app = self.screen, self.app
        chosen = list(screen.methods)
        out = [("compare: choose methods…", screen.action_choose, "a selection list (a)"),
               ("scale: " + ("per method" if screen.shared else "shared"), screen.action_toggle_shared,
                "one colour scale for every row, or one per method (s)"),
               ("difference: " + ("off" if screen.difference else f"{chosen[0]} − {chosen[1]}"),
                screen.action_toggle_difference, "the first method minus the second, each normalised (d)"),
               (f"top-k: {screen.top + 1}", partial(screen.action_top_k, 1), "more marked tokens (+)"),
               (f"top-k: {max(1, screen.top - 1)}", partial(screen.action_top_k, -1), "fewer marked tokens (-)")]
        for m in app.meta.methods:
            if m.name in chosen and len(chosen) > 2:
                out.append((f"compare set: remove {printable(m.name)}",
                            partial(app.set_compare_set, [c for c in chosen if c != m.name]), ""))
            elif m.name not in chosen and len(chosen) < 6:
                out.append((f"compare set: add {printable(m.name)}", partial(app.set_compare_set, chosen + [m.name]),
                            ""))
        out += colormap_commands(app)
        out.append(("export: figure (SVG, LaTeX, HTML)", screen.action_export,
                    f"these methods into {export_dir_hint(app)} (e)"))
        out.append(("compare: close", screen.action_close, "back to the examples"))
        return out


class AttentionCommands(_ListedCommands):
    """The attention screen: scale, colormap, close."""

    def _commands(self) -> list[tuple[str, object, str]]:
        from .render.attention_grid import NORM_NAMES

        screen = self.screen
        out = [(f"scale: {norm}", partial(screen.set_scale, norm), f"{how} (s cycles)")
               for norm, how in NORM_NAMES.items() if norm != screen.norm]
        out += colormap_commands(self.app)
        if getattr(self.app.meta, "heads", "none") == "all":  # else the store keeps each head's row only
            out.append((f"head matrix: L{screen.cursor_layer + 1} H{screen.cursor_head + 1}",
                        screen.action_head_matrix, "the cursor head's full token-to-token matrix (enter)"))
        out.append(("attention: close", screen.action_close, "back to the examples"))
        return out


class MatrixCommands(_ListedCommands):
    """The matrix screen: layer, method, scale, close."""

    def _commands(self) -> list[tuple[str, object, str]]:
        screen = self.screen
        out = []
        if screen.matrices is not None:
            for layer in range(screen.matrices.shape[0]):
                if layer != screen.view_layer:
                    out.append((f"layer: {layer + 1}/{screen.matrices.shape[0]}", partial(screen.set_layer, layer),
                                ""))
        for m in screen.methods:
            if m != screen.method:
                out.append((f"method: {printable(m)}", partial(screen.set_method, m), "its matrices"))
        for norm in ("layer", "example", "global"):
            if norm != screen.norm:
                out.append((f"scale: {norm}", partial(screen.set_normalisation, norm), "s cycles"))
        out += colormap_commands(self.app)
        out.append(("matrix: close", screen.action_close, "back to the examples"))
        return out
