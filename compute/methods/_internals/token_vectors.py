"""DecompX's propagation of per-token decompositions through a post-LN encoder and its head (docs/methods.md
"DecompX"). Every hidden state is carried as n vectors, one per input token: x_i = sum_j x_{i<-j}.

Per layer (REF: mohsenfayyaz/DecompX as configured in its paper and demo), for receiving token i, source j:

    attention  z_{i<-j} = sum_h sum_k A_ik^h W_O^h W_V^h x_{k<-j} + x_{i<-j}      (layer 1: the value bias stays in
               v_j and x_{i<-j} = [i=j] x_i, the embedding output being its own token's)
    bias       + w_ij b,  w_ij = |<z_{i<-j}, b>| / sum_k |<z_{i<-k}, b>|          ("absdot"; b = W_O b_V + b_O, or
               b_O in layer 1)
    LN1        y_{i<-j} = gamma1 * P z_{i<-j} / sigma1_i, + beta1 shared the same way (sigma1_i of the real state)
    FFN        f_{i<-j} = W2 (theta_i * (W1 y_{i<-j} + b1 share)) + b2 share,  theta_i = act(h_i) / h_i per neuron,
               h_i = W1 y_i + b1 the real pre-activation ("zero-origin" slope: the line through 0 and act(h_i))
    LN2        x'_{i<-j} = gamma2 * P (y_{i<-j} + f_{i<-j}) / sigma2_i, + beta2 shared

Each step keeps sum_j (vectors) equal to the real state, so x'_i = sum_j x'_{i<-j} exactly (up to rounding). The
head reads the explained token e: pooled_j = theta * (W_p x_{e<-j} + b_p share), theta = act(p)/p, then
logits_j = W_c pooled_j + b_c share (one share per token for every class: |<W_c pooled_j, b_c>|).

Memory: the state is [B, n, n, d]; the feed-forward block goes through blocks of source tokens whose [B, n, k, d_ff]
activations fit the budget; its bias shares need sums over all sources, which are dot products with fixed vectors
(<W1 y, b1> = <y, W1^T b1>) or are added after the last block. The last layer is computed for the explained row only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ... import interrupts
from .decomposition import center, layer_parts, tokens_per_block


@dataclass
class Propagated:
    rows: torch.Tensor  # [B, L, n, d] x^l_{e<-j}: the explained token's decomposition after every layer
    logits: torch.Tensor  # [B, n, C] every token's share of every logit


def share(vectors: torch.Tensor, dots: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """vectors + w_ij bias with w_ij = |dots_ij| / sum_j |dots_ij| (absdot). vectors [B, r, n, D], dots [B, r, n],
    bias [D] or [B, r, D]. Where every dot product is 0 the bias is left out (the reference's 1e-12 does the same)."""
    w = dots.abs()
    w = w / w.sum(-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny)
    b = bias if bias.dim() == 1 else bias[:, :, None]
    return vectors + w[..., None] * b


def zero_origin_slope(pre: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
    """act(h) / h per neuron: the slope of the line through the origin and (h, act(h)). The reference divides by
    h + 1e-12; here |h| < 1e-12 is replaced by +-1e-12 with h's sign (the reference's form flips sign near -1e-12)."""
    eps = 1e-12
    den = torch.where(pre.abs() < eps, torch.where(pre < 0, -eps, eps), pre)
    return post / den


def ln_decompose(z: torch.Tensor, sigma: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """gamma * P z_{i<-j} / sigma_i, then beta shared by absdot. z [B, r, n, d], sigma [B, r]."""
    y = gamma * center(z) / sigma[:, :, None, None]
    return share(y, y @ beta, beta)


def _rows(t: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """t [B, n, ...] at the receiving rows [B, r] (all rows where None)."""
    if rows is None:
        return t
    return t[torch.arange(t.shape[0], device=t.device)[:, None], rows]


def propagate(cap, adapter, memory_mb: int) -> Propagated:
    """The decomposition of every layer's explained row and of the logits, shared by the DecompX methods of one
    batch (and by --target all's classes) through the batch's memo."""
    key = ("decompx", memory_mb)
    if key not in cap.memo:
        L = adapter.n_layers
        source_mask = cap.mask[:, None, :, None]
        e = cap.explain_pos[:, None]  # [B, 1]
        X, rows_per_layer = None, []
        for l in range(L):
            interrupts.check()  # a stop asked for: between layers
            rows = e if l == L - 1 else None  # the last layer only for the explained row
            X = _layer(cap, adapter, l, X, rows, memory_mb) * source_mask.to(cap.attentions[l].dtype)
            rows_per_layer.append(X[:, 0] if rows is not None else _rows(X, e)[:, 0])
        logits = _head(adapter, cap, rows_per_layer[-1])
        cap.memo[key] = Propagated(rows=torch.stack(rows_per_layer, dim=1), logits=logits)
    return cap.memo[key]


def _layer(cap, adapter, l: int, X: torch.Tensor | None, rows: torch.Tensor | None, memory_mb: int) -> torch.Tensor:
    """One layer: the decomposition [B, r, n, d] of the receiving rows (all where ``rows`` is None) from the previous
    layer's [B, n, n, d] (None: layer 1, whose inputs are their own tokens)."""
    p = layer_parts(cap, adapter, l)
    B, H, n, _ = p.A.shape
    d = p.x.shape[-1]
    dh = d // H
    A = p.A if rows is None else p.A[torch.arange(B, device=p.A.device)[:, None], :, rows].transpose(1, 2)  # [B,H,r,n]
    layer = adapter.layers()[l]
    W_O = p.W_O
    if X is None:
        # z_{i<-j} = sum_h A_ij^h W_O^h v_j^h (the value bias inside v_j) + [i=j] x_i
        Z = torch.einsum("bhij,bjhd->bijd", A, p.project(W_O))  # [B, r, n, d]
        r = Z.shape[1]
        own = torch.arange(n, device=Z.device).expand(B, n) if rows is None else rows  # [B, r] each row's token
        Z[torch.arange(B, device=Z.device)[:, None], torch.arange(r, device=Z.device)[None], own] += _rows(p.x, rows)
        bias = p.b_O
    else:
        value = adapter.value_module(layer)
        W_V = value.weight.to(X.dtype)
        b_V = value.bias.to(X.dtype) if value.bias is not None else X.new_zeros(d)
        V = (X @ W_V.T).view(B, n, n, H, dh)  # [B, k, j, H, dh]: values of token k's part from source j (no bias)
        C = torch.einsum("bhik,bkjhe->bijhe", A, V).reshape(B, A.shape[2], n, d)
        Z = C @ W_O.T + _rows(X, rows)
        bias = W_O @ b_V + p.b_O
    Z = share(Z, Z @ bias, bias)
    Y = ln_decompose(Z, _rows(p.sigma1, rows), p.gamma1, p.beta1)
    Fo = _ffn(adapter.ffn_parts(layer), Y, _rows(p.y, rows), memory_mb)
    return ln_decompose(Y + Fo, _rows(p.sigma2, rows), p.gamma2, p.beta2)


def _ffn(parts, Y: torch.Tensor, y: torch.Tensor, memory_mb: int) -> torch.Tensor:
    """f_{i<-j} [B, r, n, d] for the LN1 decomposition Y [B, r, n, d] of the real LN1 outputs y [B, r, d]."""
    lin1, act, lin2 = parts
    dtype = Y.dtype
    W1, b1, W2, b2 = (t.to(dtype) for t in (lin1.weight, lin1.bias, lin2.weight, lin2.bias))
    h = F.linear(y, W1, b1)  # [B, r, d_ff] the real pre-activations
    theta = zero_origin_slope(h, act(h))
    dots1 = Y @ (W1.T @ b1)  # <W1 y_{i<-j}, b1> for every source at once
    w1 = dots1.abs()
    w1 = w1 / w1.sum(-1, keepdim=True).clamp_min(torch.finfo(dtype).tiny)
    B, r, n, d = Y.shape
    k = tokens_per_block(B * r, n, W1.shape[0] * 2, Y.element_size(), memory_mb << 20)
    out = torch.empty_like(Y)
    for j0 in range(0, n, k):
        J = slice(j0, min(n, j0 + k))
        Hb = (Y[:, :, J] @ W1.T + w1[:, :, J, None] * b1).mul_(theta[:, :, None])  # [B, r, k, d_ff]
        out[:, :, J] = Hb @ W2.T
    return share(out, out @ b2, b2)


def _head(adapter, cap, X: torch.Tensor) -> torch.Tensor:
    """logits_j [B, n, C] from the explained token's final decomposition X [B, n, d] (sums to the hidden state)."""
    dense, act, classifier = adapter.head_parts()
    dtype = X.dtype
    Wp, bp, Wc, bc = (t.to(dtype) for t in (dense.weight, dense.bias, classifier.weight, classifier.bias))
    h = _rows(cap.hidden_states[-1], cap.explain_pos[:, None])[:, 0]  # [B, d] the explained token's final state
    pre = F.linear(h, Wp, bp)
    theta = zero_origin_slope(pre, act(pre))  # [B, d]
    P = X @ Wp.T  # [B, n, d]
    P = share(P[:, None], (P @ bp)[:, None], bp)[:, 0] * theta[:, None]
    Cj = P @ Wc.T  # [B, n, C]
    return share(Cj[:, None], (Cj @ bc)[:, None], bc)[:, 0] * cap.mask[..., None].to(dtype)
