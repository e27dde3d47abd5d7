"""The example list's view: which examples it shows and in which order (sort, filter) and the text-search matches.

The App owns one :class:`ListView`. A question that needs a pass over the store (index columns for a filter or sort,
a metric's values, two methods' disagreement, a text search) runs on a thread worker through :meth:`ListView.ask`,
which shows its progress in the list header, can be cancelled (escape), and caches its answer per store size.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from . import finding


class ListView:
    def __init__(self, app):
        self.app = app
        self.cache = finding.Cache()
        self.key: np.ndarray | None = None  # sort key per store row
        self.key_name = ""
        self.metric: tuple[str, str] | None = None  # (method, metric) when the key is a per-example metric
        self.column = ""  # the head of the list's value column when it shows the key itself (disagreement)
        self.descending = False
        self.filter = finding.Filter()
        self.matches: np.ndarray | None = None  # store rows matching the last search
        self.query = ""
        self.cancel: threading.Event | None = None  # set while a pass runs

    # ---------------------------------------------------------------- passes over the store, on workers
    def ask(self, key, what: str, compute: Callable, done: Callable) -> None:
        """``done(result)`` on the UI thread with ``compute(store, progress, cancel)``'s result, from the cache when it
        was asked before at this store size."""
        n = self.app.example_list.store_rows
        hit = self.cache.get(n, key)
        if hit is not None:
            done(hit)
            return
        if self.cancel is not None:
            self.cancel.set()  # one pass at a time: the newer question wins
        cancel = self.cancel = threading.Event()
        lst = self.app.example_list
        lst.set_note(f"{what}… (esc cancels)")

        def progress(k: int, total: int) -> None:
            self.app.call_from_thread(lst.set_note, f"{what}… {100 * k // max(total, 1)}% (esc cancels)")

        def work() -> None:
            try:
                with self.app.store_lock:
                    result = compute(self.app.store, progress, cancel)
            except finding.Cancelled:
                self.app.call_from_thread(self._cancelled, what)
                return
            except Exception as err:  # a damaged store: one line, the view unchanged
                self.app.call_from_thread(self._failed, what, str(err))
                return
            self.app.call_from_thread(self._finished, key, n, result, done, cancel)

        self.app.run_worker(work, thread=True, group="finding", name=what)

    def _finished(self, key, n, result, done, cancel) -> None:
        self.cache.put(n, key, result)
        if cancel is self.cancel:
            self.cancel = None
        done(result)

    def _cancelled(self, what: str) -> None:
        self.cancel = None
        self.app.notify(f"{what}: cancelled", markup=False)
        self.show()

    def _failed(self, what: str, error: str) -> None:
        self.cancel = None
        self.app.notify(f"{what} failed: {error}", severity="error", markup=False)
        self.show()

    def stop(self) -> bool:
        """Cancel a running pass; False when none runs."""
        if self.cancel is None:
            return False
        self.cancel.set()
        return True

    # ---------------------------------------------------------------- the view
    def columns(self, then: Callable) -> None:
        self.ask("columns", "reading labels and lengths", finding.index_columns, then)

    def sort_by_column(self, column: str, descending: bool) -> None:
        def then(cols):
            key = cols[column].astype(np.float64)
            self._set_key(key, column, descending)

        self.columns(then)

    def sort_by_metric(self, method: str, name: str, descending: bool) -> None:
        self.ask(("metric", method, name), f"reading {name} of {method}",
                 lambda store, progress, cancel: np.asarray(store.metric_values(method, name), np.float64),
                 lambda values: self._set_key(values, f"{name} ({method})", descending, (method, name)))

    def sort_by_disagreement(self, a: str, b: str) -> None:
        meta = self.app.meta
        step = self.app.step if meta is not None and meta.generation else None  # a generation store's: at the step
        at = "" if step is None else f" at step {step + 1}"
        self.ask(("disagreement", a, b, step), f"ranking {a} against {b}{at}",
                 lambda store, progress, cancel: finding.disagreement(store, a, b, progress, cancel, step),
                 lambda d: self._set_key(d, f"1-ρ({a}, {b}){at}", True, column="1-ρ"))

    def sort_by_store_order(self) -> None:
        self._set_key(None, "", False)

    def _set_key(self, key, name: str, descending: bool, metric: tuple[str, str] | None = None,
                 column: str = "") -> None:
        """``column``: the list shows ``key`` itself in its value column under that head (a key that is no column
        of the list and no stored metric)."""
        self.key, self.key_name, self.descending, self.metric, self.column = key, name, descending, metric, column
        self.app.sync_list_metric()  # a metric sort shows that metric in the list's column, a disagreement sort 1-ρ
        self.show()

    def set_filter(self, f: finding.Filter) -> None:
        self.filter = f
        self.show()

    def reset(self) -> None:
        self.key, self.key_name, self.filter, self.matches, self.query = None, "", finding.Filter(), None, ""
        self.metric, self.column = None, ""
        self.app.sync_list_metric()
        self.show()

    def show(self) -> None:
        """Apply the sort and filter to the list (reads the index columns first when a filter needs them)."""
        lst = self.app.example_list
        if self.filter == finding.Filter():
            mask = None
        else:
            cols = self.cache.get(lst.store_rows, "columns")
            if cols is None:
                self.columns(lambda _cols: self.show())
                return
            mask = self.filter.mask(cols)
        if self.key is None and mask is None:
            lst.set_order(None, self._note(lst.store_rows))
            return
        rows = finding.order(self.key if self.key is not None and len(self.key) == lst.store_rows else None,
                             mask if mask is not None else np.ones(lst.store_rows, bool), self.descending)
        lst.set_order(rows, self._note(len(rows)))

    def _note(self, shown: int) -> str:
        lst = self.app.example_list
        parts = []
        if self.key_name:
            parts.append(f"{self.key_name} {'↓' if self.descending else '↑'}")
        described = self.filter.describe(self.app.meta.labels if self.app.meta else {})
        if described:
            parts.append(f"{described}: {shown} of {lst.store_rows}")
        if self.matches is not None:
            parts.append(f"/{self.query}: {len(self.matches)}")
        return " · ".join(parts)

    # ---------------------------------------------------------------- text search
    def search(self, query: str) -> None:
        q = query.strip()
        if not q:
            self.matches, self.query = None, ""
            self.show()
            return

        def then(rows):
            self.matches, self.query = rows, q
            self.show()
            self.next_match(1, from_current=True)

        self.ask(("search", q.casefold()), f"searching '{q}'",
                 lambda store, progress, cancel: finding.text_matches(store, q, progress, cancel), then)

    def next_match(self, step: int, from_current: bool = False) -> None:
        """Move to the next (step 1) or previous (-1) match in the list's order, wrapping around."""
        lst = self.app.example_list
        if self.matches is None or not len(self.matches):
            self.app.notify("no match" if self.matches is not None else "no search: / searches the texts",
                            markup=False)
            return
        positions = lst.positions_of(self.matches)
        if not len(positions):
            self.app.notify("no match in this view", markup=False)
            return
        positions = np.sort(positions)
        cur = lst.cursor
        if from_current:
            ahead = positions[positions >= cur]
        else:
            ahead = positions[positions > cur] if step > 0 else positions[positions < cur]
        if step > 0:
            target = ahead[0] if len(ahead) else positions[0]
        else:
            target = ahead[-1] if len(ahead) else positions[-1]
        lst.move_to(int(target))
