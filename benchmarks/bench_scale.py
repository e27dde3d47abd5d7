"""Examples per second of one attr-compute run on the same work: one process, and N processes under torchrun.

Each configuration is a fresh ``attr-compute`` command (its wall time is what the user waits: start-up, model load,
the work, the merge), run ``--reps`` times in turn; the table gives the median and the ratio to one process with
one thread. On the CPU: one process with 1 thread, one process with all the cores' threads, and ``--procs``
processes of ``cores / procs`` threads each under torchrun (Gloo). With CUDA: one GPU, and one process per GPU.
Also checks that the stores of every configuration hold the same examples in the same order.

    python benchmarks/bench_scale.py -n 256 --methods alti,globenc,grad_l2,attcat --reps 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
SHARED = HERE.parent / "shared"


def script(name: str) -> str:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else (shutil.which(name) or name)


def timed(cmd: list[str], env: dict, cwd: str) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env={**os.environ, **env}, cwd=cwd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(SHARED / "models" / "minilm-sst2"))
    ap.add_argument("--data", default=str(SHARED / "data" / "sst2" / "dev.tsv"))
    ap.add_argument("-n", type=int, default=256, help="examples (--limit)")
    ap.add_argument("--methods", default="alti,globenc,grad_l2,attcat")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--procs", type=int, default=2, help="processes of the torchrun configuration on the CPU")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    import torch

    cores = os.cpu_count() or 1
    job = [args.data, "--model", args.model, "--methods", args.methods, "--limit", str(args.n),
           "--batch-size", str(args.batch_size), "-q", "-o", "out.h5"]
    ac, tr = script("attr-compute"), script("torchrun")
    configs = [
        ("1 process, 1 thread (cpu)", [ac, *job, "--device", "cpu"], {"OMP_NUM_THREADS": "1"}),
        (f"1 process, {cores} threads (cpu)", [ac, *job, "--device", "cpu"], {"OMP_NUM_THREADS": str(cores)}),
        (f"torchrun {args.procs} processes x {max(cores // args.procs, 1)} thread(s) (gloo, cpu)",
         [tr, "--standalone", "--nproc-per-node", str(args.procs), "--no-python", ac, *job, "--device", "cpu"],
         {"OMP_NUM_THREADS": str(max(cores // args.procs, 1))}),
    ]
    if torch.cuda.is_available():
        gpus = torch.cuda.device_count()
        configs.append((f"1 process, 1 GPU ({torch.cuda.get_device_name(0)})", [ac, *job, "--device", "cuda"], {}))
        if gpus > 1:
            configs.append((f"torchrun {gpus} processes, 1 GPU each (nccl)",
                            [tr, "--standalone", "--nproc-per-node", str(gpus), "--no-python", ac, *job], {}))

    from store import open_store

    times: dict[str, list[float]] = {name: [] for name, _, _ in configs}
    ids = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):  # in turn, so that a slow spell of the machine hits every configuration
            for i, (name, cmd, env) in enumerate(configs):
                cwd = os.path.join(tmp, f"c{i}")
                shutil.rmtree(cwd, ignore_errors=True)
                os.makedirs(cwd)
                times[name].append(timed(cmd, env, cwd))
                with open_store(os.path.join(cwd, "out.h5")) as s:
                    ids[name] = s.ids()
    first = next(iter(ids.values()))
    assert all(v == first for v in ids.values()), "the configurations stored different examples"

    print(f"{args.n} SST-2 dev examples, methods {args.methods}, batch size {args.batch_size}, {cores} CPU cores, "
          f"median of {args.reps} (wall time of the whole command: start-up, model load, work, merge)")
    base = statistics.median(times[configs[0][0]])
    print("| configuration | seconds | examples/s | vs 1 process, 1 thread |\n|---|---|---|---|")
    for name, _, _ in configs:
        t = statistics.median(times[name])
        print(f"| {name} | {t:.1f} | {args.n / t:.1f} | {base / t:.2f}x |")


if __name__ == "__main__":
    main()
