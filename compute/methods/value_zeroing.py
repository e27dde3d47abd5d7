"""Value Zeroing (Mohebbi, Zuidema, Chrupala, Alishahi 2023, EACL; docs/methods.md "Value Zeroing").

Per layer l and token j: run the layer again with token j's value vectors set to zero in every head (queries, keys
and so the attention probabilities unchanged), and measure how far every output moves: C_ij = cosine distance
between the layer's output for token i with and without token j's values. Rows are normalised to sum 1 and the
layers multiplied without an identity (PROD, as ALTI): final = row of the explained token in C^L ... C^1.

Zeroing v_j only removes sum_h A_ij^h W_O^h v_j^h (= z_{i<-j}, the "n" vectors of the decomposition) from the pre-LN1
state of every query i, so the rest of the layer (LN1, feed-forward block, LN2) is applied to s_i - z_{i<-j} for a
block of zeroed tokens j at once: one batched pass per block instead of one layer forward per token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import interrupts
from ..errors import AttrscopeError
from ..options import Option, at_least
from ._internals.aggregate import valid_block
from ._internals.decomposition import LayerParts, SourceBlocks, layer_parts, tokens_per_block
from ._internals.layerwise import LayerwiseProduct, row_normalise


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
    pre_ln_ok = False  # the feed-forward block and LN2 are re-applied as post-LN layers compute them
    row_stochastic = True
    op_budget = 1.0  # the layer's feed-forward block and norms run again per zeroed token (batched)
    cost_exponent = 2  # the layer re-run for each of n zeroed tokens over n tokens
    run_options = (
        Option("value_zeroing_memory_mb", 64, type=int, show_default=True, metavar="MB", param="memory_mb",
               resume=True, check=at_least(1),
               help="value_zeroing: memory budget of one block of zeroed tokens (its feed-forward activations)."),
    )

    @classmethod
    def memory_per_example(cls, shape, params):
        # zeroed_distances at one zeroed token per block: [1, B, n, d_ff] activations and four [1, B, n, d] states
        return shape.n * (shape.d_ff + 4 * shape.d) * shape.itemsize

    def __init__(self, memory_mb: int = 64, **params):
        super().__init__(memory_mb=memory_mb, **params)

    def check_architecture(self, adapter) -> None:
        super().check_architecture(adapter)
        if adapter.ffn_parts(adapter.layers()[0]) is None:
            raise AttrscopeError(f"method '{self.name}' does not know the feed-forward block of "
                                 f"'{adapter.config.model_type}' models")

    def layer_matrix(self, cap, adapter, l: int) -> torch.Tensor:
        """C^l [B, n, n]: row i = receiving token, column j = zeroed token; rows sum to 1, pad rows/columns 0."""
        p = layer_parts(cap, adapter, l)
        distances = self.zeroed_distances(p, adapter.ffn_parts(adapter.layers()[l]))
        return row_normalise(valid_block(distances, cap.mask))

    def zeroed_distances(self, p: LayerParts, ffn) -> torch.Tensor:
        """[B, i, j]: cosine distance between the real layer output y2_i and the output with v_j zeroed."""
        lin1, act, lin2 = ffn
        dtype = p.s.dtype
        W1, b1, W2, b2 = (t.to(dtype) for t in (lin1.weight, lin1.bias, lin2.weight, lin2.bias))
        B, n, d = p.s.shape
        d_ff = W1.shape[0]
        # a block of k zeroed tokens holds [k, B, n, d_ff] activations and a few [k, B, n, d] states
        k = tokens_per_block(B, n, d_ff + 4 * d, p.s.element_size(), self.params["memory_mb"] << 20)
        sources = SourceBlocks(p.A, p.project(p.W_O), None)  # z_{i<-j} = sum_h A_ij^h W_O^h v_j^h
        out = p.s.new_empty(B, n, n)
        for j0 in range(0, n, k):
            interrupts.check()  # a stop asked for: between blocks of zeroed tokens
            J = slice(j0, min(n, j0 + k))
            s = p.s - sources.block(J)  # [k, B, n, d]: pre-LN1 states without token j's values
            y = F.layer_norm(s, (d,), p.gamma1, p.beta1, p.eps1)
            t = y + F.linear(act(F.linear(y, W1, b1)), W2, b2)
            y2 = F.layer_norm(t, (d,), p.gamma2, p.beta2, p.eps2)
            out[:, :, J] = unit_distance(y2, p.y2).permute(1, 2, 0)
        return out
