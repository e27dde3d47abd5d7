"""Granite: Llama's block with four multipliers from its config: the embeddings times embedding_multiplier before the
first layer (hidden_states[0] is the first layer's input), each sublayer's output times residual_multiplier before
its residual add, x' = r + m MLP(norm_2(r)) with r = x + m Attn(norm_1(x)), attention_multiplier as the scores' scale
(A only) and the causal LM's logits divided by logits_scaling (Adapter.logit_scaling). The residual multiplier is
folded into W_O and b_O (``out_proj``) and into the MLP step (``mlp``), so every method that decomposes the residual
stream reads the sublayers' outputs as the residual adds receive them."""

from __future__ import annotations

import dataclasses

from .base import Sublayer
from .llama import BLOCK, LlamaAdapter


class _Scaled:
    """W and b of a Linear times a constant (the residual multiplier), in nn.Linear's convention."""

    def __init__(self, linear, scale: float):
        self.weight = scale * linear.weight
        self.bias = None if linear.bias is None else scale * linear.bias


class GraniteAdapter(LlamaAdapter):
    family = "granite"
    model_types = ("granite",)
    block = dataclasses.replace(BLOCK, layer_input="layer")

    def out_proj(self, layer):
        return _Scaled(layer.self_attn.o_proj, self.config.residual_multiplier)

    def mlp(self, layer):
        m = layer.mlp  # DecompX's maps (block.mlp_maps: Llama's gated MLP) from m, the down map times the multiplier
        return Sublayer(m, m, root=m, scale=self.config.residual_multiplier)
