"""Padding token lists of different lengths into one batch tensor: the run's batches (compute.run.batches) and the
head-statistics pass (compute.head_pass) share it."""

from __future__ import annotations

import torch


def pad_sequences(seqs: list[list[int]], value: int, device) -> torch.Tensor:
    """[len(seqs), longest] long tensor of the sequences, right-padded with ``value``, on ``device``."""
    n = max(len(s) for s in seqs)
    out = torch.full((len(seqs), n), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out.to(device)
