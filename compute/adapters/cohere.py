"""Cohere (Command R): attention and a gated MLP in parallel on one LayerNorm without bias (mean-centred, computed in
float32), x' = x + Attn(LN x) + MLP(LN x) (the residual stream after attention is rebuilt as x + Attn); rotary
positions, optional LayerNorms per head on queries and keys (use_qk_norm: A only); the causal LM's logits multiplied
by logit_scale (Adapter.logit_scaling)."""

from __future__ import annotations

import dataclasses

from .llama import BLOCK, LlamaAdapter


class CohereAdapter(LlamaAdapter):
    family = "cohere"
    model_types = ("cohere",)

    def __init__(self, model, task="classification"):
        qk = ("self_attn.q_norm", "self_attn.k_norm") if model.config.use_qk_norm else ()
        self.block = dataclasses.replace(BLOCK, ln2="input_layernorm", parallel=True, norm="layernorm",
                                         norm_bias=False, extra_norms=qk)
        super().__init__(model, task)
