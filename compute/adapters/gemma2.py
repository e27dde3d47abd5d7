"""Gemma 2: "sandwich" norms: RMSNorm (gain 1 + weight) before and on the output of each sublayer,
r = x + norm_o(Attn(norm_1(x))), x' = r + norm_4(MLP(norm_3(r))); attention-logit soft-capping, alternating sliding
windows (both in A only); a GeGLU MLP; a final norm; a causal LM's logits soft-capped (Adapter.logit_scaling)."""

from __future__ import annotations

import dataclasses

from .llama import BLOCK, LlamaAdapter


class Gemma2Adapter(LlamaAdapter):
    family = "gemma2"
    model_types = ("gemma2",)
    block = dataclasses.replace(BLOCK, norms="sandwich", norm_offset=1.0, attn_out_norm="post_attention_layernorm",
                                ln2="pre_feedforward_layernorm", extra_norms=("post_feedforward_layernorm",),
                                softcap=True, windowed=True)
