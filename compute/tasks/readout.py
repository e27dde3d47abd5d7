"""Where a task's explained output is read off the model's forward output (torch only: adapters and the gradient
pass apply it to every forward they run)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Readout:
    """The output vector [R, C] the target indexes: a field of the model's output (``logits``, or a question-answering
    head's ``start_logits`` / ``end_logits``), at the explained position for language-model heads, whose logits are
    [R, n, V] (one vocabulary distribution per token)."""

    field: str = "logits"
    at_position: bool = False

    def __call__(self, out, pos: torch.Tensor) -> torch.Tensor:
        t = getattr(out, self.field)
        if self.at_position:
            t = t[torch.arange(t.shape[0], device=t.device), pos.to(t.device)]
        return t


def explained(logits: torch.Tensor, target: torch.Tensor, foil: torch.Tensor | None) -> torch.Tensor:
    """F per row [R]: the target's entry of ``logits`` [R, C], less the foil's where one is given (foil >= 0): the
    contrastive explanation 'why the target rather than the foil'."""
    out = logits.gather(1, target[:, None])[:, 0]
    if foil is None:
        return out
    has = foil >= 0
    other = logits.gather(1, foil.clamp_min(0)[:, None])[:, 0]
    return out - torch.where(has, other, torch.zeros_like(other))
