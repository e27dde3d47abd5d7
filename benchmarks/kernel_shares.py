"""DecompX's share kernels (compute/kernels/shares.py) against the torch bodies of the custom ops they implement on
CUDA (compute/methods/_internals/fused.py): milliseconds and agreement.

    python benchmarks/kernel_shares.py                          # on CUDA: DecompX's GPU shapes (below), float32
    python benchmarks/kernel_shares.py --dtypes float32,float64 --shapes 2048x128x768 --reps 50
    TRITON_INTERPRET=1 python benchmarks/kernel_shares.py       # no GPU: a dry run of a tiny shape (not a timing)

Shapes are R x n x D (receiving rows x parts x components): by default 2048x128x768 (a batch of 16 examples of 128
tokens at BERT-base's width: every row of a layer) and 16x128x768 (the last layer: the explained rows only). Inputs
are random and seeded: parts ~ N(0, 1), bias vectors ~ N(0, 1), gains in [0.5, 1.5); a tenth of the rows are zero
(their dots are all 0: weights 0).

For every shape, dtype and operation (absdot_weights, absdot_share_ in place, ln_share) it prints:
  * torch: the torch body as the custom op runs it without the kernel, median and minimum of --reps calls (CUDA
    events, one call each, after a warm-up call);
  * kernel: the first call (compiling for this shape's constants, once per process), then the same timings, with
    the default programs a row; and through the custom op (torch.ops.attrscope.*, the dispatcher's cost included);
  * for the out-of-place operations on shapes with fewer rows than SMs: the kernel with each of --splits programs
    a row;
  * agreement: max |kernel - torch| and max |torch| (the scale), and both against the torch body in float64 on the
    same inputs (which of the two is nearer the exact numbers);
  * GB/s: the bytes the kernel has to move (the tensor read twice and written once; read once for absdot_weights)
    over its median time, to set against the device's memory bandwidth.
Every measurement that fails (out of memory, a compile error) is printed as FAILED with its error, the script goes
on and exits with status 1. No figure is printed that was not measured in this run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from compute.kernels import shares  # noqa: E402
from compute.methods._internals import fused  # noqa: E402

FAILED: list[str] = []
OPS = ("absdot_weights", "absdot_share_", "ln_share")


def make_inputs(R: int, n: int, D: int, device, dtype, seed: int = 0):
    """(vectors [R, n, D], c [D], gain [R, 1, D]), seeded; every tenth row zero."""
    g = torch.Generator(device=device).manual_seed(seed)
    v = torch.randn(R, n, D, generator=g, device=device, dtype=dtype)
    v[::10] = 0
    c = torch.randn(D, generator=g, device=device, dtype=dtype)
    gain = torch.rand(R, 1, D, generator=g, device=device, dtype=dtype) + 0.5
    return v, c, gain


def torch_body(op: str):
    """The op's torch body; absdot_share_ on a copy (returned), so that every call sees the same inputs."""
    return {"absdot_weights": lambda v, c, g: fused._absdot_weights(v, c),
            "absdot_share_": lambda v, c, g: _in_place(fused._absdot_share_, v, c),
            "ln_share": lambda v, c, g: fused._ln_share(v, g, c)}[op]


def kernel(op: str, split: int | None = None):
    return {"absdot_weights": lambda v, c, g: shares.absdot_weights(v, c, split=split),
            "absdot_share_": lambda v, c, g: _in_place(shares.absdot_share_, v, c),
            "ln_share": lambda v, c, g: shares.ln_share(v, g, c, split=split)}[op]


def custom_op(op: str):
    ops = torch.ops.attrscope
    return {"absdot_weights": lambda v, c, g: ops.absdot_weights(v, c),
            "absdot_share_": lambda v, c, g: _in_place(ops.absdot_share_, v, c),
            "ln_share": lambda v, c, g: ops.ln_share(v, g, c)}[op]


def _in_place(fn, v, c):
    out = v.clone()
    fn(out, c)
    return out


def timed(fn, reps: int, device) -> dict:
    """The first call's seconds (wall, synchronised), then the median and minimum ms of ``reps`` calls timed one by
    one. An in-place op is timed on one tensor it keeps changing (the bias added again each call: the same work)."""
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize(device)
    first = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return {"first_s": first, "median_ms": statistics.median(times), "min_ms": min(times)}


def _timing_target(op: str, impl: str, v, c, gain, split=None):
    """What to time: the in-place op straight on ``v`` (no copy in the timing), the others as they are."""
    if op == "absdot_share_":
        fn = {"torch": fused._absdot_share_, "kernel": shares.absdot_share_,
              "custom op": torch.ops.attrscope.absdot_share_}[impl]
        return lambda: fn(v, c)
    f = {"torch": torch_body(op), "kernel": kernel(op, split), "custom op": custom_op(op)}[impl]
    return lambda: f(v, c, gain)


