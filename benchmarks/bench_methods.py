"""Method cost relative to the bare model pass it needs, measured in one run (ratios hold on a noisy machine).

For every batch of the dataset (length-sorted as attr-compute does), time
  * the bare forward: the model alone, no hooks, under no_grad;
  * the capture forward: the same pass with attrscope's hooks for what the methods need;
  * each method on the captured batch.
Report seconds and ratios (method / bare forward). Each timing is the median of --repeat runs of the whole sweep.

    python benchmarks/bench_methods.py                       # shared MiniLM-SST2 over SST-2 dev, CPU
    python benchmarks/bench_methods.py --device cuda --batch-size 64
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from compute.data import load_dataset  # noqa: E402
from compute.methods import REGISTRY, get_method, parse_methods  # noqa: E402
from compute.models import load_model, resolve_device  # noqa: E402


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO.parent / "shared/models/minilm-sst2"))
    ap.add_argument("--data", default=str(REPO.parent / "shared/data/sst2/dev.tsv"))
    ap.add_argument("--methods", default="all")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    dev = resolve_device(args.device)
    lm = load_model(args.model, device=dev)
    data = load_dataset(args.data, limit=args.limit,
                        label2id={v: k for k, v in lm.info["id2label"].items()}, num_labels=lm.info["num_labels"])
    enc = lm.tokenizer([r.text for r in data.records], truncation=True, max_length=512)
    order = sorted(range(len(data.records)), key=lambda i: -len(enc["input_ids"][i]))
    batches = []
    for b0 in range(0, len(order), args.batch_size):
        idx = order[b0:b0 + args.batch_size]
        padded = lm.tokenizer.pad({"input_ids": [enc["input_ids"][i] for i in idx]}, return_tensors="pt")
        batches.append({k: v.to(dev) for k, v in padded.items()})
    names = parse_methods(args.methods)
    methods = {n: get_method(n) for n in names}
    needs = frozenset().union(*(m.needs for m in methods.values()))

    def sweep():
        t = {"bare forward": 0.0, "capture forward": 0.0, **{n: 0.0 for n in names}}
        with torch.no_grad():
            for batch in batches:
                _sync(dev); t0 = time.perf_counter()
                lm.model(**lm.adapter.forward_inputs(batch))
                _sync(dev); t["bare forward"] += time.perf_counter() - t0
                t0 = time.perf_counter()
                cap = lm.adapter.capture(batch, needs)
                _sync(dev); t["capture forward"] += time.perf_counter() - t0
                for n, m in methods.items():
                    cap.memo.clear()  # each method pays for its own intermediates (attr-compute shares them)
                    t0 = time.perf_counter()
                    m.compute(cap, lm.adapter, cap.pred)
                    _sync(dev); t[n] += time.perf_counter() - t0
        return t

    sweep()  # warm-up
    runs = [sweep() for _ in range(args.repeat)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    base = med["bare forward"]
    n_ex = len(data.records)
    print(f"model {args.model} on {dev} ({torch.get_num_threads()} threads), {n_ex} examples, "
          f"batch {args.batch_size}, median of {args.repeat}")
    print(f"{'':18s} {'seconds':>9s} {'x bare fwd':>11s}")
    for k, v in med.items():
        print(f"{k:18s} {v:9.3f} {v / base:11.3f}")
    print(f"bare forward throughput: {n_ex / base:.1f} examples/s")


if __name__ == "__main__":
    main()
