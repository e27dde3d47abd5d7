"""Stopping a run when asked: SIGINT (Ctrl-C) and SIGTERM set a flag that the work checks at safe points.

Raised wherever the signal lands, a KeyboardInterrupt can be swallowed (inside a weakref callback or a __del__, which
h5py and torch run all the time) or cut a store commit in half. So the first signal only records the request, and
``check()`` raises :class:`Interrupted` at the next safe point: between batches and windows, between chunks of
integrated gradients, ALTI blocks, LRP layers and metric batches, and at every encoder layer of every forward pass
(``layer_checks``: a forward pre-hook, so it never raises inside autograd's backward). A second signal raises at
once, except inside ``critical()`` (a store commit), where it waits for the next check. Around a run a command
installs the handler with ``defer=False`` (a signal raises where it lands, as Python's own would), so that a stop
while the finished run's summary is printed is still one line that says what was kept, and SIGTERM never kills the
process without a word.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)

_pending: list[int] = []  # signals received and not yet acted on
_state = {"installed": False, "critical": 0, "deferred": 0}


class Interrupted(KeyboardInterrupt):
    """A stop asked for by SIGINT/SIGTERM. ``str()`` is the one line for the user (set by whoever knows the store)."""


def check() -> None:
    """Raise :class:`Interrupted` if a stop was asked for."""
    if _pending:
        raise Interrupted()


def _handler(signum, frame):
    _pending.append(signum)
    if _state["critical"]:
        return
    if len(_pending) > 1 or not _state["deferred"]:
        raise Interrupted()  # the second signal, or any outside a deferring section: at once


@contextmanager
def on_signals(defer: bool = True):
    """Install the handler for SIGINT and SIGTERM (main thread only; nested uses share the outer one). Inside a
    ``defer`` section the first signal waits for the next ``check()``; elsewhere it raises at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outer = not _state["installed"]
    if outer:
        _pending.clear()
        before = {sig: signal.signal(sig, _handler) for sig in SIGNALS}
        _state["installed"] = True
    _state["deferred"] += defer
    try:
        yield
    finally:
        _state["deferred"] -= defer
        if outer:
            for sig, old in before.items():
                signal.signal(sig, old)
            _state["installed"] = False
            _pending.clear()


@contextmanager
def critical():
    """A section a signal must not cut (a store commit, closing the store): inside it even a second signal only
    records the request, which the next ``check()`` acts on."""
    _state["critical"] += 1
    try:
        yield
    finally:
        _state["critical"] -= 1


def _pre_hook(_module, _args):
    check()


@contextmanager
def layer_checks(layers):
    """``check()`` before every forward of each module in ``layers`` (the encoder layers), for the duration. A copy of
    a model made meanwhile (the LRP methods' float64 twin) keeps the hooks; outside ``on_signals`` they do nothing."""
    handles = [layer.register_forward_pre_hook(_pre_hook) for layer in layers]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
