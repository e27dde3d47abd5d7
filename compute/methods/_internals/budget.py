"""Working memory of one block of a method's work (a stack of layers, a block of source tokens, a chunk of
integrated-gradient rows), sized to the device it runs on.

On the CPU a block is kept near the caches: each operation is cheap, memory traffic is not. On a GPU a block is as
large as is safe: each operation is a kernel launch, and for small blocks the launches, not the bytes, bound the
time. A method's memory option (--memory-mb and the like) sets the budget explicitly on either.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

# A GPU block takes this share of the card's memory (1.2 GB of an 80 GB card): a few blocks of every method of a
# batch fit beside the model and the batch's captured tensors.
GPU_SHARE = 64

# CPU working memory of one stack of layers (the layer-wise products, the capture's choice to stream the head means):
# the projected value vectors and a few attention-sized temporaries stay close to the caches (a GPU takes a share of
# its memory: work_bytes).
CPU_STACK_BYTES = 32 << 20

_gpu_bytes: int | None = None  # ``sized_as_gpu``: blocks sized as on a GPU of this much memory, whatever the device


def work_bytes(device: torch.device, cpu_bytes: int, given_mb: int | None = None, gpu_share: int = GPU_SHARE) -> int:
    """The budget in bytes: ``given_mb`` when set; else ``cpu_bytes`` on the CPU and 1 / ``gpu_share`` of the card's
    memory on a GPU (never less than ``cpu_bytes``)."""
    if given_mb is not None:
        return given_mb << 20
    if _gpu_bytes is not None:
        return max(cpu_bytes, _gpu_bytes // gpu_share)
    if device.type == "cuda":
        return max(cpu_bytes, torch.cuda.get_device_properties(device).total_memory // gpu_share)
    return cpu_bytes


@contextmanager
def sized_as_gpu(total_bytes: int):
    """Every block sized as on a GPU of ``total_bytes`` while inside (benchmarks/op_count.py counts, on the CPU, the
    operations a GPU launches; tests run the GPU's block sizes on CPU tensors)."""
    global _gpu_bytes
    saved, _gpu_bytes = _gpu_bytes, total_bytes
    try:
        yield
    finally:
        _gpu_bytes = saved
