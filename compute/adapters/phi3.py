"""Phi-3: Llama's block with a fused [q | k | v] projection (grouped key/value heads) and a fused gate/up projection."""

from __future__ import annotations

import dataclasses

from .block import MLPMaps
from .llama import BLOCK, LlamaAdapter


class Phi3Adapter(LlamaAdapter):
    family = "phi3"
    model_types = ("phi3",)
    block = dataclasses.replace(BLOCK, value="self_attn.qkv_proj", qkv="concat_gqa",
                                mlp_maps=MLPMaps(up="gate_up_proj", down="down_proj", act="activation_fn", fused=True))
