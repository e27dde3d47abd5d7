"""NormXLogit (Abbasi et al., METHODS.md 7.1): norm_t x LogAt_t, signed. Layer view l = norm x LogAt layer view l."""

from __future__ import annotations

from ._internals.base import Method, MethodResult
from .logat import LogAt
from .norm import Norm


class NormXLogit(Method):
    name = "normxlogit"
    description = "embedding norm x LogAt (head logit of the target class at each token)"
    reference = "Abbasi et al., NormXLogit; METHODS.md 7.1"
    signed = True
    class_specific = True
    needs = frozenset({"hidden_states"})
    has_layer_views = True

    def compute(self, cap, adapter, target):
        norm = Norm().compute(cap, adapter, target).scores  # [B, n]
        logat = LogAt().compute(cap, adapter, target)
        layer_scores = norm[:, None] * logat.layer_scores
        return MethodResult(scores=layer_scores[:, -1], layer_scores=layer_scores)

    def compute_classes(self, cap, adapter, num_classes):
        norm = Norm().compute(cap, adapter, None).scores
        return norm[:, None] * LogAt().compute_classes(cap, adapter, num_classes)
