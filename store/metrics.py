"""Adding faithfulness metrics to a finished store, in place and crash-safe (/metric_records, store/schema.py)."""

from __future__ import annotations

import h5py

from . import schema
from .copying import rewrite
from .errors import StoreError
from .h5 import append_metric_records, written
from .integrity import open_for_writing
from .records import MetricData


def add_metrics(path: str, metrics: list[MetricData]) -> None:
    """Add metrics to a store that no writer holds (after attr-compute closed it), in place: each becomes a record
    in /metric_records (values [N], optional curves / levels [N, K], settings and summary), and a later record of
    the same method and metric replaces an earlier one for readers.

    Crash-safe without a copy: the file is switched to SWMR writing, which only appends and keeps the file readable
    at every moment; the numbers are appended and flushed first, the record rows last, so a run killed at any point
    leaves every earlier metric readable and either all or none of a new one. (A store without /metric_records, made
    before format 1.3, or one left open for write by a killed run, is first rewritten once through a checked copy.)"""
    if not metrics:
        return
    for m in metrics:
        for name in (m.method, m.name):
            if len(name.encode("utf-8")) > schema.NAME_BYTES:
                raise StoreError(f"metric name '{name}' is longer than {schema.NAME_BYTES} bytes")
    try:
        f = open_for_writing(path, swmr=True)
    except OSError:
        f = None  # still marked open for write by a killed writer: rewrite it below
    if f is None or schema.METRIC_ROWS not in f:
        if f is not None:
            f.close()
        rewrite(path)
        f = open_for_writing(path, swmr=True)
    with written(f, path, "its examples and earlier metrics are kept"):  # SWMR appends: a failure cuts none of them
        append_metric_records(f, metrics)


