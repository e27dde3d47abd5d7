"""Padding token lists into one batch tensor (the main loop's batches and the head-statistics pass share it)."""

from __future__ import annotations

import torch


def _pad(seqs: list[list[int]], value: int, device) -> torch.Tensor:
    n = max(len(s) for s in seqs)
    out = torch.full((len(seqs), n), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out.to(device)
