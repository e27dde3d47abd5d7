"""Mixtral: Llama's block whose MLP is a sparse mixture of experts (a router picks each token's experts, whose gated
MLPs' outputs it weights): the routed MLP is the token's own step after the mixing, as a dense MLP is."""

from __future__ import annotations

import dataclasses

from .block import Experts
from .llama import BLOCK, GATED, LlamaAdapter


class MixtralAdapter(LlamaAdapter):
    family = "mixtral"
    model_types = ("mixtral",)
    block = dataclasses.replace(BLOCK, mlp_kind="moe", mlp_maps=Experts(dense=GATED))
