"""Gemma 2: "sandwich" norms: RMSNorm (gain 1 + weight) before and on the output of each sublayer,
r = x + norm_o(Attn(norm_1(x))), x' = r + norm_4(MLP(norm_3(r))); attention-logit soft-capping, alternating sliding
windows (both in A only); a GeGLU MLP; a final norm."""

from __future__ import annotations

import dataclasses

import torch

from .llama import BLOCK, LlamaAdapter


class Gemma2Adapter(LlamaAdapter):
    family = "gemma2"
    model_types = ("gemma2",)
    block = dataclasses.replace(BLOCK, norms="sandwich", norm_offset=1.0, attn_out_norm="post_attention_layernorm",
                                ln2="pre_feedforward_layernorm", extra_norms=("post_feedforward_layernorm",),
                                softcap=True, windowed=True)

    def head_logit(self, h, target, foil=None):
        """A causal LM's logits are soft-capped (final_logit_softcapping): cap tanh(logit / cap), target less foil."""
        cap = getattr(self.config, "final_logit_softcapping", None)
        if not cap:
            return super().head_logit(h, target, foil)
        capped = lambda t: cap * torch.tanh(super(Gemma2Adapter, self).head_logit(h, t) / cap)
        out = capped(target)
        if foil is not None:
            out = out - (foil >= 0).to(out.dtype)[:, None] * capped(foil.clamp_min(0))
        return out
