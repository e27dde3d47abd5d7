"""MPT: pre-LN decoder with LayerNorms without bias, ALiBi (A only), a fused [q | k | v] projection (GPT-2's layout)
clamped to [-clip_qkv, clip_qkv] where set (the values as attention reads them: clamped; DecompX refuses, as on
OLMo), a plain MLP (up_proj, GELU, down_proj) that adds the residual it is given (``mlp`` calls it with a zero
residual), norm_f after the last block."""

from __future__ import annotations

import torch

from .base import Sublayer
from .block import Block, MLPMaps
from .llama import LlamaAdapter

BLOCK = Block(layers="blocks", embeddings="wte", attention="attn", value="attn.Wqkv", out_proj="attn.out_proj",
              ln1="norm_1", ln2="norm_2", mlp="ffn", norms="pre", norm_bias=False, qkv="concat", positions="alibi",
              final_norm="norm_f", mlp_maps=MLPMaps(up="up_proj", down="down_proj", act="act"))


class MptAdapter(LlamaAdapter):
    family = "mpt"
    model_types = ("mpt",)
    block = BLOCK
    decoder = True  # causal (its attention modules carry no is_causal flag)

    @property
    def linear_values(self):
        return not self.config.attn_config.clip_qkv

    def value_of(self, out):
        clip = self.config.attn_config.clip_qkv
        return super().value_of(out if not clip else out.clamp(-clip, clip))

    def mlp(self, layer):
        m = layer.ffn
        return Sublayer(lambda y: m(y, torch.zeros_like(y)), m, root=m)
