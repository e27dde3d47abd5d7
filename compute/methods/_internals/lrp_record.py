"""What the LRP rules (compute.methods._internals.relevance) need from a forward pass: every Linear's input and
output, recorded by forward hooks during the shared gradient pass (compute.methods._internals.gradients). Its own
module so that the gradient pass and the rules both import it and not each other."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

from ...adapters import Adapter


@dataclass
class LRPRecord:
    """What the rules need from the forward pass: every Linear's input and output, per layer, and the head's."""

    layers: list[dict] = field(default_factory=list)  # per layer: role -> (input, output)
    head: list[tuple] = field(default_factory=list)  # [(input, output)] of the head's dense and classifier


def has_lrp_rules(adapter: Adapter) -> bool:
    """A rule set exists for the family's layers and for the model's head (compute.tasks)."""
    return adapter.lrp_linears(adapter.layers()[0]) is not None and adapter.lrp_head() is not None


@contextmanager
def lrp_hooks(adapter: Adapter, record: LRPRecord):
    """Record every Linear's (input, output) during one forward pass."""
    handles = []

    def keep(slot: dict, role: str):
        def hook(_m, inp, out):
            slot[role] = (inp[0], out)
        return hook

    def keep_head(i: int):
        def hook(_m, inp, out):
            # a head run on every token (a vocabulary decoder: [B, n, V]) keeps its input only: the rules need the
            # output at the explained row, recomputed there (compute.methods._internals.relevance)
            record.head[i] = (inp[0], out if out.dim() == 2 else None)
        return hook

    try:
        for layer in adapter.layers():
            slot: dict = {}
            record.layers.append(slot)
            for role, mod in adapter.lrp_linears(layer).items():
                handles.append(mod.register_forward_hook(keep(slot, role)))
        head = adapter.lrp_head()
        record.head = [None] * len(head)
        for i, mod in enumerate(head):
            handles.append(mod.register_forward_hook(keep_head(i)))
        yield record
    finally:
        for h in handles:
            h.remove()
