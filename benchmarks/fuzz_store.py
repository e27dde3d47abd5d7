"""Counts of what the reader does with damaged copies of a store: clean StoreError, identical numbers, wrong
numbers, hang (no answer within the time limit), crash, other exception.

    python benchmarks/fuzz_store.py --copies 300            # a complete store written by this attrscope
    python benchmarks/fuzz_store.py --copies 300 --killed   # a store whose writer was killed (read with SWMR)
    python benchmarks/fuzz_store.py --store old.h5          # any store
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests"), str(Path(__file__).resolve().parents[1])]

from store_fuzz import fuzz, make_target  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds before a read counts as a hang")
    ap.add_argument("--store", help="store to damage [default: a small synthetic one]")
    ap.add_argument("--killed", action="store_true", help="the synthetic store as a killed writer leaves it")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.store or str(Path(tmp) / "target.h5")
        if not args.store:
            make_target(path, complete=not args.killed)
        t0 = time.monotonic()
        report = fuzz(path, args.copies, args.seed, tmp, args.timeout)
        report["seconds"] = round(time.monotonic() - t0, 1)
        report["bytes"] = Path(path).stat().st_size
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
