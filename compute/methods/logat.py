"""LogAt (NormXLogit paper, METHODS.md 7.1): the model's own classification head applied to every token's hidden
state as if it were the pooled token; the logit of the target class (pre-softmax).

Layer view l (l = 1..L) applies the same head to hidden_states[l]; the final score is the view of the last layer.
At the explained position of the last layer this is exactly the model's own logit (METHODS.md 11.9).
"""

from __future__ import annotations

import torch

from ._internals.base import Method, MethodResult


def head_logits_per_layer(cap, adapter) -> torch.Tensor:
    """[B, L, n, C]: the head on hidden_states[1..L] (computed once per batch, shared with normxlogit)."""
    return cap.cached("head_logits_per_layer",
                      lambda: torch.stack([adapter.head_per_token(h) for h in cap.hidden_states[1:]], dim=1))


class LogAt(Method):
    name = "logat"
    description = "the model's head applied to each token's hidden state: logit of the target class"
    reference = "Abbasi et al., NormXLogit; METHODS.md 7.1"
    signed = True
    class_specific = True
    needs = frozenset({"hidden_states"})
    has_layer_views = True

    def compute(self, cap, adapter, target):
        logits = head_logits_per_layer(cap, adapter)  # [B, L, n, C]
        idx = target[:, None, None, None].expand(*logits.shape[:3], 1)
        layer_scores = logits.gather(-1, idx).squeeze(-1) * cap.mask[:, None]
        return MethodResult(scores=layer_scores[:, -1], layer_scores=layer_scores)

    def compute_classes(self, cap, adapter, num_classes):
        # The head yields every class at once: [B, n, C] -> [B, C, n].
        return (head_logits_per_layer(cap, adapter)[:, -1] * cap.mask[..., None]).transpose(1, 2)
