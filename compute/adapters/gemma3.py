"""Gemma 3 (text): Gemma 2's sandwich norms (RMSNorm, gain 1 + weight) with RMSNorm on queries and keys (QK-norm)
and sliding-window layers between global ones (both change A only); a causal LM's logits soft-capped where its config
says (Adapter.logit_scaling)."""

from __future__ import annotations

import dataclasses

from .gemma2 import Gemma2Adapter


class Gemma3Adapter(Gemma2Adapter):
    family = "gemma3"
    model_types = ("gemma3_text",)
    block = dataclasses.replace(Gemma2Adapter.block, extra_norms=("post_feedforward_layernorm", "self_attn.q_norm",
                                                                  "self_attn.k_norm"))
