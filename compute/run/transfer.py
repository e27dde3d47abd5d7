"""A batch's results on their way to the host. On a GPU each tensor is copied, without blocking, into one pinned host
buffer behind the batch's kernels, and the host waits once, when the store needs the results, by which time the
runner has queued the next batch's kernels; on the CPU the tensors are read as they are. The seconds of the batch's
stages come the same way: from events queued with the kernels on a GPU, read after the wait, never in between."""

from __future__ import annotations

import time
from collections.abc import Hashable

import numpy as np
import torch

_ALIGN = 64  # bytes: every tensor's place in the host buffer starts on a cache line


class Stopwatch:
    """The seconds of a batch's stages (the forward pass, each method), read once the batch is done."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._spans: list[tuple[str, object, object]] = []

    def now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def span(self, stage: str, start) -> None:
        self._spans.append((stage, start, self.now()))

    def seconds(self) -> dict[str, float]:
        """Seconds per stage (summed over its spans); on a GPU only after the batch's last event has completed."""
        out: dict[str, float] = {}
        for stage, a, b in self._spans:
            out[stage] = out.get(stage, 0.0) + (a.elapsed_time(b) / 1e3 if self.cuda else b - a)
        return out


class HostCopy:
    """Tensors copied to the host: ``arrays()`` gives them as numpy arrays, waiting for the copies only then."""

    def __init__(self, tensors: dict[Hashable, torch.Tensor], device: torch.device):
        tensors = {k: t.detach() for k, t in tensors.items()}
        if device.type != "cuda":
            self._arrays = {k: t.numpy() for k, t in tensors.items()}
            self._event = None
            return
        places, end = {}, 0
        for k, t in tensors.items():
            places[k] = (end, t.dtype, tuple(t.shape))
            end += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
        buffer = torch.empty(max(end, 1), dtype=torch.uint8, pin_memory=True)
        for k, t in tensors.items():
            start, dtype, shape = places[k]
            nbytes = t.numel() * t.element_size()
            buffer[start:start + nbytes].view(dtype).view(shape).copy_(t, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()  # the device tensors may be freed now: later kernels on this stream come after the copy
        self._buffer, self._places = buffer, places
        self._arrays = None

    def arrays(self) -> dict[Hashable, np.ndarray]:
        if self._arrays is None:
            self._event.synchronize()
            # out of the pinned buffer (page-locked memory is scarce; the arrays live until their window is written)
            host = self._buffer.numpy().copy()
            self._arrays = {k: _view(host, start, dtype, shape) for k, (start, dtype, shape) in self._places.items()}
            self._buffer = None
        return self._arrays


def _view(host: np.ndarray, start: int, dtype: torch.dtype, shape: tuple[int, ...]) -> np.ndarray:
    np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
    count = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(host, dtype=np_dtype, count=count, offset=start).reshape(shape)
