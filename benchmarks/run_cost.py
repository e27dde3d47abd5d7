"""Time and peak memory of a gradient-only run, before and after the LRP record became opt-in (issue 15).

Before (``--before``, a tree of the earlier code, e.g. a git worktree), the shared gradient pass recorded every
Linear's input and output for the LRP rules on every batch; after (``--after``, default this checkout) it records them only when an LRP-family method
runs. Each run is its own process with PYTHONPATH set to its tree (checked), on the same data and options; the
two trees alternate for ``--reps`` rounds, so both see the same machine load, and the ratios come from one
invocation. Reported per run: the wall time of the run call, the runner's own method seconds (the store's summary),
and the process's peak resident memory above what it held before the run (ru_maxrss, Linux kilobytes).

    git worktree add /tmp/before REV && python benchmarks/run_cost.py --before /tmp/before -n 200 --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
SHARED = HERE.parent / "shared"

CHILD = """
import json, resource, time, h5py, torch
torch.set_num_threads({threads})
import compute
assert compute.__file__.startswith({tree!r}), ("imported", compute.__file__, "not from", {tree!r})
from compute.runner import RunConfig, run
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
run(RunConfig(dataset={data!r}, model={model!r}, methods={methods!r}, limit={n}, batch_size={batch},
              output={out!r}, overwrite=True, device="cpu"))
wall = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with h5py.File({out!r}, "r") as f:
    summary = json.loads(f.attrs["summary"])
print(json.dumps({{"wall": wall, "methods": sum(summary["method_seconds"].values()),
                  "peak_mb": (peak - base) / 1024, "base_mb": base / 1024}}))
"""


def one_run(tree: Path, args, out: Path) -> dict:
    code = CHILD.format(threads=args.threads, tree=str(tree), data=str(args.data), model=str(args.model),
                        methods=args.methods, n=args.n, batch=args.batch_size, out=str(out))
    res = subprocess.run([sys.executable, "-c", code], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                         capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"run in {tree} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="code tree of the baseline (e.g. a git worktree)")
    ap.add_argument("--after", type=Path, default=HERE)
    ap.add_argument("-n", type=int, default=200, help="first N SST-2 dev rows")
    ap.add_argument("--methods", default="grad_l2,gxi_l2,attcat")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", type=Path, default=SHARED / "models" / "minilm-sst2")
    ap.add_argument("--data", type=Path, default=SHARED / "data" / "sst2" / "dev.tsv")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/run_cost"))
    args = ap.parse_args()
    args.before, args.after = args.before.resolve(), args.after.resolve()
    args.model, args.data = args.model.resolve(), args.data.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for rep in range(args.reps):
        order = ("before", "after") if rep % 2 == 0 else ("after", "before")
        for k in order:
            r = one_run(getattr(args, k), args, args.workdir / f"{k}.h5")
            runs[k].append(r)
            print(f"rep {rep} {k:6s}: wall {r['wall']:7.2f} s  methods {r['methods']:7.2f} s  "
                  f"peak +{r['peak_mb']:7.1f} MB (base {r['base_mb']:.0f} MB)", flush=True)
    print(f"\n{args.n} SST-2 dev examples, --methods {args.methods}, batch {args.batch_size}, {args.threads} torch "
          f"thread(s), {args.reps} alternating runs each (medians)")
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("wall", "methods", "peak_mb")}
           for k, v in runs.items()}
    for m, unit in (("wall", "s"), ("methods", "s"), ("peak_mb", "MB")):
        b, a = med["before"][m], med["after"][m]
        print(f"{m:8s} before {b:8.2f} {unit}  after {a:8.2f} {unit}  after/before {a / b if b else float('nan'):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
