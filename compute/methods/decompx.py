"""DecompX (Modarressi, Fayyaz, Aghazadeh, Yaghoobzadeh, Pilehvar 2023, ACL; docs/methods.md "DecompX").

Every token's vector is decomposed into one part per input token and the parts are propagated through attention,
residuals, LN1, the feed-forward block (the activation as a per-neuron line through the origin), LN2 and, for the
explained token, the classification head: the explanation of class c is each token's share of the logit of c
(signed; the shares sum to the logit, biases included). Layer view l = ||x^l_{e<-j}||_2, the norm of token j's part of
the explained token's vector after layer l (the classifier-free variant's score at that layer). The propagation is
shared with decompx_nohead and with --target all's classes (compute.methods._internals.token_vectors). Pre-LN blocks
(docs/methods.md 6.3): the norms before the sublayers folded per token, the MLP as the linear maps its block declares
(a mixture's chosen experts with the routing fixed), the final norm before the head; on --task next-token the LM
head's row of the target word (less the foil's).
"""

from __future__ import annotations

import torch

from ..errors import AttrscopeError
from ..options import Option, at_least
from ._internals.base import SEQUENCE_HEAD_TASKS, Method, MethodResult
from ._internals.decomposition import NARROW_NEEDS
from ._internals.linear_mlp import zero_origin_slope
from ._internals.pre_ln import check_final_norm
from ._internals.token_vectors import propagate

MEMORY_OPTION = Option("decompx_memory_mb", type=int, metavar="MB", param="memory_mb", resume=True,
                       check=at_least(1),
                       help="decompx, decompx_nohead: memory budget of one block of receiving tokens in the "
                            "feed-forward block [default: 64 on the CPU, 1/64 of the GPU's memory on a GPU].")
STATE_OPTION = Option("decompx_state_mb", type=int, metavar="MB", param="state_mb", resume=True, check=at_least(1),
                      help="decompx, decompx_nohead: memory budget of the decomposition, [B n, k, d] for k source "
                           "tokens at a time; where the whole [B n, n, d] is over it, the sources go through the "
                           "layers in blocks, each layer's bias shares summed in a pass of the blocks through the "
                           "layers below it (about L/2 times the work) [default: 4096 on the CPU, 1/16 of the GPU's "
                           "memory on a GPU].")


class DecompXBase(Method):
    needs = NARROW_NEEDS
    has_layer_views = True
    # the propagation runs through the sequence head, or a decoder's LM head row of the target word (both variants)
    tasks = SEQUENCE_HEAD_TASKS | {"next-token"}
    op_budget = 1.0  # the decomposition is carried from layer to layer (a step per layer)
    cost_exponent = 2  # [n, n, d] decomposed vectors through every layer
    run_options = (MEMORY_OPTION, STATE_OPTION)

    @classmethod
    def memory_per_example(cls, shape, params):
        # the feed-forward block at one receiving row per block: [n, d_ff] pre-activations and their product
        return shape.n * 2 * shape.d_ff * shape.itemsize

    def __init__(self, memory_mb: int | None = None, state_mb: int | None = None, **params):
        super().__init__(memory_mb=memory_mb, state_mb=state_mb, **params)

    def check_architecture(self, adapter) -> None:
        super().check_architecture(adapter)
        model = adapter.config.model_type
        if adapter.pre_ln:  # docs/methods.md 6.3
            check_final_norm(adapter, self.name)
        elif adapter.ffn_parts(adapter.layers()[0]) is None:
            raise AttrscopeError(f"method '{self.name}' does not know the feed-forward block of '{model}' models")
        if adapter.task == "next-token":
            if adapter.lm_head_parts()[0] is not None:  # lm_head_parts: one line where no LM head is known
                raise AttrscopeError(f"method '{self.name}' does not know a language-model head with a transform "
                                     f"before its vocabulary matrix ('{model}')")
        elif adapter.head_parts() is None:
            raise AttrscopeError(f"method '{self.name}' does not know the head of '{model}' models")
        if adapter.pre_ln and adapter.block.mlp_maps is None:
            raise AttrscopeError(f"method '{self.name}' needs the MLP's linear maps of '{model}' models: its block "
                                 "description declares no mlp_maps (compute/adapters/)")
        if not adapter.linear_values:
            raise AttrscopeError(f"method '{self.name}' is not defined for '{model}' models with clip_qkv: the "
                                 "clamp on the values has no linearisation in DecompX")

    def propagated(self, cap, adapter):
        self.check_architecture(adapter)
        return propagate(cap, adapter, self.params["memory_mb"], self.params["state_mb"])

    def layer_views(self, cap, adapter) -> torch.Tensor:
        """[B, L, n]: ||x^l_{e<-j}||_2 per layer."""
        return torch.linalg.vector_norm(self.propagated(cap, adapter).rows, dim=-1)

    def step_rows(self, cap, adapter, steps) -> torch.Tensor:
        """[R, L, n, d] every step's x^l_{e<-j}, read off the one pass's decomposition (compute/run/steps.py)."""
        self.check_architecture(adapter)
        return steps.rows(propagate(cap, adapter, self.params["memory_mb"], self.params["state_mb"],
                                    positions=steps.grid).rows)


