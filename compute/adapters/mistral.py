"""Mistral: Llama's block with sliding-window attention (the window is in the attention probabilities)."""

from __future__ import annotations

import dataclasses

from .llama import BLOCK, LlamaAdapter


class MistralAdapter(LlamaAdapter):
    family = "mistral"
    model_types = ("mistral",)
    block = dataclasses.replace(BLOCK, windowed=True)