def attempt(label: str, fn):
    try:
        return fn()
    except Exception as e:  # report and go on: one failed measurement must not hide the others
        FAILED.append(label)
        print(f"  {label}: FAILED {type(e).__name__}: {e}")
        traceback.print_exc(limit=3)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return None


def fmt(t: dict | None) -> str:
    if t is None:
        return "FAILED"
    return f"median {t['median_ms']:8.3f} ms  min {t['min_ms']:8.3f} ms  (first call {t['first_s']:.3f} s)"


def agreement(op: str, v, c, gain) -> str:
    """max |kernel - torch| against the scale, and each against the float64 torch body."""
    k = kernel(op)(v, c, gain)
    t = torch_body(op)(v, c, gain)
    exact = torch_body(op)(v.double(), c.double(), gain.double())
    scale = t.abs().max().item()
    line = (f"max|kernel - torch| {(k - t).abs().max().item():.3e}  scale {scale:.3e}  "
            f"vs float64: kernel {(k.double() - exact).abs().max().item():.3e}, "
            f"torch {(t.double() - exact).abs().max().item():.3e}")
    nan = bool(k.isnan().any())
    zero_rows = (k[::10] - (0 if op != "absdot_share_" else v[::10])).abs().max().item()
    line += f"  NaN: {nan}  zero rows' result: {zero_rows:.1e}"
    if nan or not zero_rows == 0:
        FAILED.append(f"{op} zero rows / NaN")
    return line


def run_shape(R: int, n: int, D: int, dtype, reps: int, splits: list[int], device) -> None:
    v, c, gain = make_inputs(R, n, D, device, dtype)
    size = v.numel() * v.element_size()
    print(f"\nR={R} n={n} D={D} {dtype}  ({size / 2**20:.0f} MiB a tensor)  kernel takes it: "
          f"{shares.runs(v, c, gain)}")
    for op in OPS:
        print(f" {op}")
        if device.type != "cuda":  # the interpreter: agreement only
            line = attempt(f"{op} agreement {R}x{n}x{D} {dtype}", lambda: agreement(op, v, c, gain))
            if line is not None:
                print(f"  {line}")
            continue
        moved = size * (1 if op == "absdot_weights" else 3)
        results = {}
        for impl in ("torch", "kernel", "custom op"):
            t = attempt(f"{op} {impl} {R}x{n}x{D} {dtype}",
                        lambda: timed(_timing_target(op, impl, v.clone() if op == "absdot_share_" else v, c,
                                                     gain), reps, device))
            results[impl] = t
            extra = ""
            if t is not None and "median_ms" in t and impl != "torch":
                extra = f"  {moved / t['median_ms'] / 1e6:7.1f} GB/s"
            print(f"  {impl:10s} {fmt(t)}{extra}")
        if op != "absdot_share_" and R < torch.cuda.get_device_properties(device).multi_processor_count:
            for s in splits:
                t = attempt(f"{op} split {s} {R}x{n}x{D} {dtype}",
                            lambda: timed(_timing_target(op, "kernel", v, c, gain, split=s), reps, device))
                extra = f"  {moved / t['median_ms'] / 1e6:7.1f} GB/s" if t and "median_ms" in t else ""
                print(f"  split {s:<4d} {fmt(t)}{extra}")
        line = attempt(f"{op} agreement {R}x{n}x{D} {dtype}", lambda: agreement(op, v, c, gain))
        if line is not None:
            print(f"  {line}")
        same = attempt(f"{op} custom op = kernel", lambda: torch.equal(custom_op(op)(v, c, gain),
                                                                       kernel(op)(v, c, gain)))
        print(f"  custom op gives the kernel's numbers: {same}")
        if same is False:
            FAILED.append(f"{op} custom op is not the kernel")
    del v, c, gain
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="2048x128x768,16x128x768", help="comma-separated RxnxD")
    ap.add_argument("--dtypes", default="float32", help="comma-separated: float32, float64")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--splits", default="1,2,4,8,16", help="programs a row to try where rows are fewer than SMs")
    args = ap.parse_args()

    interpreted = shares._interpreting()
    if interpreted:
        device = torch.device("cpu")
        shapes = [(3, 5, 40)]  # the interpreter runs every op in numpy, slowly: a dry run of the code paths
        print("TRITON_INTERPRET=1: a dry run on the CPU of a tiny shape, agreement only (no timing)")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
        import triton

        p = torch.cuda.get_device_properties(device)
        print(f"{p.name}, {p.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}")
    else:
        sys.exit("no CUDA device, and TRITON_INTERPRET is not set (for a dry run on the CPU): nothing to measure")
    if not shares.available(torch.empty(0, device=device)):
        sys.exit("the share kernels are not available here (is triton installed?)")
    splits = [int(s) for s in args.splits.split(",")]
    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        for R, n, D in shapes:
            run_shape(R, n, D, dtype, 0 if interpreted else args.reps, splits, device)
    if FAILED:
        print(f"\nFAILED: {', '.join(FAILED)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
