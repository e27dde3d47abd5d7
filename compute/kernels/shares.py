"""DecompX's share operations (compute/methods/_internals/fused.py) as one Triton kernel each:

    absdot_weights(v, c)          w_rj = |<v_rj, c>| / max(sum_j |<v_rj, c>|, tiny)                  [R, n, 1]
    absdot_share_(v, b)           v_rj += w_rj(v, b) b                                              in place
    ln_share(v, gain, beta)       y_rj = gain_r * (v_rj - mean_k v_rjk);  y_rj + w_rj(y, beta) beta   [R, n, D]

for vectors v [R, n, D] (R receiving rows, n parts, D components), tiny = torch.finfo(dtype).tiny (a row whose dots
are all 0 gets weights 0). The torch bodies in fused.py define the numbers; these kernels compute the same in
another order of summation.

Each program takes one row r in two passes: the first sums |dot| over the n parts (in tiles of BLOCK_N parts x all
D components), the second recomputes each tile's dots from the tile it has to read anyway (the same code, so the
same numbers) and writes the result; absdot_weights instead stores |dot| in the first pass and divides it in the
second. Passes over the [R, n, D] tensor, as the code reads (not measured): absdot_weights 1 read (the torch body
also 1, in 5 launches), absdot_share_ 2 reads + 1 write (the torch body the same, in 6 launches), ln_share 2 reads
+ 1 write (the torch body 5 reads + 3 writes, in 9 launches).

triton is optional (the ``gpu`` extra): this module imports without it; the kernels are built at their first use,
and ``available`` says whether they can run for a tensor. With ``TRITON_INTERPRET=1`` set before that first use,
they run on CPU tensors through Triton's interpreter (slowly: for tests). Checked with triton 3.9 (interpreter and
an sm_90 compile), 3.7 (interpreter) and 3.5 (sm_90 compile; there float32 divisions compile to div.rn.ftz, which
flushes quotients under 2**-126 to 0).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os

import torch

DTYPES = (torch.float32, torch.float64)
# A program keeps one tile [BLOCK_N, BLOCK_D] of parts in registers (and the centred copy under LayerNorm): 32 KiB
# where D allows, 8 warps.
TILE_BYTES = 32 << 10
# The widest parts taken: one part (BLOCK_D, a power of two at least D, components) of this many bytes still fits a
# program's registers (fp64 parts of 8192 spill on sm_90). Wider ones go to the torch body.
MAX_PART_BYTES = 32 << 10

_built: dict | None = None  # the jit kernels and the mode they were built in, at first use
tl = None  # triton.language, set by _kernels() (the kernels' bodies name it)


def _interpreting() -> bool:
    """Whether the kernels are (or, once built, will be) run by Triton's interpreter: fixed when triton.jit wraps
    them, which reads TRITON_INTERPRET (the values triton takes as true)."""
    if _built is not None:
        return _built["interpreted"]
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


@functools.cache
def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def available(tensor: torch.Tensor) -> bool:
    """Whether the kernels can run on ``tensor``'s device: triton importable and a CUDA tensor (the interpreter
    off: it would copy every tensor to the host), or the interpreter on and a CPU tensor."""
    if not _has_triton():
        return False
    if tensor.device.type == "cpu":
        return _interpreting()
    return tensor.device.type == "cuda" and not _interpreting()


def runs(vectors: torch.Tensor, c: torch.Tensor, gain: torch.Tensor | None = None) -> bool:
    """Whether the kernels take these operands: ``available``, float32 or float64 throughout on one device, vectors
    [R, n, D] whose parts fit a tile (MAX_PART_BYTES) and whose rows have fewer than 2**31 numbers (offsets within
    a row are int32), c [D] and (ln_share) a gain that broadcasts to one gain a row [R, 1, D]. Otherwise the torch
    body runs (and raises what it raises for operands it refuses)."""
    if vectors.dim() != 3 or vectors.dtype not in DTYPES or not available(vectors):
        return False
    R, n, D = vectors.shape
    if n * D >= 2**31:
        return False
    others = (c,) if gain is None else (c, gain)
    if any(t.dtype != vectors.dtype or t.device != vectors.device for t in others):
        return False
    if c.shape != (D,) or not (0 < D and _block_d(D) * vectors.element_size() <= MAX_PART_BYTES):
        return False
    if gain is None:
        return True
    try:
        return gain.dim() <= 3 and torch.broadcast_shapes(gain.shape, (R, 1, D)) == (R, 1, D)
    except RuntimeError:
        return False


# ----------------------------------------------------------------------------------------------------------------
# the kernels: plain functions here, wrapped by triton.jit in _kernels() (triton is imported only there)

def _div(a, b):
    """a / b rounded to nearest, for float operands: div_rn in float32 (triton's "/" may be approximate there; up to
    3.5 tl.fdiv's ieee_rounding does nothing), "/" in float64 (IEEE anyway; div_rn takes float32 only)."""
    if a.dtype == tl.float64:  # decided at compile time: one branch is compiled (a single return: triton 3.5)
        q = a / b
    else:
        q = tl.math.div_rn(a, b)
    return q


def _tile(V, c, g, row, j0, n, D, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, LN: tl.constexpr):
    """Parts j0 .. j0 + BLOCK_N of the row starting at V + row: their in-row offsets, mask, the parts (0 past n and
    D; centred over D and times the gain ``g`` under LN) and their dots with ``c`` (loaded, 0 past D)."""
    j = j0 + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_D)
    mask = (j < n)[:, None] & (k < D)[None, :]
    offs = j[:, None] * D + k[None, :]  # within a row: n * D < 2**31
    v = tl.load(V + row + offs, mask=mask, other=0.0)
    if LN:
        mean = _div(tl.sum(v, axis=1), D * 1.0)  # as torch's mean: the sum / D, rounded (D < 2**24: exact)
        v = tl.where(mask, (v - mean[:, None]) * g[None, :], 0.0)
    return offs, mask, v, tl.sum(v * c[None, :], axis=1)


