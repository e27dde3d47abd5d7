"""Are the stores written by two code trees identical? (issue 15's acceptance: bitwise, except provenance)

Runs the same attr-compute run (compute.runner.run) with the code of two trees, each in its own process with
PYTHONPATH set to the tree (the process checks that it imported that tree's ``compute``), then compares the two stores
dataset by dataset, byte for byte, and every attribute except the provenance ones that carry timestamps or timings.
Both processes use the same number of torch threads (the thread count changes float reductions); they run in
parallel. Prints IDENTICAL, or every differing path, and exits 1.

    git worktree add /tmp/before REV && python benchmarks/store_identity.py --before /tmp/before -n 100
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np

HERE = Path(__file__).resolve().parents[1]
SHARED = HERE.parent / "shared"

# Provenance that differs between any two runs: wall-clock times and durations (attributes), the provenance record
# (a dataset holding the output path and timings), and the timings inside JSON attributes (head-mask settings).
PROVENANCE_ATTRS = {"created", "finished", "summary", "seconds"}
PROVENANCE_DATASETS = {"provenance"}


def without_timings(value):
    """A JSON attribute's value less its "seconds*" keys (timings of a pass); other values unchanged."""
    if isinstance(value, (bytes, str)):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        if isinstance(parsed, dict):
            return json.dumps({k: v for k, v in parsed.items() if not k.startswith("seconds")}, sort_keys=True)
    return value

RUN = """
import sys, json, time, torch
torch.set_num_threads({threads})
import compute
assert compute.__file__.startswith({tree!r}), ("imported", compute.__file__, "not from", {tree!r})
from compute.runner import RunConfig, run
t0 = time.perf_counter()
run(RunConfig(dataset={data!r}, model={model!r}, methods={methods!r}, matrices={matrices!r}, limit={n},
              output={out!r}, overwrite=True, device="cpu"))
print(json.dumps({{"compute": compute.__file__, "seconds": time.perf_counter() - t0}}))
"""


def start_run(tree: Path, out: Path, args) -> subprocess.Popen:
    code = RUN.format(threads=args.threads, tree=str(tree), data=str(args.data), model=str(args.model),
                      methods=args.methods, matrices=args.matrices, n=args.n, out=str(out))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.Popen([sys.executable, "-c", code], cwd=tree, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def walk(f: h5py.File) -> dict[str, h5py.HLObject]:
    items = {"/": f}
    f.visititems(lambda name, obj: items.__setitem__(name, obj))
    return items


def same_value(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return type(a) is type(b) and a == b


def compare(path_a: Path, path_b: Path) -> tuple[list[str], int, int]:
    """(differences, datasets compared, attributes compared)."""
    diffs: list[str] = []
    n_data = n_attrs = 0
    with h5py.File(path_a, "r") as fa, h5py.File(path_b, "r") as fb:
        ia, ib = walk(fa), walk(fb)
        for name in sorted(set(ia) ^ set(ib)):
            diffs.append(f"{name}: only in {'before' if name in ia else 'after'}")
        for name in sorted(set(ia) & set(ib)):
            a, b = ia[name], ib[name]
            if isinstance(a, h5py.Dataset) != isinstance(b, h5py.Dataset):
                diffs.append(f"{name}: dataset in one store, group in the other")
                continue
            if isinstance(a, h5py.Dataset) and name not in PROVENANCE_DATASETS:
                n_data += 1
                if a.dtype != b.dtype or a.shape != b.shape:
                    diffs.append(f"{name}: dtype/shape {a.dtype}{a.shape} vs {b.dtype}{b.shape}")
                elif a[()].tobytes() != b[()].tobytes():
                    diffs.append(f"{name}: data differ")
            for key in sorted(set(a.attrs) | set(b.attrs)):
                if key in PROVENANCE_ATTRS:
                    continue
                n_attrs += 1
                if key not in a.attrs or key not in b.attrs:
                    diffs.append(f"{name} @{key}: only in {'before' if key in a.attrs else 'after'}")
                elif not same_value(without_timings(a.attrs[key]), without_timings(b.attrs[key])):
                    diffs.append(f"{name} @{key}: {str(a.attrs[key])[:80]} vs {str(b.attrs[key])[:80]}")
    return diffs, n_data, n_attrs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="code tree of the reference store (e.g. a git worktree)")
    ap.add_argument("--after", type=Path, default=HERE, help="code tree under test [default: this checkout]")
    ap.add_argument("-n", type=int, default=100, help="first N SST-2 dev rows")
    ap.add_argument("--model", type=Path, default=SHARED / "models" / "minilm-sst2")
    ap.add_argument("--data", type=Path, default=SHARED / "data" / "sst2" / "dev.tsv")
    ap.add_argument("--methods", default="all")
    ap.add_argument("--matrices", default="all")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each run (the same for both)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/store_identity"))
    ap.add_argument("--compare-only", action="store_true", help="compare the stores already in --workdir")
    args = ap.parse_args()
    args.before, args.after = args.before.resolve(), args.after.resolve()
    args.model, args.data = args.model.resolve(), args.data.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    outs = {"before": args.workdir / "before.h5", "after": args.workdir / "after.h5"}
    if not args.compare_only:
        t0 = time.perf_counter()
        procs = {k: start_run(getattr(args, k), outs[k], args) for k in outs}
        for k, p in procs.items():
            stdout, stderr = p.communicate()
            if p.returncode:
                print(f"{k} run failed ({getattr(args, k)}):\n{stderr[-3000:]}", file=sys.stderr)
                return 2
            info = json.loads(stdout.strip().splitlines()[-1])
            print(f"{k}: {info['compute']}  {info['seconds']:.1f} s")
        print(f"both runs: {time.perf_counter() - t0:.1f} s wall ({args.n} examples, --methods {args.methods}, "
              f"--matrices {args.matrices}, {args.threads} torch thread(s) each)")
    diffs, n_data, n_attrs = compare(outs["before"], outs["after"])
    print(f"compared {n_data} datasets bitwise and {n_attrs} attributes (ignored: the datasets "
          f"{', '.join(sorted(PROVENANCE_DATASETS))}, the attributes {', '.join(sorted(PROVENANCE_ATTRS))}, "
          "seconds* keys of JSON attributes)")
    if diffs:
        print("DIFFERENT")
        print("\n".join(diffs))
        return 1
    print("IDENTICAL")
    return 0


if __name__ == "__main__":
    sys.exit(main())
