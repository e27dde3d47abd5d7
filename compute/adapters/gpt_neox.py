"""GPT-NeoX (Pythia): LayerNorm with bias, partial rotary positions, a fused projection holding q, k, v per head,
and (use_parallel_residual, the default) attention and MLP in parallel: x' = x + Attn(LN1 x) + MLP(LN2 x)."""

from __future__ import annotations

import dataclasses

from .base import Adapter
from .block import Block, MLPMaps

BLOCK = Block(layers="layers", embeddings="embed_in", attention="attention", value="attention.query_key_value",
              out_proj="attention.dense", ln1="input_layernorm", ln2="post_attention_layernorm", mlp="mlp",
              norms="pre", qkv="per_head", positions="rotary", final_norm="final_layer_norm",
              mlp_maps=MLPMaps(up="dense_h_to_4h", down="dense_4h_to_h", act="act"))


class GPTNeoXAdapter(Adapter):
    family = "gpt_neox"
    model_types = ("gpt_neox",)
    pre_ln = BLOCK.pre_ln

    def __init__(self, model, task="classification"):
        super().__init__(model, task)
        # sequential blocks read LN2's input as the residual stream after attention; parallel ones have none
        self.block = dataclasses.replace(BLOCK, parallel=bool(getattr(self.config, "use_parallel_residual", True)))

    def head_parts(self):
        return None, None, self.model.score

    def _head(self, h):
        return self.model.score(h)

    def lm_head_parts(self):
        return None, None, None, self.model.get_output_embeddings()  # on the final norm's output
