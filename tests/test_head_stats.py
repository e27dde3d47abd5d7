"""Mask-LRP head statistics (METHODS.md 6.1, 14.14-15) on hand-made attention patterns."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compute.errors import AttrscopeError
from compute.head_stats import HeadStatistics, align_dependencies, argmax_keys, combine_masks
from compute.parses import RELATIONS, Dependency
from store import HeadMaskData


def attention_to(targets: torch.Tensor) -> list[torch.Tensor]:
    """L tensors [B, H, n, n] whose row i peaks at key targets[b, l, h, i] (targets [B, L, H, n])."""
    L, n = targets.shape[1], targets.shape[-1]
    A = 0.5 * torch.nn.functional.one_hot(targets, n).double() + 0.5 / n
    return [A[:, l] for l in range(L)]


def stats_for(targets: list[list[int]]) -> HeadStatistics:
    """One example, one layer, one head per row of ``targets`` (key index per query)."""
    t = torch.tensor(targets)[None, None]  # [1, 1, H, n]
    st = HeadStatistics(1, t.shape[2])
    st.update(argmax_keys(attention_to(t)), torch.ones(1, t.shape[-1], dtype=torch.bool))
    return st


def test_argmax_keys_shape_and_first_index_on_ties():
    a = torch.zeros(2, 3, 4, 4)
    a[..., 1] = 0.5
    a[..., 3] = 0.5  # tie between keys 1 and 3
    out = argmax_keys([a, a.flip(-1)])
    assert out.shape == (2, 2, 3, 4) and out.dtype == torch.long
    assert (out[:, 0] == 1).all() and (out[:, 1] == 0).all()


def test_positional_heads():
    n = 10
    i = list(range(n))
    prev = [max(k - 1, 0) for k in i]  # offset -1 for 9 of 10 queries (query 0 attends to itself)
    self_ = i  # offset 0 everywhere
    spread = [(3 * k + 1) % n for k in i]  # all offsets different-ish
    edge = [k + 1 for k in range(8)] + [0, 0]  # offset +1 for exactly 8 of 10 queries
    st = stats_for([prev, self_, spread, edge])
    assert st.n_queries == n and st.n_examples == 1
    assert st.counts.sum(axis=2).tolist() == [[n] * 4]

    ref = st.positional_mask(exclude_self=False)  # the reference: offset 0 counts
    assert ref.name == "positional" and ref.mask.dtype == np.uint8
    assert ref.mask.tolist() == [[1, 1, 0, 0]]  # 0.8 is not > 0.8
    assert ref.arrays["argmax_offset"].tolist() == [[-1, 0, ref.arrays["argmax_offset"][0, 2], 1]]
    np.testing.assert_allclose(ref.arrays["freq_max"][0, [0, 1, 3]], [0.9, 1.0, 0.8])
    assert ref.attrs == {"threshold": 0.8, "exclude_self": False, "n_queries": n, "n_examples": 1}

    paper = st.positional_mask()  # the paper (default): offset 0 excluded
    assert paper.mask.tolist() == [[1, 0, 0, 0]]
    assert paper.arrays["freq_max"][0, 1] == 0.0

    assert st.positional_mask(threshold=0.79, exclude_self=False).mask.tolist() == [[1, 1, 0, 1]]
    offs = ref.arrays["offsets"]
    assert offs.tolist() == list(range(offs[0], offs[-1] + 1)) and ref.arrays["counts"].shape == (1, 4, len(offs))


def test_padded_batch_equals_one_by_one():
    g = torch.Generator().manual_seed(0)
    L, H, lengths = 2, 3, [5, 9, 3]
    n = max(lengths)
    mask = torch.tensor([[j < k for j in range(n)] for k in lengths])
    logits = torch.randn(len(lengths), L, H, n, n, generator=g, dtype=torch.float64) * 3
    A = logits.masked_fill(~mask[:, None, None, None, :], float("-inf")).softmax(-1)
    aligned = [[(1, np.eye(k, dtype=bool)[2], 0), (0, np.arange(k) >= k - 2, 3)] for k in lengths]

    batch = HeadStatistics(L, H)
    batch.update(argmax_keys([A[:, l] for l in range(L)]), mask, aligned)
    single = HeadStatistics(L, H)
    for b, k in enumerate(lengths):
        one = A[b:b + 1, :, :, :k, :k]
        single.update(argmax_keys([one[:, l] for l in range(L)]), torch.ones(1, k, dtype=torch.bool), [aligned[b]])

    assert batch.n_queries == single.n_queries == sum(lengths)
    assert batch.n_examples == single.n_examples == 3
    assert batch.offsets.tolist() == single.offsets.tolist()
    np.testing.assert_array_equal(batch.counts, single.counts)
    np.testing.assert_array_equal(batch.hits, single.hits)
    np.testing.assert_array_equal(batch.totals, single.totals)
    assert batch.totals[0, 0].tolist() == [3, 0, 0, 3]


def test_offset_table_grows_across_batches():
    st = HeadStatistics(1, 1)
    for n, shift in [(3, 1), (7, -6), (2, 0), (12, 11)]:
        # every query attends to key (i + shift) clipped into range: offsets grow to both sides
        t = torch.tensor([min(max(i + shift, 0), n - 1) for i in range(n)])[None, None, None]
        st.update(t, torch.ones(1, n, dtype=torch.bool))
    offs = st.offsets
    assert offs[0] == -6 and offs[-1] == 11 and len(offs) == 18
    assert st.counts.sum() == st.n_queries == 3 + 7 + 2 + 12
    assert st.counts[0, 0, offs == 11].item() == 1  # only query 0 of the last batch reaches +11


def test_empty_statistics_raise():
    with pytest.raises(AttrscopeError):
        HeadStatistics(2, 2).positional_mask()


# ------------------------------------------------------------------------------------------------ syntactic

# "small foxes chased dogs": [CLS] small fox ##es cha ##sed dogs [SEP]
TEXT = "small foxes chased dogs"
SPANS = np.array([[-1, -1], [0, 5], [6, 9], [9, 11], [12, 15], [15, 18], [19, 23], [-1, -1]])
SEGMENT = np.array([-1, 0, 0, 0, 0, 0, 0, -1])
SMALL, FOXES, CHASED, DOGS = (0, 5), (6, 11), (12, 18), (19, 23)
DEPS = [Dependency("amod", 0, SMALL, FOXES, -1), Dependency("nsubj", 0, FOXES, CHASED, -1),
        Dependency("obj", 0, DOGS, CHASED, 1)]


def test_align_dependencies_subwords_segments_and_truncation():
    extra = [Dependency("advmod", 1, (0, 4), (5, 9), 1),  # pair segment: no pair tokens here -> dropped
             Dependency("advmod", 0, (24, 31), CHASED, 2)]  # dependent truncated away -> dropped
    out = align_dependencies(DEPS + extra, SPANS, SEGMENT)
    assert [(p, np.flatnonzero(h).tolist(), k) for p, h, k in out] == [
        (1, [2, 3], RELATIONS.index("amod")),  # head word split in two pieces
        (2, [4, 5], RELATIONS.index("nsubj")),  # dependent "foxes": FIRST subword is the query
        (6, [4, 5], RELATIONS.index("obj"))]
    # half-open spans: a word ending where a token starts does not overlap it
    assert align_dependencies([Dependency("amod", 0, (0, 6), (9, 11), -1)], SPANS, SEGMENT)[0][1].tolist() == \
        [False, False, False, True, False, False, False, False]
    # the same character span in the pair segment maps to pair tokens only
    spans2 = np.concatenate([SPANS[:-1], [[0, 4], [5, 9], [-1, -1]]])
    seg2 = np.concatenate([SEGMENT[:-1], [1, 1, -1]])
    (p, h, k), = align_dependencies([Dependency("nsubj", 1, (0, 4), (5, 9), -1)], spans2, seg2)
    assert p == 7 and np.flatnonzero(h).tolist() == [8] and k == 0
    assert align_dependencies([], SPANS, SEGMENT) == []


def syntactic_stats() -> HeadStatistics:
    n = len(SPANS)
    base = list(range(n))  # queries not involved point at themselves
    q_amod, q_nsubj, q_obj = 1, 2, 6
    h0 = base.copy(); h0[q_amod], h0[q_nsubj], h0[q_obj] = 3, 4, 5  # all hits (##es, cha, ##sed)
    h1 = base.copy(); h1[q_amod], h1[q_nsubj], h1[q_obj] = 0, 3, 4  # miss, miss (own piece), hit
    h2 = [0] * n  # everything to [CLS]: all misses
    t = torch.tensor([h0, h1, h2])[None, None]  # [1, 1, 3, n]
    st = HeadStatistics(1, 3)
    st.update(argmax_keys(attention_to(t)), torch.ones(1, n, dtype=torch.bool),
              [align_dependencies(DEPS, SPANS, SEGMENT)])
    return st


def test_syntactic_hits():
    st = syntactic_stats()
    #                        nsubj obj amod advmod
    assert st.hits[0].tolist() == [[1, 1, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]]
    assert st.totals[0].tolist() == [[1, 1, 1, 0]] * 3


def test_syntactic_mask_thresholds():
    st = syntactic_stats()
    # offsets are dependent - head: subjects and adjectives precede their heads (negative offsets)
    dist = {"nsubj": {-1: 6, -2: 4}, "obj": {1: 5, 2: 5}, "amod": {-1: 8, -2: 2}, "advmod": {}}
    m = st.syntactic_mask(dist)
    assert m.name == "syntactic" and m.mask.dtype == np.uint8
    np.testing.assert_allclose(m.arrays["lambda_max"][:3], [0.6, 0.5, 0.8])
    np.testing.assert_allclose(m.arrays["thresholds"][:3], [0.7, 0.6, 0.9])
    assert np.isnan(m.arrays["thresholds"][3]) and np.isnan(m.arrays["rates"][0, 0, 3])
    assert m.mask.tolist() == [[1, 1, 0]]  # head 1: obj rate 1.0 > 0.6
    assert m.attrs["relations"] == list(RELATIONS) and m.attrs["margin"] == 0.1
    assert m.attrs["n_dependencies"] == {"nsubj": 1, "obj": 1, "amod": 1, "advmod": 0}
    assert m.arrays["hits"].dtype == np.int64 and m.arrays["rates"].dtype == np.float32

    # obj's threshold above 1 (one fixed offset always right): head 1 no longer beats it; rate 1.0 > 1.0 is false
    strict = st.syntactic_mask({**dist, "obj": {1: 10}, "nsubj": {-1: 9, -2: 1}})
    assert strict.mask.tolist() == [[1, 0, 0]]  # head 0 still passes through amod (1.0 > 0.9)
    assert st.syntactic_mask({}).mask.tolist() == [[0, 0, 0]]


def test_combine_masks():
    pos = HeadMaskData("positional", np.array([[1, 0], [1, 0]], dtype=np.uint8))
    syn = HeadMaskData("syntactic", np.array([[1, 1], [0, 0]], dtype=np.uint8))
    union = combine_masks(pos, syn)
    assert union.name == "mask_lrp" and union.mask.dtype == np.uint8
    assert union.mask.tolist() == [[1, 1], [1, 0]]
    assert union.attrs == {"how": "union", "sources": ["positional", "syntactic"]}
    assert combine_masks(pos, syn, "sum").mask.tolist() == [[2, 1], [1, 0]]
    with pytest.raises(AttrscopeError):
        combine_masks(pos, syn, "max")
    with pytest.raises(AttrscopeError):
        combine_masks(pos, HeadMaskData("syntactic", np.zeros((3, 2), dtype=np.uint8)))
