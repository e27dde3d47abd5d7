"""Qwen3: Llama's block with RMSNorm on queries and keys (QK-norm: it changes the attention probabilities only)."""

from __future__ import annotations

import dataclasses

from .llama import BLOCK, LlamaAdapter


class Qwen3Adapter(LlamaAdapter):
    family = "qwen3"
    model_types = ("qwen3",)
    block = dataclasses.replace(BLOCK, extra_norms=("self_attn.q_norm", "self_attn.k_norm"))
