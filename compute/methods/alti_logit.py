"""ALTI-Logit (Ferrando, Gallego, Tsiamas, Costa-jussa 2023, ACL; docs/methods.md "ALTI-Logit").

Per layer l, each source token j's attention contribution to the explained token e, z^l_{e<-j} = sum_h A_ej^h W_O^h
v_j^h (value biases inside v_j, b_O left out), is projected on the direction g^l along which the state it enters
reaches the explained logit: Delta^l_j = <g^l, z^l_{e<-j}>. Tracked to the input tokens with ALTI's rollout of the
layers below, view_l = Delta^l C^{l-1} ... C^1 (the layer's logit contributions per input token), and the final
score is their sum over layers (signed).

g^l: pre-LN decoders (the paper's setting): the logit is linear in the residual stream once the final norm's scale
is frozen, so g^l = P(gamma_f * u) / sigma_f for every layer (gamma_f * u / rms_f with RMSNorm), u the score row of
the target class. Post-LN encoders (attrscope's transfer, not in the paper): the explained token's own path from
the pre-LN1 state s^l_e to the logit (residual, LN1, feed-forward, LN2 of every layer above, then the head) taken
with frozen LayerNorm scales and zero-origin slopes act(h)/h for the feed-forward and pooler activations (as
DecompX), g^l being that linear path's vector-Jacobian product with the head's row u.

The target enters only through ``output_direction`` (u for the class explained): masked- and next-token targets
(compute.tasks) put the unembedding row of the target word there, less the foil's (the paper's contrastive form),
carried through a masked LM's head transform as through the classifier's (frozen LayerNorm scale, zero-origin
activation slopes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..errors import AttrscopeError
from ._internals.base import SEQUENCE_HEAD_TASKS, Method, MethodResult
from ._internals.aggregate import valid_pairs
from ._internals.decomposition import (STREAMED_NEEDS, center, layer_stack, stacked_ffn, stacked_weights,
                                       streamed_layers, streams, widened)
from ._internals.token_vectors import zero_origin_slope
from .alti import Alti


WORD_TASKS = frozenset({"masked-token", "next-token"})  # the explained logit is a row of a vocabulary head


def at(t: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """t[b, pos[b]] for every example b: [B, n, ...] -> [B, ...]."""
    return t[torch.arange(t.shape[0], device=t.device), pos]


class AltiLogit(Method):
    name = "alti_logit"
    tasks = SEQUENCE_HEAD_TASKS | {"masked-token", "next-token"}  # a logit read at the explained token
    description = "ALTI-Logit: each layer's attention contributions to the target logit, tracked to the inputs by ALTI"
    reference = "Ferrando, Gallego, Tsiamas, Costa-jussa (2023), ACL; docs/methods.md"
    signed = True
    class_specific = True
    needs = STREAMED_NEEDS  # every layer's stacked, or (a batch above the block budget) a layer at a time
    has_layer_views = True
    op_budget = 1.0  # a backward sweep of directions and a rollout per layer beside ALTI's matrices
    cost_exponent = 2  # ALTI's [n, n, d] contributions
    run_options = (Alti.run_options[1],)  # --memory-mb: ALTI's source-token blocks

    @classmethod
    def memory_per_example(cls, shape, params):
        return Alti.memory_per_example(shape, params)  # ALTI's blocks, which it runs

    def __init__(self, memory_mb: int | None = None, **params):
        super().__init__(memory_mb=memory_mb, **params)

    def check_architecture(self, adapter) -> None:
        super().check_architecture(adapter)
        block = adapter.block
        why = None if block is None else ("its MLP reads the layer input in parallel with attention" if block.parallel
                                          else "norms sit on its sublayers' outputs" if block.attn_out_norm
                                          else None)
        if why:
            raise AttrscopeError(f"method '{self.name}' is not defined for the '{adapter.config.model_type}' block: it "
                                 f"rebuilds the final state as r + MLP(LN2(r)) through a final norm, and {why}")
        if adapter.task == "next-token" and adapter.logit_scaling()[1] is not None:
            raise AttrscopeError(f"method '{self.name}' is not defined for '{adapter.config.model_type}' causal LMs: "
                                 "their logits are soft-capped (final_logit_softcapping), not linear in the final state")
        head = adapter.lm_head_parts() if adapter.task in WORD_TASKS else adapter.head_parts()
        known = adapter.mlp(adapter.layers()[0]) is not None if adapter.pre_ln else \
            adapter.ffn_parts(adapter.layers()[0]) is not None
        if head is None or not known:
            raise AttrscopeError(f"method '{self.name}' does not know the head or the feed-forward block of "
                                 f"'{adapter.config.model_type}' models")

    # --- what the method reads of the layers, target-independent ---------------------------------------------------
    def record(self, cap, adapter) -> "Record":
        """ALTI's matrices and the explained token's rows of every layer, from the capture's stacks or, where the
        capture streamed the layers ("layer_parts"), a layer at a time as a forward makes them (one layer's
        [B, H, n, n] alive at a time); made once per batch, shared by its classes."""
        return cap.cached(("alti_logit", "record", self.params["memory_mb"]), lambda: self._record(cap, adapter))

    def _record(self, cap, adapter) -> "Record":
        alti = Alti(memory_mb=self.params["memory_mb"])
        e = cap.explain_pos
        b = torch.arange(e.shape[0], device=e.device)
        if not streams(cap):
            p = layer_stack(cap, adapter)
            post = None if adapter.pre_ln else (p.y[:, b, e], p.sigma1[:, b, e], p.sigma2[:, b, e])
            return Record(C=alti.layer_matrices(cap, adapter), v=p.v, A_e=p.A[:, b, :, e],
                          W_O=p.weights.W_O, post=post, h_e=at(self._final_state(cap, adapter), e))
        # Streamed: no layer's C^l or values are kept. The views are view_l = Delta^l R^{l-1} with the running
        # product R^{l-1} = C^{l-1} ... C^1 and Delta^l_j = <g^l, z^l_{e<-j}>, so view_l[c] = <g^l, M^l_c> with
        # M^l = (R^{l-1})^T Z^l [B, n, d] (Z^l: the explained token's contributions z^l_{e<-j}): held per layer in
        # place of C^l [n, n] and the values [n, d] (g^l, known at the top, is the target's).
        layers: dict[str, list] = {k: [] for k in ("M", "y_e", "sigma1_e", "sigma2_e")}
        last = {}
        R = None  # C^{l-1} ... C^1 [B, n, n]; None below the first layer (the identity)

        def consume(p):
            nonlocal R
            a_e = widened(p.A[b, :, e], p.v.dtype).transpose(1, 2)  # [B, j, H]: the explained row of every head
            W_O = p.weights.W_O[p.layers]
            Z = torch.matmul((a_e[..., None] * p.v).flatten(-2), W_O.t()).mul_(p.mask[..., None])  # z_{e<-j} [B, j, d]
            layers["M"].append(Z if R is None else torch.bmm(R.transpose(1, 2), Z))
            C = valid_pairs(alti.stack_matrices(p, adapter), p.mask)
            R = C if R is None else torch.bmm(C, R)
            if not adapter.pre_ln:
                layers["y_e"].append(p.y[b, e])
                layers["sigma1_e"].append(p.sigma1[b, e])
                layers["sigma2_e"].append(p.sigma2[b, e])
            last.update(W_O=p.weights.W_O, t_e=p.t[b, e], y2_e=p.y2[b, e])  # not p: its attention goes

        streamed_layers(cap, adapter, consume, narrow_attention=alti.narrow_attention)
        del R
        if adapter.pre_ln:  # the final norm's input r + MLP(LN2(r)) of the explained token
            mlp = adapter.mlp(adapter.layers()[-1])
            dtype = next(mlp.parameters()).dtype
            h_e = last["t_e"] + mlp(last["y2_e"][:, None].to(dtype))[:, 0].to(last["t_e"].dtype)
            post = None
        else:  # the last layer's output (LN2's)
            h_e = last["y2_e"]
            post = tuple(torch.stack(layers[k]) for k in ("y_e", "sigma1_e", "sigma2_e"))
        return Record(C=None, v=None, A_e=None, W_O=last["W_O"], post=post, h_e=h_e, M=torch.stack(layers["M"]))

    # --- the target: the direction of the explained output at the final state ----------------------------------
    def output_direction(self, cap, adapter, target: torch.Tensor, rec: "Record | None" = None) -> torch.Tensor:
        """u [B, d]: logit_target = <u, final state of the explained token> + a constant, with the head's
        activation frozen at its zero-origin slope (exact for a linear head). A word target's row of the
        vocabulary matrix, less the foil's (the contrast), through a masked LM's head transform (dense, activation
        at its zero-origin slope, LayerNorm at its frozen scale)."""
        h = (rec or self.record(cap, adapter)).h_e  # the explained token's final state
        dtype = h.dtype
        if adapter.task in WORD_TASKS:
            dense, act, norm, decoder = adapter.lm_head_parts()
            W = decoder.weight.to(dtype)
            rows = W[target]
            if cap.foil is not None:
                rows = rows - (cap.foil >= 0).to(dtype)[:, None] * W[cap.foil.clamp_min(0)]
            if adapter.task == "next-token":  # the logit as the model scales it (Cohere, Granite)
                rows = adapter.logit_scaling()[0] * rows
            if dense is None:
                return rows
            pre = nn.functional.linear(h, dense.weight.to(dtype), _maybe(dense.bias, dtype))
            a = act(pre)
            sigma = (center(a).square().mean(-1) + norm.eps).sqrt()
            rows = center(norm.weight.to(dtype) * rows) / sigma[:, None]  # through the LayerNorm, scale frozen
            return (zero_origin_slope(pre, a) * rows) @ dense.weight.to(dtype)
        dense, act, classifier = adapter.head_parts()
        rows = classifier.weight.to(dtype)[target]  # [B, C-row]
        if dense is None:
            return rows
        pre = nn.functional.linear(h, dense.weight.to(dtype), _maybe(dense.bias, dtype))
        return (zero_origin_slope(pre, act(pre)) * rows) @ dense.weight.to(dtype)

    def _final_state(self, cap, adapter) -> torch.Tensor:
        """The state the head reads: the last hidden state (post-LN), the final norm's input (pre-LN)."""
        if not adapter.pre_ln:
            return cap.hidden_states[-1]
        layer = adapter.layers()[-1]
        mlp = adapter.mlp(layer)
        dtype = next(mlp.parameters()).dtype
        r = cap.ln2_in[-1]
        return r + mlp(cap.ln2_out[-1].to(dtype)).to(r.dtype)

    # --- the directions g^l -------------------------------------------------------------------------------------
    def directions(self, cap, adapter, target, rec: "Record | None" = None) -> torch.Tensor:
        """g^l [B, L, d]: the vector whose inner product with an attention contribution of layer l is its share of
        the target logit."""
        rec = rec or self.record(cap, adapter)
        u = self.output_direction(cap, adapter, target, rec)
        L = adapter.n_layers
        if adapter.pre_ln:
            norm = adapter.final_norm()
            r = rec.h_e
            gamma = adapter.norm_gain(norm, r.shape[-1]).to(r.dtype)  # Gemma's 1 + weight
            if adapter.block.norm == "layernorm":  # OLMo's has no parameters (not an nn.LayerNorm)
                sigma = (center(r).square().mean(-1) + adapter.norm_eps(norm)).sqrt()
                g = center(gamma * u) / sigma[:, None]
            else:  # RMSNorm: no centring
                rms = (r.square().mean(-1) + adapter.norm_eps(norm)).sqrt()
                g = gamma * u / rms[:, None]
            return g[:, None].expand(-1, L, -1)
        # Post-LN: the explained token's path from layer l's pre-LN1 state to the logit, taken backwards. What does
        # not depend on g (the frozen sigmas, the feed-forward slopes) is computed for every layer at once; only the
        # products with g step through the layers.
        ffn = stacked_ffn(adapter, u.dtype, u.device)
        y_e, sigma1_e, sigma2_e = rec.post  # [L, B, d] the explained token's LN1 outputs; [L, B] its sigmas
        pre = torch.baddbmm(ffn.b1[:, None], y_e, ffn.W1.transpose(1, 2))  # [L, B, d_ff]
        theta = zero_origin_slope(pre, ffn.act(pre))
        inv_sigma1, inv_sigma2 = sigma1_e[..., None].reciprocal(), sigma2_e[..., None].reciprocal()
        weights = stacked_weights(adapter, u.dtype, u.device)
        g1, g2 = weights.gamma1[:, None], weights.gamma2[:, None]  # [L, 1, d]
        G = u.new_empty(L, *u.shape)
        g = u
        for l in range(L - 1, -1, -1):
            g_t = center(g2[l] * g).mul_(inv_sigma2[l])  # through LN2 (frozen sigma)
            g_y = torch.matmul(theta[l] * (g_t @ ffn.W2[l]), ffn.W1[l]).add_(g_t)  # residual + feed-forward
            g = G[l] = center(g1[l] * g_y).mul_(inv_sigma1[l])  # through LN1: the pre-LN1 state's vector
        return G.transpose(0, 1)

    # --- the method -----------------------------------------------------------------------------------------------
    def layer_contributions(self, cap, adapter, target, rec: "Record | None" = None) -> torch.Tensor:
        """Delta^l_j [B, L, n]: source token j's attention contribution in layer l to the target logit, for every
        layer at once: <g^l, z^l_{e<-j}> = sum_h A_ej^h <(W_O^h)^T g^l, v_j^h> (the explained row only)."""
        rec = rec or self.record(cap, adapter)
        G = self.directions(cap, adapter, target, rec).transpose(0, 1)  # [L, B, d]
        L, B, n, H, dh = rec.v.shape
        Yt = torch.bmm(G, rec.W_O).view(L, B, H, 1, dh)  # (W_O^h)^T g per head: [L, B, d] x [L, d, d]
        S = torch.matmul(Yt, rec.v.movedim(2, -1))[..., 0, :]  # [L, B, H, j]
        return (S.transpose(0, 1) * rec.A_e).sum(2).mul_(cap.mask[:, None])  # [B, L, j]

    def compute(self, cap, adapter, target):
        self.check_architecture(adapter)
        rec = self.record(cap, adapter)
        if rec.M is not None:  # streamed: view_l[c] = <g^l, M^l_c> (``_record``)
            G = self.directions(cap, adapter, target, rec).transpose(0, 1)  # [L, B, d]
            views = torch.matmul(rec.M, G[..., None])[..., 0].transpose(0, 1)  # [B, L, n]
            return MethodResult(scores=views.sum(1), layer_scores=views)
        views = self.layer_contributions(cap, adapter, target, rec)  # Delta^l, then C^{l-1} ... C^1 applied below
        C = rec.C
        # C^k applied to every view above it (l > k), top down: one batched product per layer
        for k in range(adapter.n_layers - 2, -1, -1):
            views[:, k + 1:] = torch.bmm(views[:, k + 1:], C[k])
        return MethodResult(scores=views.sum(1), layer_scores=views)


@dataclass
class Record:
    """What ALTI-Logit reads of the layers (every layer's, stacked first): ALTI's C^l [L, B, n, n], the value vectors
    v [L, B, n, H, dh], the explained row of every head's attention A_e [B, L, H, n], the output projections W_O
    [L, d, d], post-LN the explained token's LN1 output and both sigmas ([L, B, d], [L, B], [L, B]; None pre-LN),
    and its final state h_e [B, d] (the head's input, or the final norm's). Streamed, in place of C, v and A_e
    (None): M^l = (C^{l-1} ... C^1)^T Z^l [L, B, n, d] (``AltiLogit._record``)."""

    C: torch.Tensor | None
    v: torch.Tensor | None
    A_e: torch.Tensor | None
    W_O: torch.Tensor
    post: tuple | None
    h_e: torch.Tensor
    M: torch.Tensor | None = None


def _maybe(bias, dtype):
    """A Linear's bias in ``dtype``, or None where it has none (ModernBERT's head dense)."""
    return None if bias is None else bias.to(dtype)
