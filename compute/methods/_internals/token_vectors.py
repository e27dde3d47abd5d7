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
from .budget import work_bytes
from .decomposition import kept, layer_stack, stack_params, stacked_ffn
from .fused import absdot_share_, absdot_weights, ln_share

CPU_BLOCK_BYTES = 64 << 20  # the feed-forward block's activations of one block of source tokens, on the CPU


@dataclass
class Propagated:
    rows: torch.Tensor  # [B, L, n, d] x^l_{e<-j}: the explained token's decomposition after every layer
    logits: torch.Tensor  # [B, n, C] every token's share of every logit


def zero_origin_slope(pre: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
    """act(h) / h per neuron: the slope of the line through the origin and (h, act(h)). The reference divides by
    h + 1e-12; here |h| < 1e-12 is replaced by +-1e-12 with h's sign (the reference's form flips sign near -1e-12)."""
    eps = 1e-12
    den = torch.where(pre.abs() < eps, torch.where(pre < 0, -eps, eps), pre)
    return post / den


@dataclass
class DecompXWeights:
    """What the propagation needs of every layer besides the decomposition's weights, stacked [L, ...]."""

    W_Vt: torch.Tensor  # [L, d, d] W_V^T (values of a part: x W_V^T)
    W_Ot: torch.Tensor  # [L, d, d] W_O^T
    bias: torch.Tensor  # [L, d] b = W_O b_V + b_O (layers after the first)
    W1t: torch.Tensor  # [L, d, d_ff] W1^T
    W2t: torch.Tensor  # [L, d_ff, d] W2^T
    W1b1: torch.Tensor  # [L, d] W1^T b1: <W1 y, b1> = <y, W1^T b1>


def decompx_weights(adapter, weights, ffn, dtype, device) -> DecompXWeights:
    def build():
        values = [adapter.value_module(layer) for layer in adapter.layers()]
        W_V = stack_params([v.weight for v in values], dtype, device)
        b_V = (torch.zeros_like(W_V[:, 0]) if values[0].bias is None
               else stack_params([v.bias for v in values], dtype, device))
        return DecompXWeights(W_Vt=W_V.transpose(1, 2).contiguous(), W_Ot=weights.W_O.transpose(1, 2).contiguous(),
                              bias=torch.matmul(weights.W_O, b_V[..., None])[..., 0] + weights.b_O,
                              W1t=ffn.W1.transpose(1, 2).contiguous(), W2t=ffn.W2.transpose(1, 2).contiguous(),
                              W1b1=torch.matmul(ffn.W1.transpose(1, 2), ffn.b1[..., None])[..., 0])

    return kept(adapter, ("decompx", dtype, device), build)


@dataclass
class Step:
    """One layer's inputs to the propagation (views of the stacks made before the layers are stepped through)."""

    A: torch.Tensor  # [B H, r, n] the attention rows of the receiving tokens
    gain1: torch.Tensor  # [R, 1, d] gamma1 / sigma1 of each receiving row (R = B r)
    gain2: torch.Tensor
    theta: torch.Tensor  # [R, 1, d_ff] the feed-forward slopes act(h) / h of each receiving row's real state
    W_Vt: torch.Tensor
    W_Ot: torch.Tensor
    bias: torch.Tensor
    W1t: torch.Tensor
    b1: torch.Tensor
    W2t: torch.Tensor
    b2: torch.Tensor
    W1b1: torch.Tensor
    beta1: torch.Tensor
    beta2: torch.Tensor


def propagate(cap, adapter, memory_mb: int | None) -> Propagated:
    """The decomposition of every layer's explained row and of the logits, shared by the DecompX methods of one
    batch (and by --target all's classes) through the batch's memo.

    What does not depend on the carried decomposition (the frozen LayerNorm scales gamma / sigma_i, the
    feed-forward slopes act(h_i) / h_i of the real states, the fixed bias vectors) is computed for every layer at
    once before the layers are stepped through; each layer then costs a few large products and fused steps
    (compute.methods._internals.fused), with the decomposition laid out as [rows x parts, d] for the products."""
    key = ("decompx", memory_mb)
    if key not in cap.memo:
        p = layer_stack(cap, adapter)  # [L, B, ...]
        L, B, n, d = p.x.shape
        H = p.A.shape[2]
        ffn = stacked_ffn(adapter, p.x.dtype, p.x.device)
        W = decompx_weights(adapter, p.weights, ffn, p.x.dtype, p.x.device)
        b, e = torch.arange(B, device=p.x.device), cap.explain_pos
        gain1 = p.gamma1 / p.sigma1[..., None]  # [L, B, n, d]
        gain2 = p.gamma2 / p.sigma2[..., None]
        pre = torch.baddbmm(ffn.b1[:, None], p.y.view(L, B * n, d), W.W1t)  # [L, B n, d_ff]
        theta = zero_origin_slope(pre, ffn.act(pre)).view(L, B, n, -1)

        def rows(t, l):  # the receiving rows of layer l: every token, the explained one in the last layer
            return (t[l].flatten(0, 1) if l < L - 1 else t[l, b, e])[:, None]

        steps = [Step(A=(p.A[l] if l < L - 1 else p.A[l][b, :, e, None]).flatten(0, 1), gain1=rows(gain1, l),
                      gain2=rows(gain2, l), theta=rows(theta, l), W_Vt=W_Vt, W_Ot=W_Ot, bias=bias, W1t=W1t, b1=b1,
                      W2t=W2t, b2=b2, W1b1=W1b1, beta1=beta1, beta2=beta2)
                 for l, (W_Vt, W_Ot, bias, W1t, b1, W2t, b2, W1b1, beta1, beta2) in enumerate(zip(*(
                     t.unbind(0) for t in (W.W_Vt, W.W_Ot, W.bias, W.W1t, ffn.b1, W.W2t, ffn.b2, W.W1b1,
                                           p.weights.beta1, p.weights.beta2))))]
        budget = work_bytes(p.x.device, CPU_BLOCK_BYTES, memory_mb)
        out = p.x.new_empty(B, L, n, d)
        X = None
        for l, step in enumerate(steps):
            interrupts.check()  # a stop asked for: between layers
            if X is None:
                Z = _first_layer(p, e if l == L - 1 else None)
            else:
                Z = _attention(step, X, H, None if l < L - 1 else (b, e))
            absdot_share_(Z, step.bias if l > 0 else p.weights.b_O[0])
            Y = ln_share(Z, step.gain1, step.beta1)
            Y += _ffn(step, Y, budget)
            X = ln_share(Y, step.gain2, step.beta2)  # [R, n, d]
            out[:, l] = X if l == L - 1 else X.view(B, n, n, d)[b, e]
        logits = _head(adapter, cap, out[:, -1])
        cap.memo[key] = Propagated(rows=out, logits=logits)
    return cap.memo[key]


def _first_layer(p, explained: torch.Tensor | None) -> torch.Tensor:
    """Layer 1's z_{i<-j} = sum_h A_ij^h W_O^h v_j^h (the value bias inside v_j) + [i=j] x_i [R, n, d] (the residual
    part is the token's own embedding output), for every receiving row or for the ``explained`` ones."""
    first = p.layer(0)
    B, H, n, _ = first.A.shape
    A = first.A.permute(0, 3, 2, 1)  # [B, j, i, H]
    if explained is not None:  # a one-layer model: its only layer is the last one
        A = A[torch.arange(B, device=A.device), :, explained, None]  # [B, j, 1, H]
    Z = torch.matmul(A, first.project(first.W_O)).transpose(1, 2).contiguous()  # [B, r, j, d]
    r = Z.shape[1]
    b = torch.arange(B, device=Z.device)[:, None]
    i = torch.arange(r, device=Z.device)
    own = i.expand(B, r) if explained is None else explained[:, None]
    Z[b, i, own] += first.x[b, own]
    return Z.flatten(0, 1)


def _attention(step: Step, X: torch.Tensor, H: int, explained) -> torch.Tensor:
    """z_{i<-j} = sum_h sum_k A_ik^h W_O^h W_V^h x_{k<-j} + x_{i<-j} [R, n, d] from the previous layer's parts X
    [B n, n, d] (the value and output biases are shared afterwards)."""
    Bn, n, d = X.shape
    B, dh = Bn // n, d // H
    V = torch.mm(X.view(-1, d), step.W_Vt).view(B, n, n, H, dh).permute(0, 3, 1, 2, 4).reshape(B * H, n, n * dh)
    r = step.A.shape[1]
    C = torch.bmm(step.A, V).view(B, H, r, n, dh).permute(0, 2, 3, 1, 4).reshape(B * r * n, d)
    residual = X.view(-1, d) if explained is None else X.view(B, n, n, d)[explained].view(-1, d)
    return torch.addmm(residual, C, step.W_Ot).view(B * r, n, d)


def _ffn(step: Step, Y: torch.Tensor, budget: int) -> torch.Tensor:
    """f_{i<-j} [R, n, d] for the LN1 decomposition Y [R, n, d]: W2 (theta_i * (W1 y_{i<-j} + w_ij b1)) + w'_ij b2,
    the biases shared by absdot. Source tokens go in blocks whose [R, k, d_ff] activations fit ``budget``."""
    R, n, d = Y.shape
    d_ff = step.W1t.shape[1]
    w1 = absdot_weights(Y, step.W1b1)  # <W1 y_{i<-j}, b1> = <y_{i<-j}, W1^T b1>, for every source at once
    k = budget // max(1, R * 2 * d_ff * Y.element_size())  # source tokens per block: [R, k, d_ff] and a product
    if k >= n:
        out = _ffn_block(step, Y, w1)
    else:
        out = torch.empty_like(Y)
        for j0 in range(0, n, max(k, 1)):
            J = slice(j0, min(n, j0 + max(k, 1)))
            out[:, J] = _ffn_block(step, Y[:, J].contiguous(), w1[:, J])
    absdot_share_(out, step.b2)
    return out


def _ffn_block(step: Step, Y: torch.Tensor, w1: torch.Tensor) -> torch.Tensor:
    R, k, d = Y.shape
    Hd = torch.mm(Y.view(-1, d), step.W1t).view(R, k, -1).addcmul_(w1, step.b1).mul_(step.theta)
    return torch.mm(Hd.view(R * k, -1), step.W2t).view(R, k, d)


def _head(adapter, cap, X: torch.Tensor) -> torch.Tensor:
    """logits_j [B, n, C] from the explained token's final decomposition X [B, n, d] (sums to the hidden state)."""
    dense, act, classifier = adapter.head_parts()
    dtype = X.dtype
    Wp, bp, Wc, bc = (t.to(dtype) for t in (dense.weight, dense.bias, classifier.weight, classifier.bias))
    b = torch.arange(X.shape[0], device=X.device)
    h = cap.hidden_states[-1][b, cap.explain_pos]  # [B, d] the explained token's final state
    pre = F.linear(h, Wp, bp)
    theta = zero_origin_slope(pre, act(pre))  # [B, d]
    P = X @ Wp.T  # [B, n, d]
    absdot_share_(P, bp)
    Cj = P.mul_(theta[:, None]) @ Wc.T  # [B, n, C]
    absdot_share_(Cj, bc)
    return Cj.mul_(cap.mask[..., None].to(dtype))