class DecompX(DecompXBase):
    name = "decompx"
    description = "DecompX: each token's share of the target logit, propagated through every layer and the head"
    reference = "Modarressi et al. (2023), ACL; docs/methods.md"
    signed = True
    class_specific = True

    def compute(self, cap, adapter, target):
        if adapter.task == "next-token":
            scores = word_shares(adapter, cap, self.propagated(cap, adapter).rows[:, -1], target)
            return MethodResult(scores=scores, layer_scores=self.layer_views(cap, adapter))
        logits = self.propagated(cap, adapter).logits  # [B, n, C]
        scores = logits.gather(-1, target[:, None, None].expand(-1, logits.shape[1], 1))[..., 0]
        return MethodResult(scores=scores, layer_scores=self.layer_views(cap, adapter))

    def compute_rows(self, cap, adapter, steps, rows):
        X = self.step_rows(cap, adapter, steps)
        return MethodResult(scores=word_shares(adapter, rows(), X[:, -1], steps.target),
                            layer_scores=torch.linalg.vector_norm(X, dim=-1))

    def compute_classes(self, cap, adapter, num_classes):
        return self.propagated(cap, adapter).logits.transpose(1, 2)  # every class at once: [B, C, n]


def word_shares(adapter, cap, X: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """[B, n] each token's share of the target word's logit (less the foil's where one is given) from the explained
    token's final parts X [B, n, d] (after the final norm: the state the LM head reads): the vocabulary row of the
    word on each part, its bias shared by absdot (|part * bias|), times the config's logit scale; a soft cap
    cap tanh(z / cap) at its zero-origin slope of the real logit (docs/methods.md 6.3). The shares sum to the
    model's logit (less the foil's)."""
    _, W, bias = adapter.lm_head()
    scale, softcap = adapter.logit_scaling()
    dtype = X.dtype

    def shares(t):  # [B, n] of the words t [B]
        parts = torch.linalg.vecdot(X, W[t].to(dtype)[:, None])  # [B, n]
        if bias is not None:
            b = bias[t].to(dtype)
            w = parts.abs()
            parts = parts + w / w.sum(-1, keepdim=True).clamp_min(torch.finfo(dtype).tiny) * b[:, None]
        parts = scale * parts
        if softcap is None:
            return parts
        z = parts.sum(-1)  # the real logit before the cap (the parts sum to it)
        return parts * zero_origin_slope(z, softcap * torch.tanh(z / softcap))[:, None]

    out = shares(target)
    if cap.foil is not None:
        out = out - (cap.foil >= 0).to(dtype)[:, None] * shares(cap.foil.clamp_min(0))
    return out * cap.mask.to(dtype)
