"""Phi (1, 1.5, 2): attention and MLP in parallel on one LayerNorm's output, x' = x + Attn(LN x) + MLP(LN x) (the
residual stream after attention is rebuilt as x + Attn); partial rotary positions, optional LayerNorm on queries and
keys (A only), a plain MLP (fc1, GELU, fc2), a final LayerNorm; the causal LM's head has a bias."""

from __future__ import annotations

import dataclasses

from .block import MLPMaps
from .llama import BLOCK, LlamaAdapter


class PhiAdapter(LlamaAdapter):
    family = "phi"
    model_types = ("phi",)
    block = dataclasses.replace(BLOCK, out_proj="self_attn.dense", ln2="input_layernorm", parallel=True,
                                norm="layernorm", norm_bias=True, mlp_kind="plain", final_norm="final_layernorm",
                                mlp_maps=MLPMaps(up="fc1", down="fc2", act="activation_fn"))
