"""Reading a whole store once, to refuse a damaged one before it is shown (attr-tui) rather than when the damaged
part is reached: every committed byte of every dataset goes through HDF5's chunk checksums, every index row
through the reader's row checks, every text, metric, head mask and scale statistic through its decoding, and every
example's bytes in each per-example dataset through its digest (format 1.6: data moved inside the file, such as two
chunks swapped, each with its own checksum, is refused).

Memory stays bounded: the flat datasets are read a slice at a time (whole examples' runs, so one example larger
than a slice is read whole). Time grows with the file (the bulk is decompressing the method arrays).

``python -m store.verify STORE`` (:func:`main`, started by :func:`command`) runs it in a process of its own: attr-tui
checks a large store so, beside the app, whose reads then neither wait for the check's (HDF5 and the reader hold
one lock per process) nor share its CPU time (the child runs niced).
"""

from __future__ import annotations

import os
import sys

import numpy as np

from . import schema
from .errors import StoreError
from .integrity import damaged, one_line
from .reader import Store, open_store

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
        if d.path in s._digest_col:
            _check_runs(s, d, need, step)
        else:  # a store without digests (before 1.6)
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
            s.check_metric_digest(m, name)
            s.metric_values(m, name)
            s.metric_info(m, name)
    if n:  # the last example whole: the path every consumer takes first
        ex = s[n - 1]
        _ = ex.tokens, ex.task_info, ex.evidence
        if s.generation:
            _ = ex.step_probs, ex.step_outputs, ex.step_foil_tokens, ex.step_foil_probs
        for m in s.methods:
            ex.view_arrays(m), ex.class_scores(m), ex.step_values(m) if s.generation else ex.example_values(m)



def command(path: str, nice: int = 0) -> list[str]:
    """The command line of a child process that verifies ``path`` (:func:`main`), at ``nice`` more niceness; the
    child imports this very package, whatever the working directory."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = f"import sys; sys.path.insert(0, {root!r}); from store.verify import main; sys.exit(main())"
    return [sys.executable, "-c", code, "--nice", str(int(nice)), os.fspath(path)]


def main(argv: list[str] | None = None) -> int:
    """``python -m store.verify [--nice N] STORE``: verify STORE; exit 0, or 1 with the one-line error on stdout."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m store.verify", description=main.__doc__)
    ap.add_argument("store")
    ap.add_argument("--nice", type=int, default=0, help="lower this process's priority by N (a background check)")
    args = ap.parse_args(argv)
    if args.nice > 0:
        os.nice(args.nice)
    try:
        with open_store(args.store) as s:
            verify(s)
    except StoreError as err:
        print(one_line(err, 10_000))
        return 1
    except Exception as err:  # noqa: BLE001 - any failure is the verdict, in one line
        print(one_line(f"cannot read '{args.store}': {type(err).__name__}: {err}", 10_000))
        return 1
    return 0


def _check_runs(s: Store, d: schema.Flat, need: int, step: int) -> None:
    """Read dataset ``d`` whole, consecutive examples' runs at once (about ``step`` rows, one example at least), each
    run checked against its digest; the runs must tile the dataset's committed rows [0, need)."""
    end = 0
    for lo in range(0, len(s), ROWS):
        rows = s.index_rows(lo, min(lo + ROWS, len(s)))
        starts, counts = d.example_rows(rows, lo, _token_strings(s, rows) if d.per == "token_string_bytes" else None)
        ends = starts + counts
        if starts[0] != end or (starts[1:] != ends[:-1]).any() or (counts < 0).any():
            raise damaged(s.path, f"/{d.path}", f"the examples {lo}-{lo + len(rows) - 1} do not lie one after the "
                                                "other in it")
        a = 0
        while a < len(rows):
            b = max(a + 1, int(np.searchsorted(ends, starts[a] + step, side="right")))
            values = s._read(d.path, slice(int(starts[a]), int(ends[b - 1])),
                             int(ends[b - 1] - starts[a]) * (d.width or 1))
            s.check_digests(d.path, lo + a, counts[a:b], values)
            a = b
        end = int(ends[-1])
    if end != need:
        raise damaged(s.path, f"/{d.path}", f"its examples end at {end} of its {need} committed entries")


def _token_strings(s: Store, rows) -> tuple[np.ndarray, np.ndarray]:
    """The (start, count) of each example's bytes in /tokens/strings, from its tokens' offsets and lengths."""
    t0 = int(rows["tok_off"][0])
    t1 = int(rows["tok_off"][-1]) + int(rows["n_tokens"][-1])
    off = s._read(schema.TOKEN_STR_OFF, slice(t0, t1), t1 - t0).astype(np.int64)
    ln = s._read(schema.TOKEN_STR_LEN, slice(t0, t1), t1 - t0)
    first = rows["tok_off"] - t0
    last = first + rows["n_tokens"] - 1
    return off[first], off[last] + ln[last] - off[first]


if __name__ == "__main__":
    sys.exit(main())
