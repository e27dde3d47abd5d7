"""norm (NormXLogit paper, METHODS.md 7.1): L2 norm of the embedding-module output hidden_states[0] per token."""

from __future__ import annotations

from ._internals.base import Method, MethodResult


class Norm(Method):
    name = "norm"
    description = "L2 norm of each token's embedding-module output (hidden_states[0])"
    reference = "Abbasi et al., NormXLogit; METHODS.md 7.1"
    needs = frozenset({"hidden_states"})

    def compute(self, cap, adapter, target):
        scores = cap.hidden_states[0].norm(dim=-1) * cap.mask
        return MethodResult(scores=scores)

    def compute_rows(self, cap, adapter, steps, rows):
        return MethodResult(scores=self.compute(cap, adapter, None).scores[steps.example])  # a step's prefix: masked by the runner
