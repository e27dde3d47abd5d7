"""Accuracy of the LRP family's precisions (--lrp-dtype) against float64 on the shared model.

For the first N SST-2 dev examples (length-sorted batches, as attr-compute runs them), every LRP method is computed
with --lrp-dtype float64 (forward, backward and rules on a float64 copy of the model) and with each other precision
(mixed: float64 forward, float32 rules; model: float32 throughout, the reference's), and compared example by example
on the final scores (the explained [CLS], 0 everywhere, left out): max |difference| over the example's max |float64
score| (worst example), the number of examples where it exceeds 1e-3, and the Spearman rank correlation (mean and
minimum). ``alone vs batched`` repeats the comparison for one example computed alone against the same example in its
padded batch, in the same precision. mask_lrp keeps every other head (its cost and conditioning do not depend on
which).

    python benchmarks/lrp_precision.py --limit 100
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from compute.methods import get_method  # noqa: E402

from bench_methods import setup  # noqa: E402

NAMES = ("lrp", "partial_lrp", "transatt", "mask_lrp")


def scores(model_parts, batches, name, dtype, half):
    _, adapter, _, _ = model_parts
    out = []
    for batch in batches:
        m = get_method(name, dtype=dtype, **({"head_mask": half} if name == "mask_lrp" else {}))
        with torch.no_grad():
            cap = adapter.capture(batch, m.needs)
        s = m.compute(cap, adapter, cap.pred).scores.double()
        out += [s[i, 1:int(n)].numpy() for i, n in enumerate(cap.lengths)]
    return out


def compare(got, want) -> str:
    rel = [np.abs(a - b).max() / max(np.abs(b).max(), 1e-300) for a, b in zip(got, want)]
    rho = [spearmanr(a, b).correlation if len(a) > 1 else 1.0 for a, b in zip(got, want)]
    return (f"{max(rel):9.2e} {sum(r > 1e-3 for r in rel):4d}/{len(rel):<4d} {np.nanmean(rho):8.5f} "
            f"{np.nanmin(rho):8.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO.parent / "shared/models/minilm-sst2"))
    ap.add_argument("--data", default=str(REPO.parent / "shared/data/sst2/dev.tsv"))
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--alone", type=int, default=32, help="examples also computed alone (the first of the run)")
    args = ap.parse_args()
    args.random_base, args.device = None, "cpu"
    parts = setup(args, torch.device("cpu"))
    batches = parts[2]
    adapter = parts[1]
    half = [[(l + h) % 2 for h in range(adapter.n_heads)] for l in range(adapter.n_layers)]
    # the same examples one by one (each alone, cut to its length), in batch order
    singles = []
    for batch in batches:
        lengths = batch["attention_mask"].sum(-1).tolist()
        singles += [{k: v[i:i + 1, :int(n)] for k, v in batch.items()} for i, n in enumerate(lengths)]
    singles = singles[:args.alone]
    print(f"{args.model}, first {args.limit} examples of {args.data}, batch {args.batch_size}")
    print(f"{'method':12s} {'precision':22s} {'max|d|/scale':>9s} {'>1e-3':>9s} {'mean rho':>8s} {'min rho':>8s}")
    for name in NAMES:
        ref = scores(parts, batches, name, "float64", half)
        for dtype in ("mixed", "model"):
            got = scores(parts, batches, name, dtype, half)
            print(f"{name:12s} {dtype + ' vs float64':22s} {compare(got, ref)}")
        for dtype in ("float64", "mixed", "model"):
            alone = scores(parts, singles, name, dtype, half)
            batched = scores(parts, batches, name, dtype, half)[:len(alone)]
            print(f"{name:12s} {dtype + ' alone vs batched':22s} {compare(alone, batched)}")


if __name__ == "__main__":
    main()
