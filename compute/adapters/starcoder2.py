"""StarCoder2: Llama's block with LayerNorm (with bias), biases on the projections, a plain MLP (c_fc, GELU, c_proj)
and sliding-window attention (A only)."""

from __future__ import annotations

import dataclasses

from .block import MLPMaps
from .llama import BLOCK, LlamaAdapter


class Starcoder2Adapter(LlamaAdapter):
    family = "starcoder2"
    model_types = ("starcoder2",)
    block = dataclasses.replace(BLOCK, norm="layernorm", norm_bias=True, mlp_kind="plain", windowed=True,
                                mlp_maps=MLPMaps(up="c_fc", down="c_proj", act="act"))
