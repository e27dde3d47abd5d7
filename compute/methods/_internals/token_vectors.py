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

Memory: the state is [B, n, n, d], or [B, n, k, d] for blocks of k source tokens where the whole is over its budget
(``_blocked``: each bias share's sums over all sources come from a pass of the blocks before); the feed-forward block
goes through blocks of receiving rows whose [r, k, d_ff] activations fit its budget (its bias shares need sums over
all sources, which are dot products with fixed vectors: <W1 y, b1> = <y, W1^T b1>). Work tensors of 32 MB or more
are reused from layer to layer (``Buffers``: on the CPU fresh ones fault their pages). The last layer is
computed for the explained row only.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ... import interrupts
from ...adapters.base import _stack_and_upcast, linear_weight
from .base import SEQUENCE_HEAD_TASKS
from .budget import work_bytes
from .decomposition import _parts_of, center, kept, ln_sigma, stack_params, stacked_ffn, stacked_weights, widened
from .fused import absdot_share_, absdot_weights, ln_share, ln_share_
from .linear_mlp import factors, linear_mlps, zero_origin_slope
from .pre_ln import mlp_output_norm

CPU_BLOCK_BYTES = 64 << 20  # the feed-forward block's activations of one block of source tokens, on the CPU
# The decomposition of a block of sources, [B n, k, d]: this many of its size alive at once (a layer's input, its
# attention's values and mixture, the LN1 and feed-forward outputs), within CPU_STATE_BYTES on the CPU and 1 /
# STATE_GPU_SHARE of a GPU. Blocks cost passes (about L/2 times the work), so the budget is all that is safe to take.
STATE_COPIES = 5
CPU_STATE_BYTES = 4 << 30
STATE_GPU_SHARE = 16


@dataclass
class Propagated:
    rows: torch.Tensor  # [B, L, n, d] x^l_{e<-j}: the explained token's decomposition after every layer ([B, S, L, n,
    # d] for the positions [B, S] asked for)
    logits: torch.Tensor | None  # [B, n, C] every token's share of every logit (a sequence head's)


@dataclass
class DecompXWeights:
    """What the propagation needs of every layer besides the decomposition's weights, stacked [L, ...]."""

    W_Vt: torch.Tensor  # [L, d, d] W_V^T (values of a part: x W_V^T)
    W_Ot: torch.Tensor  # [L, d, d] W_O^T
    bias: torch.Tensor  # [L, d] b = W_O b_V + b_O (layers after the first)
    W1t: torch.Tensor  # [L, d, d_ff] W1^T
    W2t: torch.Tensor  # [L, d_ff, d] W2^T
    W1b1: torch.Tensor  # [L, d] W1^T b1: <W1 y, b1> = <y, W1^T b1>


def decompx_weights(adapter, weights, W1, b1, W2, dtype, device, only: slice | None = None) -> DecompXWeights:
    """The attention's value and output maps of every layer (W_V^T per query head from the value module's weight
    as its layout holds the values: ``Adapter.value_columns``) and the MLP's first and second maps W1 [L, F, d],
    b1, W2 [L, d, F] (kept across batches); ``only``: those layers' (the maps given are theirs), made afresh."""
    def build():
        ls = only or slice(None)
        values = [adapter.value_module(layer) for layer in adapter.layers()[ls]]
        W_Vt = stack_params([adapter.value_columns(linear_weight(v).t()) for v in values], dtype, device)
        b_V = (W_Vt.new_zeros(W_Vt.shape[0], W_Vt.shape[2]) if values[0].bias is None
               else stack_params([adapter.value_columns(v.bias) for v in values], dtype, device))
        W_O = weights.W_O[ls]
        return DecompXWeights(W_Vt=W_Vt.contiguous(), W_Ot=W_O.transpose(1, 2).contiguous(),
                              bias=torch.matmul(W_O, b_V[..., None])[..., 0] + weights.b_O[ls],
                              W1t=W1.transpose(1, 2).contiguous(), W2t=W2.transpose(1, 2).contiguous(),
                              W1b1=torch.matmul(W1.transpose(1, 2), b1[..., None])[..., 0])

    return build() if only is not None else kept(adapter, ("decompx", dtype, device), build)


class Layers:
    """Where the propagation reads each layer's captured tensors and weights: every layer's at once from the
    capture's float32 stacks (``every``: the batch's stack of every layer's attention within the block budget, the
    capture's rule), or a layer at a time from the lists as the forward made them (Adapter.capture's
    "narrow_layers": the model's dtype, one tensor a layer), widened to float32 when read, the layer's weights cast
    then (issue 36: no stack of every layer's attention, no float32 copy of every layer's weights)."""

    def __init__(self, cap, adapter):
        self.cap, self.adapter, self.L = cap, adapter, adapter.n_layers
        self.every = not adapter.streams_attention(cap.input_ids)
        if self.every:  # a narrow capture's part cut below the budget (compute/run/parts.py) is stacked now
            _stack_and_upcast(cap)
        first = cap.hidden_states[0]
        self.dtype = first.dtype if first.element_size() >= 4 else torch.float32
        self.device, self.itemsize = first.device, torch.finfo(self.dtype).bits // 8
        self.B, self.n, self.d = first.shape
        self.H = cap.attentions[0].shape[1]
        self.example, self.mask, self.memo = None, cap.mask, cap.memo

    def trimmed(self, b: int, m: int) -> "Layers":
        """Example b alone, its first m tokens (its real ones: ``_trim``), views of these layers' tensors."""
        one = copy.copy(self)
        one.example, one.B, one.n = (b, m), 1, m
        one.mask, one.memo = self.cap.mask[b:b + 1, :m], None  # not the batch's memo: its keys say no example
        return one

    def own(self, ls: slice) -> slice | None:
        """The layers whose weights to cast afresh: ``ls`` a layer at a time, None (every layer's, kept) else."""
        return None if self.every else ls

    def take(self, name: str, ls: slice) -> torch.Tensor:
        """[K, B, ...] the list ``name`` of the layers ``ls`` (a view of its stack where it has one)."""
        if self.every or name in self.cap.stacks:
            return self._cut(name, self.cap.stack(name)[ls])
        return widened(self._cut(name, getattr(self.cap, name)[ls.start][None]), self.dtype)

    def _cut(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """[K, B, ...] cut to the example and tokens of ``trimmed``."""
        if self.example is None:
            return t
        b, m = self.example
        t = t[:, b:b + 1]
        return t[..., :m, :m] if name == "attentions" else t[:, :, :m]

    def parts(self, ls: slice):
        """The decomposition's parts of the layers ``ls`` as one stack (``decomposition.layer_stack``'s)."""
        return _parts_of(lambda name: self.take(name, ls), bool(self.cap.ln1_in), self.mask, self.adapter, ls,
                        slice(None), False, self.memo)


class LayerSteps:
    """The steps of every layer: built at once (``Layers.every``), or a layer's when the propagation reaches it,
    the one before dropped first (one layer's float32 attention and weights alive at a time), again for each block
    of source tokens."""

    def __init__(self, build, layers: Layers):
        self.build, self.L = build, layers.L
        self.every = build(slice(0, self.L)) if layers.every else None
        self.one = None

    def __getitem__(self, l: int) -> Step:
        l %= self.L
        if self.every is not None:
            return self.every[l]
        if self.one is None or self.one[0] != l:
            self.one = None
            self.one = (l, self.build(slice(l, l + 1))[0])
        return self.one[1]


@dataclass
class Step:
    """One layer's inputs to the propagation (views of the stacks made before the layers are stepped through)."""

    A: torch.Tensor  # [B H, r, n] the attention rows of the receiving tokens
    gain1: torch.Tensor | None  # [R, 1, d] gamma1 / sigma1 of each receiving row (R = B r; pre-LN: of every token)
    gain2: torch.Tensor | None
    theta: torch.Tensor  # [R, 1, d_ff] the feed-forward factors (act(h) / h; a gate) of each receiving row
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
    gain_o: torch.Tensor | None = None  # pre-LN: [R, 1, d] the attention output norm's gamma / rho of each row
    gain_p: torch.Tensor | None = None  # pre-LN: the MLP output norm's
    gain_f: torch.Tensor | None = None  # pre-LN, the last layer: the final norm's of the explained rows
    first: object = None  # layer 1 (post-LN): its parts and its projected values W_O^h v_j^h [B, n, H, d]
    U: torch.Tensor | None = None


# --- how a step shares a bias among the parts ---------------------------------------------------------------------
# Every bias is shared among the parts of a receiving row in proportion to |<part, c>| over all its source tokens
# (absdot). With every source's parts at hand (``Whole``) the fused operations compute the weights; with a block of
# sources, the sums over every source (the weights' denominators) come from passes before (``Known``): for each
# stage (the steps from one attention to the next, which only mixes receiving rows) one pass of the blocks through
# the stages below it, in which the stage's shares are left as unknowns (``Collect``) and their sums solved for
# (``solve``). Everything else is fixed by the forward (the norms' scales, the feed-forward factors), so a part is
# linear in the parts of the layer below and in the shares' weights.

PSEUDO = 5  # the most bias shares in one stage (post-LN: the attention's, LN1's, b1, b2, LN2's)


class Whole:
    """The parts of every source token at once: each share's weights normalised over them (compute.methods.
    _internals.fused)."""

    def weights(self, V: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return absdot_weights(V, c)

    def share_(self, V: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        absdot_share_(V, bias)
        return V

    def ln(self, V: torch.Tensor, gain: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        return ln_share(V, gain, beta)

    def ln_(self, V: torch.Tensor, gain: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        """``ln`` of parts not read again: in place on the CPU (``fused.ln_share_``)."""
        if V.device.type != "cpu":
            return ln_share(V, gain, beta)
        ln_share_(V, gain, beta)
        return V


class Known(Whole):
    """A block of source tokens in a stage whose sums over every source are known, [R, 1, 1] per share in the order
    the stage shares its biases (fused._weights' operations, its sum replaced)."""

    def __init__(self, sums: list[torch.Tensor]):
        self.sums = iter(sums)

    def weights(self, V, c):
        return torch.matmul(V, c[:, None]).abs_().div_(next(self.sums))

    def share_(self, V, bias):
        return V.addcmul_(self.weights(V, bias), bias)

    def ln(self, V, gain, beta):
        return self.share_(center(V).mul_(gain), beta)

    def ln_(self, V, gain, beta):
        return self.share_(V.sub_(V.mean(-1, keepdim=True)).mul_(gain), beta)


class Collect(Known):
    """A block of k source tokens through the stage whose sums are sought, its parts [R, k + PSEUDO, D] (``pad``):
    share m's bias goes into the extra column k + m instead of the parts, so that after it a part is its column plus
    the extra columns times its (unknown) weights; the dots of every column with each shared vector are kept."""

    def __init__(self, k: int):
        self.k, self.dots = k, []

    def weights(self, V, c):
        self.dots.append(torch.matmul(V, c[:, None])[..., 0])  # [R, k + PSEUDO]
        w = V.new_zeros(*V.shape[:-1], 1)
        w[:, self.k + len(self.dots) - 1] = 1
        return w


def pad(V: torch.Tensor) -> torch.Tensor:
    """The parts [R, k, D] with PSEUDO zero columns after them (the shares' columns of ``Collect``)."""
    return torch.cat([V, V.new_zeros(V.shape[0], PSEUDO, V.shape[-1])], 1)


def solve(blocks: list[Collect]) -> list[torch.Tensor]:
    """The sums over every source token [R, 1, 1] of each share of a stage, from its blocks' dots: share m's dot of
    part j is its column's plus the earlier shares' weights times their columns' (the same in every block)."""
    sums, weights = [], []
    first = blocks[0]
    for m in range(len(first.dots)):
        d = torch.cat([c.dots[m][:, :c.k] for c in blocks], 1)  # [R, n]
        extra = first.dots[m][:, first.k:]  # [R, PSEUDO]
        for i, w in enumerate(weights):
            d.addcmul_(w, extra[:, i:i + 1])
        a = d.abs_()
        s = a.sum(-1, keepdim=True).clamp_min_(torch.finfo(a.dtype).tiny)
        weights.append(a / s)
        sums.append(s[..., None])
    return sums


def source_blocks(B: int, n: int, d: int, itemsize: int, budget: int) -> int:
    """Source tokens per block: STATE_COPIES of the parts [B n, k, d] within ``budget``."""
    return max(1, min(n, budget // max(1, STATE_COPIES * B * n * d * itemsize)))


def _blocked(walk, stages, n: int, k: int, finish):
    """Every source token's parts through the stages: ``walk(J, sharer, stop)`` takes the sources J through the
    stages up to ``stop`` (None: to the last layer's attention, whose explained rows [B, |J|, ...] it returns),
    each stage's shares by ``sharer(stage)``; ``finish`` the explained rows of every source. One block when k >= n
    (the fused operations); else a pass of the blocks for each stage in ``stages`` before the last."""
    if k >= n:
        return finish(*walk(slice(0, n), lambda _: Whole(), None))
    blocks = [slice(j0, min(n, j0 + k)) for j0 in range(0, n, k)]
    sums = {}
    for s in stages:
        collected = []
        for J in blocks:
            interrupts.check()  # a stop asked for: between blocks
            c = Collect(J.stop - J.start)
            walk(J, lambda t, c=c: c if t == s else Known(sums[t]), s)
            collected.append(c)
        sums[s] = solve(collected) if collected[0].dots else []
    parts = []
    for J in blocks:
        interrupts.check()
        # copies: the next block's walk reuses the work buffers (``Buffers``) that may hold these
        parts.append([t.clone() for t in walk(J, lambda t: Known(sums[t]), None)])
    return finish(*(torch.cat(p, 1) for p in zip(*parts)))


def propagate(cap, adapter, memory_mb: int | None, state_mb: int | None = None,
              positions: torch.Tensor | None = None) -> Propagated:
    """The decomposition of every layer's explained row and of the logits, shared by the DecompX methods of one
    batch (and by --target all's classes) through the batch's memo. ``positions`` [B, S]: the rows of these
    positions instead of the explained one (a generation's steps off its one pass: a causal model's row e reads
    the tokens up to e only), no logits.

    What does not depend on the carried decomposition (the frozen LayerNorm scales gamma / sigma_i, the
    feed-forward slopes act(h_i) / h_i of the real states, the fixed bias vectors) is computed for every layer at
    once before the layers are stepped through; each layer then costs a few large products and fused steps
    (compute.methods._internals.fused), with the decomposition laid out as [rows x parts, d] for the products. The
    parts go through the layers in blocks of source tokens within ``state_mb`` (``_blocked``)."""
    key = ("decompx", memory_mb, state_mb, positions is not None)
    if key not in cap.memo:
        src = Layers(cap, adapter)
        run = _propagate_pre_ln if adapter.pre_ln else _propagate_post_ln
        e = cap.explain_pos[:, None] if positions is None else positions

        def one(src, e):  # [B, S, L, n, d]
            k = source_blocks(src.B, src.n, src.d, src.itemsize, work_bytes(src.device, CPU_STATE_BYTES, state_mb,
                                                                           STATE_GPU_SHARE))
            return run(cap, adapter, src, memory_mb, k, e)

        lengths = _trim(cap.mask, e)
        if lengths is None:
            out = one(src, e)
        else:  # a padded source's parts are 0 in every real row: left out, they stay 0
            out = torch.zeros(src.B, e.shape[1], src.L, src.n, src.d, dtype=src.dtype, device=src.device)
            for b, m in enumerate(lengths):
                out[b:b + 1, :, :, :m] = one(src.trimmed(b, m), e[b:b + 1])
        cap.memo[key] = (Propagated(rows=out[:, 0], logits=_logits(adapter, cap, out[:, 0, -1]))
                         if positions is None else Propagated(rows=out, logits=None))
    return cap.memo[key]


# Trimming a padded batch (CPU): each example propagated alone at its real length where the batch is this long and
# its padding costs more than this share of the work (the parts are [n, n, d] a layer: n^2 each); shorter batches
# at once, where the layers' fixed cost per propagation outweighs the padding's
TRIM_TOKENS = 64
TRIM_WASTE = 0.02


def _trim(mask: torch.Tensor, e: torch.Tensor) -> list[int] | None:
    """Each example's real length where the batch is propagated an example at a time (``TRIM_TOKENS``), or None: a
    GPU's batch (a kernel launch per operation and example), a short or unpadded batch, or padding that is not
    after the real tokens, or a row asked for among it."""
    B, n = mask.shape
    if mask.device.type != "cpu" or B == 1 or n < TRIM_TOKENS:
        return None
    # a CPU batch (above): numpy views of its tensors, no device to wait for
    m = mask.numpy()
    lengths = m.sum(1)
    if not (m == (np.arange(n) < lengths[:, None])).all() or not (e.numpy() < lengths[:, None]).all():
        return None
    work = float(np.square(lengths.astype(np.float64)).sum())
    return [int(x) for x in lengths] if B * n * n > (1 + TRIM_WASTE) * work else None


def _last_rows(A: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """[B H, S, n] the attention rows [B, H, n, n] of the positions e [B, S]."""
    B, H, _, n = A.shape
    return A.gather(2, e[:, None, :, None].expand(B, H, e.shape[1], n)).flatten(0, 1)


def _propagate_post_ln(cap, adapter, src: Layers, memory_mb, k, e) -> torch.Tensor:
    """[B, S, L, n, d] the rows of the positions e [B, S]."""
    L, B, n, d, H, S = src.L, src.B, src.n, src.d, src.H, e.shape[1]
    b = torch.arange(B, device=src.device)[:, None]

    def build(ls):  # the steps of the layers ls
        p = src.parts(ls)
        ffn = stacked_ffn(adapter, src.dtype, src.device, src.own(ls))
        W = decompx_weights(adapter, p.weights, ffn.W1, ffn.b1, ffn.W2, src.dtype, src.device, src.own(ls))
        K = p.x.shape[0]
        gain1 = p.gamma1 / p.sigma1[..., None]  # [K, B, n, d]
        gain2 = p.gamma2 / p.sigma2[..., None]
        pre = torch.baddbmm(ffn.b1[:, None], p.y.view(K, B * n, d), W.W1t)  # [K, B n, d_ff]
        theta = zero_origin_slope(pre, ffn.act(pre)).view(K, B, n, -1)

        def rows(t, i, l):  # the receiving rows of layer l: every token, the explained ones in the last layer
            return (t[i] if l < L - 1 else t[i][b, e]).flatten(0, 1)[:, None]

        steps = [Step(A=p.A[i].flatten(0, 1) if l < L - 1 else _last_rows(p.A[i], e), gain1=rows(gain1, i, l),
                      gain2=rows(gain2, i, l), theta=rows(theta, i, l), W_Vt=W_Vt, W_Ot=W_Ot, bias=bias, W1t=W1t,
                      b1=b1, W2t=W2t, b2=b2, W1b1=W1b1, beta1=p.weights.beta1[l], beta2=p.weights.beta2[l])
                 for i, (l, W_Vt, W_Ot, bias, W1t, b1, W2t, b2, W1b1) in enumerate(zip(range(*ls.indices(L)), *(
                     t.unbind(0) for t in (W.W_Vt, W.W_Ot, W.bias, W.W1t, ffn.b1, W.W2t, ffn.b2, W.W1b1))))]
        if ls.start == 0:
            first = steps[0].first = p.layer(0)
            steps[0].U = first.project(first.W_O)  # [B, n, H, d]
            steps[0].bias = p.weights.b_O[0]  # layer 1's value bias stays in v_j
        return steps

    steps = LayerSteps(build, src)
    budget = work_bytes(src.device, CPU_BLOCK_BYTES, memory_mb)
    out = torch.empty(B, S, L, n, d, dtype=src.dtype, device=src.device)
    bufs = Buffers(out)

    def layer(sh, step, Z):  # a layer after its attention: the bias, LN1, the feed-forward block, LN2
        Z = sh.share_(Z, step.bias)
        Y = sh.ln_(Z, step.gain1, step.beta1)
        Y += _ffn(step, Y, budget, sh, bufs)
        return sh.ln_(Y, step.gain2, step.beta2)  # [R, k, d]

    def walk(J, sharer, stop):
        X = None
        for l in range(L):
            interrupts.check()  # a stop asked for: between layers
            step = steps[l]
            if X is None:
                Z = _first_layer(step.first, step.U, e if l == L - 1 else None, J)
            else:
                Z = _attention(step, X, H, None if l < L - 1 else (b, e), bufs=bufs)
            if l == L - 1:
                return (Z,)
            sh = sharer(l)
            X = layer(sh, step, pad(Z) if isinstance(sh, Collect) else Z)
            if l == stop:
                return
            out[:, :, l, J] = X.view(B, n, -1, d)[b, e]

    def finish(Z):
        out[:, :, -1] = layer(Whole(), steps[L - 1], Z).view(B, S, n, d)
        return out

    return _blocked(walk, range(L - 1), n, k, finish)


def _norm_scale(u: torch.Tensor, eps: float, centred: bool) -> torch.Tensor:
    """[..., n, 1] a norm's divisor of the real states u: LayerNorm's sigma, RMSNorm's rms."""
    return (ln_sigma(u, eps) if centred else (u.square().mean(-1) + eps).sqrt())[..., None]


def _normed(X: torch.Tensor, gain: torch.Tensor | None, beta: torch.Tensor | None, centred: bool,
            sh: Whole) -> torch.Tensor:
    """A norm at its frozen scale applied to the parts X [R, n, d] (gain [R, 1, d] = gamma / sigma of each row's real
    state; None: the block has no such norm), its beta shared by absdot (RMSNorm has none)."""
    if gain is None:
        return X
    if centred and beta is not None:
        return sh.ln(X, gain, beta)
    return (center(X) if centred else X) * gain  # OLMo's LayerNorm keeps no bias


def _propagate_pre_ln(cap, adapter, src: Layers, memory_mb, k, e) -> torch.Tensor:
    """docs/methods.md 6.3: the parts of every token's layer input x go through N1 (folded per token), attention
    (its biases shared), the norm on its output, the residual (no norm), N2, the MLP as its linear maps around the
    factors frozen at the real input (compute.methods._internals.linear_mlp), the norm on the MLP's output; the
    explained row of the last layer through the final norm N_f, then the head. Every norm's scale is the real
    state's, computed for every layer at once before the layers are stepped through. A stage runs from one
    layer's attention to the next one's (N1 of the next layer in it; stage -1: layer 1's N1)."""
    L, B, n, d, H, S = src.L, src.B, src.n, src.d, src.H, e.shape[1]
    block, dtype, device = adapter.block, src.dtype, src.device
    centred = block.norm == "layernorm"
    reads_norm = block.ln2 != block.mlp  # OLMo 2: the MLP reads the residual stream itself
    post = [mlp_output_norm(adapter, layer) for layer in adapter.layers()]
    final = adapter.final_norm()
    beta_f = None if getattr(final, "bias", None) is None else final.bias.detach().to(dtype)
    centred_f = stacked_weights(adapter, dtype, device).centred_f
    b = torch.arange(B, device=device)[:, None]

    def build(ls):  # the steps of the layers ls
        p = src.parts(ls)
        w = p.weights
        mlp = linear_mlps(adapter, dtype, device, src.own(ls))
        W = decompx_weights(adapter, w, mlp.W_in, mlp.b_in, mlp.W_out, dtype, device, src.own(ls))
        K = p.x.shape[0]

        def gain(gamma, u, eps):  # [K, B, n, d] gamma / the real states' scale
            return gamma[ls][:, None, None] / _norm_scale(u, eps, centred)

        gain1 = gain(w.gamma1, p.s, w.eps1) if cap.ln1_in else None  # OLMo 2: attention reads x itself
        u = src.take("ln2_out" if reads_norm else "ln2_in", ls)  # the MLP's real input
        gain2 = gain(w.gamma2, src.take("ln2_in", ls), w.eps2) if reads_norm else None
        theta, up = factors(mlp, u.reshape(K, B * n, d))
        gain_o = None if p.rho is None else w.gamma_o[ls][:, None, None] / p.rho[..., None]
        f = torch.baddbmm(mlp.b_out[:, None], theta * up, mlp.W_out.transpose(1, 2)).view(K, B, n, d)  # real out
        del up
        theta = theta.view(K, B, n, -1)
        gain_p = None
        if post[0] is not None:  # RMSNorm on the MLP's output (Gemma 2, OLMo 2), at the real output's rms
            gamma_p = stack_params([adapter.norm_gain(m, d) for m in post[ls]], dtype, device)
            gain_p = gamma_p[:, None, None] / _norm_scale(f, adapter.norm_eps(post[0]), False)
            f = f * gain_p

        def rows(t, i, l):  # the receiving rows of layer l: every token, the explained ones in the last layer
            return None if t is None else (t[i] if l < L - 1 else t[i][b, e]).flatten(0, 1)[:, None]

        steps = [Step(A=p.A[i].flatten(0, 1) if l < L - 1 else _last_rows(p.A[i], e),
                      gain1=None if gain1 is None else gain1[i].flatten(0, 1)[:, None], gain2=rows(gain2, i, l),
                      theta=rows(theta, i, l), W_Vt=W.W_Vt[i], W_Ot=W.W_Ot[i], bias=W.bias[i], W1t=W.W1t[i],
                      b1=mlp.b_in[i], W2t=W.W2t[i], b2=mlp.b_out[i], W1b1=W.W1b1[i], beta1=w.beta1[l],
                      beta2=w.beta2[l], gain_o=rows(gain_o, i, l), gain_p=rows(gain_p, i, l))
                 for i, l in enumerate(range(*ls.indices(L)))]
        if ls.stop >= L:
            # N_f at the real last layer output (before the final norm, which the capture's last hidden state is
            # after)
            last = (p.t[-1] + f[-1])[b, e].flatten(0, 1)  # [B S, d]
            steps[-1].gain_f = (w.gamma_f / _norm_scale(last, w.eps_f, w.centred_f))[:, None]  # [B S, 1, d]
        return steps

    def n1(sh, X, l):  # layer l's N1 on the parts of every token
        step = steps[l]
        return _normed(X, step.gain1, step.beta1, centred, sh)

    steps = LayerSteps(build, src)
    budget = work_bytes(device, CPU_BLOCK_BYTES, memory_mb)
    out = torch.empty(B, S, L, n, d, dtype=dtype, device=device)
    x0 = src.take("hidden_states", slice(0, 1))[0]  # layer 1's input

    def layer(sh, l, a, own):  # a layer after its attention a [R, k, d], its residual own
        step = steps[l]
        a = sh.share_(a, step.bias)
        if step.gain_o is not None:
            a.mul_(step.gain_o)
        h = a.add_(own)
        mixed = _normed(own if block.parallel else h, step.gain2, step.beta2, centred, sh)
        F_ = _ffn(step, mixed, budget, sh)
        if step.gain_p is not None:
            F_.mul_(step.gain_p)
        return h.add_(F_)

    def walk(J, sharer, stop):
        k = J.stop - J.start
        X = x0.new_zeros(B, n, k, d)  # layer 1: every token's input is its own
        X[:, J].diagonal(dim1=1, dim2=2).copy_(x0[:, J].transpose(1, 2))
        X = X.view(B * n, k, d)
        sh = sharer(-1)
        if isinstance(sh, Collect):
            X = pad(X)
        Y = n1(sh, X, 0)
        if stop == -1:
            return
        for l in range(L):
            interrupts.check()  # a stop asked for: between layers
            top = l == L - 1
            a = _attention(steps[l], Y, H, (b, e) if top else None, residual=False)  # [R, k, d]
            if top:
                return a, X.view(B, n, k, d)[b, e].flatten(0, 1)
            sh = sharer(l)
            X = layer(sh, l, *((pad(a), pad(X)) if isinstance(sh, Collect) else (a, X)))
            Y = n1(sh, X, l + 1)
            if l == stop:
                return
            out[:, :, l, J] = X.view(B, n, -1, d)[b, e]

    def finish(a, own):
        top = layer(Whole(), L - 1, a, own)
        # the state the head reads
        top = _normed(top, steps[L - 1].gain_f, beta_f, centred_f, Whole())
        out[:, :, -1] = top.view(B, S, n, d)
        return out

    return _blocked(walk, range(-1, L - 1), n, k, finish)


def _first_layer(first, U: torch.Tensor, explained: torch.Tensor | None, J: slice) -> torch.Tensor:
    """Layer 1's z_{i<-j} = sum_h A_ij^h W_O^h v_j^h (the value bias inside v_j) + [i=j] x_i [R, k, d] (the residual
    part is the token's own embedding output) of the sources J, for every receiving row or for the ``explained``
    ones [B, S]; U [B, n, H, d] = W_O^h v_j^h."""
    B, H, n, _ = first.A.shape
    A = first.A.permute(0, 3, 2, 1)[:, J]  # [B, j, i, H]
    if explained is not None:  # a one-layer model: its only layer is the last one
        A = A.gather(2, explained[:, None, :, None].expand(B, A.shape[1], explained.shape[1], H))  # [B, j, S, H]
    Z = torch.matmul(A, U[:, J]).transpose(1, 2).contiguous()  # [B, r, j, d]
    r, k = Z.shape[1:3]
    b = torch.arange(B, device=Z.device)[:, None]
    own = torch.arange(r, device=Z.device).expand(B, r) if explained is None else explained
    inside = ((own >= J.start) & (own < J.stop)).to(Z.dtype)  # the receiving token is among the sources J
    Z[b, torch.arange(r, device=Z.device), (own - J.start).clamp(0, k - 1)] += first.x[b, own] * inside[..., None]
    return Z.flatten(0, 1)


def _attention(step: Step, X: torch.Tensor, H: int, explained, residual: bool = True,
               bufs: Buffers | None = None) -> torch.Tensor:
    """z_{i<-j} = sum_h sum_k A_ik^h W_O^h W_V^h x_{k<-j} + x_{i<-j} [R, k, d] from the previous layer's parts X
    [B n, k, d] of k sources (the value and output biases are shared afterwards); without ``residual`` the first
    term only. Its work tensors and result in ``bufs`` where given (holding none of X)."""
    Bn, k, d = X.shape
    n = step.A.shape[-1]
    B, dh = Bn // n, d // H
    r = step.A.shape[1]
    V = torch.mm(X.view(-1, d), step.W_Vt, out=_take(bufs, (Bn * k, d), X))
    V = _contiguous(bufs, V.view(B, n, k, H, dh).permute(0, 3, 1, 2, 4), X, V)
    C = torch.bmm(step.A, V.view(B * H, n, k * dh), out=_take(bufs, (B * H, r, k * dh), X, V))
    C = _contiguous(bufs, C.view(B, H, r, k, dh).permute(0, 2, 3, 1, 4), X, C).view(B * r * k, d)
    if not residual:
        return torch.mm(C, step.W_Ot, out=_take(bufs, (B * r * k, d), X, C)).view(B * r, k, d)
    own = X.view(-1, d) if explained is None else X.view(B, n, k, d)[explained].view(-1, d)
    return torch.addmm(own, C, step.W_Ot, out=_take(bufs, (B * r * k, d), X, C)).view(B * r, k, d)


def _ffn(step: Step, Y: torch.Tensor, budget: int, sh: Whole, bufs: Buffers | None = None) -> torch.Tensor:
    """f_{i<-j} [R, n, d] for the LN1 decomposition Y [R, n, d]: W2 (theta_i * (W1 y_{i<-j} + w_ij b1)) + w'_ij b2,
    the biases shared by absdot. Receiving rows go in blocks whose [r, n, d_ff] activations fit ``budget`` (each
    block's rows contiguous in Y and in the result, which ``bufs`` holds where given)."""
    R, n, d = Y.shape
    d_ff = step.W1t.shape[1]
    w1 = sh.weights(Y, step.W1b1)  # <W1 y_{i<-j}, b1> = <y_{i<-j}, W1^T b1>, for every source at once
    r = max(1, budget // max(1, n * 2 * d_ff * Y.element_size()))  # rows per block: [r, n, d_ff] and a product
    out = _take(bufs, (R, n, d), Y)
    if r >= R:
        out = _ffn_block(step.theta, step, Y, w1, out)
    else:
        if out is None:
            out = torch.empty_like(Y)
        hidden = _take(bufs, (r * n, d_ff), Y, out)  # one for every block
        for r0 in range(0, R, r):
            rows = slice(r0, min(R, r0 + r))
            _ffn_block(step.theta[rows], step, Y[rows], w1[rows], out[rows], hidden)
    return sh.share_(out, step.b2)


def _ffn_block(theta: torch.Tensor, step: Step, Y: torch.Tensor, w1: torch.Tensor, out: torch.Tensor | None,
               hidden: torch.Tensor | None = None) -> torch.Tensor:
    """W2 (theta * (W1 Y + w1 b1)) [r, n, d] for the rows of Y [r, n, d] (their factors theta [r, 1, d_ff]), in
    ``out`` where given; the activations in ``hidden`` where given."""
    r, n, d = Y.shape
    Hd = torch.mm(Y.view(-1, d), step.W1t, out=None if hidden is None else hidden[:r * n])
    Hd = Hd.view(r, n, -1).addcmul_(w1, step.b1).mul_(theta)
    return torch.mm(Hd.view(r * n, -1), step.W2t, out=None if out is None else out.view(r * n, d)).view(r, n, d)


# A work tensor this large is taken from ``Buffers``: glibc's malloc maps every allocation above its largest mmap
# threshold (32 MB) afresh, and the new pages fault when first written; smaller ones come from its heap, reused.
REUSED_BYTES = 32 << 20


class Buffers:
    """Work tensors of REUSED_BYTES or more reused by the layers of one propagation: the page faults of fresh ones
    cost DecompX a sixth of its CPU time. ``take`` hands out a view of a buffer that holds none of the tensors still
    in use, or None for a smaller tensor (the operation allocates it)."""

    def __init__(self, like: torch.Tensor):
        self.like, self.pool = like, []

    def take(self, shape: tuple, *live: torch.Tensor) -> torch.Tensor | None:
        numel = math.prod(shape)
        if numel * self.like.element_size() < REUSED_BYTES:
            return None
        busy = {t.untyped_storage().data_ptr() for t in live}
        for i, t in enumerate(self.pool):
            if t.untyped_storage().data_ptr() in busy:
                continue
            if t.numel() < numel:
                t = self.pool[i] = self.like.new_empty(numel)
            return (t if t.numel() == numel else t[:numel]).view(shape)
        self.pool.append(self.like.new_empty(numel))
        return self.pool[-1].view(shape)


def _take(bufs: Buffers | None, shape: tuple, *live: torch.Tensor) -> torch.Tensor | None:
    """``bufs.take``: a work tensor of ``shape``, or None (no buffers, or a small tensor: the operation's own)."""
    return None if bufs is None else bufs.take(shape, *live)


def _contiguous(bufs: Buffers | None, t: torch.Tensor, *live: torch.Tensor) -> torch.Tensor:
    """``t`` laid out contiguously, in a work tensor of ``bufs`` where it takes one."""
    out = _take(bufs, tuple(t.shape), *live)
    return t.contiguous() if out is None else out.copy_(t)


def _logits(adapter, cap, X: torch.Tensor) -> torch.Tensor | None:
    """The sequence head's logit shares; None for a language model's (its target word's row: decompx.word_shares)."""
    return _head(adapter, cap, X) if adapter.task in SEQUENCE_HEAD_TASKS else None


def _head(adapter, cap, X: torch.Tensor) -> torch.Tensor:
    """logits_j [B, n, C] from the explained token's final decomposition X [B, n, d] (sums to the hidden state):
    through the head's dense map and activation (zero-origin slope) where it has them, then the classifier (a
    decoder's score reads the final-normed state directly)."""
    dense, act, classifier = adapter.head_parts()
    dtype = X.dtype
    if dense is not None:
        Wp, bp = dense.weight.to(dtype), dense.bias.to(dtype)
        b = torch.arange(X.shape[0], device=X.device)
        h = widened(cap.hidden_states[-1][b, cap.explain_pos], dtype)  # [B, d] the explained token's final state
        pre = F.linear(h, Wp, bp)
        theta = zero_origin_slope(pre, act(pre))  # [B, d]
        X = X @ Wp.T  # [B, n, d]
        absdot_share_(X, bp)
        X.mul_(theta[:, None])
    Cj = X @ classifier.weight.to(dtype).T  # [B, n, C]
    if classifier.bias is not None:
        absdot_share_(Cj, classifier.bias.to(dtype))
    return Cj.mul_(cap.mask[..., None].to(dtype))
