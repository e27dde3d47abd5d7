"""OLMo 2: RMSNorm on each sublayer's output only, r = x + norm_o(Attn(x)), x' = r + norm_f(MLP(r)) (no norm before
attention: the values come from x itself); QK-norm (A only); a gated MLP; a final norm."""

from __future__ import annotations

import dataclasses

from .llama import BLOCK, LlamaAdapter


class Olmo2Adapter(LlamaAdapter):
    family = "olmo2"
    model_types = ("olmo2",)
    block = dataclasses.replace(BLOCK, norms="output", ln1=None, attn_out_norm="post_attention_layernorm",
                                ln2="mlp", extra_norms=("self_attn.q_norm", "self_attn.k_norm",
                                                        "post_feedforward_layernorm"))
