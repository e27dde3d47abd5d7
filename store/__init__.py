"""attrscope store: the HDF5 contract between compute and the TUI. Imports only numpy and h5py.

Modules: schema (the layout, the one place that knows it), records (what a writer is given), writer (create,
append, close), copying (resume, rewrite, merge), metrics (metrics added in place), reader (open_store, Store,
Example), verify (read a whole store once), digests (each example's CRC-32 per dataset), table (tabular views),
scale (view statistics), integrity (safe opening), attrs, h5 (low-level writing), lock (one writer per store).

The names below are imported from their modules when first used: a reader (attr-tui) does not pay for the writing
modules' imports.
"""

from __future__ import annotations

import importlib

# Eager: the submodule's own name is the function's, and importing ``store.verify`` first (as the TUI does) would
# otherwise leave ``from store import verify`` the module. It needs only the reader, which every user imports.
from .verify import verify

# name -> the module that defines it
_EXPORTS = {
    "open_store": "reader", "Store": "reader", "Example": "reader", "HeadMask": "reader",
    "StoreError": "errors",
    "StoreWriter": "writer",
    "ExampleData": "records", "MethodLayout": "records", "HeadMaskData": "records", "MetricData": "records",
    "add_metrics": "metrics",
    "merge": "copying", "resume": "copying",
    "ENCODING_VERSION": "schema",
}

__all__ = [*_EXPORTS, "verify"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'store' has no attribute '{name}'")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
