"""DecompX (Modarressi, Fayyaz, Aghazadeh, Yaghoobzadeh, Pilehvar 2023, ACL; docs/methods.md "DecompX").

Every token's vector is decomposed into one part per input token and the parts are propagated through attention,
residuals, LN1, the feed-forward block (the activation as a per-neuron line through the origin), LN2 and, for the
explained token, the classification head: the explanation of class c is each token's share of the logit of c
(signed; the shares sum to the logit, biases included). Layer view l = ||x^l_{e<-j}||_2, the norm of token j's part of
the explained token's vector after layer l (the classifier-free variant's score at that layer). The propagation is
shared with decompx_nohead and with --target all's classes (compute.methods._internals.token_vectors).
"""

from __future__ import annotations

import torch

from ..errors import AttrscopeError
from ..options import Option, at_least
from ._internals.base import SEQUENCE_HEAD_TASKS, Method, MethodResult
from ._internals.decomposition import NEEDS
from ._internals.pre_ln import check_final_norm
from ._internals.token_vectors import propagate

MEMORY_OPTION = Option("decompx_memory_mb", type=int, metavar="MB", param="memory_mb", resume=True,
                       check=at_least(1),
                       help="decompx, decompx_nohead: memory budget of one block of source tokens in the feed-forward "
                            "block (the [n, n, d] decomposition itself is kept whole) [default: 64 on the CPU, 1/64 of "
                            "the GPU's memory on a GPU].")


class DecompXBase(Method):
    needs = NEEDS
    has_layer_views = True
    tasks = SEQUENCE_HEAD_TASKS  # the propagation runs through the sequence head (both variants)
    op_budget = 1.0  # the decomposition is carried from layer to layer (a step per layer)
    cost_exponent = 2  # [n, n, d] decomposed vectors through every layer
    run_options = (MEMORY_OPTION,)

    @classmethod
    def memory_per_example(cls, shape, params):
        # the feed-forward block at one source token per block: [B, n, 1, d_ff] pre-activations and their product
        return shape.n * 2 * shape.d_ff * shape.itemsize

    def __init__(self, memory_mb: int | None = None, **params):
        super().__init__(memory_mb=memory_mb, **params)

    def check_architecture(self, adapter) -> None:
        super().check_architecture(adapter)
        model = adapter.config.model_type
        if adapter.pre_ln:  # docs/methods.md 6.3
            check_final_norm(adapter, self.name)
            if adapter.block.mlp_maps is None:
                raise AttrscopeError(f"method '{self.name}' does not know the MLP's linear maps of '{model}' models: "
                                     "its block description declares no mlp_maps (compute/adapters/)")
            if not adapter.linear_values:
                raise AttrscopeError(f"method '{self.name}' is not defined for '{model}' models with clip_qkv: the "
                                     "clamp on the values has no linearisation in DecompX")
        elif adapter.ffn_parts(adapter.layers()[0]) is None:
            raise AttrscopeError(f"method '{self.name}' does not know the feed-forward block of '{model}' models")
        if adapter.head_parts() is None:
            raise AttrscopeError(f"method '{self.name}' does not know the head of '{model}' models")

    def propagated(self, cap, adapter):
        self.check_architecture(adapter)
        return propagate(cap, adapter, self.params["memory_mb"])

    def layer_views(self, cap, adapter) -> torch.Tensor:
        """[B, L, n]: ||x^l_{e<-j}||_2 per layer."""
        return torch.linalg.vector_norm(self.propagated(cap, adapter).rows, dim=-1)


class DecompX(DecompXBase):
    name = "decompx"
    description = "DecompX: each token's share of the target logit, propagated through every layer and the head"
    reference = "Modarressi et al. (2023), ACL; docs/methods.md"
    signed = True
    class_specific = True

    def compute(self, cap, adapter, target):
        logits = self.propagated(cap, adapter).logits  # [B, n, C]
        scores = logits.gather(-1, target[:, None, None].expand(-1, logits.shape[1], 1))[..., 0]
        return MethodResult(scores=scores, layer_scores=self.layer_views(cap, adapter))

    def compute_classes(self, cap, adapter, num_classes):
        return self.propagated(cap, adapter).logits.transpose(1, 2)  # every class at once: [B, C, n]
