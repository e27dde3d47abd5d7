"""ALTI's L1 proximities in one fused Triton kernel (docs/methods.md section 4; the torch forms are in
compute/methods/_internals/l1_proximity.py):

    c_ij = sum_k |a_ik| - |a_ik - T_ijk|,    T_ijk = sum_h A[h, i, j] U[j, h, k] + [i = j] diag[i, k]

for N independent problems (layers x examples, flattened). The torch dense form writes every T_ij (n^2 d numbers per
problem) to memory and reads it back; the kernel keeps each tile of T in registers (``_alti_l1_triton``).

triton is optional (the ``gpu`` extra): this module imports without it, and ``available`` says whether the kernel
can run for a device. On a GPU the launch is autotuned; with ``TRITON_INTERPRET=1`` (set before triton is first
imported) it runs on CPU tensors through Triton's interpreter, slowly, for tests.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
import sys
from typing import NamedTuple

import torch

DTYPES = (torch.float32, torch.float64)
# The oldest triton the kernel was checked with (the interpreter's tests and an sm_90 compile of every candidate):
# 3.4's tl.dot has no float64.
MIN_TRITON = (3, 5)
_KERNEL_MODULE = __name__.rpartition(".")[0] + "._alti_l1_triton"


class Blocks(NamedTuple):
    """A fixed launch configuration (powers of two): queries and sources per program, components per step, heads
    per ``tl.dot`` (at least 16: tl.dot's least K on NVIDIA GPUs up to triton 3.7; the interpreter takes less)."""
    queries: int
    sources: int
    dims: int
    heads: int = 16


# The interpreter's launch when none is given: few programs (each interpreted op costs the same at any block size).
INTERPRET_BLOCKS = Blocks(16, 16, 32, 16)
# tl.dot's products in float32: "ieee" (exact fp32, the default) or "tf32x3" (three TF32 tensor-core products per
# product, close to but not fp32: opt-in, its speed and accuracy to be measured by benchmarks/kernel_alti_l1.py).
PRECISIONS = ("ieee", "tf32x3")


def _interpreting() -> bool:
    """Whether the kernel is (or, once imported, will be) interpreted: fixed when triton.jit decorated it, which
    reads TRITON_INTERPRET (the values triton takes as true)."""
    module = sys.modules.get(_KERNEL_MODULE)
    if module is not None:
        return module.INTERPRETED
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


def _kernels():
    """The kernel module (imports triton)."""
    return importlib.import_module(_KERNEL_MODULE)


def available(device: torch.device | str, dtype: torch.dtype | None = None) -> bool:
    """Whether ``l1_proximities`` runs for tensors on ``device`` (and of ``dtype``, if given): triton importable (and
    at least ``MIN_TRITON``) and the device CUDA, or the interpreter on and the device the CPU."""
    device = torch.device(device)
    if dtype is not None and dtype not in DTYPES:
        return False
    if importlib.util.find_spec("triton") is None:
        return False
    if device.type == "cpu":
        if not _interpreting():
            return False
    elif device.type != "cuda" or _interpreting() or not torch.cuda.is_available():
        return False
    try:
        import triton

        if triton_version(triton.__version__) < MIN_TRITON:
            return False
        _kernels()
    except ImportError:  # a triton that does not import beside this torch
        return False
    return True


def triton_version(text: str) -> tuple[int, int]:
    """(major, minor) of a version string such as "3.5.0" or "3.6.0+git1234"."""
    m = re.match(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _next_power_of_2(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` with its last dimension contiguous (the loads along k are the coalesced ones)."""
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def l1_proximities(A: torch.Tensor, U: torch.Tensor, diag: torch.Tensor | None, a: torch.Tensor,
                   blocks: Blocks | None = None, precision: str = "ieee") -> torch.Tensor:
    """c [N, n, n] with c[:, i, j] = sum_k |a_ik| - |a_ik - T_ijk| (module docstring), in the inputs' dtype.

    A [N, H, n, n] attention probabilities; U [N, n, H, d] (U[:, j, h] = head h's value vector of source j through
    the output projection); diag [N, n, d] or None (added to T_ii only); a [N, n, d]. float32 or float64, all on
    one device for which ``available`` is true. ``blocks``: a fixed launch instead of the autotuner's (the
    interpreter always runs a fixed one, ``INTERPRET_BLOCKS`` by default). ``precision``: of float32 products
    (``PRECISIONS``; float64 ignores it)."""
    if A.dim() != 4 or U.dim() != 4 or a.dim() != 3:
        raise ValueError(f"expected A [N, H, n, n], U [N, n, H, d], a [N, n, d]; got {tuple(A.shape)}, "
                         f"{tuple(U.shape)}, {tuple(a.shape)}")
    N, H, n, n2 = A.shape
    d = a.shape[-1]
    if n2 != n or tuple(U.shape) != (N, n, H, d) or tuple(a.shape) != (N, n, d) or \
            (diag is not None and tuple(diag.shape) != (N, n, d)):
        raise ValueError(f"shapes do not agree: A {tuple(A.shape)}, U {tuple(U.shape)}, a {tuple(a.shape)}"
                         + ("" if diag is None else f", diag {tuple(diag.shape)}"))
    tensors = (A, U, a) + (() if diag is None else (diag,))
    if a.dtype not in DTYPES or any(t.dtype != a.dtype for t in tensors):
        raise TypeError(f"float32 or float64 tensors of one dtype expected, got {[t.dtype for t in tensors]}")
    if any(t.device != a.device for t in tensors):
        raise ValueError(f"tensors on several devices: {[str(t.device) for t in tensors]}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is none of {PRECISIONS}")
    if blocks is not None and (any(v < 1 or v & (v - 1) for v in blocks) or blocks.heads < 16):
        raise ValueError(f"block sizes must be powers of two, heads at least 16: {blocks}")
    if not available(a.device):
        raise RuntimeError(f"the Triton kernel cannot run on {a.device} here (triton missing or older than "
                           f"{'.'.join(map(str, MIN_TRITON))}, or CPU tensors without TRITON_INTERPRET=1 set before "
                           "triton was imported)")

    c = torch.empty(N, n, n, dtype=a.dtype, device=a.device)
    if N == 0 or n == 0:
        return c
    # A source-major ([N, j, i, H] in memory, as SourceBlocks lays it out): for a source j the [queries, heads] slice
    # the kernel reads is contiguous. One pass over N n^2 H numbers; skipped when the caller's A is laid out so.
    if not A.permute(0, 3, 2, 1).is_contiguous():
        A = A.permute(0, 3, 2, 1).contiguous().permute(0, 3, 2, 1)
    U, a = _unit_last(U), _unit_last(a)
    strides = (*A.stride(), *U.stride())
    kt = _kernels()

    def grid(meta):
        return (N * _cdiv(n, meta["BI"]) * _cdiv(n, meta["BJ"]),)

    # triton launches on the current CUDA device, not the tensors'
    with torch.cuda.device(a.device) if a.device.type == "cuda" else contextlib.nullcontext():
        args = (A, U, a, c, n, H, d, *strides, *a.stride(), *c.stride(), _next_power_of_2(n))
        # multiply-adds fused: the dot's are either way, the diagonal's too with this, whatever the triton version's
        # default (3.9 warns that its default will change)
        if blocks is None and not kt.INTERPRETED:
            kt.alti_l1_autotuned[grid](*args, PRECISION=precision, enable_fp_fusion=True)
        else:
            bi, bj, bk, hc = blocks or INTERPRET_BLOCKS
            kt.alti_l1_kernel[grid](*args, PRECISION=precision, BI=bi, BJ=bj, BK=bk, HC=hc, num_warps=4,
                                    enable_fp_fusion=True)
        if diag is not None:  # c_ii again, with the residual in T_ii (N n H d work, a second launch)
            diag = _unit_last(diag)
            kt.diagonal_kernel[(N * _cdiv(n, 16),)](A, U, diag, a, c, n, H, d, *strides, *diag.stride(), *a.stride(),
                                                    *c.stride(), BI=16, BK=64, num_warps=4, enable_fp_fusion=True)
    return c


def _cdiv(x: int, y: int) -> int:
    return -(-x // y)


def chosen_config() -> dict | None:
    """The autotuner's pick for the most recent autotuned launch (kwargs, num_warps, num_stages), or None where
    none ran (for benchmarks/kernel_alti_l1.py)."""
    if importlib.util.find_spec("triton") is None or _interpreting():
        return None
    tuned = _kernels().alti_l1_autotuned
    best = getattr(tuned, "best_config", None)
    if best is None:
        return None
    return {**best.kwargs, "num_warps": best.num_warps, "num_stages": best.num_stages}
