"""Every method within its op budget (``Method.op_budget``): ATen ops per batch, each a kernel launch on a GPU, as a
multiple of the bare model pass it needs, at 12 and 24 layers of a BERT-base-wide model (issue 26). A per-layer or
per-head Python loop of small operations grows the count with depth and fails here."""

from __future__ import annotations

import pytest
import torch

from compute.methods import REGISTRY
from op_counting import CountOps, bare_counts, count, method_count, random_batch, random_bert

DEPTHS = (12, 24)


@pytest.fixture(scope="module", params=DEPTHS, ids=lambda L: f"{L}layers")
def model_at_depth(request):
    model, adapter = random_bert(request.param)
    batch = random_batch(2, 24)
    return model, adapter, batch, bare_counts(model, batch)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_method_within_op_budget(model_at_depth, name):
    model, adapter, batch, bare = model_at_depth
    cls = REGISTRY[name]
    ops = method_count(name, model, adapter, batch).total
    base = bare[cls.op_base()].total
    assert ops <= cls.op_budget * base, (
        f"{name}: {ops} ops per batch, {ops / base:.2f}x the bare {cls.op_base()} ({base}); budget {cls.op_budget}x")


def test_counter_counts_forward_and_backward_ops():
    """The counter sees every op of a forward and of its backward (a budget measured with a blind counter passes
    anything)."""
    x = torch.randn(3, 4, requires_grad=True)

    def fwd():
        (x.exp() * 2).sum()

    def fwd_bwd():
        torch.autograd.grad((x.exp() * 2).sum(), x)

    forward = count(fwd).by_op
    assert forward["aten.exp"] == forward["aten.mul"] == forward["aten.sum"] == 1
    backward = count(fwd_bwd).by_op  # the backward's products and the gradient's seed
    assert backward["aten.mul"] == 3 and backward["aten.ones_like"] == 1
    with CountOps() as mode:
        x.view(12)
    assert mode.count.views == 1 and mode.count.total == 1
