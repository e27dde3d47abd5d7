"""When a capture of the head-mean attentions streams layer by layer (issue 36): the one rule, read by the capture
(compute.adapters.base) and by the memory model (compute.memory_model), which imports nothing of torch. A module of
its own so that neither imports the other (the memory model reads the method registry, which imports the adapters)."""

from __future__ import annotations

F32 = 4  # the stack the rule weighs is float32 (compute.adapters._stack_and_upcast)


def streams_attention(layers: int, heads: int, batch: int, n: int, budget: int) -> bool:
    """Whether the capture of the head-mean attentions ("attention_mean") takes each layer's mean as the forward
    makes its attention (issue 36), keeping one layer's [B, H, n, n] at a time: where the float32 stack of every
    layer's would exceed the block budget. Below it the layers are stacked and reduced in one operation (a GPU's
    launches; tests/test_op_budget.py)."""
    return layers * batch * heads * n * n * F32 > budget


# float32 [B, n, n] a head of a chunk at once in the head-chunked gradient pass (checkpointed.HeadChunks): the eager
# attention's scores, softmax and A, in the backward dF/dA and the softmax's gradient, the terms' widened copies
CHUNK_COPIES = 6


def heads_per_chunk(heads: int, batch: int, n: int, budget: int) -> int:
    """Heads a chunk of the head-chunked gradient pass: as many as the block budget holds of CHUNK_COPIES float32
    [B, n, n] a head, at least one, at most all (one chunk: the layer's attention at once, as the eager pass)."""
    return max(1, min(heads, budget // (CHUNK_COPIES * batch * n * n * F32)))
