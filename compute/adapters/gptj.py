"""GPT-J: one LayerNorm before attention and MLP in parallel, x' = x + Attn(LN x) + MLP(LN x) (the residual stream
after attention is rebuilt as x + Attn); rotary positions on part of each head, projections without bias, a plain MLP
(fc_in, GELU, fc_out), ln_f after the last block; the causal LM's head has a bias."""

from __future__ import annotations

from .block import Block, MLPMaps
from .llama import LlamaAdapter

BLOCK = Block(layers="h", embeddings="drop", attention="attn", value="attn.v_proj", out_proj="attn.out_proj",
              ln1="ln_1", ln2="ln_1", mlp="mlp", norms="pre", positions="rotary", parallel=True, final_norm="ln_f",
              mlp_maps=MLPMaps(up="fc_in", down="fc_out", act="act"))


class GPTJAdapter(LlamaAdapter):
    family = "gptj"
    model_types = ("gptj",)
    block = BLOCK
