"""Qwen2: Llama's block with biases on the q, k, v projections (the value bias is in the captured values)."""

from __future__ import annotations

from .llama import BLOCK, LlamaAdapter


class Qwen2Adapter(LlamaAdapter):
    family = "qwen2"
    model_types = ("qwen2",)
    block = BLOCK
