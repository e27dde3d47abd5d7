"""ALTI's L1 proximities sum_k |a_ik| - |a_ik - T_ijk| for every query i and source j (METHODS.md 2.2; docs/methods.md
section 4), with T_ij = sum_h A_ij^h U_j^h + [i=j] diag_i (``decomposition.operand_weights``, unscaled).

Two exact ways to the same numbers:

* ``dense``: every vector T_ij is built, a block of source tokens at a time: an n^2 H d contraction with inner
  dimension H and elementwise passes over n^2 d numbers. Its products alone cost about a forward's layer at n = 512.
* ``pruned``: per component, |a| - |a - t| = s t - 2 max(0, s t - |a|) with s = sign(a) (exact; s = +1 at a = 0).
  Summed over k, the first term is an inner product <s_i, T_ij> that needs no vectors (one [n, d] x [d, d] product
  and per-head [n, dh] x [dh, n] ones), and the second is non-zero only for the components where s_ik T_ijk > |a_ik|.
  Off the diagonal, |T_ijk| <= ||A_ij||_2 max_k ||U_jk||_2 =: b_ij (Cauchy-Schwarz over the heads), so only the
  r_ij components of row i with |a_ik| < b_ij can contribute. With the components of each row sorted by |a|, the
  first ``steps`` of them are evaluated for every pair (a gather of whole rows of U and a dot over heads: n^2 H per
  step) and the rest, for the few pairs with r_ij beyond that, one entry at a time. Past its r_ij, a component adds
  exactly 0 (|a_ik| >= b_ij >= |T_ijk|), so no mask is needed. The diagonal (the residual) is computed whole.

``choose_steps`` prices both from the histogram of r (the bound is cheap) and picks the faster. How much pruning
removes depends on how much single sources move a token: diffuse attention over many tokens (random BERT-base at
n = 512: r ~ 2 of 768 components) prunes almost everything, sharp attention on short sentences (trained models on
SST-2: r ~ 15-20% of d) nothing; there the dense form runs.
"""

from __future__ import annotations

import dataclasses

import torch

from ... import interrupts
from ...kernels import alti_l1
from .decomposition import LayerParts, SourceBlocks, attention_inner, flat, own_vectors, tokens_per_block, widened

# Relative costs in units of one pruned step over all pairs (a row gather of U and a dot over heads per pair), from
# timings on the 2-core CPU (random BERT-base and the trained MiniLM, n = 128 and 512): the dense form costs about
# d / 34 units per pair; one component of one pair evaluated alone TAIL_COST / pairs; the fixed work (the inner
# product, the projection and the diagonal: three n d^2 products, and a few passes over n^2 H numbers) about
# 3 + d^2 / (384 n) units.
DENSE_PER_DIM = 1 / 34
TAIL_COST = 6.0
# The probe estimates r's histogram from this many query rows of every example before the whole bound is sorted.
PROBE_ROWS = 32
# Below this length pruning does not pay for its fixed work (random BERT-base, one thread: n = 128 equal to the dense
# form, n = 256 1.7x faster, n = 512 2.5x; trained models on SST-2 sentences have r ~ 15-20% of d), and even the
# probe (the projection it needs) would be wasted: the dense form runs without asking.
PROBE_MIN_TOKENS = 256
PATHS = ("auto", "dense", "pruned", "kernel")


