"""StableLM: Llama's block with LayerNorm (with bias), partial rotary positions and, optionally, a LayerNorm per head
on queries and keys (qk_layernorm: A only); with use_parallel_residual the MLP reads the same norm's output as
attention, x' = x + Attn(LN x) + MLP(LN x) (the residual stream after attention is rebuilt as x + Attn)."""

from __future__ import annotations

import dataclasses

from .llama import BLOCK, LlamaAdapter

SEQUENTIAL = dataclasses.replace(BLOCK, norm="layernorm", norm_bias=True)


class StableLmAdapter(LlamaAdapter):
    family = "stablelm"
    model_types = ("stablelm",)

    def __init__(self, model, task="classification"):
        parallel = bool(getattr(model.config, "use_parallel_residual", False))
        self.block = dataclasses.replace(SEQUENTIAL, parallel=True, ln2="input_layernorm") if parallel else SEQUENTIAL
        super().__init__(model, task)
