"""BLOOM: pre-LN decoder (LayerNorm with bias) with a LayerNorm on the word embeddings (its output is the first
layer's input), ALiBi (a per-head linear bias on the scores: A only, captured as the model computes it), a fused
projection holding [q_h k_h v_h] per head (GPT-NeoX's layout), a plain MLP (GELU), ln_f after the last block. Its
attention module and MLP add the residual they are given: the attention module's output is the residual stream
after attention (LN2's input), and ``mlp`` calls the MLP with a zero residual. With
apply_residual_connection_post_layernorm the residual is the norm's output: not described (refused in one line)."""

from __future__ import annotations

import torch

from .base import Sublayer
from .block import Block, MLPMaps
from .llama import LlamaAdapter

BLOCK = Block(layers="h", embeddings="word_embeddings_layernorm", attention="self_attention",
              value="self_attention.query_key_value", out_proj="self_attention.dense", ln1="input_layernorm",
              ln2="post_attention_layernorm", mlp="mlp", norms="pre", qkv="per_head", positions="alibi",
              final_norm="ln_f", mlp_maps=MLPMaps(up="dense_h_to_4h", down="dense_4h_to_h", act="gelu_impl"))


class BloomAdapter(LlamaAdapter):
    family = "bloom"
    model_types = ("bloom",)
    block = BLOCK
    decoder = True  # causal (its attention modules carry no is_causal flag)

    @classmethod
    def describes(cls, model) -> bool:
        return not model.config.apply_residual_connection_post_layernorm

    def mlp(self, layer):
        m = layer.mlp
        return Sublayer(lambda y: m(y, torch.zeros_like(y)), m, root=m)
