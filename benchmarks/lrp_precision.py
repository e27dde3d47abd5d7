"""Accuracy of the LRP family's precisions (--lrp-dtype) against float64.

Every LRP method (lrp, partial_lrp, transatt, mask_lrp) is computed with --lrp-dtype float64 (forward, backward and
rules on a float64 copy of the model) and with each other precision asked for (auto: the default, whatever it
resolves to; mixed: float64 forward and backward, float32 rules; model: the model's dtype throughout, the
reference's), batch by batch (length-sorted padded batches, as attr-compute runs them), and compared over the final
scores and the layer views:

* max|d|/scale: the largest |difference| over every example's scores and layer views, over the method's scale, the
  largest |float64 value| of its scores and layer views over all examples (issue 26's bound: <= 1e-3);
* worst ex.: the same per example, over the example's own largest |float64 value| (the worst example);
* >1e-3: examples whose difference exceeds 1e-3 of the method's scale;
* mean rho, min rho: Spearman rank correlation of each example's final scores with float64's (the explained
  token, 0 in both, left out), mean (bound: >= 0.9999) and minimum over the examples.

``alone vs batched`` repeats the comparison, in one precision, for examples computed one by one (cut to their
length) against the same examples inside their padded batches. mask_lrp keeps every other head (its cost and
conditioning do not depend on which).

    python benchmarks/lrp_precision.py --limit 100                 # the shared MiniLM-SST2, first 100 SST-2 dev
    python benchmarks/lrp_precision.py --random-base 32            # random 12-layer BERT-base, 32 x 64-128 tokens
    python benchmarks/lrp_precision.py --random-base 32 --device cuda --precisions auto,mixed,model
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from compute.methods import get_method  # noqa: E402
from compute.models import resolve_device  # noqa: E402

from bench_methods import setup  # noqa: E402

NAMES = ("lrp", "partial_lrp", "transatt", "mask_lrp")


def random_base(n_ex: int, lengths: tuple[int, int], batch_size: int, dev):
    """A seeded random BERT-base classifier (12 layers, hidden 768, 12 heads, float32) and ``n_ex`` random token
    sequences of seeded lengths in ``lengths``, as length-sorted padded batches."""
    from transformers import BertConfig, BertForSequenceClassification

    from compute.adapters import adapter_for

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(attn_implementation="eager")).to(dev).eval()
    ad = adapter_for(model)
    ad.mask_token_id, ad.sep_token_id = 103, 102
    g = torch.Generator().manual_seed(1)
    ns = torch.randint(lengths[0], lengths[1] + 1, (n_ex,), generator=g).sort(descending=True).values.tolist()
    batches = []
    for b0 in range(0, n_ex, batch_size):
        rows = ns[b0:b0 + batch_size]
        ids = torch.zeros(len(rows), rows[0], dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, n in enumerate(rows):
            ids[i, :n] = torch.randint(1000, 30000, (n,), generator=g)
            ids[i, 0], ids[i, n - 1] = 101, 102
            mask[i, :n] = 1
        batches.append({"input_ids": ids.to(dev), "attention_mask": mask.to(dev),
                        "token_type_ids": torch.zeros_like(ids).to(dev)})
    return model, ad, batches


def run(adapter, batches, name, dtype, half):
    """[(final scores [n], layer views [L, n])] per example, and the precision that ran (auto resolves)."""
    out, ran = [], None
    params = {"head_mask": half} if name == "mask_lrp" else {}
    for batch in batches:
        m = get_method(name, **params) if dtype == "auto" else get_method(name, dtype=dtype, **params)
        ran = m.params["dtype"]
        with torch.no_grad():
            cap = adapter.capture(batch, m.needs)
        res = m.compute(cap, adapter, cap.pred)
        s, v = res.scores.double().cpu(), res.layer_scores.double().cpu()
        out += [(s[i, :int(n)].numpy(), v[i, :, :int(n)].numpy()) for i, n in enumerate(cap.lengths.tolist())]
    return out, ran


def compare(got, want) -> str:
    scale = max(max(np.abs(s).max(), np.abs(v).max()) for s, v in want)
    diff = [max(np.abs(gs - ws).max(), np.abs(gv - wv).max()) for (gs, gv), (ws, wv) in zip(got, want)]
    own = [d / max(np.abs(ws).max(), np.abs(wv).max(), 1e-300) for d, (ws, wv) in zip(diff, want)]
    # Spearman over the final scores less the explained ([CLS], position 0) token's 0
    rho = [spearmanr(gs[1:], ws[1:]).correlation if len(ws) > 2 else 1.0 for (gs, _), (ws, _) in zip(got, want)]
    return (f"{max(diff) / scale:12.2e} {max(own):10.2e} {sum(d > 1e-3 * scale for d in diff):4d}/{len(diff):<4d} "
            f"{np.nanmean(rho):9.6f} {np.nanmin(rho):8.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO.parent / "shared/models/minilm-sst2"))
    ap.add_argument("--data", default=str(REPO.parent / "shared/data/sst2/dev.tsv"))
    ap.add_argument("--limit", type=int, default=100, help="examples of --data (default 100)")
    ap.add_argument("--random-base", type=int, metavar="N",
                    help="a random 12-layer BERT-base on N random sequences of --lengths tokens instead")
    ap.add_argument("--lengths", default="64,128", help="--random-base: shortest,longest sequence (default 64,128)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--methods", default=",".join(NAMES))
    ap.add_argument("--precisions", default="auto,mixed,model", help="compared with float64 (default auto,mixed,model)")
    ap.add_argument("--alone", type=int, default=0, metavar="K",
                    help="also compare the first K examples computed alone with the same in their batches")
    ap.add_argument("--alone-precisions", default="auto", help="precisions of the alone-vs-batched rows")
    args = ap.parse_args()
    dev = resolve_device(args.device)
    if args.random_base:
        lo, hi = (int(x) for x in args.lengths.split(","))
        _, adapter, batches = random_base(args.random_base, (lo, hi), args.batch_size, dev)
        what = f"random 12-layer BERT-base, {args.random_base} random sequences of {lo}-{hi} tokens"
    else:
        args.random_base, args.join = None, 1
        _, adapter, batches, _ = setup(args, dev)
        what = f"{args.model}, first {args.limit} examples of {args.data}"
    half = [[(l + h) % 2 for h in range(adapter.n_heads)] for l in range(adapter.n_layers)]
    print(f"{what}, batch {args.batch_size}, {dev}, torch {torch.__version__}")
    print(f"{'method':12s} {'precision':26s} {'max|d|/scale':>12s} {'worst ex.':>10s} {'>1e-3':>9s} {'mean rho':>9s} "
          f"{'min rho':>8s}")
    singles = []
    for batch in batches:  # the same examples one by one (each alone, cut to its length), in batch order
        lengths = batch["attention_mask"].sum(-1).tolist()
        singles += [{k: v[i:i + 1, :int(n)] for k, v in batch.items()} for i, n in enumerate(lengths)]
    singles = singles[:args.alone]
    for name in args.methods.split(","):
        t0 = time.perf_counter()
        ref, _ = run(adapter, batches, name, "float64", half)
        for dtype in args.precisions.split(","):
            got, ran = run(adapter, batches, name, dtype, half)
            label = f"{dtype} ({ran}) vs float64" if dtype == "auto" else f"{dtype} vs float64"
            print(f"{name:12s} {label:26s} {compare(got, ref)}", flush=True)
        for dtype in (args.alone_precisions.split(",") if singles else ()):
            alone, ran = run(adapter, singles, name, dtype, half)
            batched, _ = run(adapter, batches, name, dtype, half)
            print(f"{name:12s} {f'{ran}, alone vs batched':26s} {compare(alone, batched[:len(alone)])}", flush=True)
        print(f"{'':12s} ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
