"""How long does the compute loop wait on writing the store? (issue 16: writing overlaps compute)

Runs one attr-compute run (compute.runner.run) with the code of ``--tree`` (a subprocess with PYTHONPATH set to it)
and prints the wall time and the seconds the main thread waited on the store: a tree whose summary has
``write_wait_seconds`` (the writer thread) reports that; an older tree, which appends on the main thread, is timed
by wrapping ``StoreWriter.append`` (every second of it is a second the model waited). Also prints the writer's own
busy time (seconds inside ``append`` on any thread).

    python benchmarks/write_wait.py --tree /tmp/before --limit 300 --methods rollout,norm,alti,attcat --matrices all
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
SHARED = HERE.parent / "shared"

CHILD = r"""
import json, sys, threading, time
import torch
torch.set_num_threads(int(sys.argv[2]))
import compute
assert compute.__file__.startswith(sys.argv[1]), compute.__file__
from store.writer import StoreWriter
spent = {"main": 0.0, "any": 0.0}
append = StoreWriter.append
def timed(self, examples):
    t0 = time.perf_counter()
    try:
        return append(self, examples)
    finally:
        dt = time.perf_counter() - t0
        spent["any"] += dt
        if threading.current_thread() is threading.main_thread():
            spent["main"] += dt
StoreWriter.append = timed
from compute.runner import run
from compute.runner import RunConfig
cfg = RunConfig(**json.loads(sys.argv[3]))
s = run(cfg)
wait = s.get("write_wait_seconds", spent["main"])
print(json.dumps({"wall_seconds": s["wall_seconds"], "write_wait_seconds": round(wait, 3),
                  "wait_fraction": round(wait / s["wall_seconds"], 4), "append_seconds": round(spent["any"], 3),
                  "examples": s["examples"], "batch_size": cfg.batch_size}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", required=True, help="the code tree to run (a git worktree)")
    ap.add_argument("--model", default=str(SHARED / "models" / "minilm-sst2"))
    ap.add_argument("--data", default=str(SHARED / "data" / "sst2" / "dev.tsv"))
    ap.add_argument("--limit", type=int, default=300)
    ap.add_argument("--methods", default="rollout,norm,alti,attcat")
    ap.add_argument("--matrices", default="all")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    tree = str(Path(args.tree).resolve())
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {"dataset": args.data, "model": args.model, "limit": args.limit, "methods": args.methods,
               "matrices": args.matrices, "batch_size": args.batch_size, "device": "cpu",
               "output": os.path.join(tmp, "run.h5")}
        env = {**os.environ, "PYTHONPATH": tree}
        out = subprocess.run([sys.executable, "-c", CHILD, tree, str(args.threads), json.dumps(cfg)], env=env,
                             cwd=tmp, capture_output=True, text=True)
    if out.returncode:
        sys.exit(out.stderr[-2000:])
    print(json.dumps({"tree": tree, **json.loads(out.stdout.strip().splitlines()[-1])}))


if __name__ == "__main__":
    main()
