"""A pass in a wider dtype than the model's (the LRP family's float64) without a wide copy of the model: each
layer's parameters and buffers are cast when the layer's forward starts and put back when it ends, the modules
outside the layers (embeddings, final norm, head) for the pass's forward; the casts the backward keeps (a Linear's
weight, a norm's gain) are kept as their source and cast again when the backward reads them
(``torch.autograd.graph.saved_tensors_hooks``). At most one layer's wide weights are alive at a time, in the forward
and in the backward, besides the modules outside the layers; the numbers are the wide copy's (the same casts, the
same operations)."""

from __future__ import annotations

import weakref
from contextlib import ExitStack, contextmanager, nullcontext

import torch
from ...adapters import Adapter


def cast_weight(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A module's parameter as a rule reads it in the pass's dtype: itself where it has that dtype already."""
    return t if t.dtype == dtype else t.detach().to(dtype)


@contextmanager
def widened(adapter: Adapter, dtype: torch.dtype):
    """The model's forwards inside run in ``dtype`` (its floating parameters and buffers cast as ``Module.to`` casts
    them), layer by layer; a no-op where the model has that dtype. Yields ``layer_cast(layer)``, a context that casts
    one layer while inside (itself a no-op where the layer is cast already): a checkpointed layer's recomputation,
    which runs after this context, calls the layer's forward without its hooks (checkpointed.layer_checkpoints)."""
    model = adapter.model
    if next(model.parameters()).dtype == dtype:
        yield lambda _layer: nullcontext()
        return
    casts: dict[int, tuple] = {}  # id(cast) -> (a weak reference to it, its source)

    def cast(t):
        c = t.detach().to(dtype)
        casts[id(c)] = (weakref.ref(c), t)
        return c

    def swap(modules) -> list:
        swapped = []
        for m in modules:
            for table in (m._parameters, m._buffers):
                for name, t in table.items():
                    if t is not None and t.is_floating_point() and t.dtype != dtype:
                        swapped.append((table, name, t))
                        table[name] = cast(t)
        return swapped

    def put_back(swapped):
        for table, name, t in reversed(swapped):
            table[name] = t

    def pack(t):
        base = t if t._base is None else t._base
        hit = casts.get(id(base))
        if hit is not None and hit[0]() is base:  # a view of a cast (a Linear saves W^T): rebuilt the same way
            return (hit[1], t.shape, t.stride(), t.storage_offset())
        return t

    def unpack(p):
        if isinstance(p, tuple):
            src, shape, stride, offset = p
            return src.detach().to(dtype).as_strided(shape, stride, offset)
        return p

    layers = list(adapter.layers())
    in_layers = {m for layer in layers for m in layer.modules()}
    outside = [m for m in model.modules() if m not in in_layers]
    pending: list[list] = []

    def enter(layer, *_):
        pending.append(swap(layer.modules()))

    def leave(layer, *_):
        put_back(pending.pop())

    @contextmanager
    def layer_cast(layer):
        swapped = swap(layer.modules())
        try:
            yield
        finally:
            put_back(swapped)

    with ExitStack() as stack:
        for layer in layers:
            stack.callback(layer.register_forward_pre_hook(enter).remove)
            stack.callback(layer.register_forward_hook(leave, always_call=True).remove)
        experts = getattr(model.config, "_experts_implementation", None)
        if experts not in (None, "eager"):  # the grouped matmul has no float64 kernel: the eager loop for the pass
            model.set_experts_implementation("eager")
            stack.callback(model.set_experts_implementation, experts)
        swapped = swap(outside)
        stack.callback(put_back, swapped)
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, unpack))
        yield layer_cast
