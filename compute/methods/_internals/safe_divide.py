"""The reference's safe_divide (Transformer-Explainability's LRP), shared by Chefer's closed-form rules (relevance.py)
and their decoder form as a modified backward (chefer_decoder_rules.py)."""

from __future__ import annotations

import torch

EPS = 1e-9
INF = float("inf")


def safe_den(b: torch.Tensor, eps: float = EPS, *, inplace: bool = False) -> torch.Tensor:
    """The reference's safe_divide(a, b) as a / safe_den(b): b + eps (eps where that is 0), +inf where b == 0 (so
    that a / den is 0 there, as the reference's mask makes it). Built once per denominator, for all layers at once;
    ``inplace`` overwrites b (a temporary)."""
    zero = b == 0
    den = b.add_(eps) if inplace else b + eps
    den.masked_fill_(den == 0, eps)
    return den.masked_fill_(zero, INF)


def safe_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The reference's safe_divide: a / (b + 1e-9), and 0 where b == 0 (a denominator that rounds to 0, b = -1e-9,
    becomes 1e-9)."""
    return a / safe_den(b)
