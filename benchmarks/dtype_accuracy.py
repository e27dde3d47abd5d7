"""What a half-precision model costs in accuracy, per method: --dtype bfloat16 / float16 against float32.

The model is loaded once per dtype; the same length-sorted batches of the first N dataset examples run through the
capture forward and every method, each method with its own intermediates (nothing shared between methods) and the
class that the float32 model predicts (so a flipped prediction does not change the class explained; the flips are
counted apart). The dtypes are interleaved batch by batch and method by method, so a busy machine slows them alike. Per method and dtype, over the real tokens of all examples:

  * max |s - s32|: the largest absolute difference of the final scores from float32's;
  * relative: that divided by max |s32| (methods of different scales compare);
  * Spearman: per-example rank correlation with float32's scores, mean and minimum (examples whose float32 or
    half-precision scores are constant have none and are counted);
  * time: the method's wall time over float32's, measured in this one run.

    python benchmarks/dtype_accuracy.py                          # 100 SST-2 dev sentences, CPU, every method
    python benchmarks/dtype_accuracy.py -n 40 --dtypes float16 --methods grad_l2,ig_l2
    python benchmarks/dtype_accuracy.py --device cuda -n 872     # on a GPU

mask_lrp runs with a fixed head mask (every other head) instead of its head-statistics pass.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from compute.data import load_dataset  # noqa: E402
from compute.methods import get_method, parse_methods  # noqa: E402
from compute.metrics.spearman import spearman_rho  # noqa: E402
from compute.models import load_model, resolve_device  # noqa: E402


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def batches_of(lm, texts, batch_size, dev):
    """Length-sorted padded batches (as attr-compute batches) and, per batch, the dataset rows it holds."""
    enc = lm.tokenizer(texts, truncation=True, max_length=512)
    order = sorted(range(len(texts)), key=lambda i: -len(enc["input_ids"][i]))
    out = []
    for b0 in range(0, len(order), batch_size):
        rows = order[b0:b0 + batch_size]
        padded = lm.tokenizer.pad({k: [enc[k][i] for i in rows] for k in ("input_ids", "token_type_ids")},
                                  return_tensors="pt")
        out.append((rows, {k: v.to(dev) for k, v in padded.items()}))
    return out


class DtypeRun:
    """One dtype's model, methods and what they produced: scores per method and example (float64, real tokens),
    seconds per method, predictions, capture seconds."""

    def __init__(self, args, dtype, dev, n_examples):
        self.lm = load_model(args.model, device=dev, dtype=dtype)
        ad = self.lm.adapter
        every_other_head = [[(l + h) % 2 for h in range(ad.n_heads)] for l in range(ad.n_layers)]
        extra = {"mask_lrp": {"head_mask": every_other_head}, "ig_l2": {"steps": args.ig_steps},
                 "ig_mean": {"steps": args.ig_steps}}
        self.methods = {n: get_method(n, **extra.get(n, {})) for n in args.names}
        self.needs = frozenset().union(*(m.needs for m in self.methods.values()))
        self.scores = {n: [None] * n_examples for n in self.methods}
        self.seconds = {n: 0.0 for n in self.methods}
        self.preds = np.zeros(n_examples, dtype=np.int64)
        self.t_capture = 0.0

    def capture(self, rows, batch, dev):
        _sync(dev)
        t0 = time.perf_counter()
        with torch.no_grad():
            cap = self.lm.adapter.capture(batch, self.needs)
        _sync(dev)
        self.t_capture += time.perf_counter() - t0
        self.preds[rows] = cap.pred.cpu().numpy()
        return cap

    def method(self, name, cap, rows, target, dev):
        cap.memo.clear()  # each method pays for its own intermediates
        cap.passes = self.methods[name].passes  # the gradient pass records the LRP tensors for LRP methods only
        t0 = time.perf_counter()
        with torch.no_grad():  # as attr-compute runs them (gradient methods enable grad themselves)
            res = self.methods[name].compute(cap, self.lm.adapter, target)
        _sync(dev)
        self.seconds[name] += time.perf_counter() - t0
        s = res.scores.double().cpu().numpy()
        for b, i in enumerate(rows):
            self.scores[name][i] = s[b, :int(cap.lengths[b])]


def run_all(args, dtypes, dev, texts) -> dict[str, DtypeRun]:
    """Every dtype on the same batches, interleaved (each batch's capture, then each method, in every dtype one
    after the other), so that a busy machine slows all dtypes alike and the time ratios hold."""
    runs = {d: DtypeRun(args, d, dev, len(texts)) for d in ["float32", *dtypes]}
    for rows, batch in batches_of(runs["float32"].lm, texts, args.batch_size, dev):
        caps = {d: r.capture(rows, batch, dev) for d, r in runs.items()}
        target = caps["float32"].pred  # the class the float32 model predicts, in every dtype
        for name in args.names:
            for d, r in runs.items():
                r.method(name, caps[d], rows, target, dev)
    return runs


def compare(ref: list[np.ndarray], got: list[np.ndarray]) -> dict:
    finite = all(np.isfinite(g).all() for g in got)
    diff = max(float(np.abs(g - r).max()) for r, g in zip(ref, got))
    scale = max(float(np.abs(r).max()) for r in ref)
    rhos = [spearman_rho(r, g) for r, g in zip(ref, got)]
    ok = [x for x in rhos if x == x]
    return {"finite": finite, "max_abs": diff, "relative": diff / scale if scale > 0 else float("nan"),
            "rho_mean": float(np.mean(ok)) if ok else float("nan"), "rho_min": float(np.min(ok)) if ok else float("nan"),
            "no_rho": len(rhos) - len(ok)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO.parent / "shared/models/minilm-sst2"))
    ap.add_argument("--data", default=str(REPO.parent / "shared/data/sst2/dev.tsv"))
    ap.add_argument("-n", "--limit", type=int, default=100, help="the first N examples (default 100)")
    ap.add_argument("--dtypes", default="bfloat16,float16", help="compared with float32 (default bfloat16,float16)")
    ap.add_argument("--methods", default="all")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:k or auto")
    ap.add_argument("--ig-steps", type=int, default=50, help="quadrature steps of ig_l2/ig_mean (default 50)")
    ap.add_argument("--threads", type=int, help="torch CPU threads [default: torch's]")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = resolve_device(args.device)
    args.names = parse_methods(args.methods)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    data = load_dataset(args.data, limit=args.limit)
    texts = [r.text for r in data.records]

    t0 = time.perf_counter()
    runs = run_all(args, dtypes, dev, texts)
    ref, ref_s, ref_pred, ref_cap = (runs["float32"].scores, runs["float32"].seconds, runs["float32"].preds,
                                     runs["float32"].t_capture)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(f"model {args.model}, {len(texts)} examples of {args.data}, batch {args.batch_size}, {dev} ({name}), "
          f"ig steps {args.ig_steps}, torch {torch.__version__}, {time.perf_counter() - t0:.0f} s in all")
    for d in dtypes:
        pred, cap_s = runs[d].preds, runs[d].t_capture
        print(f"{d}: {int((pred != ref_pred).sum())} of {len(texts)} predictions differ from float32's (the float32 "
              f"prediction is explained); capture forward {cap_s / ref_cap:.2f} x float32's time")
    head = "| method | " + " | ".join(f"{d} max abs diff | rel. | Spearman mean | min | time" for d in dtypes) + " |"
    print()
    print(head)
    print("|" + "---|" * (1 + 5 * len(dtypes)))
    bad = []
    for n in args.names:
        cells = []
        for d in dtypes:
            scores, seconds = runs[d].scores, runs[d].seconds
            c = compare(ref[n], scores[n])
            if not c["finite"]:
                bad.append(f"{n} ({d})")
            no_rho = f" ({c['no_rho']} const.)" if c["no_rho"] else ""
            cells.append(f"{c['max_abs']:.2g} | {c['relative']:.2g} | {c['rho_mean']:.4f} | {c['rho_min']:.3f}{no_rho}"
                         f" | {seconds[n] / ref_s[n]:.2f}x")
        print(f"| {n} | " + " | ".join(cells) + " |")
    if bad:
        print(f"\nNON-FINITE scores: {', '.join(bad)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
