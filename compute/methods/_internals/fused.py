"""DecompX's per-layer elementwise steps as fused operations (docs/methods.md "DecompX").

Each is one custom operator (torch.library): on a GPU with Triton (pip install 'attrscope[gpu]') one kernel
(compute.kernels.shares), elsewhere the few torch operations written here, which define its numbers. A chain of
small elementwise operations per layer would otherwise cost a kernel launch each; these read each vector once or
twice and write it once.

Shapes: vectors [R, n, D], one row r per receiving token (n parts, one per source token j, of D components).
"""

from __future__ import annotations

import torch
from torch.library import custom_op


def _weights(dots: torch.Tensor) -> torch.Tensor:
    """|dots| / sum_j |dots| in place ([R, n, 1]); a row whose dots are all 0 gets weights 0 (the reference's 1e-12
    leaves the bias out there too)."""
    w = dots.abs_()
    return w.div_(w.sum(-2, keepdim=True).clamp_min_(torch.finfo(w.dtype).tiny))


def _absdot_weights(vectors: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return _weights(torch.matmul(vectors, c[:, None]))


def _absdot_share_(vectors: torch.Tensor, bias: torch.Tensor) -> None:
    vectors.addcmul_(_weights(torch.matmul(vectors, bias[:, None])), bias)


def _ln_share(vectors: torch.Tensor, gain: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    y = (vectors - vectors.mean(-1, keepdim=True)).mul_(gain)
    return y.addcmul_(_weights(torch.matmul(y, beta[:, None])), beta)


def _ln_share_(vectors: torch.Tensor, gain: torch.Tensor, beta: torch.Tensor) -> None:
    # the same operations as _ln_share, in place (the same numbers)
    y = vectors.sub_(vectors.mean(-1, keepdim=True)).mul_(gain)
    y.addcmul_(_weights(torch.matmul(y, beta[:, None])), beta)


@custom_op("attrscope::absdot_weights", mutates_args=())
def absdot_weights(vectors: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """w_rj = |<v_rj, c>| / sum_j |<v_rj, c>| [R, n, 1]: DecompX's "absdot" share of a bias among the parts."""
    return _absdot_weights(vectors, c)


@custom_op("attrscope::absdot_share_", mutates_args=("vectors",))
def absdot_share_(vectors: torch.Tensor, bias: torch.Tensor) -> None:
    """v_rj += w_rj bias with w = absdot_weights(v, bias), in place: the bias added to the parts in proportion to
    |<v_rj, bias>|."""
    _absdot_share_(vectors, bias)


@custom_op("attrscope::ln_share", mutates_args=())
def ln_share(vectors: torch.Tensor, gain: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """A LayerNorm at a frozen scale applied to the parts: y_rj = gain_r * (v_rj - mean(v_rj)) (gain_r = gamma /
    sigma_r of the real state, [R, 1, D]), then beta shared by absdot."""
    return _ln_share(vectors, gain, beta)


@custom_op("attrscope::ln_share_", mutates_args=("vectors",))
def ln_share_(vectors: torch.Tensor, gain: torch.Tensor, beta: torch.Tensor) -> None:
    """ln_share in place, for parts that are not read again (the CPU's: there a fresh [R, n, D] result is a new
    mapping whose pages fault on first write, which cost more than the operation's arithmetic; a GPU's allocator
    reuses its blocks, and its Triton kernel writes ln_share's result)."""
    _ln_share_(vectors, gain, beta)


# On CUDA: the Triton kernels when they take the operands (compute.kernels.shares.runs: triton installed, float32 or
# float64, parts that fit a tile, the shapes these take), else the torch bodies above. Nothing here imports triton:
# shares does when a kernel first runs.

@absdot_weights.register_kernel("cuda")
def _absdot_weights_cuda(vectors, c):
    from ...kernels import shares

    return shares.absdot_weights(vectors, c) if shares.runs(vectors, c) else _absdot_weights(vectors, c)


@absdot_share_.register_kernel("cuda")
def _absdot_share_cuda(vectors, bias):
    from ...kernels import shares

    if shares.runs(vectors, bias):
        shares.absdot_share_(vectors, bias)
    else:
        _absdot_share_(vectors, bias)


@ln_share.register_kernel("cuda")
def _ln_share_cuda(vectors, gain, beta):
    from ...kernels import shares

    if shares.runs(vectors, beta, gain):
        return shares.ln_share(vectors, gain, beta)
    return _ln_share(vectors, gain, beta)


@absdot_weights.register_fake
def _(vectors, c):
    return vectors.new_empty(*vectors.shape[:-1], 1)


@ln_share.register_fake
def _(vectors, gain, beta):
    return torch.empty_like(vectors)
