"""Attention-block decomposition of post-LN layers (Kobayashi et al. 2021; METHODS.md 1.1 and 10).

For layer l, query i and source token j (heads h, centering P = I - 11^T/d):

    u_j^h      = W_O^h (W_V^h x_j + b_V^h)                         value vector through the output projection
    z_{i<-j}   = sum_h A_ij^h u_j^h                                attention only
    z+_{i<-j}  = z_{i<-j} + [i=j] x_i                              plus the residual on the diagonal
    T_i(x_j)   = gamma1 * P z+_{i<-j} / sigma1_i                   LN1-linearised (sigma1_i of the REAL pre-LN1 state)
    x~_{i<-j}  = gamma2 * P T_i(x_j) / sigma2_i                    through LN2 (GlobEnc; sigma2_i of the real state)

Because P and the gains are linear, they are applied once to u and x (``LayerParts``), never to n x n x d tensors.
Norms of these vectors use Gram matrices over heads (``decomposed_norms``): no heads x n x n x d tensor is ever built.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from ...adapters import Adapter, Captured


def center(v: torch.Tensor) -> torch.Tensor:
    return v - v.mean(dim=-1, keepdim=True)


def ln_sigma(s: torch.Tensor, eps: float) -> torch.Tensor:
    """sigma(s) = sqrt(mean((s - mean s)^2) + eps) (ALTI's reference code drops eps: eps = 0)."""
    # one fused norm of the centred rows (torch.var is 10x slower on CPU)
    return (torch.linalg.vector_norm(center(s), dim=-1).square() / s.shape[-1] + eps).sqrt()


@dataclass
class LayerParts:
    """Per-layer tensors of the decomposition, batched and padded ([B, ...])."""

    A: torch.Tensor  # [B, H, n, n] attention probabilities
    x: torch.Tensor  # [B, n, d]    layer input (residual)
    v: torch.Tensor  # [B, n, H, d_h] value vectors W_V x + b_V
    W_O: torch.Tensor  # [d, d] output projection (out = concat_h v^h @ W_O^T + b_O)
    b_O: torch.Tensor  # [d]
    s: torch.Tensor  # [B, n, d]    real pre-LN1 state
    y: torch.Tensor  # [B, n, d]    real LN1 output
    t: torch.Tensor  # [B, n, d]    real pre-LN2 state
    y2: torch.Tensor  # [B, n, d]   real LN2 output (the layer output)
    gamma1: torch.Tensor
    beta1: torch.Tensor
    gamma2: torch.Tensor
    beta2: torch.Tensor
    eps1: float  # LayerNorm epsilons (0 under the reference's quirk)
    eps2: float
    cache: dict | None = None  # per-layer tensors that depend only on the weights, kept across batches
    weights_key: tuple = ()  # the layer, dtype, device and the versions of its weights
    weights: tuple = ()  # the weight tensors themselves (identity checked on a hit)
    memo: dict | None = None  # the batch's memo (Captured.memo): results shared by the methods of one batch
    by_kind: dict = field(default_factory=dict, repr=False)  # operand_weights per kind, for this instance

    def shared(self, key, fn):
        """fn(), shared by the methods of this batch (through the batch's memo) while the layer's weights stay."""
        if self.memo is None:
            return fn()
        key = (*key, self.weights_key, tuple(map(id, self.weights)), self.eps1, self.eps2)
        if key not in self.memo:
            self.memo[key] = fn()
        return self.memo[key]

    def cached(self, key, fn):
        """fn(), remembered across batches while this layer's weights are the same tensors, unmodified."""
        if self.cache is None:
            return fn()
        key = (*self.weights_key, *key)
        hit = self.cache.get(key)
        if hit is None or any(a is not b for a, b in zip(hit[0], self.weights)):
            hit = self.cache[key] = (self.weights, fn())
        return hit[1]

    @functools.cached_property
    def sigma1(self) -> torch.Tensor:
        """[B, n] LN1's sigma of the real pre-LN1 state (computed when a method needs it)."""
        return ln_sigma(self.s, self.eps1)

    @functools.cached_property
    def sigma2(self) -> torch.Tensor:
        return ln_sigma(self.t, self.eps2)

    def ln1_linear(self, v: torch.Tensor) -> torch.Tensor:
        """gamma1 * P v (the linear part of LN1, without 1/sigma1)."""
        return self.gamma1 * center(v)

    def ln2_linear(self, v: torch.Tensor) -> torch.Tensor:
        return self.gamma2 * center(v)

    @property
    def b_tilde(self) -> torch.Tensor:
        """b~_i = gamma1 * P b_O / sigma1_i + beta1 [B, n, d]: output bias and LN1 beta, assigned to no token."""
        return self.ln1_linear(self.b_O)[None, None] / self.sigma1[..., None] + self.beta1

    def project(self, W: torch.Tensor) -> torch.Tensor:
        """u_j^h = W^h v_j^h for an output projection W [d, d] split by heads: [B, n, H, d]."""
        B, n, H, dh = self.v.shape
        return torch.einsum("bnhk,dhk->bnhd", self.v, W.reshape(W.shape[0], H, dh))


    def project_sources(self, W: torch.Tensor) -> torch.Tensor:
        """``project`` laid out source-major, [n, B, H, d] (what ``SourceBlocks`` multiplies): one [B n, dh] x [dh, d]
        product per head written into its slot, instead of a head-major product, its permuted copy and a transposed
        copy (those copies were a fifth of ALTI's time at SST-2 lengths)."""
        B, n, H, dh = self.v.shape
        v = self.v.transpose(0, 1)  # [n, B, H, dh]
        Wh = W.reshape(W.shape[0], H, dh)
        U = self.v.new_empty(n, B, H, W.shape[0])
        for h in range(H):
            U[:, :, h] = torch.matmul(v[:, :, h], Wh[:, h].T)
        return U


NEEDS = frozenset({"attentions", "hidden_states", "values", "ln1", "ln2"})


def layer_parts(cap: Captured, adapter: Adapter, l: int, eps_quirk: bool = False) -> LayerParts:
    """Gather layer ``l`` (0-based) of a captured batch. On pre-LN models (METHODS.md 1.1, pre-LN variant) the values
    come from LN1(x_j), s = x is LN1's input, and t = r (the residual stream after attention) is LN2's input."""
    layer = adapter.layers()[l]
    ln1, ln2, out = adapter.ln1(layer), adapter.ln2(layer), adapter.out_proj(layer)
    A = cap.attentions[l]
    B, H, n, _ = A.shape
    dtype = A.dtype
    W_O = out.weight.to(dtype)
    s, t = cap.ln1_in[l], cap.ln2_in[l]

    def bias(module, size):  # Llama's o_proj and RMSNorm have none
        b = getattr(module, "bias", None)
        return torch.zeros(size, dtype=dtype, device=A.device) if b is None else b.to(dtype)

    d = W_O.shape[0]
    # sigma is LayerNorm's (centred); RMSNorm models are pre-LN, where no method reads it
    eps1, eps2 = (getattr(m, "eps", getattr(m, "variance_epsilon", 0.0)) for m in (ln1, ln2))
    # weights change (in place or replaced) only in tests: their versions and identities guard the cache
    params = tuple(m.weight for m in (ln1, ln2, out))
    return LayerParts(
        cache=adapter.__dict__.setdefault("_weight_cache", {}), weights=params, memo=cap.memo,
        weights_key=(l, dtype, A.device, *(w._version for w in params)),
        A=A, x=cap.hidden_states[l], v=cap.values[l].view(B, n, H, -1), W_O=W_O,
        b_O=bias(out, d), s=s, y=cap.ln1_out[l], t=t, y2=cap.ln2_out[l],
        gamma1=ln1.weight.to(dtype), beta1=bias(ln1, d), gamma2=ln2.weight.to(dtype), beta2=bias(ln2, d),
        eps1=0.0 if eps_quirk else eps1, eps2=0.0 if eps_quirk else eps2)


def operand_weights(p: LayerParts, kind: str):
    """(W [d, d], diag [B, n, d] | None, scale [B, n] | None) such that the decomposed vector is
    (sum_h A_ij^h W^h v_j^h + [i=j] diag_i) / scale_i:

        "n"      z_{i<-j}                           (N)
        "res"    z+_{i<-j}                          (N_RES)
        "resln"  T_i(x_j) = gamma1 P z+ / sigma1_i  (N_RESLN, ALTI)
        "enc"    x~_{i<-j} = gamma2 P T / sigma2_i  (N_ENC, GlobEnc)

    LayerNorm's linear parts are folded into W_O (gamma P W_O, a d x d product per layer) rather than applied to
    the [B, n, H, d] vectors. Computed once per kind for a LayerParts (its users ask for the same kind repeatedly)."""
    if kind not in p.by_kind:
        p.by_kind[kind] = _operand_weights(p, kind)
    return p.by_kind[kind]


def _operand_weights(p: LayerParts, kind: str):
    if kind == "n":
        return p.W_O, None, None
    if kind == "res":
        return p.W_O, p.x, None
    W1 = p.cached(("W", "resln"), lambda: p.gamma1[:, None] * center_rows(p.W_O))
    if kind == "resln":
        return W1, p.ln1_linear(p.x), p.sigma1
    if kind == "enc":
        W2 = p.cached(("W", "enc"), lambda: p.gamma2[:, None] * center_rows(W1))
        return W2, p.ln2_linear(p.ln1_linear(p.x)), p.sigma1 * p.sigma2
    raise ValueError(kind)


def operands(p: LayerParts, kind: str):
    """(U [B, n, H, d], diag, scale): the projected vectors U_j^h = W^h v_j^h of :func:`operand_weights`."""
    W, diag, scale = operand_weights(p, kind)
    return p.project(W), diag, scale


def decomposed_norms(p: LayerParts, kind: str, chunk_bytes: int | None = None) -> torch.Tensor:
    """||decomposed vector_{i<-j}||_2 for every i, j [B, n, n] (METHODS.md 10): Gram matrices over heads
    (``head_gram``) contracted with the attention weights (``gram_quadratic``). ``chunk_bytes`` overrides both
    steps' block sizes (tests). Shared by the methods of one batch (N by N and N_FIXEDRES, ...) through the memo."""
    def norms():
        _, _, scale = operand_weights(p, kind)
        q = decomposed_sq_norms(p, kind, chunk_bytes, scaled=False).sqrt()
        return q if scale is None else q / scale[..., None]

    return norms() if chunk_bytes is not None else p.shared(("decomposed_norms", kind), norms)


def decomposed_sq_norms(p: LayerParts, kind: str, chunk_bytes: int | None = None, scaled: bool = True,
                        diagonal: bool = True) -> torch.Tensor:
    """||decomposed vector_{i<-j}||_2^2 [B, n, n] (divided by scale_i^2 unless ``scaled`` is False), clamped at 0.
    Without ``diagonal`` the residual term is left out, so entries i = j are wrong (callers that overwrite them)."""
    W, diag, scale = operand_weights(p, kind)
    diag = diag if diagonal else None
    factors = p.cached(("gram", kind), lambda: gram_factors(W, p.v.shape[2]))
    sizes = {} if chunk_bytes is None else {"chunk_bytes": chunk_bytes}
    G, cross = head_gram(p.v, factors, W, diag, **sizes)
    q = gram_quadratic(p.A, G, diag, cross, **sizes).clamp_min_(0)
    return q / scale[..., None].square() if scaled and scale is not None else q


def decomposed_inner(p: LayerParts, kind: str, y: torch.Tensor, diagonal: bool = True) -> torch.Tensor:
    """<y_i, decomposed vector_{i<-j}> for every i, j [B, n, n] and vectors y_i [B, n, d], without the vectors
    (``attention_inner``). ``diagonal`` as in decomposed_sq_norms."""
    W, diag, scale = operand_weights(p, kind)
    inner = attention_inner(p, W, y)
    if diagonal and diag is not None:
        inner.diagonal(dim1=1, dim2=2).add_(torch.linalg.vecdot(y, diag))
    return inner if scale is None else inner / scale[..., None]


def attention_inner(p: LayerParts, W: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """<y_i, sum_h A_ij^h W^h v_j^h> [B, n, n] (no residual, unscaled): <y_i, W^h v_j^h> = <(W^h)^T y_i, v_j^h>, so one
    [n, d] x [d, d] product and per head an [n, dh] x [dh, n] one (O(n d^2 + n^2 d) instead of the O(n^2 H d) of
    building the vectors)."""
    B, n, H, dh = p.v.shape
    Yt = (y @ W).view(B, n, H, dh).transpose(1, 2)  # [B, H, n, dh]: (W^h)^T y_i
    S = torch.matmul(Yt, p.v.permute(0, 2, 3, 1))  # [B, H, i, j] = <y_i, U_j^h>
    return S.mul_(p.A).sum(1)  # sum over heads: [B, i, j]


def diagonal_vectors(p: LayerParts, kind: str) -> torch.Tensor:
    """The decomposed vectors of every token to itself, x_{i<-i} [B, n, d] (``own_vectors`` / scale_i)."""
    W, diag, scale = operand_weights(p, kind)
    own = own_vectors(p, W, diag)
    return own if scale is None else own / scale[..., None]


def own_vectors(p: LayerParts, W: torch.Tensor, diag: torch.Tensor | None) -> torch.Tensor:
    """sum_h A_ii^h W^h v_i^h + diag_i [B, n, d] (unscaled) = W (a_ii * v_i) + diag_i: one [n, d] x [d, d] product."""
    a_ii = torch.diagonal(p.A, dim1=2, dim2=3).transpose(1, 2)  # [B, n, H]
    own = torch.flatten(a_ii[..., None] * p.v, 2) @ W.T
    return own if diag is None else own + diag


def gram_factors(W: torch.Tensor, H: int) -> list[torch.Tensor]:
    """The upper block triangle of P = W^T W by block rows: factors[g] = P[g-th head's rows, heads 0..g] [dh, (g+1)dh].

    <W^h a, W^g b> = a^T P^{hg} b, so with P (one d x d product per layer and kind, cached across batches) the
    head Gram matrices need no projected vectors: per token and head g one [dh] x [dh, (g+1) dh] product and a
    dot product per block, half of what projecting v would cost and with a large M dimension for the matmul."""
    d = W.shape[1]
    dh = d // H
    P = W.T @ W
    return [P[g * dh:(g + 1) * dh, :(g + 1) * dh].contiguous() for g in range(H)]


def head_gram(v: torch.Tensor, factors: list[torch.Tensor], W: torch.Tensor, diag: torch.Tensor | None = None,
              chunk_bytes: int = 4 << 20):
    """G_j[h, h'] = <U_j^h, U_j^h'> [B, n, H, H] and cross_i[h] = <U_i^h, diag_i> [B, n, H] (or None), U_j^h = W^h v_j^h,
    from the ``gram_factors`` of W: G[h, g] = sum_k v^h_k (P^{g,<=g} v^g)_{h,k} for h <= g, mirrored.

    cross is v^h . (W^T diag)^h (one [N, d] x [d, d] product). Tokens go in chunks whose [c, d] products stay within
    ``chunk_bytes``."""
    B, n, H, dh = v.shape
    N = B * n
    vf = v.reshape(N, H, dh)
    G = v.new_zeros(N, H, H)
    step = max(1, chunk_bytes // (H * dh * v.element_size()))
    for s in range(0, N, step):
        vs = vf[s:s + step]
        c = vs.shape[0]
        for g in range(H):
            R = torch.mm(vs[:, g], factors[g]).view(c, g + 1, dh)  # P^{h,g} v^g for every h <= g
            G[s:s + step, :g + 1, g] = torch.linalg.vecdot(R, vs[:, :g + 1])
    # mirror the upper triangle (the diagonal is counted once)
    G = G + G.transpose(1, 2) - torch.diag_embed(torch.diagonal(G, dim1=1, dim2=2))
    cross = None
    if diag is not None:
        cross = torch.linalg.vecdot((diag.reshape(N, -1) @ W).view(N, H, dh), vf).view(B, n, H)
    return G.view(B, n, H, H), cross


def center_rows(W: torch.Tensor) -> torch.Tensor:
    """P W: centre every column of W over the output dimension (so P (W v) = (P W) v)."""
    return W - W.mean(dim=0, keepdim=True)


def attention_vectors(p: LayerParts, rows: slice, U: torch.Tensor, diag: torch.Tensor | None,
                      scale: torch.Tensor | None) -> torch.Tensor:
    """(sum_h A_ij^h U_j^h + [i=j] diag_i) / scale_i for the query rows ``rows``: [B, rows, n, d] (tests and
    identities; ALTI uses the blocks of ``SourceBlocks``)."""
    n = p.A.shape[-1]
    Z = SourceBlocks(p.A, U, diag).block(slice(0, n)).permute(1, 2, 0, 3)[:, rows]
    if scale is not None:
        Z = Z / scale[:, rows, None, None]
    return Z


class SourceBlocks:
    """sum_h A_ij^h U_j^h + [i=j] diag_i (unscaled) for a block of source tokens j and every query i.

    For each (j, b) this is one [n, H] @ [H, d] product, so a block is a single batched matmul with heads contracted
    at once (no heads x n x n x d tensor); blocking over sources keeps M = n large for the BLAS kernel (2.7x faster
    than blocking over queries at n = 512). A and U are laid out source-major once per layer, so that every block's
    operands are contiguous slices (per-block gathers and the matmul's own copies were a third of ALTI's time)."""

    def __init__(self, A: torch.Tensor, U: torch.Tensor, diag: torch.Tensor | None, source_major: bool = False):
        """U: [B, n, H, d] (``LayerParts.project``), or [n, B, H, d] with ``source_major`` (``project_sources``)."""
        self.A = A.permute(3, 0, 2, 1).contiguous()  # [j, B, i, H]
        self.U = U.contiguous() if source_major else U.transpose(0, 1).contiguous()  # [j, B, H, d]
        self.diag = diag

    def block(self, cols: slice, out: torch.Tensor | None = None, minus: torch.Tensor | None = None) -> torch.Tensor:
        """[k, B, n, d] for the sources in ``cols`` (source-major). ``out``: a buffer of at least [k * B, n, d]
        reused across blocks (a fresh block per call cost up to 2x in page faults at n = 512). ``minus`` [B, n, d]:
        subtracted from every source's block inside the product (the matmul accumulates onto it), which saves
        a pass over the block."""
        n, B, _, H = self.A.shape
        d = self.U.shape[-1]
        k = cols.stop - cols.start
        A, U = self.A[cols].view(k * B, n, H), self.U[cols].view(k * B, H, d)
        if minus is None:
            Z = torch.bmm(A, U, out=None if out is None else out[:k * B]).view(k, B, n, d)
        else:
            Z = (minus.new_empty(k * B, n, d) if out is None else out[:k * B]).view(k, B, n, d)
            torch.neg(minus, out=Z[0])
            Z[1:] = Z[0]
            Z = Z.view(k * B, n, d).baddbmm_(A, U).view(k, B, n, d)
        if self.diag is not None:
            kk = torch.arange(k, device=Z.device)
            Z[kk, :, cols.start + kk, :] += self.diag[:, cols, :].transpose(0, 1)
        return Z


def gram_quadratic(A: torch.Tensor, G: torch.Tensor, diag: torch.Tensor | None = None,
                   cross: torch.Tensor | None = None, chunk_bytes: int = 512 << 10) -> torch.Tensor:
    """|| sum_h A_ij^h U_j^h + [i=j] diag_i ||_2^2 for all i, j: [B, n, n], from the head Gram matrices
    G [B, n, H, H] and cross [B, n, H] of ``head_gram`` (METHODS.md 10).

    ||sum_h a_h u^h||^2 = a^T G a: O(n H^2 d + n^2 H^2) time, O(n^2 H) memory. Per source token j the quadratic
    forms of all queries are one [H, H] x [H, n] product; source tokens go in blocks whose copy of A fits
    ``chunk_bytes`` (in cache: 3x faster at n = 512 than one pass over all of them)."""
    B, H, n, _ = A.shape
    q = A.new_empty(B, n, n)  # [b, j, i] (source-major while it is built)
    k = max(1, chunk_bytes // (B * n * H * A.element_size()))
    for j0 in range(0, n, k):
        J = slice(j0, j0 + k)
        Aj = A[:, :, :, J].permute(0, 3, 1, 2).contiguous()  # [B, k, H, i]
        torch.sum(torch.matmul(G[:, J], Aj).mul_(Aj), dim=2, out=q[:, J])
    q = q.transpose(1, 2)
    if diag is not None:
        a_ii = torch.diagonal(A, dim1=2, dim2=3).transpose(1, 2)  # [B, n, H]
        extra = 2 * torch.linalg.vecdot(a_ii, cross) + torch.linalg.vecdot(diag, diag)  # [B, n]
        q.diagonal(dim1=1, dim2=2).add_(extra)
    return q


def tokens_per_block(B: int, n: int, d: int, itemsize: int, budget_bytes: int, copies: int = 1) -> int:
    """How many tokens of a block fit: a [B, k, n, d] block and ``copies`` temporaries of its size within the budget."""
    per_row = B * n * d * itemsize * copies
    return max(1, min(n, budget_bytes // max(per_row, 1)))