def l1_proximities(p: LayerParts, W: torch.Tensor, diag: torch.Tensor | None, a: torch.Tensor, memory_bytes: int,
                   path: str = "auto", steps: int | None = None) -> torch.Tensor:
    """sum_k |a_ik| - |a_ik - T_ijk| [*, n, n] for the layers of ``p`` (one, or a stack). ``path``: "auto" (on a GPU
    the fused Triton kernel where it runs, else the dense form; on the CPU the cheaper of the dense and the pruned
    form, by ``choose_steps``), "dense", "pruned" or "kernel" (the Triton kernel: compute.kernels.alti_l1); ``steps``
    fixes the pruned form's number of dense steps (tests)."""
    if path not in PATHS:
        raise ValueError(path)
    n = a.shape[-2]
    # the kernel lays the whole attention out anew in the vectors' dtype: where that copy exceeds the budget (a
    # streamed layer of a long input, its attention in the model's narrower dtype: issue 36) the dense form's
    # source blocks run instead, each widened and laid out on its own
    whole = p.A.numel() * a.element_size() <= memory_bytes
    if path == "kernel" or path == "auto" and a.device.type == "cuda" and whole and alti_l1.available(a.device, a.dtype):
        lead = a.shape[:-2]
        return alti_l1.l1_proximities(widened(flat(p.A, 3), a.dtype), flat(p.project(W), 3),
                                      None if diag is None else flat(diag, 2), flat(a, 2)).view(*lead, n, n)
    narrow = p.A.dtype != a.dtype
    if path == "dense" or path == "auto" and not probes(n, a.device.type, narrow):
        return dense_l1_proximities(p, W, diag, a, memory_bytes)
    if narrow:  # the pruned form asked for on a narrower attention: widened whole (its steps read every head's)
        p = dataclasses.replace(p, A=p.A.to(a.dtype))
    if p.stacked:  # the pruned form and its probe go a layer at a time (a CPU path: its loops cost no launches there)
        return torch.stack([l1_proximities(p.layer(k), W[k, 0], None if diag is None else diag[k], a[k], memory_bytes,
                                           path, steps) for k in range(a.shape[0])])
    if path == "pruned":
        return pruned_l1_proximities(p, W, diag, a, memory_bytes, force=True, steps=steps)
    c = pruned_l1_proximities(p, W, diag, a, memory_bytes)  # None after a probe that finds pruning too dear
    return dense_l1_proximities(p, W, diag, a, memory_bytes) if c is None else c


def probes(n: int, device_type: str, narrow: bool) -> bool:
    """Whether "auto" probes the pruned form (else the dense form runs, or a GPU's kernel): ``worth_probing``, on an
    attention in the vectors' dtype (``narrow``: a narrower one, a streamed layer's)."""
    return not narrow and worth_probing(n, device_type)


def may_prune(n: int, d: int, device_type: str, narrow: bool) -> bool:
    """Whether "auto" can run the pruned form on an attention of ``n`` tokens and vectors of ``d``: it probes
    (``probes``) and pruning's least cost, its fixed work with no step and no tail, is below the dense form's
    (``choose_steps``); else the dense form runs whatever the numbers. compute/memory_model.py counts the pruned
    form's memory where this holds."""
    return probes(n, device_type, narrow) and fixed_steps(n, d) < DENSE_PER_DIM * d


def worth_probing(n: int, device_type: str) -> bool:
    """Whether "auto" asks the pruned form at all: from PROBE_MIN_TOKENS tokens on, and on the CPU only (its costs
    were measured there; on a GPU the dense product's kernels are what has been measured, and the pruned form's
    gathers and host synchronisations are not)."""
    return device_type == "cpu" and n >= PROBE_MIN_TOKENS


def dense_l1_proximities(p: LayerParts, W: torch.Tensor, diag: torch.Tensor | None, a: torch.Tensor,
                         memory_bytes: int) -> torch.Tensor:
    """The vectors built a block of source tokens at a time, for every layer and example of ``p`` at once
    ([k, N, n, d] within ``memory_bytes``, N = layers x examples; heads contracted in the product); the diagonal, where
    the residual enters, from the tokens' own vectors (one [n, d] x [d, d] product)."""
    lead = a.shape[:-2]
    A, a_flat = flat(p.A, 3), flat(a, 2)
    N, n, d = a_flat.shape
    a_abs = a_flat.abs()
    cols = tokens_per_block(N, n, d, a.element_size(), memory_bytes)
    c = torch.empty(N, n, n, dtype=a.dtype, device=a.device)
    sources = SourceBlocks(A, p.project(W, source_major=True))
    buffer = a.new_empty(cols * N, n, d)  # one for every block
    for j0 in range(0, n, cols):
        interrupts.check()  # a stop asked for: between source blocks
        J = slice(j0, min(n, j0 + cols))
        Z = sources.block(J, out=buffer).sub_(a_flat)  # T - a [j, N, i, d] for the source block J
        # sum_k (|a_k| - |a_k - T_k|), summed dimension by dimension: each term is bounded by |T_k| (exactly 0 where
        # T = 0, e.g. a causal mask), so float32 does not lose small contributions in the difference of two large
        # sums (that form saves a pass but drifted 2.5x further from float64 on SST-2 and left 1e-7 where a token
        # takes nothing). In place, no temporaries.
        c[:, :, J] = torch.sub(a_abs, Z.abs_(), out=Z).sum(-1).permute(1, 2, 0)
    c = c.view(*lead, n, n)
    own = own_vectors(p, W, diag)  # T_ii, the residual included
    c.diagonal(dim1=-2, dim2=-1).copy_(torch.sub(a.abs(), (a - own).abs_()).sum(-1))
    return c


