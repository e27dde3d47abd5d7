"""Attention-block decomposition of post-LN layers (Kobayashi et al. 2021; METHODS.md 1.1 and 10).

For layer l, query i and source token j (heads h, centering P = I - 11^T/d):

    u_j^h      = W_O^h (W_V^h x_j + b_V^h)                         value vector through the output projection
    z_{i<-j}   = sum_h A_ij^h u_j^h                                attention only
    z+_{i<-j}  = z_{i<-j} + [i=j] x_i                              plus the residual on the diagonal
    T_i(x_j)   = gamma1 * P z+_{i<-j} / sigma1_i                   LN1-linearised (sigma1_i of the REAL pre-LN1 state)
    x~_{i<-j}  = gamma2 * P T_i(x_j) / sigma2_i                    through LN2 (GlobEnc; sigma2_i of the real state)

Because P and the gains are linear, they are applied once to u and x (``LayerParts``), never to n x n x d tensors.
Norms of these vectors use Gram matrices over heads (``gram_norms``): no heads x n x n x d tensor is ever built.
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
    u: torch.Tensor  # [B, H, n, d] W_O^h v_j^h (value bias included)
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


NEEDS = frozenset({"attentions", "hidden_states", "values", "ln1", "ln2"})


def layer_parts(cap: Captured, adapter: Adapter, l: int, eps_quirk: bool = False) -> LayerParts:
    """Gather layer ``l`` (0-based) of a captured batch. Post-LN architectures only."""
    layer = adapter.layers()[l]
    ln1, ln2, out = adapter.ln1(layer), adapter.ln2(layer), adapter.out_proj(layer)
    A = cap.attentions[l]
    B, H, n, _ = A.shape
    dtype = A.dtype
    W_O = out.weight.to(dtype)  # [d, d]: out = concat_h v^h @ W_O^T + b_O
    d = W_O.shape[0]
    v = cap.values[l].view(B, n, H, d // H)
    u = torch.einsum("bnhk,dhk->bhnd", v, W_O.view(d, H, d // H))
    s, t = cap.ln1_in[l], cap.ln2_in[l]
    return LayerParts(
        A=A, x=cap.hidden_states[l], u=u, b_O=out.bias.to(dtype), s=s, y=cap.ln1_out[l], t=t, y2=cap.ln2_out[l],
        gamma1=ln1.weight.to(dtype), beta1=ln1.bias.to(dtype), gamma2=ln2.weight.to(dtype), beta2=ln2.bias.to(dtype),
        sigma1=ln_sigma(s, ln1.eps, eps_quirk), sigma2=ln_sigma(t, ln2.eps, eps_quirk))


def attention_vectors(p: LayerParts, rows: slice, W: torch.Tensor, diag: torch.Tensor | None,
                      scale: torch.Tensor | None) -> torch.Tensor:
    """(sum_h A_ij^h W_j^h + [i=j] diag_i) / scale_i for the query rows ``rows``: [B, rows, n, d].

    Heads are contracted at once, so the largest tensor is rows x n x d (the caller sizes ``rows``)."""
    Z = torch.einsum("bhij,bhjd->bijd", p.A[:, :, rows, :], W)
    if diag is not None:
        k = torch.arange(Z.shape[1], device=Z.device)
        Z[:, k, rows.start + k, :] += diag[:, rows, :]
    if scale is not None:
        Z = Z / scale[:, rows, None, None]
    return Z


def gram_norms(A: torch.Tensor, W: torch.Tensor, diag: torch.Tensor | None = None,
               scale: torch.Tensor | None = None) -> torch.Tensor:
    """|| sum_h A_ij^h W_j^h + [i=j] diag_i ||_2 / scale_i for all i, j: [B, n, n], via Gram matrices (METHODS.md 10).

    ||sum_h a_h w^h||^2 = a^T G a with G[h, h'] = <w^h, w^h'>: O(n H^2 d + n^2 H^2) time, O(n^2 H) memory."""
    G = torch.einsum("bhjd,bkjd->bjhk", W, W)  # [B, n, H, H]
    Ap = A.permute(0, 3, 2, 1)  # [B, j, i, h]
    q = (torch.matmul(Ap, G) * Ap).sum(-1).transpose(1, 2)  # [B, i, j]
    if diag is not None:
        a_ii = torch.diagonal(A, dim1=2, dim2=3)  # [B, H, n]
        cross = torch.einsum("bhid,bid->bhi", W, diag)
        extra = 2 * (a_ii * cross).sum(1) + diag.pow(2).sum(-1)  # [B, n]
        q = q + torch.diag_embed(extra)
    norms = q.clamp_min(0).sqrt()
    if scale is not None:
        norms = norms / scale[..., None]
    return norms


def resln_operands(p: LayerParts):
    """W, diag, scale of T_i(x_j) (N_RESLN, ALTI)."""
    return p.ln1_linear(p.u), p.ln1_linear(p.x), p.sigma1


def enc_operands(p: LayerParts):
    """W, diag, scale of x~_{i<-j} (N_ENC, GlobEnc): LN2's linear part after LN1's."""
    return p.ln2_linear(p.ln1_linear(p.u)), p.ln2_linear(p.ln1_linear(p.x)), p.sigma1 * p.sigma2


def rows_for_budget(B: int, n: int, d: int, itemsize: int, budget_bytes: int, copies: int = 3) -> int:
    """How many query rows fit: a [B, rows, n, d] block and ``copies`` temporaries of its size within the budget."""
    per_row = B * n * d * itemsize * copies
    return max(1, min(n, budget_bytes // max(per_row, 1)))
