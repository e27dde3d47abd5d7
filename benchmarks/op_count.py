"""ATen operations per batch for every method, against the bare model pass it needs (issue 26's budgets).

Every ATen operation a batch dispatches is a kernel launch on a GPU (views aside), so a method that issues many more
of them than the forward pass it reads is launch-bound there, however cheap it is on a CPU. This counts them with a
``TorchDispatchMode`` on the CPU, every block sized as on an 80 GB GPU, for a random BERT-base-shaped classifier
(hidden 768, 12 heads) of 12 and 24 layers on a batch of 2 x 24 tokens, and compares each method with its budget
(``Method.op_budget``):

    python benchmarks/op_count.py                     # the table at 12 and 24 layers
    python benchmarks/op_count.py --layers 12 --methods alti,globenc --top 15   # where one method's ops go
    python benchmarks/op_count.py --family llama --methods attnlrp,grads   # a random Llama (pre-LN decoder)

Columns: all ops (what the budget counts), of which views (no kernel), the ratio to the bare pass and the budget.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "tests"))

from op_counting import count_table  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="12,24", help="comma-separated depths (default 12,24)")
    ap.add_argument("--methods", default="all")
    ap.add_argument("--family", default="bert", choices=("bert", "llama"),
                    help="a random BERT-base-shaped classifier, or a Llama (the methods defined there)")
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--top", type=int, default=0, metavar="K", help="also list each method's K most frequent ops")
    args = ap.parse_args()
    failed = False
    for layers in [int(x) for x in args.layers.split(",")]:
        rows, bare = count_table(layers=layers, hidden=args.hidden, heads=args.heads, batch=args.batch,
                                 tokens=args.tokens, methods=args.methods, family=args.family)
        print(f"\n{args.family}, {layers} layers, hidden {args.hidden}, {args.heads} heads, batch {args.batch} x {args.tokens}: "
              f"bare forward {bare['forward'].total} ops ({bare['forward'].views} views), "
              f"bare forward + backward {bare['backward'].total} ({bare['backward'].views} views)")
        print(f"{'method':16s} {'ops':>7s} {'views':>6s} {'base':>9s} {'x base':>7s} {'budget':>7s}")
        for r in rows:
            ok = r.ratio <= r.budget
            failed |= not ok
            print(f"{r.method:16s} {r.count.total:7d} {r.count.views:6d} {r.base:>9s} {r.ratio:7.2f} "
                  f"{r.budget:7.2f}{'' if ok else '  OVER'}")
            if args.top:
                for op, k in r.count.by_op.most_common(args.top):
                    print(f"{'':18s}{k:6d}  {op}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
