"""CPU cost ratios of every method, two code trees in one run: is any method slower than before?

Each tree is measured by its own code in its own process (this script's --measure mode with the tree first on the
path, its benchmarks/bench_methods.py's setup: model, data, length-sorted batches): each batch captured once with
every method's needs, then each method's ``compute`` on it timed in CPU seconds of the process (time.process_time:
what other sessions' load on the machine changes least), the least of --repeat sweeps, and the bare pass of the same
batches likewise: the forward for the capture-based methods, forward + backward for the gradient,
integrated-gradient and relevance methods. The trees alternate --rounds times (the order flips every round) and each
method's ratio is the median over rounds.

    git worktree add /tmp/before b3bbb1a
    python benchmarks/ratios_before_after.py --before /tmp/before --limit 64 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
SHARED = HERE.parent / "shared"


def measure(args) -> dict[str, float]:
    """In this process, with ``args.measure`` first on the path: method -> CPU seconds / its bare pass's."""
    tree = args.measure.resolve()
    sys.path.insert(0, str(tree / "benchmarks"))
    sys.path.insert(0, str(tree))
    import torch

    import bench_methods as bm
    from compute.methods import get_method
    from compute.methods._internals.gradients import GradientMethod, IntegratedGradientsMethod
    from compute.methods._internals.relevance import RelevanceMethod

    torch.set_num_threads(args.threads)
    setup_args = argparse.Namespace(model=str(args.model), data=str(args.data), limit=args.limit,
                                    batch_size=args.batch_size, random_base=None, family="bert", join=1,
                                    methods=args.methods, device="cpu")
    model, adapter, batches, _ = bm.setup(setup_args, torch.device("cpu"))
    # as bench_methods.py times them: IG with 16 steps, mask_lrp keeping every other head
    half = [[(l + h) % 2 for h in range(adapter.n_heads)] for l in range(adapter.n_layers)]
    params = {"ig_l2": {"steps": 16}, "ig_mean": {"steps": 16}, "mask_lrp": {"head_mask": half}}
    methods = {n: get_method(n, **params.get(n, {})) for n in bm.parse_methods(args.methods)}
    methods = {n: m for n, m in methods.items() if bm._defined(m, adapter)}
    own_pass = (GradientMethod, IntegratedGradientsMethod, RelevanceMethod)
    needs = frozenset().union(*(m.needs for m in methods.values()))
    caps = [adapter.capture(b, needs) for b in batches]

    def least(work) -> float:
        times = []
        for _ in range(args.repeat):
            t0 = time.process_time()
            work()
            times.append(time.process_time() - t0)
        return min(times)

    def forward():
        with torch.no_grad():
            for b in batches:
                model(**adapter.forward_inputs(b))

    def forward_backward():
        for b in batches:
            bm.bare_forward_backward(model, b)

    def run(m):
        def work():
            with torch.no_grad():
                for cap in caps:
                    cap.memo.clear()  # each method pays for its own intermediates
                    m.compute(cap, adapter, cap.pred)
        return work

    fwd, fwd_bwd = least(forward), least(forward_backward)
    return {n: least(run(m)) / (fwd_bwd if isinstance(m, own_pass) else fwd) for n, m in methods.items()}


def ratios(tree: Path, args) -> dict[str, float]:
    """One process measuring ``tree``'s code."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, __file__, "--before", str(tree), "--measure", str(tree), "--threads", str(args.threads),
           "--limit", str(args.limit), "--methods", args.methods, "--batch-size", str(args.batch_size),
           "--repeat", str(args.repeat), "--model", str(args.model), "--data", str(args.data)]
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"measuring {tree} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="the reference code tree (e.g. a git worktree)")
    ap.add_argument("--after", type=Path, default=HERE, help="the tree under test [default: this checkout]")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each tree, alternated")
    ap.add_argument("--repeat", type=int, default=2, help="sweeps per run; the least CPU time counts")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--limit", type=int, default=64, help="first N SST-2 dev rows")
    ap.add_argument("--methods", default="all")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--model", type=Path, default=SHARED / "models" / "minilm-sst2")
    ap.add_argument("--data", type=Path, default=SHARED / "data" / "sst2" / "dev.tsv")
    ap.add_argument("--worse", type=float, default=0.10, help="flag a method whose ratio grew by more than this")
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the child: measure this tree, print JSON
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args)))
        return
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    for r in range(args.rounds):
        for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
            runs[side].append(ratios(trees[side], args))
            print(f"round {r + 1}: {side} done", file=sys.stderr, flush=True)
    med = {side: {k: statistics.median(run[k] for run in rs if k in run) for k in rs[0]} for side, rs in runs.items()}
    print(f"CPU seconds / the bare pass's, median of {args.rounds} runs each (least of {args.repeat} sweeps; "
          f"{args.threads} thread(s), {args.limit} SST-2 dev rows, batch {args.batch_size}); "
          f"before = {trees['before']}, after = {trees['after']}")
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
