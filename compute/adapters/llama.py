"""Llama: pre-LN decoder with RMSNorm, rotary positions inside attention, grouped-query attention, a gated MLP;
r = x + Attn(norm_1(x)), x' = r + MLP(norm_2(r)); a final norm. The decoders below subclass it for their heads
(a linear score on the final norm's output, pooled at the last real token; the LM head on the same)."""

from __future__ import annotations

from .base import Adapter
from .block import Block, MLPMaps

GATED = MLPMaps(up="up_proj", gate="gate_proj", down="down_proj", act="act_fn")  # SwiGLU, GeGLU (Gemma)

BLOCK = Block(layers="layers", embeddings="embed_tokens", attention="self_attn", value="self_attn.v_proj",
              out_proj="self_attn.o_proj", ln1="input_layernorm", ln2="post_attention_layernorm", mlp="mlp",
              norms="pre", norm="rmsnorm", norm_bias=False, positions="rotary", mlp_kind="gated", final_norm="norm",
              mlp_maps=GATED)


class LlamaAdapter(Adapter):
    family = "llama"
    model_types = ("llama",)
    block = BLOCK
    pre_ln = BLOCK.pre_ln

    def _base(self):
        return self.model.base_model  # .model, or .transformer for LlamaForQuestionAnswering

    def head_parts(self):
        return None, None, self.model.score

    def _head(self, h):
        return self.model.score(h)

    def lm_head_parts(self):
        return None, None, None, self.model.lm_head  # on the final norm's output
