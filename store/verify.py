"""Reading a whole store once, to refuse a damaged one before it is shown (attr-tui) rather than when the damaged
part is reached: every committed byte of every dataset goes through HDF5's chunk checksums, every index row
through the reader's row checks, every text, metric, head mask and scale statistic through its decoding.

Memory stays bounded: the flat datasets are read a slice at a time. Time grows with the file (the bulk is
decompressing the method arrays).
"""

from __future__ import annotations

from .reader import Store

SLICE_VALUES = 1 << 22  # values per read of a flat dataset (16 MB of float32)
ROWS = 8192  # index rows (and their texts) per step


def verify(s: Store, progress=None, slice_values: int = SLICE_VALUES) -> None:
    """Read everything committed in ``s``; StoreError (one line, naming the part) on the first damage.
    ``progress(done, total)``: called after each dataset; ``slice_values``: values per read (smaller reads hold
    h5py's global lock for less time, which matters beside an app's readers)."""
    _ = s.config, s.summary, s.model_info
    n = len(s)
    for lo in range(0, n, ROWS):
        hi = min(lo + ROWS, n)
        s.index_rows(lo, hi)  # checked block by block
        s.ids_range(lo, hi), s.texts_range(lo, hi), s.pairs_range(lo, hi)
    flats = list(s._flats)
    for k, d in enumerate(flats):
        need = d.length(s._extent)
        step = max(1, slice_values // (d.width or 1))
        for a in range(0, need, step):
            b = min(a + step, need)
            s._read(d.path, slice(a, b), (b - a) * (d.width or 1))
        if progress is not None:
            progress(k + 1, len(flats))
    for m in s.methods:
        s.method_info(m)
        s.scale_stats(m)
    for name in s.head_masks:
        s.head_mask(name)
    for m in s.metric_methods:
        for name in s.metric_names(m):
            s.metric_values(m, name)
            s.metric_info(m, name)
    if n:  # the last example whole: the path every consumer takes first
        ex = s[n - 1]
        _ = ex.tokens, ex.task_info, ex.evidence
        for m in s.methods:
            ex.scores(m), ex.layer_scores(m), ex.matrices(m), ex.class_scores(m), ex.example_values(m)

