"""GPT-BigCode (SantaCoder, StarCoder 1): GPT-2's pre-LN block with nn.Linear projections; multi_query (the default)
shares one key and one value head among the query heads, the fused projection holding [q | k | v] with k and v one
head wide; without it the projection holds [q_h k_h v_h] per head (GPT-NeoX's layout)."""

from __future__ import annotations

import dataclasses

from .gpt2 import BLOCK, GPT2Adapter


class GPTBigCodeAdapter(GPT2Adapter):
    family = "gpt_bigcode"
    model_types = ("gpt_bigcode",)

    def __init__(self, model, task="classification"):
        self.block = dataclasses.replace(BLOCK, qkv="concat_gqa" if model.config.multi_query else "per_head")
        super().__init__(model, task)

    @property
    def n_kv_heads(self) -> int:
        return 1 if self.config.multi_query else self.n_heads

    def out_proj(self, layer):
        return layer.attn.c_proj  # an nn.Linear (GPT-2's is a Conv1D)