def _weights_kernel(V, C, W, n, D, TINY: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """W [R, n] = |<v_rj, c>| / max(sum_j |<v_rj, c>|, TINY), one program per row (axis 0) and chunk of its parts
    (axis 1: each program sums over the whole row, the same numbers in each, and writes its chunk)."""
    r = tl.program_id(0).to(tl.int64)
    chunk = tl.cdiv(tl.cdiv(n, tl.num_programs(1)), BLOCK_N) * BLOCK_N
    first = tl.program_id(1) * chunk
    k = tl.arange(0, BLOCK_D)
    c = tl.load(C + k, mask=k < D, other=0.0)
    acc = tl.zeros([BLOCK_N], dtype=V.dtype.element_ty)
    for j0 in range(0, n, BLOCK_N):
        _, _, _, dots = _tile(V, c, c, r * n * D, j0, n, D, BLOCK_N, BLOCK_D, False)
        a = tl.abs(dots)
        acc += a
        j = j0 + tl.arange(0, BLOCK_N)
        tl.store(W + r * n + j, a, mask=(j < n) & (j >= first) & (j < first + chunk))
    total = tl.maximum(tl.sum(acc, axis=0), TINY)
    tl.debug_barrier()  # the |dots| this program stored are read back by other threads of it
    for j0 in range(first, tl.minimum(first + chunk, n), BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        a = tl.load(W + r * n + j, mask=j < n, other=0.0)
        tl.store(W + r * n + j, _div(a, total), mask=j < n)


def _share_kernel(V, G, C, OUT, n, D, stride_gr, stride_gd, TINY: tl.constexpr, LN: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """OUT_rj = y_rj + |<y_rj, c>| / max(sum_j |<y_rj, c>|, TINY) c, with y = v (OUT may be V: in place) or, under
    LN, y = (v - mean(v)) * g_r (G [R, D] with strides). Programs as in _weights_kernel; in place there is one a row
    (a chunk written before another program of the row has read it would change that program's sum)."""
    r = tl.program_id(0).to(tl.int64)
    chunk = tl.cdiv(tl.cdiv(n, tl.num_programs(1)), BLOCK_N) * BLOCK_N
    first = tl.program_id(1) * chunk
    row = r * n * D
    k = tl.arange(0, BLOCK_D)
    c = tl.load(C + k, mask=k < D, other=0.0)
    g = c  # unused without LN
    if LN:
        g = tl.load(G + r * stride_gr + k * stride_gd, mask=k < D, other=0.0)
    acc = tl.zeros([BLOCK_N], dtype=V.dtype.element_ty)
    for j0 in range(0, n, BLOCK_N):
        _, _, _, dots = _tile(V, c, g, row, j0, n, D, BLOCK_N, BLOCK_D, LN)
        acc += tl.abs(dots)
    total = tl.maximum(tl.sum(acc, axis=0), TINY)
    # backwards through the chunk: the tiles the first pass read last are the likeliest to be in L2 still
    tiles = tl.cdiv(tl.maximum(tl.minimum(first + chunk, n) - first, 0), BLOCK_N)
    for t in range(0, tiles):
        j0 = first + (tiles - 1 - t) * BLOCK_N
        offs, mask, y, dots = _tile(V, c, g, row, j0, n, D, BLOCK_N, BLOCK_D, LN)
        w = _div(tl.abs(dots), total)
        tl.store(OUT + row + offs, y + w[:, None] * c[None, :], mask=mask)


def _kernels() -> dict:
    """The jit kernels, built at the first call (importing triton then, not with this module)."""
    global _built, tl, _div, _tile
    if _built is None:
        interpreted = _interpreting()
        import triton
        import triton.language

        tl = triton.language  # the name the kernels' bodies use, resolved when triton compiles them
        # called from the kernels: jit functions by the time they compile
        _div, _tile = triton.jit(_div), triton.jit(_tile)
        _built = {"interpreted": interpreted, "weights": triton.jit(_weights_kernel),
                  "share": triton.jit(_share_kernel)}
    return _built


# ----------------------------------------------------------------------------------------------------------------
# launches

def _block_d(D: int) -> int:
    return max(16, 1 << (D - 1).bit_length())


def _launch(vectors: torch.Tensor) -> tuple[int, int, int, dict]:
    """BLOCK_N, BLOCK_D, the TINY floor and the launch options for vectors [R, n, D]."""
    _, n, D = vectors.shape
    block_d = _block_d(D)
    per_tile = max(1, TILE_BYTES // (block_d * vectors.element_size()))
    block_n = max(2, min(1 << (n - 1).bit_length(), 1 << (per_tile.bit_length() - 1)))
    # about 32 float32 (16 float64) values of a tile a thread
    warps = min(16, max(4, block_n * block_d * vectors.element_size() // 4096))
    # FMA contraction as triton <= 3.9 does by default (3.10 changes the default)
    return block_n, block_d, torch.finfo(vectors.dtype).tiny, {"num_warps": warps, "enable_fp_fusion": True}


def _split(vectors: torch.Tensor, split: int | None, block_n: int) -> int:
    """Programs a row: given, or on a GPU about as many as give every SM one program when there are fewer rows than
    SMs (not yet measured against other choices: benchmarks/kernel_shares.py times several), at most one a tile of
    parts. Each program reads the whole row for the sum (the others' reads of it come from L2) and writes its
    chunk."""
    R, n, _ = vectors.shape
    tiles = -(-n // block_n)
    if split is None:
        if vectors.device.type != "cuda":
            return 1
        sms = torch.cuda.get_device_properties(vectors.device).multi_processor_count
        split = max(1, sms // max(R, 1))
    if split < 1:
        raise ValueError(f"split must be at least 1, not {split}")
    return min(split, tiles)


def _on(t: torch.Tensor):
    """The tensor's GPU made current for the launch: triton launches on the current device, not the operands'."""
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


def _check(vectors: torch.Tensor, c: torch.Tensor, gain: torch.Tensor | None = None) -> None:
    if not runs(vectors, c, gain):
        what = "" if gain is None else f", gain {tuple(gain.shape)}"
        raise RuntimeError(f"the share kernels cannot run on vectors {vectors.dtype} {tuple(vectors.shape)} on "
                           f"{vectors.device} with c {c.dtype} {tuple(c.shape)}{what} (see shares.runs)")


def absdot_weights(vectors: torch.Tensor, c: torch.Tensor, *, split: int | None = None) -> torch.Tensor:
    """|<v_rj, c>| / max(sum_j |<v_rj, c>|, tiny) [R, n, 1] (fused.absdot_weights). ``split``: programs per row
    (default: by the device's SMs on a GPU, 1 elsewhere)."""
    _check(vectors, c)
    R, n, D = vectors.shape
    c = c.contiguous()
    out = vectors.new_empty(R, n, 1)
    if R == 0 or n == 0:
        return out
    v = vectors.contiguous()
    block_n, block_d, tiny, options = _launch(v)
    grid = (R, _split(v, split, block_n))
    with _on(v):
        _kernels()["weights"][grid](v, c, out, n, D, TINY=tiny, BLOCK_N=block_n, BLOCK_D=block_d, **options)
    return out


def absdot_share_(vectors: torch.Tensor, bias: torch.Tensor) -> None:
    """v_rj += w_rj bias, w = absdot_weights(v, bias), in place (fused.absdot_share_): one program a row."""
    _check(vectors, bias)
    R, n, D = vectors.shape
    bias = bias.contiguous()
    if R == 0 or n == 0:
        return
    v = vectors.contiguous()  # a non-contiguous input: computed in a copy, copied back
    block_n, block_d, tiny, options = _launch(v)
    with _on(v):
        _kernels()["share"][(R, 1)](v, v, bias, v, n, D, 0, 0, TINY=tiny, LN=False, BLOCK_N=block_n,
                                    BLOCK_D=block_d, **options)
    if v is not vectors:
        vectors.copy_(v)


def ln_share(vectors: torch.Tensor, gain: torch.Tensor, beta: torch.Tensor, *,
             split: int | None = None) -> torch.Tensor:
    """gain * (v - mean(v)) with beta shared by absdot [R, n, D] (fused.ln_share); ``gain`` broadcasts to
    [R, 1, D] (one gain a row). ``split`` as in absdot_weights."""
    _check(vectors, beta, gain)
    R, n, D = vectors.shape
    beta = beta.contiguous()
    g = gain.expand(R, 1, D)[:, 0]  # [R, D], stride 0 where gain broadcasts
    out = vectors.new_empty(R, n, D)
    if R == 0 or n == 0:
        return out
    v = vectors.contiguous()
    block_n, block_d, tiny, options = _launch(v)
    grid = (R, _split(v, split, block_n))
    with _on(v):
        _kernels()["share"][grid](v, g, beta, out, n, D, g.stride(0), g.stride(1), TINY=tiny, LN=True,
                                  BLOCK_N=block_n, BLOCK_D=block_d, **options)
    return out
