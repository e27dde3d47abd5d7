"""Qwen2-MoE and Qwen3-MoE: Qwen2's (Qwen3's, with QK-norm) block whose MLP is a mixture of experts (Qwen2-MoE adds a
gated shared expert; some layers may keep a dense MLP): the routed MLP is the token's own step (Mixtral's)."""

from __future__ import annotations

import dataclasses

from .block import Experts
from .llama import BLOCK, GATED, LlamaAdapter


class Qwen2MoeAdapter(LlamaAdapter):
    family = "qwen2_moe"
    model_types = ("qwen2_moe",)
    block = dataclasses.replace(BLOCK, mlp_kind="moe", mlp_maps=Experts(dense=GATED, shared="shared_expert",
                                                                        shared_gate="shared_expert_gate"))


class Qwen3MoeAdapter(LlamaAdapter):
    family = "qwen3_moe"
    model_types = ("qwen3_moe",)
    block = dataclasses.replace(BLOCK, mlp_kind="moe", mlp_maps=Experts(dense=GATED),
                                extra_norms=("self_attn.q_norm", "self_attn.k_norm"))
