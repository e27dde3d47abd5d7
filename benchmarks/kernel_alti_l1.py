"""The fused Triton kernel for ALTI's L1 proximities (compute/kernels/alti_l1.py) against the torch dense form:
milliseconds and agreement.

The torch form here is ``torch_dense``: what ``dense_l1_proximities`` (compute/methods/_internals/l1_proximity.py)
computes, written out on the same operands so that this script does not follow the internals' signatures: T - a
built a block of source tokens at a time (A and U source-major, one batched [n, H] x [H, d] product per source and
problem, the residual added on the diagonal), then |a| - |a - T| summed component by component, blocks sized to a
memory budget (ALTI's option ``memory_mb``). tests/test_kernel_alti_l1.py holds the kernel to the real function.

    python benchmarks/kernel_alti_l1.py                        # on CUDA: BERT-base shapes (below)
    python benchmarks/kernel_alti_l1.py --shapes 768x128,12x512 --reps 20
    TRITON_INTERPRET=1 python benchmarks/kernel_alti_l1.py     # no GPU: a dry run of a tiny shape (not a timing)

Shapes are N x n (N problems = layers x examples, n tokens), all with H = 12 heads and d = 768 (BERT-base): by
default 768 x 128 (12 layers x 64 examples) and 12 x 512. Inputs are random: attention rows from a softmax, value
vectors U laid out source-major as ``LayerParts.project_sources`` gives them (the kernel reads them through a
transposed view, the torch form as they are), targets a = sum_j T_ij + noise, and a residual diag.

Per shape it prints:
  * kernel: the first call (the autotuner timing its candidates and compiling: once per shape), then the median and
    minimum of --reps calls (CUDA events), and the configuration the autotuner chose;
  * torch dense: the same at ALTI's default block budget (--memory-mb 8) and a large one;
  * agreement: max |c_kernel - c_torch| / max |c_torch|, and each against a float64 torch reference on the first
    --check problems;
  * with --precisions ieee,tf32x3 (the default) also the kernel's opt-in "tf32x3" products, its time and its error
    against float64;
  * a float64 kernel run on a small shape (4 x 128) against the float64 torch form.
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

from compute.kernels import alti_l1  # noqa: E402

HEADS, WIDTH = 12, 768
FAILED: list[str] = []


def torch_dense(A: torch.Tensor, U_src: torch.Tensor, diag: torch.Tensor | None, a: torch.Tensor,
                memory_bytes: int) -> torch.Tensor:
    """c [N, n, n] as the torch dense form computes it (module docstring). A [N, H, n, n], U_src [n, N, H, d]."""
    N, H, n, _ = A.shape
    d = a.shape[-1]
    A_src = A.permute(3, 0, 2, 1).contiguous()  # [j, N, i, H]
    a_abs = a.abs()
    cols = max(1, min(n, memory_bytes // max(1, N * n * d * a.element_size())))
    c = torch.empty(N, n, n, dtype=a.dtype, device=a.device)
    buffer = a.new_empty(cols * N, n, d)  # one for every block
    for j0 in range(0, n, cols):
        j1 = min(n, j0 + cols)
        k = j1 - j0
        Z = torch.bmm(A_src[j0:j1].reshape(k * N, n, H), U_src[j0:j1].reshape(k * N, H, d),
                      out=buffer[:k * N]).view(k, N, n, d)  # T [j, N, i, d]
        if diag is not None:
            kk = torch.arange(k, device=a.device)
            Z[kk, :, j0 + kk, :] += diag[:, j0:j1, :].transpose(0, 1)
        Z.sub_(a)
        c[:, :, j0:j1] = torch.sub(a_abs, Z.abs_(), out=Z).sum(-1).permute(1, 2, 0)
    return c


def make_inputs(N: int, n: int, H: int, d: int, device, dtype, seed: int = 0):
    """(A [N, H, n, n], U_src [n, N, H, d], diag [N, n, d], a [N, n, d]), random and seeded."""
    g = torch.Generator(device=device).manual_seed(seed)
    A = (torch.randn(N, H, n, n, generator=g, device=device, dtype=dtype) * 2).softmax(-1)
    U_src = torch.randn(n, N, H, d, generator=g, device=device, dtype=dtype) / H ** 0.5
    diag = torch.randn(N, n, d, generator=g, device=device, dtype=dtype)
    a = torch.einsum("bhij,jbhk->bik", A, U_src) + diag + torch.randn(N, n, d, generator=g, device=device,
                                                                       dtype=dtype)
    return A, U_src, diag, a


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, reps: int, device):
    """(median ms, min ms, last result) over ``reps`` calls, CUDA events on a GPU, wall clock on the CPU."""
    times, out = [], None
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            out = fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), min(times), out


def attempt(label: str, fn):
    """fn() or None, printing a failure (and remembering it for the exit status)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a benchmark reports and goes on
        FAILED.append(label)
        print(f"  {label}: FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        traceback.print_exc(limit=3, file=sys.stderr)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return None


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def run_shape(N: int, n: int, args, device, dry: bool):
    print(f"\nN = {N} problems, n = {n} tokens, H = {HEADS}, d = {args.width}" + (" (dry run)" if dry else ""))
    A, U_src, diag, a = make_inputs(N, n, HEADS, args.width, device, torch.float32)
    U = U_src.transpose(0, 1)  # [N, n, H, d], a view
    reps = 1 if dry else args.reps
    results = {}

    for precision in args.precisions:
        def kernel(precision=precision):
            return alti_l1.l1_proximities(A, U, diag, a, precision=precision)

        def first(kernel=kernel):
            sync(device)
            t = time.perf_counter()
            c = kernel()
            sync(device)
            return (time.perf_counter() - t) * 1e3, c

        got = attempt(f"kernel {precision} first call", first)
        if got is None:
            continue
        config = alti_l1.chosen_config()
        got2 = attempt(f"kernel {precision}", lambda kernel=kernel: timed(kernel, reps, device))
        if got2 is None:
            continue
        med, best, c = got2
        results[f"kernel {precision}"] = c
        print(f"  kernel {precision:7s} first call {got[0]:10.1f} ms   median {med:9.3f} ms   min {best:9.3f} ms"
              + (f"   config {config}" if config else ""))

    for mb in args.memory_mb:
        def dense(mb=mb):
            return torch_dense(A, U_src, diag, a, mb << 20)

        got = attempt(f"torch dense {mb} MB", lambda dense=dense: timed(dense, max(1, min(reps, args.torch_reps)),
                                                                         device))
        if got is None:
            continue
        med, best, c = got
        results[f"torch {mb} MB"] = c
        print(f"  torch dense, {mb:5d} MB blocks          median {med:9.3f} ms   min {best:9.3f} ms")

    torch_keys = [k for k in results if k.startswith("torch")]
    if "kernel ieee" in results and torch_keys:
        diff = rel(results["kernel ieee"], results[torch_keys[0]])
        print(f"  kernel ieee vs {torch_keys[0]}: max |diff| / max |c| = {diff:.3e}")
    P = min(N, args.check)

    def reference():
        return torch_dense(A[:P].double(), U_src[:, :P].double(), diag[:P].double(), a[:P].double(), 64 << 20)

    ref = attempt("float64 reference", reference)
    if ref is not None:
        for key, c in results.items():
            print(f"  {key:16s} vs float64 on {P} problems: max |diff| / max |c| = {rel(c[:P], ref):.3e}")
    del A, U_src, U, diag, a, results


def run_float64(args, device, dry: bool):
    N, n = (2, 20) if dry else (4, 128)
    print(f"\nfloat64: N = {N}, n = {n}, H = {HEADS}, d = {args.width}")
    A, U_src, diag, a = make_inputs(N, n, HEADS, args.width, device, torch.float64, seed=1)
    reps = 1 if dry else args.reps

    def kernel():
        return alti_l1.l1_proximities(A, U_src.transpose(0, 1), diag, a)

    def dense():
        return torch_dense(A, U_src, diag, a, 64 << 20)

    got = attempt("kernel float64", lambda: (kernel(), timed(kernel, reps, device))[1])  # a first call, untimed
    ref = attempt("torch dense float64", lambda: timed(dense, reps, device))
    if got is not None:
        print(f"  kernel float64       median {got[0]:9.3f} ms   min {got[1]:9.3f} ms")
    if ref is not None:
        print(f"  torch dense float64  median {ref[0]:9.3f} ms   min {ref[1]:9.3f} ms")
    if got is not None and ref is not None:
        print(f"  kernel vs torch, float64: max |diff| / max |c| = {rel(got[2], ref[2]):.3e}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="cuda (default where there is one) or cpu (the interpreter)")
    ap.add_argument("--shapes", default="768x128,12x512", help="N x n, comma-separated (default 768x128,12x512)")
    ap.add_argument("--width", type=int, default=WIDTH, help="d (default 768)")
    ap.add_argument("--reps", type=int, default=10, help="timed kernel calls per shape (default 10)")
    ap.add_argument("--torch-reps", type=int, default=3, help="timed torch calls per shape and budget (default 3)")
    ap.add_argument("--memory-mb", default="8,1024", help="the torch form's block budgets, MB (default 8,1024)")
    ap.add_argument("--precisions", default="ieee,tf32x3", help="kernel products (default ieee,tf32x3)")
    ap.add_argument("--check", type=int, default=4, help="problems checked against float64 (default 4)")
    args = ap.parse_args()
    args.memory_mb = [int(x) for x in args.memory_mb.split(",") if x]
    args.precisions = [x for x in args.precisions.split(",") if x]

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dry = device.type == "cpu"
    if not alti_l1.available(device):
        print(f"the kernel cannot run on {device} here: " + (
            "set TRITON_INTERPRET=1 for a dry run on the CPU" if dry else "is triton installed (the gpu extra)?"))
        return 2
    import triton

    print(f"torch {torch.__version__}, triton {triton.__version__}, device: "
          + (torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU, Triton's interpreter"))
    if dry:
        print("dry run: one tiny shape, one call each; the times are the interpreter's, not the kernel's speed, and "
              "its products are exact whatever the precision")
        shapes = [(2, 20)]
        args.width = 64
    else:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",") if s]
    for N, n in shapes:
        attempt(f"shape {N}x{n}", lambda N=N, n=n: run_shape(N, n, args, device, dry))
    attempt("float64", lambda: run_float64(args, device, dry))
    if FAILED:
        print(f"\nFAILED: {', '.join(FAILED)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
