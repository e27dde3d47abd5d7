"""The checkpointed gradient pass of the methods that read the attention (issue 36, grads24): attcat, grads,
attgrads and gae. Their layers' attention runs a chunk of heads at a time in the forward, in the recomputation and in
the backward, and each chunk's A and dF/dA are reduced to what the methods keep (AttentionTerm.heads) before the next
chunk is made: no tensor of the batch's [B, H, n, n] is made. The numbers are the eager recomputation's (the path a
model without the attention interface keeps) to 1e-10 of scale, in float64."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_batch_invariant, captured_tiny
from tensors_made import Made

from compute.methods import get_method
from compute.methods._internals import budget, checkpointed as ck
from test_gradient_checkpointing import checkpointed, the_pass

ATTENTION = [("attcat", {}), ("attcat", {"layers": "outputs"}), ("grads", {}), ("attgrads", {}),
             ("attgrads", {"variant": "gradsam"}), ("gae", {})]


def declared(cap, methods):
    """A copy with its own memo, declaring passes and the methods' attention terms as the runner does."""
    terms = frozenset().union(*(m.attention_terms for m in methods))
    return type(cap)(**{**cap.__dict__, "memo": {}, "stacks": {}, "passes": frozenset({"forward", "backward"}),
                        "attention_terms": terms})


def stored(m, cap, ad, target) -> dict:
    with torch.no_grad():
        res = m.compute(cap, ad, target)
    return {f: getattr(res, f) for f in ("scores", "layer_scores", "matrices") if getattr(res, f) is not None}


def one_head_a_chunk(monkeypatch):
    monkeypatch.setattr(budget, "CPU_STACK_BYTES", 1)  # the block budget: one head a chunk


@pytest.mark.parametrize("arch", ["llama", "gpt2", "bert"])
@pytest.mark.parametrize("chunk", ["one head", "all heads"])
def test_head_chunks_give_the_eager_recomputations_numbers(arch, chunk, monkeypatch):
    """A padded float64 batch: every value each method stores, head-chunked against the eager recomputation (the
    path of a model class without the attention interface: _supports_attention_backend False)."""
    _, ad, _, cap = captured_tiny(arch)
    target = cap.logits.argmax(-1)
    checkpointed(monkeypatch)
    if chunk == "one head":
        one_head_a_chunk(monkeypatch)
    for name, params in ATTENTION:
        with monkeypatch.context() as mp:
            mp.setattr(type(ad.model), "_supports_attention_backend", False)
            m = get_method(name, **params)
            c = declared(cap, [m])
            eager = stored(m, c, ad, target)
            assert the_pass(c).checkpointed and the_pass(c).heads is None
        m = get_method(name, **params)
        c = declared(cap, [m])
        chunked = stored(m, c, ad, target)
        gp = the_pass(c)
        assert gp.checkpointed and gp.heads == (1 if chunk == "one head" else ad.n_heads)
        assert ad.model.config._attn_implementation == "eager"  # set back after the pass
        assert eager.keys() == chunked.keys()
        for k, x in eager.items():
            scale = float(x.abs().max()) or 1.0
            torch.testing.assert_close(chunked[k], x, rtol=0, atol=1e-10 * scale, msg=f"{name} {params} {k}")


@pytest.mark.parametrize("arch", ["llama", "gpt2", "bert"])
def test_no_tensor_of_every_heads_attention_with_a_small_chunk_budget(arch, monkeypatch):
    """With one head a chunk, neither the forward, the recomputations nor the backward makes a tensor of the
    batch's [B, H, n, n] (nor any [.., H, n, n]): only one head's [B, 1, n, n] (and the mask's) at a time."""
    checkpointed(monkeypatch)
    one_head_a_chunk(monkeypatch)
    _, ad, _, cap = captured_tiny(arch, lengths=(9, 12))
    B, n = cap.input_ids.shape
    H, L = ad.n_heads, ad.n_layers
    assert H > 1 and len({B, H, L}) == 3  # no shape of one read as another's
    ms = [get_method(name, **params) for name, params in ATTENTION]
    c = declared(cap, ms)
    with Made() as rec:
        for m in ms:
            stored(m, c, ad, cap.pred)
    heads = [s for s in rec.shapes if len(s) >= 3 and s[-2:] == (n, n) and s[-3] == H]
    assert heads == []
    # of the [B, k, n, n] made, one head's (and the mask's) and gae's stored matrices [B, L, n, n] only
    assert {s[1] for s in rec.shapes if len(s) == 4 and s[0] == B and s[-2:] == (n, n)} <= {1, L}
    assert (B, 1, n, n) in rec.shapes  # one head's attention (the check sees the chunks)
    assert the_pass(c).heads == 1


@pytest.mark.parametrize("arch", ["bert", "llama"])
@pytest.mark.parametrize("name", ["attcat", "grads", "attgrads", "gae"])
def test_head_chunked_pass_is_batch_invariant(arch, name, monkeypatch):
    """One example alone equals its row of the padded batch, one head a chunk."""
    checkpointed(monkeypatch)
    one_head_a_chunk(monkeypatch)
    assert_batch_invariant(arch, name, declared=True)


def test_heads_per_chunk_follow_the_block_budget():
    """As many heads as the block budget holds of a chunk's copies (ck.CHUNK_COPIES float32 [B, n, n] a head),
    at least one, at most all."""
    per_head = ck.CHUNK_COPIES * 2 * 100 * 100 * 4
    assert ck.heads_per_chunk(8, 2, 100, 3 * per_head) == 3
    assert ck.heads_per_chunk(8, 2, 100, 3 * per_head - 1) == 2
    assert ck.heads_per_chunk(8, 2, 100, 1) == 1
    assert ck.heads_per_chunk(8, 2, 100, 100 * per_head) == 8
