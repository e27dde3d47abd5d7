"""Which tensors a piece of code makes: the tests that hold a method to making no tensor of some size (no stack of
every layer's attention, no [H, n, n] in an SDPA pass) record every operation's outputs."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class Made(TorchDispatchMode):
    """``made``: (shape, dtype) of every tensor an operation returns while it is on; ``new_only``: only those in new
    memory (not views of the operation's inputs)."""

    def __init__(self, new_only: bool = False):
        super().__init__()
        self.new_only = new_only
        self.made: list[tuple[tuple[int, ...], torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = ({t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
                  if self.new_only else set())
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.made.append((tuple(t.shape), t.dtype))
        return out

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [s for s, _ in self.made]
