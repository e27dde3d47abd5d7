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

from dataclasses import dataclass

import torch

from ..adapters import Adapter, Captured


def center(v: torch.Tensor) -> torch.Tensor:
    return v - v.mean(dim=-1, keepdim=True)


def ln_sigma(s: torch.Tensor, eps: float, eps_quirk: bool = False) -> torch.Tensor:
    """sigma(s) = sqrt(mean((s - mean s)^2) + eps). With ``eps_quirk`` (ALTI's reference code) eps is dropped."""
    var = center(s).pow(2).mean(dim=-1)
    return var.sqrt() if eps_quirk else (var + eps).sqrt()


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
    sigma1: torch.Tensor  # [B, n]
    sigma2: torch.Tensor  # [B, n]

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
    return LayerParts(
        A=A, x=cap.hidden_states[l], v=cap.values[l].view(B, n, H, -1), W_O=W_O,
        b_O=bias(out, d), s=s, y=cap.ln1_out[l], t=t, y2=cap.ln2_out[l],
        gamma1=ln1.weight.to(dtype), beta1=bias(ln1, d), gamma2=ln2.weight.to(dtype), beta2=bias(ln2, d),
        sigma1=ln_sigma(s, eps1, eps_quirk), sigma2=ln_sigma(t, eps2, eps_quirk))


def operand_weights(p: LayerParts, kind: str):
    """(W [d, d], diag [B, n, d] | None, scale [B, n] | None) such that the decomposed vector is
    (sum_h A_ij^h W^h v_j^h + [i=j] diag_i) / scale_i:

        "n"      z_{i<-j}                           (N)
        "res"    z+_{i<-j}                          (N_RES)
        "resln"  T_i(x_j) = gamma1 P z+ / sigma1_i  (N_RESLN, ALTI)
        "enc"    x~_{i<-j} = gamma2 P T / sigma2_i  (N_ENC, GlobEnc)

    LayerNorm's linear parts are folded into W_O (gamma P W_O, a d x d product per layer) rather than applied to
    the [B, n, H, d] vectors."""
    if kind == "n":
        return p.W_O, None, None
    if kind == "res":
        return p.W_O, p.x, None
    W1 = p.gamma1[:, None] * center_rows(p.W_O)
    if kind == "resln":
        return W1, p.ln1_linear(p.x), p.sigma1
    if kind == "enc":
        return p.gamma2[:, None] * center_rows(W1), p.ln2_linear(p.ln1_linear(p.x)), p.sigma1 * p.sigma2
    raise ValueError(kind)


def operands(p: LayerParts, kind: str):
    """(U [B, n, H, d], diag, scale): the projected vectors U_j^h = W^h v_j^h of :func:`operand_weights`."""
    W, diag, scale = operand_weights(p, kind)
    return p.project(W), diag, scale


def decomposed_norms(p: LayerParts, kind: str, chunk_bytes: int = 2 << 20) -> torch.Tensor:
    """||decomposed vector_{i<-j}||_2 for every i, j [B, n, n] (METHODS.md 10): Gram matrices over heads, built
    from the projected vectors a cache-sized chunk of tokens at a time (``head_gram``)."""
    W, diag, scale = operand_weights(p, kind)
    G, cross = head_gram(p.v, W, diag, chunk_bytes)
    return gram_norms(p.A, G, diag, scale, cross)


