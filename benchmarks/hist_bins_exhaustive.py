"""Every float32 value (all 2**32 bit patterns: both signs, zeros, subnormals, infinities, NaNs) through
``store.scale.hist_bins`` (a table lookup) and through the formula that defines the bins (``_bins_by_formula``:
floor of 8 log10|x| in float64): they must agree everywhere. Stored views are float32 or float16 and the scale
statistics count them as read, so this covers every value a store's histogram can see. Takes a few minutes.

    python benchmarks/hist_bins_exhaustive.py
"""

from __future__ import annotations

import sys
import time

import numpy as np

from store.scale import _bins_by_formula, hist_bins


def main() -> None:
    step = 1 << 24
    t0 = time.perf_counter()
    for start in range(0, 1 << 32, step):
        with np.errstate(invalid="ignore"):  # NaNs
            x = np.arange(start, start + step, dtype=np.uint64).astype(np.uint32).view(np.float32).astype(np.float64)
        got, want = hist_bins(x), _bins_by_formula(x)
        if not np.array_equal(got, want):
            i = int(np.flatnonzero(got != want)[0])
            sys.exit(f"float32 bits {start + i:#010x} ({x[i]!r}): lookup bin {got[i]}, formula bin {want[i]}")
    print(f"all 2**32 float32 values: the lookup's bins equal the formula's ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