def fixed_steps(n: int, d: int) -> float:
    """The pruned form's cost beside its steps, in steps (``DENSE_PER_DIM``'s comment)."""
    return 3.0 + d * d / (384.0 * n)


def choose_steps(hist: torch.Tensor, n: int, d: int, force: bool = False) -> int | None:
    """The number of dense steps that makes the pruned form cheapest, from ``hist`` [K + 1] (pairs by r, any scale),
    or None where the dense form is cheaper (unless ``force``)."""
    hist = hist.double() / hist.sum()  # fractions of the pairs
    at_least = hist.flip(0).cumsum(0).flip(0)  # at_least[t] = share of pairs with r >= t
    # with t steps, sum over pairs of max(0, r - t) = sum_{u > t} at_least[u] entries are left one by one
    left = torch.cat([at_least.flip(0).cumsum(0).flip(0)[1:], hist.new_zeros(1)])  # left[t] = sum_{u > t}
    costs = torch.arange(hist.numel(), dtype=hist.dtype) + TAIL_COST * left
    steps = int(costs.argmin())
    if not force and fixed_steps(n, d) + float(costs[steps]) >= DENSE_PER_DIM * d:
        return None
    return steps


def pair_bounds(A: torch.Tensor, u_max: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """b_ij = ||A_ij||_2 u_max_j >= max_k |T_ijk| off the diagonal (Cauchy-Schwarz over heads: T_ijk = <A_ij, U_jk>),
    0 on it (computed whole) [B, i, j]; ``rows``: only those queries i. A [B, H, n, n], u_max [B, n]."""
    Ar = A if rows is None else A[:, :, rows]
    b = torch.linalg.vecdot(Ar, Ar, dim=1).sqrt_().mul_(u_max[:, None, :])
    if rows is None:
        b.diagonal(dim1=1, dim2=2).zero_()
    else:
        b[:, torch.arange(rows.numel(), device=A.device), rows] = 0
    return b


def pruned_l1_proximities(p: LayerParts, W: torch.Tensor, diag: torch.Tensor | None, a: torch.Tensor,
                          memory_bytes: int, force: bool = False, steps: int | None = None) -> torch.Tensor | None:
    """The sign split (module docstring); None where ``choose_steps`` finds the dense form cheaper (unless ``force``):
    what that costs is the projection and a sample of ``PROBE_ROWS`` query rows."""
    A = p.A  # [B, H, i, j]
    B, H, n, _ = A.shape
    d = a.shape[-1]
    dh = d // H
    # U[b, h, k, j] = (W^h v_j^h)_k: per head one [d, dh] x [dh, n] product; rows (b, h, k) are what the steps gather
    # (contiguous operands: 1.5x faster than the strided views)
    U = torch.matmul(W.view(d, H, dh).transpose(0, 1).contiguous(), p.v.permute(0, 2, 3, 1).contiguous())
    sq = U[:, 0].square()
    for h in range(1, H):  # a head at a time: [B, d, n] stays in cache (a reduction over dim 1 is 2x slower)
        sq.addcmul_(U[:, h], U[:, h])
    u_max = sq.amax(1).sqrt_()  # [B, j]: max_k ||U_jk||_2 over heads
    a_abs = a.abs()
    if steps is None and not force:  # a sample of query rows first: most batches that prune nothing stop here
        I = torch.linspace(0, n - 1, min(n, PROBE_ROWS), device=A.device).long()
        r = torch.searchsorted(a_abs[:, I].sort(-1).values, pair_bounds(A, u_max, I))
        if choose_steps(torch.bincount(r.view(-1), minlength=d + 1), n, d) is None:
            return None
    bound = a.new_empty(B, n, n)
    k = tokens_per_block(B * H, n, 1, A.element_size(), memory_bytes, copies=2)  # [B, H, k, n] rows and squares
    for i0 in range(0, n, k):  # a block of queries at a time: no [B, H, n, n] of squares beside the layer's attention
        bound[:, i0:i0 + k] = pair_bounds(A, u_max, torch.arange(i0, min(n, i0 + k), device=A.device))
    K = max(1, int((a_abs < bound.amax(-1, keepdim=True)).sum(-1).max()))
    srt, order = torch.topk(a_abs, K, dim=-1, largest=False, sorted=True)  # [B, n, K]: the smallest |a_ik|, ascending
    r = torch.searchsorted(srt, bound)  # [B, i, j]: components of row i that pair (i, j) can exceed
    if steps is None:
        steps = choose_steps(torch.bincount(r.view(-1), minlength=K + 1), n, d, force)
        if steps is None:
            return None
    steps = min(steps, K)
    s = torch.where(a >= 0, 1.0, -1.0).to(a.dtype)
    sign = torch.gather(s, -1, order)  # [B, n, K]: the signs of the sorted components

    c = attention_inner(p, W, s)  # <s_i, T_ij> off the diagonal, without the vectors
    excess = torch.zeros_like(c)  # sum_k max(0, s_ik T_ijk - |a_ik|)

    # steps: component t of every row i, for every pair: T_{i j k_t(i)} = sum_h A_ij^h U[h, k_t(i), j], a head at a
    # time (the gathered rows [B, i, n] of one head stay in cache while they are multiplied in)
    rows = U.view(B * H * d, n)
    row0 = torch.arange(B, device=A.device)[:, None, None] * (H * d) + order[..., :steps].transpose(1, 2)  # [B, t, i]
    T = torch.empty_like(c)
    for t in range(steps):
        interrupts.check()  # a stop asked for: between steps
        for h in range(H):
            G = rows.index_select(0, (row0[:, t] + h * d).view(-1)).view(B, n, n)
            if h == 0:
                torch.mul(G, A[:, 0], out=T)
            else:
                T.addcmul_(G, A[:, h])
        excess += T.mul_(sign[:, :, t, None]).sub_(srt[:, :, t, None]).clamp_min_(0)

    # the rest: pairs whose r goes past the steps, one component at a time
    flat_r, flat_excess, flat_U, flat_A = r.view(-1), excess.view(-1), U.view(-1), A.reshape(-1)
    heads = torch.arange(H, device=A.device)
    chunk = max(1, memory_bytes // (H * 8 * 4))  # a chunk's [N, H] indices and values
    for t in range(steps, K):
        interrupts.check()
        pairs = (flat_r > t).nonzero().squeeze(1)  # (b n + i) n + j
        if pairs.numel() == 0:
            break  # r > t implies r > t - 1: no pair goes further
        for q in pairs.split(chunk):
            bi = q // n
            j = q - bi * n
            b = bi // n
            at = bi * K + t  # row (b, i), component t of the sorted ones
            k = order.view(-1).index_select(0, at)
            bh = b[:, None] * H + heads  # [N, H]
            Tq = torch.linalg.vecdot(flat_U.take((bh * d + k[:, None]) * n + j[:, None]),
                                     flat_A.take(bh * (n * n) + (q - b * (n * n))[:, None]))
            Tq.mul_(sign.view(-1).index_select(0, at)).sub_(srt.view(-1).index_select(0, at))
            flat_excess.index_add_(0, q, Tq.clamp_min_(0))

    # the diagonal, whole (one [n, d] x [d, d] product: 2x faster than summing the heads of U, laid out for gathers)
    own = own_vectors(p, W, diag)
    c.diagonal(dim1=1, dim2=2).copy_(torch.linalg.vecdot(s, own))
    excess.diagonal(dim1=1, dim2=2).copy_((s * own - a_abs).clamp_min_(0).sum(-1))
    return c.sub_(excess, alpha=2)
