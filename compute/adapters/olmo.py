"""OLMo (1): Llama's block with LayerNorm without gain or bias; with clip_qkv, queries, keys and values are clamped
to [-clip, clip] after their projections (the values as attention reads them: clamped)."""

from __future__ import annotations

import dataclasses

from .llama import BLOCK, LlamaAdapter


class OlmoAdapter(LlamaAdapter):
    family = "olmo"
    model_types = ("olmo",)
    block = dataclasses.replace(BLOCK, norm="layernorm", norm_bias=False)

    def norm_eps(self, norm):
        return 1e-5  # OlmoLayerNorm's constant: the module keeps no attribute of it

    @property
    def linear_values(self):
        return self.config.clip_qkv is None

    def value_of(self, out):
        clip = self.config.clip_qkv
        return super().value_of(out if clip is None else out.clamp(-clip, clip))
