"""The writer's own cost per example: a store's examples appended again by ``StoreWriter.append`` of each code tree.

Each repetition is a process with PYTHONPATH set to one tree (it checks that it imported that tree's ``store``): it
reads every example of STORE through its reader into memory, then appends them to a new store in windows of
``--window`` rows (the default batch size's 256) and closes it complete, timing only the appends (and the close
separately: the stamp and compaction), and the part of the appends spent on the per-example digests (format 1.6).
The trees alternate, so both share the machine's load.

    attr-compute dev.tsv --model minilm-sst2 --methods rollout,globenc,alti,attcat,grad_l2 --matrices cls -o dev.h5
    git archive REV | tar -x -C /tmp/before
    python benchmarks/write_cost.py dev.h5 --trees /tmp/before . --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")  # an older tree reading a newer store: a notice only
args = json.loads(sys.argv[1])
import store
assert store.__file__.startswith(args["tree"]), ("imported", store.__file__)
from store import StoreWriter, open_store
from store.copying import _example_data
from store.records import layout_from_dict

with open_store(args["store"]) as s:
    methods = [layout_from_dict(m) for m in s._method_layouts.values()]
    examples = [_example_data(s[i], methods) for i in range(len(s))]
    shape = dict(n_layers=s.n_layers, n_heads=s.n_heads, labels=dict(s.labels), methods=methods, provenance={},
                 evidence=s.has_evidence, task=s.task, heads=s.heads, heads_dtype=s.heads_dtype or "float16")
spent = [0.0]  # seconds in the per-example digests (format 1.6), a part of the appends
if hasattr(StoreWriter, "_digests"):
    inner = StoreWriter._digests

    def timed(self, *a):
        t = time.perf_counter()
        out = inner(self, *a)
        spent[0] += time.perf_counter() - t
        return out

    StoreWriter._digests = timed
w = StoreWriter.create(args["out"], **shape)
t0 = time.perf_counter()
for lo in range(0, len(examples), args["window"]):
    w.append(examples[lo:lo + args["window"]])
t1 = time.perf_counter()
w.close(complete=True)
t2 = time.perf_counter()
n = len(examples)
print(json.dumps({"append_ms": 1e3 * (t1 - t0) / n, "close_ms": 1e3 * (t2 - t1) / n, "digests_ms": 1e3 * spent[0] / n}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store")
    ap.add_argument("--trees", nargs="+", default=["."], help="code trees to compare, alternated")
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    trees = [str(Path(t).resolve()) for t in a.trees]
    results: dict[str, list[dict]] = {t: [] for t in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.reps):
            for k, tree in enumerate(trees):
                out = os.path.join(tmp, f"w{rep}-{k}.h5")
                args = {"tree": tree, "store": os.path.abspath(a.store), "out": out, "window": a.window}
                res = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True,
                                     cwd=tree, env={**os.environ, "PYTHONPATH": tree}, check=True)
                results[tree].append(json.loads(res.stdout.strip().splitlines()[-1]))
                if rep == 0:
                    print(f"{tree}: store of {os.path.getsize(out):,} bytes")
                os.remove(out)
    for tree, runs in results.items():
        append = [r["append_ms"] for r in runs]
        close = [r["close_ms"] for r in runs]
        digests = [r["digests_ms"] for r in runs]
        print(f"{tree}: append {statistics.median(append):.3f} ms per example (runs {min(append):.3f}-"
              f"{max(append):.3f}), of which digests {statistics.median(digests):.4f} (runs {min(digests):.4f}-"
              f"{max(digests):.4f}); close {statistics.median(close):.3f}")


if __name__ == "__main__":
    main()
