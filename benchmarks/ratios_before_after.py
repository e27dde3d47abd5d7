"""CPU cost ratios of every method, two code trees in one run: is any method slower than before?

Runs ``benchmarks/bench_methods.py`` of each tree (its own code, its own process) in alternation, --rounds times
(the order flips every round, so a load that drifts during the run falls on both trees alike), and reports per
method the median of its ratios to the bare pass of the same sweep: the forward for the capture-based methods,
forward + backward for the gradient, integrated-gradient and relevance methods. Ratios to a pass timed in the same
process hold on a loaded machine where seconds do not.

    git worktree add /tmp/before b3bbb1a
    python benchmarks/ratios_before_after.py --before /tmp/before --limit 64 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
SHARED = HERE.parent / "shared"
# a row of bench_methods.py's tables: name, seconds, ratio (names may hold brackets, e.g. alti[dense])
ROW = re.compile(r"^(\S+)\s+(\d+\.\d+)\s+(\d+\.\d+)")
BARE = ("bare forward", "capture forward", "bare fwd + bwd")


def ratios(tree: Path, bench_args: list[str], threads: int) -> dict[str, float]:
    """One run of ``tree``'s bench_methods.py: method -> ratio to its bare pass."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, str(tree / "benchmarks" / "bench_methods.py"), *bench_args],
                         cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"bench_methods.py in {tree} failed:\n{out.stderr[-2000:]}")
    found = {}
    for line in out.stdout.splitlines():
        if any(line.startswith(b) for b in BARE):
            continue
        m = ROW.match(line)
        if m:
            found[m.group(1)] = float(m.group(3))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="the reference code tree (e.g. a git worktree)")
    ap.add_argument("--after", type=Path, default=HERE, help="the tree under test [default: this checkout]")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each tree, alternated")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--limit", type=int, default=64, help="first N SST-2 dev rows")
    ap.add_argument("--methods", default="all")
    ap.add_argument("--model", type=Path, default=SHARED / "models" / "minilm-sst2")
    ap.add_argument("--data", type=Path, default=SHARED / "data" / "sst2" / "dev.tsv")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--worse", type=float, default=0.10, help="flag a method whose ratio grew by more than this")
    args = ap.parse_args()
    bench = ["--model", str(args.model.resolve()), "--data", str(args.data.resolve()), "--limit", str(args.limit), "--methods", args.methods, "--batch-size", str(args.batch_size),
             "--repeat", "1"]
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    for r in range(args.rounds):
        for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
            runs[side].append(ratios(trees[side], bench, args.threads))
            print(f"round {r + 1}: {side} done", file=sys.stderr, flush=True)
    med = {side: {k: statistics.median(run[k] for run in rs if k in run) for k in rs[0]} for side, rs in runs.items()}
    print(f"ratio to the bare pass, median of {args.rounds} runs each ({args.threads} thread(s), {args.limit} "
          f"SST-2 dev rows, batch {args.batch_size}); before = {trees['before']}, after = {trees['after']}")
    print("| method | before | after | after / before |\n|---|---|---|---|")
    flagged = []
    for k in med["after"]:
        if k not in med["before"]:
            print(f"| {k} | - | {med['after'][k]:.3f} | new |")
            continue
        change = med["after"][k] / med["before"][k]
        if change > 1 + args.worse:
            flagged.append(k)
        print(f"| {k} | {med['before'][k]:.3f} | {med['after'][k]:.3f} | {change:.3f} |")
    print(f"worse by more than {args.worse:.0%}: {', '.join(flagged) if flagged else 'none'}")


if __name__ == "__main__":
    main()
