"""LogAt (NormXLogit paper, METHODS.md 7.1): the model's own head applied to every token's hidden state as if it were
the explained token; the logit of the target (pre-softmax).

Layer view l (l = 1..L) applies the same head to hidden_states[l]; the final score is the view of the last layer.
At the explained position of the last layer this is exactly the model's own logit (METHODS.md 11.9).

Per task (compute.tasks): a classifier's head and class; a masked or causal LM's vocabulary head and target word,
less the foil's logit where one is given (the paper's BLiMP LogAt(Foil) contrast); a regression head's distance
|g(h_t) - g(h_explained)| (METHODS.md 7.1, 14.18), ranked as ``regression_rank`` says: ascending (closer to the
prediction = more important, the default; the score is -distance) or descending (the score is the distance).
"""

from __future__ import annotations

import torch

from ..options import Option
from ._internals.base import Method, MethodResult, Same

REGRESSION_RANK = Option(
    "regression_rank", "ascending", choices=("ascending", "descending"), show_default=True, param="regression_rank",
    resume=True, help="LogAt/NormXLogit under --task regression: rank tokens by |g(h_t) - g(h_explained)| "
                      "ascending (closer to the prediction = more important) or descending (METHODS.md 14.18).")


def head_logits_per_layer(cap, adapter) -> torch.Tensor:
    """[B, L, n, C]: a sequence head on hidden_states[1..L], every layer at once (computed once per batch, shared
    with normxlogit)."""
    return cap.cached("head_logits_per_layer",
                      lambda: adapter.head_per_token(cap.stack("hidden_states")[1:]).transpose(0, 1))


def logat_layers(cap, adapter, target: torch.Tensor, regression_rank: str = "ascending") -> torch.Tensor:
    """[B, L, n]: LogAt of every layer for the batch's task (padding zeroed)."""
    if adapter.task in ("classification", "regression"):
        logits = head_logits_per_layer(cap, adapter)  # [B, L, n, C]
        if adapter.task == "regression":
            g = logits[..., 0]
            b = torch.arange(g.shape[0], device=g.device)
            distance = (g - g[b, :, cap.explain_pos][..., None]).abs()
            scores = -distance if regression_rank == "ascending" else distance
        else:
            idx = target[:, None, None, None].expand(*logits.shape[:3], 1)
            scores = logits.gather(-1, idx).squeeze(-1)
    else:  # language-model heads: the target's (minus the foil's) row of the vocabulary matrix only
        key = ("head_logit_per_layer", Same(target))
        scores = cap.cached(key, lambda: adapter.head_logit(cap.stack("hidden_states")[1:], target,
                                                            cap.foil).transpose(0, 1))
    return scores * cap.mask[:, None]


class LogAt(Method):
    name = "logat"
    description = "the model's head applied to each token's hidden state: logit of the target"
    reference = "Abbasi et al., NormXLogit; METHODS.md 7.1"
    signed = True
    class_specific = True
    needs = frozenset({"hidden_states"})
    has_layer_views = True
    tasks = frozenset({"classification", "regression", "masked-token", "next-token"})  # a head read per token
    run_options = (REGRESSION_RANK,)

    def check_architecture(self, adapter) -> None:
        super().check_architecture(adapter)
        adapter.check_head()  # the task's head read per token: one line where the model's is not known

    def compute(self, cap, adapter, target):
        layer_scores = logat_layers(cap, adapter, target, self.params.get("regression_rank", "ascending"))
        return MethodResult(scores=layer_scores[:, -1], layer_scores=layer_scores)

    def compute_classes(self, cap, adapter, num_classes):
        if adapter.task != "classification":
            return super().compute_classes(cap, adapter, num_classes)
        # The head yields every class at once: [B, n, C] -> [B, C, n].
        return (head_logits_per_layer(cap, adapter)[:, -1] * cap.mask[..., None]).transpose(1, 2)
