"""Rules on part of a batch: a doubled batch whose first half runs the plain gradient and whose second half runs
the rules' modified backward, so that one forward and one backward give both (transatt and mask_lrp weight the
rules' R^{A,l} by the plain dF/dA: docs/methods.md 8). The halves share every operation of the model's forward and
backward; each rule hook keeps its node's plain backward on the plain rows (``select``, or the factor 1 there:
``scale``, ``where``)."""

from __future__ import annotations

import torch


class _Select(torch.autograd.Function):
    """The rule's value on the rule rows, the plain one on the others (the same numbers: a rule changes only the
    backward); backward: g to the rule's graph on the rule rows, to the plain graph on the others."""

    @staticmethod
    def forward(ctx, plain, rule, rows):
        ctx.rows = rows
        return torch.where(rows, rule, plain)

    @staticmethod
    def backward(ctx, g):
        return torch.where(ctx.rows, 0, g), torch.where(ctx.rows, g, 0), None


class RuleRows:
    """The rows of a doubled batch that the rules apply to: the second half (rows B..2B-1), also where the batch's
    tokens are flattened to [2B n, ...] (a mixture's experts, OPT's MLP): the second half of those rows too."""

    def __init__(self, half: int, device: torch.device):
        self.half = half
        self.device = device
        self._masks: dict[tuple, torch.Tensor] = {}
        self._scales: dict[tuple, torch.Tensor] = {}

    def mask(self, t: torch.Tensor) -> torch.Tensor:
        """The rule rows as a bool [N, 1, ...] that broadcasts against ``t`` [N, ...] (N = 2B, or 2B n)."""
        key = (t.shape[0], t.dim())
        if key not in self._masks:
            n = t.shape[0]
            self._masks[key] = (torch.arange(n, device=self.device) >= n // 2).view(-1, *(1,) * (t.dim() - 1))
        return self._masks[key]

    def select(self, plain: torch.Tensor, rule: torch.Tensor) -> torch.Tensor:
        return _Select.apply(plain, rule, self.mask(plain))

    def scale(self, s, t: torch.Tensor) -> torch.Tensor:
        """A gradient factor ``s`` (a number, or one per column) on the rule rows, 1 on the plain rows, in t's dtype
        (made once per factor: the hooks' factors are the same objects every layer)."""
        key = (s if isinstance(s, float) else id(s), t.dtype, t.shape[0], t.dim())
        if key not in self._scales:
            one = torch.ones((), dtype=t.dtype, device=t.device)
            s_t = torch.as_tensor(s, dtype=t.dtype, device=t.device)
            self._scales[key] = (torch.where(self.mask(t), s_t, one), s)  # keeps s alive: its id is the key
        return self._scales[key][0]


def select(rows: RuleRows | None, plain: torch.Tensor, rule: torch.Tensor) -> torch.Tensor:
    """``rule`` on every row (no plain rows), else the rows' selection."""
    return rule if rows is None else rows.select(plain, rule)


def scale(rows: RuleRows | None, s, t: torch.Tensor):
    return s if rows is None else rows.scale(s, t)
