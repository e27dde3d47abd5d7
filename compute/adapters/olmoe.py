"""OLMoE: OLMo's block with RMSNorm (its epsilon kept by the module), RMSNorm on the whole query and key projections
(QK-norm: A only), the clip_qkv clamp where set (OLMo's, on the values as attention reads them) and a mixture of
experts as the MLP: the routed MLP is the token's own step (Mixtral's)."""

from __future__ import annotations

import dataclasses

from .base import Adapter
from .block import Experts
from .llama import BLOCK, GATED
from .olmo import OlmoAdapter


class OlmoeAdapter(OlmoAdapter):
    family = "olmoe"
    model_types = ("olmoe",)
    block = dataclasses.replace(BLOCK, mlp_kind="moe", extra_norms=("self_attn.q_norm", "self_attn.k_norm"),
                                mlp_maps=Experts(dense=GATED))
    norm_eps = Adapter.norm_eps  # OLMo's LayerNorm keeps no epsilon; OLMoE's RMSNorm does
