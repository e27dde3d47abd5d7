"""Damaged copies of a store through the reader and every consumer, and faults while stores are written.

    python benchmarks/fuzz_store.py --copies 300            # the reader API on a small synthetic store
    python benchmarks/fuzz_store.py --copies 300 --killed   # ... as a killed writer leaves it (read with SWMR)
    python benchmarks/fuzz_store.py --store old.h5          # ... on any store
    python benchmarks/fuzz_store.py --consumers all --copies 45 --faults   # a real run's store through read, eval,
        resume, export, report and attr-tui; SIGKILL in merge and export; a full disk (benchmarks/fuzz_consumers.py)
    ... --repo OTHER_CHECKOUT                               # the same on another checkout's code (before / after)

The reader counts: clean StoreError, identical numbers, wrong numbers, hang, crash, other exception. The consumer
table: per consumer clean / internal / traceback / hang / equal / different (/ notice: attr-tui opened and said so).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _table(report: dict) -> str:
    from fuzz_consumers import VERDICTS

    lines = ["| consumer | " + " | ".join(VERDICTS) + " | slowest s |", "|---|" + "---|" * (len(VERDICTS) + 1)]
    for c, counts in report["counts"].items():
        lines.append(f"| {c} | " + " | ".join(str(counts.get(v, 0)) for v in VERDICTS)
                     + f" | {report['slowest_s'][c]} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds before a read counts as a hang")
    ap.add_argument("--store", help="store to damage [default: a small synthetic one]")
    ap.add_argument("--killed", action="store_true", help="the synthetic store as a killed writer leaves it")
    ap.add_argument("--consumers", default="", help="read,eval,resume,export,report,tui or all")
    ap.add_argument("--faults", action="store_true", help="SIGKILL in merge and export, a full disk (a tmpfs)")
    ap.add_argument("--kill-trials", type=int, default=5)
    ap.add_argument("--repo", default=str(REPO), help="the checkout whose code is tested [default: this one]")
    ap.add_argument("--work", help="folder for the built stores [default: a temporary one]")
    args = ap.parse_args()
    repo = str(Path(args.repo).resolve())
    sys.path[:0] = [repo, str(REPO / "tests"), str(REPO / "benchmarks")]
    if not args.consumers and not args.faults:
        from store_fuzz import fuzz, make_target

        with tempfile.TemporaryDirectory() as tmp:
            path = args.store or str(Path(tmp) / "target.h5")
            if not args.store:
                make_target(path, complete=not args.killed)
            t0 = time.monotonic()
            report = fuzz(path, args.copies, args.seed, tmp, args.timeout)
            report["seconds"] = round(time.monotonic() - t0, 1)
            report["bytes"] = Path(path).stat().st_size
        print(json.dumps(report, indent=1))
        return

    import fuzz_consumers as fc

    def log(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)

    consumers = fc.CONSUMERS if args.consumers == "all" else tuple(c for c in args.consumers.split(",") if c)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        paths = fc.build(work, repo, log)
        out = {"repo": repo, "copies": args.copies, "seed": args.seed}
        if consumers:
            out["consumers"] = fc.fuzz_consumers(paths, work, repo, args.copies, args.seed, consumers, log)
        if args.faults:
            out["faults"] = {**fc.kill_trials(paths, work, repo, args.kill_trials, args.seed, log),
                             **{f"ENOSPC {k}": v for k, v in fc.full_disk(paths, work, repo, log).items()}}
        out["seconds"] = round(time.monotonic() - t0, 1)
    print(json.dumps(out, indent=1))
    if consumers:
        print(_table(out["consumers"]))


if __name__ == "__main__":
    main()
