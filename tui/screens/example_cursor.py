"""What the screens of one example share (compare, matrix, attention, generation, head matrix): j / k through the
list's examples, the cursor over a heatmap's drawn blocks, and the reads they make on workers (the example, the
store-wide scale of a method)."""

from __future__ import annotations

from textual import work

from ..data import LoadedExample, read_example


class ExampleCursor:
    """Mixin of a screen that shows example ``self.index``: j / k move it in the list's order (a sort or filter
    included) and the browse screen follows; the screen then shows the new one with its ``show_example()``. A
    screen that reads the example with :meth:`_read_example` draws it in its ``example_read(ex)``; one that reads
    the global scale with :meth:`_read_global` has ``method``, ``global_scale`` and ``_draw()``."""

    index: int

    def action_example(self, step: int) -> None:
        lst = self.app.example_list
        self.index = lst.step_row(self.index, step)  # in the list's order (a sort or filter included)
        lst.move_to_row(self.index)  # the browse screen follows
        self.show_example()

    def block_step(self) -> tuple[int, int]:
        """Token rows and columns per drawn cell of the last draw's heatmap (1, 1 before any)."""
        geometry = getattr(self, "geometry", None)
        return (geometry.fr, geometry.fc) if geometry is not None else (1, 1)

    # ---------------------------------------------------------------- reads (on workers)
    @work(thread=True, exclusive=True, group="example", name="read example")
    def _read_example(self, index: int) -> None:
        """Example ``index`` with every method's scores, then :meth:`_example_read` on the UI thread."""
        app = self.app
        try:
            with app.store_lock:
                ex = read_example(app.store, index, tuple(m.name for m in app.meta.methods))
        except Exception as err:  # a damaged store: say so, keep the screen
            app.call_from_thread(self.notify, f"could not read example {index + 1}: {err}", severity="error",
                                 markup=False)
            return
        app.call_from_thread(self._example_read, ex)

    def _example_read(self, ex: LoadedExample) -> None:
        self.app.cache.put(ex.index, ex)
        if ex.index == self.index:
            self.example_read(ex)

    ANNOUNCE_GLOBAL = False  # say that the store-wide scale is being computed (a pass over the store)

    @work(thread=True, exclusive=True, group="global scale", name="global scale")
    def _read_global(self, method: str) -> None:
        """The store's scale statistics of ``method`` (the writer's, or one pass computed and kept), then
        ``self.global_scale`` and a draw when the screen still shows that method."""
        app = self.app
        if self.ANNOUNCE_GLOBAL:
            app.call_from_thread(self.notify, f"computing the global scale of {method} (once)…", markup=False)
        try:
            with app.store_lock:
                stats = app.store.scale_stats(method, compute=True)
        except Exception as err:
            app.call_from_thread(self.notify, f"could not compute the global scale: {err}", severity="error",
                                 markup=False)
            return
        app.call_from_thread(self._global_loaded, method, stats)

    def _global_loaded(self, method: str, stats) -> None:
        if method == self.method:
            self.global_scale = stats
            self._draw()
