"""Per-head attention in the store (format 1.5, ``attr-compute --heads``): written, read back, resumed, merged, and a
store without it that reads nothing for it."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from synthetic import make_store

from store import StoreError, StoreWriter, merge, open_store
from store import resume as resume_store
from store import schema


@pytest.mark.parametrize("mode", ["cls", "all"])
def test_per_head_attention_round_trips(tmp_path, mode):
    path = str(tmp_path / "h.h5")
    exs = make_store(path, n_examples=7, L=2, heads=mode, H=3)
    with open_store(path) as s:
        assert (s.heads, s.heads_dtype, s.n_heads) == (mode, "float16", 3)
        assert "heads" not in s.model_info
        for i, ex in enumerate(exs):
            got = s[i].heads()
            n = ex.token_ids.shape[0]
            assert got.dtype == np.float32 and got.shape == ((2, 3, n, n) if mode == "all" else (2, 3, n))
            np.testing.assert_array_equal(got, ex.heads.astype(np.float16).astype(np.float32))
            row = ex.heads[:, :, 0] if mode == "all" else ex.heads
            np.testing.assert_array_equal(s[i].head_rows(), row.astype(np.float16).astype(np.float32))
            assert s[i].head_rows().shape == (2, 3, n)


@pytest.mark.parametrize("mode", ["none", "cls", "all"])
def test_one_heads_matrix_reads_that_head_alone(tmp_path, monkeypatch, mode):
    """Example.head_matrix(l, h): heads()[l, h] of a store with every head's full matrix, read as its n x n block
    only; None, reading nothing, in the other stores; a head outside the model is an IndexError."""
    path = str(tmp_path / "h.h5")
    exs = make_store(path, n_examples=4, L=2, heads=mode, H=3)
    with open_store(path) as s:
        reads = []
        read = s._read
        monkeypatch.setattr(s, "_read", lambda name, sel, expect=None: (reads.append((name, expect)),
                                                                        read(name, sel, expect))[1])
        for i, ex in enumerate(exs):
            e = s[i]
            n = e.n_tokens
            for layer in range(2):
                for head in range(3):
                    reads.clear()
                    got = e.head_matrix(layer, head)
                    if mode != "all":
                        assert got is None and reads == []
                        continue
                    assert got.dtype == np.float32 and got.shape == (n, n)
                    np.testing.assert_array_equal(got, ex.heads[layer, head].astype(np.float16).astype(np.float32))
                    assert [r for r in reads if r[0] == schema.HEADS] == [(schema.HEADS, n * n)]
        if mode == "all":
            with pytest.raises(IndexError, match="head L3 H1 out of range: the store has 2 layers x 3 heads"):
                s[0].head_matrix(2, 0)


def test_a_store_without_heads_reads_nothing_for_them(tmp_path, monkeypatch):
    path = str(tmp_path / "plain.h5")
    make_store(path, n_examples=3)
    with open_store(path) as s:
        assert (s.heads, s.heads_dtype) == ("none", None)
        ex = s[1]
        reads = []
        monkeypatch.setattr(s, "_read", lambda *a, **k: reads.append(a))
        assert ex.heads() is None and ex.head_rows() is None and reads == []
    with h5py.File(path, "r", locking=False) as f:
        assert "heads" not in f.attrs and "heads" not in f


def test_the_writer_refuses_heads_of_the_wrong_shape(tmp_path):
    path = str(tmp_path / "h.h5")
    exs = make_store(str(tmp_path / "src.h5"), n_examples=2, L=2, heads="cls", H=3)
    w = StoreWriter.create(path, n_layers=2, n_heads=3, labels={0: "negative", 1: "positive"}, methods=[],
                           provenance={}, heads="cls")
    bad = exs[0]
    bad.results = {}
    bad.heads = bad.heads[:, :2]
    with pytest.raises(ValueError, match=r"per-head attention of shape \(2, 2, \d+\), expected \(2, 3, \d+\)"):
        w.append([bad])
    bad.heads = None
    with pytest.raises(ValueError, match="per-head attention of shape None"):
        w.append([bad])
    w.close()
    with open_store(path) as s:
        assert len(s) == 0


def test_a_heads_attribute_without_its_dataset_is_damage(tmp_path):
    path = str(tmp_path / "h.h5")
    make_store(path, n_examples=2, L=2, heads="cls", H=3)
    with h5py.File(path, "r+", locking=False) as f:
        del f[schema.HEADS]
    with pytest.raises(StoreError, match="per-head attention cannot be read"):
        open_store(path)


@pytest.mark.parametrize("mode", ["cls", "all"])
def test_resume_and_merge_copy_the_heads_bit_for_bit(tmp_path, mode):
    a, b = str(tmp_path / "a.h5"), str(tmp_path / "b.h5")
    exs_a = make_store(a, n_examples=4, L=2, heads=mode, H=3)
    exs_b = make_store(b, n_examples=3, L=2, heads=mode, H=3, seed=5)
    with h5py.File(b, "r+", locking=False) as f:  # shard b's rows come after shard a's
        rows = f[schema.INDEX][()]
        rows["row"] += 10
        f[schema.INDEX][...] = rows
    out = str(tmp_path / "m.h5")
    merge(out, [a, b], {"merged": True})
    with open_store(out) as s:
        assert s.heads == mode and len(s) == 7
        for i, ex in enumerate(exs_a + exs_b):
            np.testing.assert_array_equal(s[i].heads(), ex.heads.astype(np.float16).astype(np.float32))
    w = resume_store(a)  # a resumed store keeps its heads and appends more
    w.append(exs_b[:1])
    w.close(complete=True)
    with open_store(a) as s:
        assert s.heads == mode and len(s) == 5
        for i, ex in enumerate(exs_a + exs_b[:1]):
            np.testing.assert_array_equal(s[i].heads(), ex.heads.astype(np.float16).astype(np.float32))


def test_merge_refuses_shards_with_other_heads(tmp_path):
    a, b = str(tmp_path / "a.h5"), str(tmp_path / "b.h5")
    make_store(a, n_examples=2, L=2, heads="cls", H=4)
    make_store(b, n_examples=2, L=2, H=4)
    with pytest.raises(StoreError, match="differs from .* in its per-head attention"):
        merge(str(tmp_path / "m.h5"), [a, b], {})
