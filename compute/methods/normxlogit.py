"""NormXLogit (Abbasi et al., METHODS.md 7.1): norm_t x LogAt_t, signed. Layer view l = norm x LogAt layer view l.
LogAt's task forms apply (compute.methods.logat), the regression distance with its ranking direction included."""

from __future__ import annotations

from ._internals.base import Method, MethodResult
from .logat import REGRESSION_RANK, LogAt, logat_layers
from .norm import Norm


class NormXLogit(Method):
    name = "normxlogit"
    description = "embedding norm x LogAt (head logit of the target at each token)"
    reference = "Abbasi et al., NormXLogit; METHODS.md 7.1"
    signed = True
    class_specific = True
    needs = frozenset({"hidden_states"})
    has_layer_views = True
    tasks = LogAt.tasks
    run_options = (REGRESSION_RANK,)

    def check_architecture(self, adapter) -> None:
        super().check_architecture(adapter)
        adapter.check_head()  # LogAt's head read per token

    def compute(self, cap, adapter, target):
        norm = Norm().compute(cap, adapter, target).scores  # [B, n]
        layer_scores = norm[:, None] * logat_layers(cap, adapter, target,
                                                    self.params.get("regression_rank", "ascending"))
        return MethodResult(scores=layer_scores[:, -1], layer_scores=layer_scores)

    def compute_classes(self, cap, adapter, num_classes):
        norm = Norm().compute(cap, adapter, None).scores
        return norm[:, None] * LogAt().compute_classes(cap, adapter, num_classes)
