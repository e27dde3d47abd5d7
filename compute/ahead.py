"""Items of an iterator made ahead on a worker thread, so that the consumer (the run's loop, waiting on the GPU) finds
the next one ready: the run tokenises its next window while the model computes the current one."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


def ahead(items: Iterator[T], depth: int = 1, name: str = "attrscope-ahead") -> Iterator[T]:
    """The items of ``items`` in order, each made on a worker thread while the consumer works on the ones before,
    at most ``depth`` waiting. An error of the worker is raised in the consumer where its item would have come.
    When the consumer stops early (an error, an interrupt, ``close()``), the worker stops after its current item."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def work() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                q.put(item)
        except BaseException as err:  # noqa: BLE001 - handed to the consumer
            q.put(_Failed(err))
            return
        q.put(_DONE)

    thread = threading.Thread(target=work, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # take what the worker still puts, so that it is never stuck on a full queue
            try:
                q.get(timeout=0.05)
            except queue.Empty:
                pass
