"""A batch cut into length-homogeneous parts for the methods whose cost grows faster than n
(``Method.cost_exponent``): the batch's capture cut to a part's rows and tokens, and the parts' results put back
into tensors of the batch's shape. The rows of a batch come longest first, so a part is a range of rows and its
tokens the first ``n`` columns: the cut is a slice, and padding is masked, so a part's results are those the whole
batch would give."""

from __future__ import annotations

import dataclasses

import torch

from ..adapters import Captured
from ..adapters.base import STACKED

# How each field of a Captured is cut: [B, n] | [B, ...] | lists of [B, n, ...] | lists of [B, H, n, n] | as is
_TOKEN_FIELDS = frozenset({"input_ids", "mask", "special", "sep"})
_ROW_FIELDS = frozenset({"lengths", "explain_pos", "logits", "foil", "kept_row"})
_PAIR_LISTS = frozenset({"attentions", "attention_mean"})  # [B, H, n, n] and [B, n, n]
_TOKEN_LISTS = frozenset(STACKED) - _PAIR_LISTS  # every other captured layer list is [B, n, ...]
_KEPT = frozenset({"passes", "attention_terms", "readout", "kept_matrices"})


def cut_capture(cap: Captured, rows: slice, n: int) -> Captured:
    """``cap`` for the rows ``rows`` and their first ``n`` tokens, as contiguous tensors (methods may view them),
    with an empty memo (the batch's intermediates have the batch's shape) and no model output (the runner drops it
    before the methods run)."""
    out = {}
    for f in dataclasses.fields(cap):
        value = getattr(cap, f.name)
        if f.name in _KEPT:
            out[f.name] = value
        elif f.name in ("memo", "stacks"):  # the batch's intermediates and layer stacks have the batch's shape
            out[f.name] = {}
        elif f.name == "output":
            out[f.name] = None
        elif value is None:
            out[f.name] = None
        elif f.name in _TOKEN_FIELDS:
            out[f.name] = value[rows, :n].contiguous()
        elif f.name in _ROW_FIELDS:
            out[f.name] = value[rows].contiguous()
        elif f.name in _TOKEN_LISTS:
            out[f.name] = [t[rows, :n].contiguous() for t in value]
        elif f.name in _PAIR_LISTS:
            out[f.name] = [t[rows, ..., :n, :n].contiguous() for t in value]
        elif f.name == "inputs":  # the model's [B, n] inputs (a method may run the model again)
            out[f.name] = {k: t[rows, :n].contiguous() for k, t in value.items()}
        else:
            raise TypeError(f"compute/run/parts.py does not know how to cut Captured.{f.name}: add it to a field set")
    return dataclasses.replace(cap, **out)


# The results' shapes: how many trailing token axes each has ([B, n], [B, V, n], [B, L, n, n], [B, C, n], [B])
TOKEN_AXES = {"scores": 1, "layer_scores": 1, "class_scores": 1, "matrices": 2, "value": 0}


def put_back(pieces: list[tuple[slice, torch.Tensor]], batch: int, n: int, axes: int) -> torch.Tensor:
    """One result of every part (``pieces``: the part's rows and its tensor [b, ..., n_p (, n_p)]) as one tensor
    [batch, ..., n (, n)], zero where padding is."""
    first = pieces[0][1]
    shape = (batch, *first.shape[1:first.dim() - axes], *([n] * axes))
    out = first.new_zeros(shape)
    for rows, t in pieces:
        index = (rows, ...) + tuple(slice(0, t.shape[-1]) for _ in range(axes))
        out[index] = t
    return out
