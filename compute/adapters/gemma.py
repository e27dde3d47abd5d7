"""Gemma: Llama's block with RMSNorm gains 1 + weight, a GeGLU MLP and embeddings scaled by sqrt(d) inside the
embedding module (its output is the first layer's input)."""

from __future__ import annotations

import dataclasses

from .llama import BLOCK, LlamaAdapter


class GemmaAdapter(LlamaAdapter):
    family = "gemma"
    model_types = ("gemma",)
    block = dataclasses.replace(BLOCK, norm_offset=1.0)
