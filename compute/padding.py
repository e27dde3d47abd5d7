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
    return to_device(out, device)


def to_device(tensor: torch.Tensor, device) -> torch.Tensor:
    """``tensor`` (on the CPU) on ``device``. To a GPU it is copied from pinned (page-locked) memory without blocking
    the host: the copy is queued on the current stream, ahead of the kernels that read it, while Python goes on
    building the next inputs. On the CPU nothing is pinned or copied (pinning there would only cost memory)."""
    if torch.device(device).type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
