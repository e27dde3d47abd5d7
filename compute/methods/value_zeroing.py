"""Value Zeroing (Mohebbi, Zuidema, Chrupala, Alishahi 2023, EACL; docs/methods.md "Value Zeroing").

Per layer l and token j: run the layer again with token j's value vectors set to zero in every head (queries, keys
and so the attention probabilities unchanged), and measure how far every output moves: C_ij = cosine distance
between the layer's output for token i with and without token j's values. Rows are normalised to sum 1 and the
layers multiplied without an identity (PROD, as ALTI): final = row of the explained token in C^L ... C^1.

Zeroing v_j only removes sum_h A_ij^h W_O^h v_j^h (= z_{i<-j}, the "n" vectors of the decomposition) from the pre-LN1
state of every query i, so the rest of the layer (LN1, feed-forward block, LN2) is applied to s_i - z_{i<-j} for a
block of zeroed tokens j at once: one batched pass per block instead of one layer forward per token. Pre-LN blocks
(docs/methods.md 6.2): the residual stream after attention becomes x_i + N_o(o_i - z_{i<-j}) and the block's own MLP
step (its norms and MLP modules, compute.methods._internals.pre_ln) runs on it, once per layer and block.

A layer's matrix depends only on that layer's input and attention, so above the block budget the layers stream
(issue 36, LayerwiseProduct): each one as a forward of its own makes it, its attention in the model's dtype (widened
a block of zeroed tokens at a time), a post-LN layer's feed-forward weights cast to float32 while it is processed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import interrupts
from ..errors import AttrscopeError
from ..options import Option, at_least
from ._internals.aggregate import valid_pairs
from ._internals.budget import work_bytes
from ._internals.decomposition import FeedForward, LayerParts, SourceBlocks, flat, stacked_ffn, tokens_per_block
from ._internals.layerwise import LayerwiseProduct, row_normalise
from ._internals.pre_ln import BlockSteps, check_known


CPU_BLOCK_BYTES = 64 << 20  # a block of zeroed tokens on the CPU


def unit_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """1 - cos(a, b) over the last dimension, as ||a/|a| - b/|b|||^2 / 2: the same number, without the cancellation
    of 1 - cos when the vectors nearly agree (most tokens move an output a little)."""
    tiny = torch.finfo(a.dtype).tiny
    ua = a / torch.linalg.vector_norm(a, dim=-1, keepdim=True).clamp_min(tiny)
    ub = b / torch.linalg.vector_norm(b, dim=-1, keepdim=True).clamp_min(tiny)
    return torch.linalg.vector_norm(ua - ub, dim=-1).square() / 2


class ValueZeroing(LayerwiseProduct):
    name = "value_zeroing"
    description = "Value Zeroing: how far each layer's outputs move when a token's values are zeroed, rolled out"
    reference = "Mohebbi, Zuidema, Chrupala, Alishahi (2023), EACL; docs/methods.md"
    row_stochastic = True
    narrow_attention = True  # read only through SourceBlocks, which widens a block of sources at a time
    op_budget = 1.0  # the layer's feed-forward block and norms run again per zeroed token (batched)
    cost_exponent = 2  # the layer re-run for each of n zeroed tokens over n tokens
    run_options = (
        Option("value_zeroing_memory_mb", type=int, metavar="MB", param="memory_mb", resume=True, check=at_least(1),
               help="value_zeroing: memory budget of one block of zeroed tokens (its feed-forward activations) "
                    "[default: 64 on the CPU, 1/64 of the GPU's memory on a GPU]."),
    )

    @classmethod
    def memory_per_example(cls, shape, params):
        # zeroed_distances at one zeroed token per block: [1, B, n, d_ff] activations and four [1, B, n, d] states
        return shape.n * (shape.d_ff + 4 * shape.d) * shape.itemsize

    def __init__(self, memory_mb: int | None = None, **params):
        super().__init__(memory_mb=memory_mb, **params)

    def check_architecture(self, adapter) -> None:
        super().check_architecture(adapter)
        if adapter.pre_ln:
            check_known(adapter, self.name)
        elif adapter.ffn_parts(adapter.layers()[0]) is None:
            raise AttrscopeError(f"method '{self.name}' does not know the feed-forward block of "
                                 f"'{adapter.config.model_type}' models")

    def stack_matrices(self, p: LayerParts, adapter) -> torch.Tensor:
        """C^l [*, n, n]: row i = receiving token, column j = zeroed token; rows sum to 1, pad rows/columns 0."""
        if adapter.pre_ln:
            distances = self.zeroed_distances_pre_ln(p, adapter)
        else:
            # a streamed layer's feed-forward weights cast for it alone, every layer's stack kept otherwise
            one = None if p.stacked else slice(p.layers, p.layers + 1)
            distances = self.zeroed_distances(p, stacked_ffn(adapter, p.s.dtype, p.s.device, one))
        return row_normalise(valid_pairs(distances, p.mask))

    def zeroed_distances(self, p: LayerParts, ffn: FeedForward) -> torch.Tensor:
        """[*, i, j]: cosine distance between the real layer output y2_i and the output with v_j zeroed, for every
        layer of ``p`` at once: a block of zeroed tokens of every layer goes through LN1, the feed-forward block
        (one batched product per weight over the layers) and LN2 together. ``ffn``: every layer's, or for one
        layer's ``p`` that layer's alone."""
        one = not p.stacked
        A, s, y2 = (t[None] if one else t for t in (p.A, p.s, p.y2))  # [K, B, ...]
        K, B, n, d = s.shape
        layers = slice(p.layers, p.layers + 1) if one else p.layers
        own = slice(0, 1) if one else layers  # one layer's feed-forward block is cast for that layer alone
        W1t, W2t = ffn.W1[own].transpose(1, 2), ffn.W2[own].transpose(1, 2)  # [K, d, d_ff], [K, d_ff, d]
        b1, b2 = ffn.b1[own, None], ffn.b2[own, None]  # [K, 1, .]
        g1, be1, g2, be2 = (w[layers, None, None, None] for w in (p.weights.gamma1, p.weights.beta1,
                                                                  p.weights.gamma2, p.weights.beta2))
        d_ff = W1t.shape[-1]
        # a block of k zeroed tokens holds [K, k, B, n, d_ff] activations and a few [K, k, B, n, d] states
        budget = work_bytes(s.device, CPU_BLOCK_BYTES, self.params["memory_mb"])
        k = tokens_per_block(K * B, n, d_ff + 4 * d, s.element_size(), budget)
        sources = SourceBlocks(flat(A, 3), p.project(p.W_O, source_major=True))  # z_{i<-j} = sum_h A_ij^h W_O^h v_j^h
        out = s.new_empty(K, B, n, n)
        for j0 in range(0, n, k):
            interrupts.check()  # a stop asked for: between blocks of zeroed tokens
            J = slice(j0, min(n, j0 + k))
            kj = J.stop - J.start
            z = sources.block(J).view(kj, K, B, n, d).transpose(0, 1)  # [K, k, B, n, d]
            # the pre-LN1 states without token j's values, laid out layer first for the products
            x = torch.sub(s[:, None], z, out=s.new_empty(K, kj, B, n, d))
            y = F.layer_norm(x, (d,), eps=p.eps1).mul_(g1).add_(be1)
            h = torch.baddbmm(b1, y.view(K, -1, d), W1t)  # [K, k B n, d_ff]
            t = torch.baddbmm(b2, ffn.act(h), W2t).view_as(y).add_(y)
            y2z = F.layer_norm(t, (d,), eps=p.eps2).mul_(g2).add_(be2)
            out[..., J] = unit_distance(y2z, y2[:, None]).permute(0, 2, 3, 1)  # [K, B, i, j]
        return out[0] if one else out

    def zeroed_distances_pre_ln(self, p: LayerParts, adapter) -> torch.Tensor:
        """[*, i, j] for pre-LN blocks (docs/methods.md 6.2): the layer output x + N_o(o - z_{i<-j}) + its MLP step
        against the real one, the MLP step and the norms being the block's modules (one call per layer and block of
        zeroed tokens; the distances of every layer at once)."""
        one = not p.stacked
        A, x, t = (u[None] if one else u for u in (p.A, p.x, p.t))
        o = None if p.o is None else p.o[None] if one else p.o
        K, B, n, d = x.shape
        first = p.layers if one else p.layers.start
        steps = [BlockSteps(adapter, first + k) for k in range(K)]
        normed = steps[0].attn_norm is not None
        # the real layer outputs (the last one hidden behind the final norm in the capture) and, for a parallel
        # block, its MLP step, which reads the layer input and so is left as it is by the zeroing
        own = torch.stack([st.mlp_step(x[k] if st.parallel else t[k]) for k, st in enumerate(steps)])
        real = t + own
        d_ff = getattr(adapter.config, "intermediate_size", None) or 4 * d
        budget = work_bytes(x.device, CPU_BLOCK_BYTES, self.params["memory_mb"])
        # a gated MLP holds about three [B, n, d_ff] activations per zeroed token and layer, and a few states
        k = tokens_per_block(K * B, n, 3 * d_ff + 4 * d, x.element_size(), budget)
        sources = SourceBlocks(flat(A, 3), p.project(p.W_O, source_major=True))  # z_{i<-j}, W_O without N_o
        out = x.new_empty(K, B, n, n)
        for j0 in range(0, n, k):
            interrupts.check()  # a stop asked for: between blocks of zeroed tokens
            J = slice(j0, min(n, j0 + k))
            z = sources.block(J).view(J.stop - J.start, K, B, n, d).transpose(0, 1)  # [K, k, B, n, d]
            if normed:  # the attention output without token j's part through the block's norm on it
                h = torch.stack([st.residual(x[i, None], o[i, None] - z[i]) for i, st in enumerate(steps)])
            else:
                h = t[:, None] - z
            if steps[0].parallel:
                h += own[:, None]
            else:
                for i, st in enumerate(steps):
                    h[i] += st.mlp_step(h[i])
            out[..., J] = unit_distance(h, real[:, None]).permute(0, 2, 3, 1)  # [K, B, i, j]
        return out[0] if one else out
