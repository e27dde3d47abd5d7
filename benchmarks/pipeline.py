"""The host's cost per example of ``attr-compute run`` with a model that costs nothing (issue 26 item 6).

A stand-in replaces the model's forward pass (``Adapter.capture``) and every method's ``compute``: they return
views of tensors made once, of the shapes the real ones return (scores [B, n], layer views [B, L, n], matrices
[B, L, n, n], per-example values [B], logits [B, C]), so they take no time. Everything else is the real run on the
CPU: loading the data, tokenisation, batching, padding, the task's outcome, the results' conversion, cutting them to
each example, the scale statistics and the store write. What is left is what the host spends per example, which
a GPU run waits for wherever it is not hidden behind the GPU's own work. Torch runs on one thread (the stand-in's few
small tensor operations stand for kernels queued on a GPU; a thread pool's synchronisation would only add noise).

Prints the run's seconds after loading (the model and data) per example, and the run's own per-stage host seconds
(the summary's ``host_seconds`` where the code has them; ``write_seconds`` is the writer thread's). Each repetition
is its own process.

    python benchmarks/pipeline.py --batch-size 128 --reps 3
    python benchmarks/pipeline.py --batch-size 128 --reps 3 --tree ../main   # another checkout, alternated with this

On the project's 2-core CPU under other jobs' load (load average about 3, 2026-11-27), alternating the trees three
times: 0.71 ms per example (median of the medians) before the writer's work of issue 26 item 6 (gzip level 4, the
histogram by log10, per-example conversions) and 0.59 after; the writer thread 0.29-0.35 -> 0.18-0.22 ms per example.
SST-2 dev is one window: its tokenisation (before the first batch) and its write (after the last) cannot overlap the
loop, which puts a floor of about 0.3 ms per example under this measurement on this CPU (docs/benchmarks.md).
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

HERE = Path(__file__).resolve().parents[1]
SHARED = HERE.parent / "shared"

CHILD = r"""
import json, sys, time
import torch
torch.set_num_threads(1)  # the stand-in's small tensor operations stand for kernels queued on a GPU: no thread pool
args = json.loads(sys.argv[1])
import compute
assert compute.__file__.startswith(args["tree"]), ("imported", compute.__file__)
import compute.adapters as adapters
import compute.runner as runner
from compute.methods import REGISTRY
from compute.methods._internals.base import MethodResult
from transformers.modeling_outputs import SequenceClassifierOutput

B, N, C = args["batch_size"], args["longest"], 8  # the largest shapes the stand-in serves (views of these)
L = json.load(open(args["model"] + "/config.json"))["num_hidden_layers"]
g = torch.Generator().manual_seed(0)
MATRICES = torch.rand(B, L, N, N, generator=g) if args["matrices"] != "none" else None
VECTORS = torch.rand(B, L + 1, N, generator=g)
LOGITS = torch.rand(B, C, generator=g)


def capture(self, enc, needs, grad=False):
    ids, mask = enc["input_ids"], enc["attention_mask"].bool()
    b = ids.shape[0]
    cap = adapters.Captured(input_ids=ids, mask=mask, lengths=mask.sum(-1),
                            explain_pos=self.explain_positions(ids, mask),
                            logits=LOGITS[:b, :self.model.config.num_labels], special=self.special_mask(ids, mask),
                            sep=self.sep_mask(ids, mask), inputs=self.forward_inputs(enc))
    cap.output = SequenceClassifierOutput(logits=cap.logits)
    return cap


def stand_in(cls):
    def compute(self, cap, adapter, target):
        b, n = cap.input_ids.shape
        layers = adapter.n_layers
        return MethodResult(
            scores=VECTORS[:b, 0, :n],
            layer_scores=VECTORS[:b, 1:1 + self.n_layer_views(adapter), :n] if cls.has_layer_views else None,
            matrices=MATRICES[:b, :layers, :n, :n] if cls.has_matrices and MATRICES is not None else None,
            example_values={k: VECTORS[:b, 0, 0] for k in cls.example_values} or None)
    return compute


adapters.Adapter.capture = capture
for cls in REGISTRY.values():
    cls.compute = stand_in(cls)

loaded_at = {}
load = runner.load
def timed_load(*a, **k):
    out = load(*a, **k)
    loaded_at["t"] = time.perf_counter()
    return out
runner.load = timed_load

cfg = runner.RunConfig(dataset=args["data"], model=args["model"], methods=args["methods"], limit=args["limit"],
                       batch_size=args["batch_size"], matrices=args["matrices"], output=args["out"], overwrite=True,
                       device="cpu")
s = runner.run(cfg)
after_load = time.perf_counter() - loaded_at["t"]
print(json.dumps({"examples": s["examples"], "after_load_seconds": after_load,
                  "host_seconds": s.get("host_seconds"), "write_seconds": s["write_seconds"],
                  "write_wait_seconds": s["write_wait_seconds"]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", default=str(HERE), help="the code tree to run (default: this checkout)")
    ap.add_argument("--model", default=str(SHARED / "models" / "minilm-sst2"))
    ap.add_argument("--data", default=str(SHARED / "data" / "sst2" / "dev.tsv"))
    ap.add_argument("--methods", default="rollout,globenc,alti,attcat,grad_l2")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--matrices", default="cls", choices=("none", "cls", "all"))
    ap.add_argument("--limit", type=int)
    ap.add_argument("--longest", type=int, default=192, help="the longest example's tokens the stand-in serves")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    tree = str(Path(a.tree).resolve())
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        args = {"tree": tree, "model": a.model, "data": a.data, "methods": a.methods, "limit": a.limit,
                "batch_size": a.batch_size, "longest": a.longest, "matrices": a.matrices,
                "out": os.path.join(tmp, "o.h5")}
        env = {**os.environ, "PYTHONPATH": tree}
        for _ in range(a.reps):
            p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True, env=env,
                               cwd=tmp)
            if p.returncode != 0:
                sys.exit(p.stderr[-3000:])
            runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    n = runs[0]["examples"]
    per = [r["after_load_seconds"] / n * 1e3 for r in runs]
    print(f"{a.data}: {n} examples, batch size {a.batch_size}, methods {a.methods}, --matrices {a.matrices}, "
          f"{a.reps} runs (tree {tree})")
    print(f"host ms per example (after loading): median {statistics.median(per):.3f}  "
          f"(runs: {', '.join(f'{x:.3f}' for x in per)})")
    best = min(runs, key=lambda r: r["after_load_seconds"])
    if best["host_seconds"]:
        print("per stage, the fastest run (ms per example; the writer's on its own thread):")
        for stage, sec in best["host_seconds"].items():
            print(f"  {stage:<12} {sec / n * 1e3:8.3f}")
    print(f"  {'write':<12} {best['write_seconds'] / n * 1e3:8.3f}  (writer thread; the loop waited "
          f"{best['write_wait_seconds'] / n * 1e3:.3f})")


if __name__ == "__main__":
    main()
