"""attr-compute export in bounded memory: peak RSS of exporting stores of two sizes, and of the whole table at once.

    python benchmarks/export_memory.py                       # 5,000 and 20,000 examples, Parquet and CSV
    python benchmarks/export_memory.py --sizes 5000,100000 --formats parquet --keep-dir DIR

The stores are tui_scale.py's SST-2-like synthetic stores (8-60 tokens, five methods with six layer views each, two
metrics per method), built once. Each measurement runs in a fresh child process (so peaks do not mix) that imports
everything first and reads its peak RSS (VmHWM, Linux) before and after: "export" runs ``export_store`` with
``--layers --metrics`` at the default chunk size; "whole table" builds ``Store.token_table(layers=True)`` of the
whole store in one piece, the memory the export avoids. Bounded means: the export's growth does not follow the
store's size, while the whole table's does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

CHILD = r'''
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
mode, store, out = sys.argv[2], sys.argv[3], sys.argv[4]
import numpy, h5py, pyarrow, pyarrow.parquet, csv  # noqa: F401 - imported before the baseline is read
from compute.export import export_store
from store import open_store

def peak_mb():  # VmHWM: this process image's peak (ru_maxrss would carry the parent's over fork and exec)
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM")) / 1024

with open_store(store) as s:  # open and close once: the baseline includes the reader's own state
    len(s)
base = peak_mb()
t = time.perf_counter()
if mode == "export":
    done = export_store(store, out, layers=True, metrics=True)
    rows = sum(done["files"].values())
else:
    with open_store(store) as s:
        rows = len(s.token_table(layers=True)["score"])
print(json.dumps({"base_mb": base, "peak_mb": peak_mb(), "seconds": time.perf_counter() - t, "rows": rows}))
'''


def measure(mode: str, store: str, out: str) -> dict:
    res = subprocess.run([sys.executable, "-c", CHILD, str(REPO), mode, store, out], capture_output=True, text=True,
                         check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="5000,20000")
    ap.add_argument("--formats", default="parquet,csv")
    ap.add_argument("--keep-dir", default=None, help="Where the stores are built (kept) [default: a temporary one].")
    args = ap.parse_args()
    from tui_scale import build

    work = args.keep_dir or tempfile.mkdtemp(prefix="attrscope-export-")
    os.makedirs(work, exist_ok=True)
    print("| examples | what | rows | seconds | RSS before (MB) | peak RSS (MB) | growth (MB) |")
    print("|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.sizes.split(",")):
        store = os.path.join(work, f"export-{n}.h5")
        if not os.path.exists(store):
            t = time.perf_counter()
            build(store, n)
            print(f"<!-- built {store} in {time.perf_counter() - t:.0f} s -->", file=sys.stderr)
        runs = [(f"export .{fmt}", "export", os.path.join(work, f"export-{n}.{fmt}")) for fmt in args.formats.split(",")]
        runs.append(("whole table", "whole", ""))
        for label, mode, out in runs:
            r = measure(mode, store, out)
            print(f"| {n:,} | {label} | {r['rows']:,} | {r['seconds']:.1f} | {r['base_mb']:.0f} | {r['peak_mb']:.0f} "
                  f"| {r['peak_mb'] - r['base_mb']:.0f} |", flush=True)
            for path in (out, out.replace(".parquet", ".metrics.parquet").replace(".csv", ".metrics.csv")):
                if path and os.path.exists(path):
                    os.unlink(path)


if __name__ == "__main__":
    main()