def head_gram(v: torch.Tensor, W: torch.Tensor, diag: torch.Tensor | None = None, chunk_bytes: int = 2 << 20):
    """G_j[h, h'] = <U_j^h, U_j^h'> [B, n, H, H] and cross_i[h] = <U_i^h, diag_i> [B, n, H] (or None), U_j^h = W^h v_j^h.

    The [B, n, H, d] projected vectors are never held whole: each chunk of tokens is projected, reduced while it
    is in cache, and dropped (1.5x faster on CPU than one projection followed by the reductions, and less memory)."""
    B, n, H, dh = v.shape
    d = W.shape[0]
    Wh = W.view(d, H, dh).permute(1, 2, 0)  # [H, dh, d]: the per-head blocks W^h, transposed
    vf = v.reshape(B * n, H, dh)
    df = diag.reshape(B * n, d) if diag is not None else None
    G = v.new_empty(B * n, H, H)
    cross = v.new_empty(B * n, H) if diag is not None else None
    step = max(1, chunk_bytes // (H * d * v.element_size()))
    for s in range(0, B * n, step):
        U = torch.bmm(vf[s:s + step].transpose(0, 1), Wh).transpose(0, 1)  # [c, H, d]
        torch.bmm(U, U.transpose(1, 2), out=G[s:s + step])
        if cross is not None:
            cross[s:s + step] = (U * df[s:s + step, None]).sum(-1)  # in cache: faster than a batched mat-vec
    return G.view(B, n, H, H), (cross.view(B, n, H) if cross is not None else None)


def center_rows(W: torch.Tensor) -> torch.Tensor:
    """P W: centre every column of W over the output dimension (so P (W v) = (P W) v)."""
    return W - W.mean(dim=0, keepdim=True)


def attention_vectors(p: LayerParts, rows: slice, U: torch.Tensor, diag: torch.Tensor | None,
                      scale: torch.Tensor | None) -> torch.Tensor:
    """(sum_h A_ij^h U_j^h + [i=j] diag_i) / scale_i for the query rows ``rows``: [B, rows, n, d] (tests and
    identities; ALTI uses the blocked ``contributions_of_sources``)."""
    n = p.A.shape[-1]
    Z = contributions_of_sources(p.A, U, diag, slice(0, n)).transpose(1, 2)[:, rows]
    if scale is not None:
        Z = Z / scale[:, rows, None, None]
    return Z


def contributions_of_sources(A: torch.Tensor, U: torch.Tensor, diag: torch.Tensor | None, cols: slice) -> torch.Tensor:
    """sum_h A_ij^h U_j^h + [i=j] diag_i (unscaled) for the source tokens j in ``cols`` and every query i:
    [B, cols, n, d] (source-major).

    For each (b, j) this is one [n, H] @ [H, d] product, so a block is a single batched matmul with heads contracted
    at once (no heads x n x n x d tensor); blocking over sources keeps M = n large for the BLAS kernel, which was
    2.7x faster than blocking over queries at n = 512."""
    B, n, H, d = U.shape
    k = cols.stop - cols.start
    Ablk = A[:, :, :, cols].permute(0, 3, 2, 1).reshape(B * k, n, H)  # [B*j, i, H]
    Z = torch.bmm(Ablk, U[:, cols].reshape(B * k, H, d)).view(B, k, n, d)  # [B, j, i, d]
    if diag is not None:
        kk = torch.arange(k, device=Z.device)
        Z[:, kk, cols.start + kk, :] += diag[:, cols, :]
    return Z


def gram_norms(A: torch.Tensor, G: torch.Tensor, diag: torch.Tensor | None = None,
               scale: torch.Tensor | None = None, cross: torch.Tensor | None = None) -> torch.Tensor:
    """|| sum_h A_ij^h U_j^h + [i=j] diag_i ||_2 / scale_i for all i, j: [B, n, n], from the head Gram matrices
    G [B, n, H, H] and cross [B, n, H] of ``head_gram`` (METHODS.md 10).

    ||sum_h a_h u^h||^2 = a^T G a: O(n H^2 d + n^2 H^2) time, O(n^2 H) memory."""
    Ap = A.permute(0, 3, 2, 1)  # [B, j, i, H]
    q = torch.linalg.vecdot(torch.matmul(Ap, G), Ap).transpose(1, 2)  # [B, i, j]
    if diag is not None:
        a_ii = torch.diagonal(A, dim1=2, dim2=3).transpose(1, 2)  # [B, n, H]
        extra = 2 * (a_ii * cross).sum(-1) + diag.pow(2).sum(-1)  # [B, n]
        q.diagonal(dim1=1, dim2=2).add_(extra)
    norms = q.clamp_min(0).sqrt()
    if scale is not None:
        norms = norms / scale[..., None]
    return norms


def resln_operands(p: LayerParts):
    """U, diag, scale of T_i(x_j) (N_RESLN, ALTI)."""
    return operands(p, "resln")


def enc_operands(p: LayerParts):
    """U, diag, scale of x~_{i<-j} (N_ENC, GlobEnc): LN2's linear part after LN1's."""
    return operands(p, "enc")


def tokens_per_block(B: int, n: int, d: int, itemsize: int, budget_bytes: int, copies: int = 3) -> int:
    """How many tokens of a block fit: a [B, k, n, d] block and ``copies`` temporaries of its size within the budget."""
    per_row = B * n * d * itemsize * copies
    return max(1, min(n, budget_bytes // max(per_row, 1)))
