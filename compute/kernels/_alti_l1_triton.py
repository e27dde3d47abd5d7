"""The Triton kernel behind ``alti_l1.l1_proximities`` (imported only when it runs: triton is an optional extra).

c_ij = sum_k |a_ik| - |a_ik - T_ijk| with T_ijk = sum_h A[h, i, j] U[j, h, k], for N independent problems. No T
reaches global memory: one program owns a block of BI queries and BJ sources of one problem; it walks the
components k in blocks of BK, keeps that block of ``a`` in registers and, source by source, builds the [BI, BK]
tile of T_.j. as ``tl.dot``s of [BI, HC] x [HC, BK] (heads in chunks of HC >= 16, zero-padded: tl.dot's least K
on NVIDIA GPUs up to triton 3.7, for float32 and float64 alike; 3.8 lowered it to 8 and 4) and folds |a| - |a - T|
over the tile's components into a [BI, BJ] accumulator. The operands of a source (a [BI, H] slice of the
source-major A, an [H, BK] slice of U) are small and read from cache; ``a`` and the output cross the program once.
The sum runs component by component, as the torch path's (never sum |a| - sum |a - T|: see
``dense_l1_proximities``).

The residual term (diag, on i = j only) is not in this kernel: ``diagonal_kernel`` rewrites c_ii afterwards with
T_ii = sum_h A[h, i, i] U[i, h] + diag_i (N n H d work), which keeps the diag tile's registers out of the main loop.

Products are fp32 ("ieee": torch's float32 matmul, which the dense path uses, does not use TF32 by default either)
unless PRECISION says otherwise; so on sm_90 the dot compiles to FFMA on the CUDA cores, register-tiled by Triton
("tf32x3": to wgmma on the tensor cores).

The launch decomposes one flat grid axis as (problem, source block, query block), query block fastest: programs
that run together share a problem and a source block, hence the same slices of U in L2. Offsets beyond a tile are
64-bit (one problem of A at n = 8192, H = 32 has 2^31 elements; a source-major U has N H d between tokens);
offsets within a tile are 32-bit.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def alti_l1_kernel(A, U, X, C, n, H, d,
                   sAb, sAh, sAi, sAj,
                   sUb, sUj, sUh, sUk,
                   sXb, sXi, sXk,
                   sCb, sCi, sCj,
                   n_bucket,  # the autotuner's key (n rounded up to a power of two), unused here
                   HC: tl.constexpr, PRECISION: tl.constexpr,
                   BI: tl.constexpr, BJ: tl.constexpr, BK: tl.constexpr):
    pid = tl.program_id(0)
    blocks_i = tl.cdiv(n, BI)
    blocks_j = tl.cdiv(n, BJ)
    ib = pid % blocks_i
    jb = (pid // blocks_i) % blocks_j
    b = (pid // (blocks_i * blocks_j)).to(tl.int64)
    i0 = ib.to(tl.int64) * BI
    j0 = jb.to(tl.int64) * BJ
    rows = tl.arange(0, BI)  # local: query i0 + rows
    row_ok = rows < n - i0
    heads = tl.arange(0, HC)
    cols = tl.arange(0, BJ)  # local: source j0 + cols
    sources = tl.minimum(n - j0, BJ).to(tl.int32)

    A += b * sAb + i0 * sAi + j0 * sAj
    U += b * sUb + j0 * sUj  # 64-bit: U may be a view of a source-major [n, N, H, d] (sUj = N H d)
    X += b * sXb + i0 * sXi
    C += b * sCb + i0 * sCi + j0 * sCj
    A_tile = rows[:, None] * sAi + heads[None, :] * sAh  # [BI, HC]: + h0 sAh + j sAj
    U_tile = heads[:, None] * sUh  # [HC, 1]: + components, + h0 sUh + j sUj

    acc = tl.zeros([BI, BJ], dtype=C.dtype.element_ty)
    for k0 in range(0, d, BK):
        ks = k0 + tl.arange(0, BK)
        k_ok = ks < d
        x = tl.load(X + rows[:, None] * sXi + ks[None, :] * sXk, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        Uk = U_tile + ks[None, :] * sUk  # [HC, BK]
        jA = A  # source j's slices: advanced a source at a time (pointer arithmetic is 64-bit; j sUj need not be)
        jU = U
        for j in range(0, sources):
            t = tl.zeros([BI, BK], dtype=C.dtype.element_ty)
            for h0 in range(0, H, HC):
                h_ok = heads < H - h0
                Aj = tl.load(jA + h0 * sAh + A_tile, mask=row_ok[:, None] & h_ok[None, :], other=0.0)
                Uj = tl.load(jU + h0 * sUh + Uk, mask=h_ok[:, None] & k_ok[None, :], other=0.0)
                t = tl.dot(Aj, Uj, t, input_precision=PRECISION, out_dtype=C.dtype.element_ty)
            # masked rows and components hold a = 0 and T = 0 and add exactly 0
            e = tl.sum(tl.abs(x) - tl.abs(x - t), axis=1)
            acc = tl.where(cols[None, :] == j, acc + e[:, None], acc)
            jA += sAj
            jU += sUj

    tl.store(C + rows[:, None] * sCi + cols[None, :] * sCj, acc, mask=row_ok[:, None] & (cols < sources)[None, :])


@triton.jit
def diagonal_kernel(A, U, D, X, C, n, H, d,
                    sAb, sAh, sAi, sAj,
                    sUb, sUj, sUh, sUk,
                    sDb, sDi, sDk,
                    sXb, sXi, sXk,
                    sCb, sCi, sCj,
                    BI: tl.constexpr, BK: tl.constexpr):
    """c_ii = sum_k |a_ik| - |a_ik - T_iik| with T_ii = sum_h A[h, i, i] U[i, h] + diag_i, for BI tokens of one
    problem per program (rank-1 updates a head at a time: N n H d work in all, no dot needed)."""
    pid = tl.program_id(0)
    blocks_i = tl.cdiv(n, BI)
    b = (pid // blocks_i).to(tl.int64)
    i0 = (pid % blocks_i).to(tl.int64) * BI
    rows = tl.arange(0, BI)
    row_ok = rows < n - i0
    rows64 = rows.to(tl.int64)  # U's token stride may be N H d (a source-major view)
    A += b * sAb + i0 * (sAi + sAj)
    U += b * sUb + i0 * sUj
    D += b * sDb + i0 * sDi
    X += b * sXb + i0 * sXi
    C += b * sCb + i0 * (sCi + sCj)
    acc = tl.zeros([BI], dtype=C.dtype.element_ty)
    for k0 in range(0, d, BK):
        ks = k0 + tl.arange(0, BK)
        tile_ok = row_ok[:, None] & (ks < d)[None, :]
        x = tl.load(X + rows[:, None] * sXi + ks[None, :] * sXk, mask=tile_ok, other=0.0)
        t = tl.load(D + rows[:, None] * sDi + ks[None, :] * sDk, mask=tile_ok, other=0.0)
        for h in range(0, H):
            w = tl.load(A + h * sAh + rows * (sAi + sAj), mask=row_ok, other=0.0)  # A[h, i, i]
            u = tl.load(U + h * sUh + rows64[:, None] * sUj + ks[None, :] * sUk, mask=tile_ok, other=0.0)
            t += w[:, None] * u
        acc += tl.sum(tl.abs(x) - tl.abs(x - t), axis=1)
    tl.store(C + rows * (sCi + sCj), acc, mask=row_ok)


INTERPRETED = isinstance(alti_l1_kernel, InterpretedFunction)


def _configs():
    """The candidates the autotuner times on a GPU: (BI, BJ, BK, HC, warps, stages). Chosen from an sm_90
    compile without a GPU (none spills registers in float32, "ieee" or "tf32x3"), not from timings:
    benchmarks/kernel_alti_l1.py prints the pick."""
    return [triton.Config({"BI": bi, "BJ": bj, "BK": bk, "HC": hc}, num_warps=warps, num_stages=stages)
            for bi, bj, bk, hc, warps, stages in CONFIGS]


CONFIGS = ((32, 32, 64, 16, 4, 1), (32, 32, 64, 16, 4, 2), (64, 32, 64, 16, 4, 1), (64, 32, 64, 16, 8, 1),
           (64, 32, 64, 16, 8, 2), (64, 64, 64, 16, 8, 2), (64, 32, 128, 16, 8, 1), (128, 32, 64, 16, 8, 1))


def _prune(configs, named_args, **kwargs):
    """No block larger than what it covers rounded up to a power of two (short inputs, small d), unless nothing
    would be left."""
    n, d = named_args["n"], named_args["d"]
    fits = [c for c in configs if c.kwargs["BI"] <= max(32, triton.next_power_of_2(n))
            and c.kwargs["BK"] <= max(64, triton.next_power_of_2(d))]
    return fits or configs[:1]


# Keyed on the rounded length, the head count, the width and the products' precision (and, by the autotuner itself,
# on the dtypes): a batch padded to a new length reuses the tuning of its power of two instead of timing every
# candidate again.
alti_l1_autotuned = triton.autotune(configs=_configs(), key=["n_bucket", "H", "d", "PRECISION"],
                                    prune_configs_by={"early_config_prune": _prune})(alti_l1_kernel)
