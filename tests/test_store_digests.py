"""Data bound to its place (issue 34, point 2): two compressed chunks of one dataset swapped in the file each keep
their fletcher32, so HDF5 reads them without complaint; the per-example digests (/examples/digests) refuse them in
verify, on read, in resume and merge, and through attr-tui, eval, --resume and merge on the command line."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from cli_results import invoke, ok, one_line

from store import (ExampleData, MethodLayout, MetricData, StoreError, StoreWriter, add_metrics, merge, open_store,
                   schema, verify)
from store import resume as resume_store

L, H = 2, 2
METHODS = [MethodLayout("rollout", signed=False, n_layer_views=L, matrices="cls", n_matrix_layers=L,
                        params={"store_dtype": "float16"}),
           MethodLayout("normxlogit", signed=True, class_scores=True),
           MethodLayout("ig", signed=True, example_values=("ig_delta",))]


def _noise(rng, shape, dtype) -> np.ndarray:
    """Finite values of random bits: they do not compress, so every full chunk of them has one size."""
    dtype = np.dtype(dtype)
    bits = rng.integers(0, 1 << (8 * dtype.itemsize), size=shape, dtype=f"u{dtype.itemsize}")
    exp = np.array(0x7C00 if dtype.itemsize == 2 else 0x7F800000, dtype=bits.dtype)
    top = np.array(0x4000 if dtype.itemsize == 2 else 0x40000000, dtype=bits.dtype)
    bits[(bits & exp) == exp] &= ~top  # no inf, no NaN
    return bits.view(dtype)


def _examples(n_examples: int, seed: int, first_row: int = 0, heads: str = "all") -> list[ExampleData]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_examples):
        n = int(rng.integers(40, 60))
        toks = ["[CLS]"] + [f"w{j}" for j in rng.integers(0, 500, n - 2)] + ["[SEP]"]
        res = {"rollout": {"scores": _noise(rng, n, "f4"), "layer_scores": _noise(rng, (L, n), "f4"),
                           "matrices": _noise(rng, (L, 1, n), "f2")},
               "normxlogit": {"scores": _noise(rng, n, "f4"), "class_scores": _noise(rng, (2, n), "f4")},
               "ig": {"scores": _noise(rng, n, "f4"), "example_values": {"ig_delta": float(rng.normal())}}}
        row = first_row + i
        out.append(ExampleData(row=row, id=f"ex{row}", text=" ".join(toks[1:-1]), pair=None,
                               token_ids=rng.integers(0, 500, n), tokens=toks, spans=rng.integers(0, 200, (n, 2)),
                               segment=np.zeros(n), label=row % 2, pred=int(rng.integers(0, 2)),
                               probs=np.array([0.3, 0.7]), target=0, explain_pos=0, n_orig_tokens=n, truncated=False,
                               heads=_noise(rng, (L, H, n, n) if heads == "all" else (L, H, n), "f2"),
                               results=res))
    return out


def _make(path, n_examples=400, seed=0, first_row=0, complete=True, heads="all") -> None:
    w = StoreWriter.create(str(path), n_layers=L, n_heads=H, labels={0: "negative", 1: "positive"}, methods=METHODS,
                           provenance={"model": "synthetic"}, heads=heads)
    exs = _examples(n_examples, seed, first_row, heads)
    for lo in range(0, n_examples, 128):
        w.append(exs[lo:lo + 128])
    w.close(complete=complete, summary={"examples": n_examples} if complete else None)


def _full_chunks(ds: h5py.Dataset) -> list:
    """The chunk infos of the dataset's chunks that lie wholly inside its extent."""
    rows = ds.chunks[0]
    infos = [ds.id.get_chunk_info(k) for k in range(ds.id.get_num_chunks())]
    return [c for c in infos if c.chunk_offset[0] + rows <= ds.shape[0]]


def swap_equal_chunks(path, dataset: str) -> tuple[int, int]:
    """Swap the bytes of two compressed chunks of equal size of ``dataset`` in the file, as the issue's tester did.
    Returns the first element of each."""
    with h5py.File(path, "r", locking=False) as f:
        chunks = _full_chunks(f[dataset])
    by_size: dict = {}
    for c in chunks:
        by_size.setdefault(c.size, []).append(c)
    a, b = next(v[:2] for v in by_size.values() if len(v) >= 2)
    with open(path, "r+b") as fh:
        fh.seek(a.byte_offset)
        da = fh.read(a.size)
        fh.seek(b.byte_offset)
        db = fh.read(b.size)
        assert da != db
        fh.seek(a.byte_offset)
        fh.write(db)
        fh.seek(b.byte_offset)
        fh.write(da)
    return a.chunk_offset[0], b.chunk_offset[0]


def swap_chunks(path, dataset: str) -> None:
    """Swap the first two full chunks of ``dataset`` whatever their sizes (raw, filters and checksum as stored)."""
    with h5py.File(path, "r+", locking=False) as f:
        ds = f[dataset]
        a, b = (c.chunk_offset for c in _full_chunks(ds)[:2])
        ma, da = ds.id.read_direct_chunk(a)
        mb, db = ds.id.read_direct_chunk(b)
        assert da != db
        ds.id.write_direct_chunk(a, db, mb)
        ds.id.write_direct_chunk(b, da, ma)


@pytest.fixture(scope="module")
def intact(tmp_path_factory):
    path = tmp_path_factory.mktemp("digests") / "intact.h5"
    _make(path)
    return path


SWAPPED = [schema.HEADS, "methods/rollout/scores", "methods/rollout/layer_scores", "methods/normxlogit/class_scores"]


@pytest.mark.parametrize("dataset", SWAPPED)
def test_equal_chunks_swapped_in_the_file_are_refused_by_verify(intact, tmp_path, dataset):
    path = tmp_path / "swapped.h5"
    shutil.copy(intact, path)
    swap_equal_chunks(path, dataset)
    with open_store(path) as s:
        with pytest.raises(StoreError) as err:
            verify(s)
    msg = str(err.value)
    assert "\n" not in msg and f"/{dataset} cannot be read" in msg and "digest" in msg and str(path) in msg


@pytest.mark.parametrize("dataset", [schema.TOKEN_IDS, schema.TOKEN_STR_OFF, schema.TOKEN_SPANS, schema.STRINGS,
                                     "methods/ig/example_values/ig_delta", "methods/rollout/matrices"])
def test_any_swapped_chunks_of_a_per_example_dataset_are_refused(tmp_path, dataset):
    path = tmp_path / "swapped.h5"
    many = "example_values" in dataset or "matrices" in dataset  # more examples for two full chunks
    _make(path, n_examples=2200 if many else 400, heads="cls" if many else "all")
    swap_chunks(path, dataset)
    with open_store(path) as s:
        with pytest.raises(StoreError, match=f"/{dataset} cannot be read .*digest"):
            verify(s)


def _first_damaged(s, dataset: str) -> int:
    """The first example whose data in ``dataset`` lies in a full chunk other than its own (the swapped ones)."""
    with h5py.File(s.path, "r", locking=False) as f:
        rows = f[dataset].chunks[0]
    for i in range(len(s)):
        r = s.index_rows(i, i + 1)[0]
        start = int(r["sq_off"]) * L * H if dataset == schema.HEADS else int(r["tok_off"])
        if start // rows in (0, 1) and i > 0:
            return i
    raise AssertionError("no example in the first chunks")


def test_an_example_read_from_swapped_chunks_is_refused(intact, tmp_path):
    path = tmp_path / "swapped.h5"
    shutil.copy(intact, path)
    swap_chunks(path, schema.HEADS)
    with open_store(path) as s, open_store(intact) as good:
        i = _first_damaged(s, schema.HEADS)
        with pytest.raises(StoreError, match=f"/{schema.HEADS} cannot be read .*example {i}"):
            s[i].heads()
        np.testing.assert_array_equal(s[i].scores("rollout"), good[i].scores("rollout"))  # its other data reads
        last = len(s) - 1
        np.testing.assert_array_equal(s[last].heads(), good[last].heads())  # far from the swap: as written


def test_resume_and_merge_refuse_swapped_chunks_and_write_digests(intact, tmp_path):
    swapped = tmp_path / "swapped.h5"
    shutil.copy(intact, swapped)
    swap_chunks(swapped, "methods/rollout/scores")
    before = swapped.read_bytes()
    with pytest.raises(StoreError, match="/methods/rollout/scores cannot be read .*digest"):
        resume_store(str(swapped))
    assert swapped.read_bytes() == before and not list(tmp_path.glob("*tmp*"))
    with pytest.raises(StoreError, match="/methods/rollout/scores cannot be read .*digest"):
        merge(str(tmp_path / "m.h5"), [str(swapped)], {"model": "synthetic"})
    assert not (tmp_path / "m.h5").exists() and not list(tmp_path.glob("*tmp*"))
    # what resume and merge write carries digests of its own: a swap there is refused as well
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    _make(a, n_examples=200, seed=1)
    _make(b, n_examples=200, seed=2, first_row=200)
    merged = tmp_path / "merged.h5"
    merge(str(merged), [str(a), str(b)], {"model": "synthetic"})
    resumed = tmp_path / "resumed.h5"
    shutil.copy(intact, resumed)
    resume_store(str(resumed)).close(complete=True)
    for path in (merged, resumed):
        with open_store(path) as s:
            verify(s)
            with h5py.File(path, "r", locking=False) as f:
                assert f[schema.DIGESTS].shape == (len(s), len(json.loads(f[schema.DIGESTS].attrs["datasets"])))
        swap_chunks(path, schema.HEADS)
        with open_store(path) as s, pytest.raises(StoreError, match=f"/{schema.HEADS} cannot be read .*digest"):
            verify(s)


def test_a_store_without_digests_reads_and_verifies(intact, tmp_path):
    """A store of format 1.5 (no /examples/digests) reads as before and verify says nothing."""
    path = tmp_path / "old.h5"
    shutil.copy(intact, path)
    with h5py.File(path, "r+", locking=False) as f:
        del f[schema.DIGESTS]
        f.attrs["encoding-version"] = "1.5.0"
    with open_store(path) as s, open_store(intact) as good:
        verify(s)
        assert s.warnings == []
        for i in (0, len(s) - 1):
            np.testing.assert_array_equal(s[i].heads(), good[i].heads())
            assert s[i].tokens == good[i].tokens and s[i].text == good[i].text


def test_an_older_fixture_verifies_without_digests_and_its_rewrite_has_them(tmp_path):
    from pathlib import Path

    from store.copying import rewrite

    path = tmp_path / "old.h5"
    shutil.copy(Path(__file__).parent / "fixtures" / "store-1.3.h5", path)
    with open_store(path) as s:
        verify(s)
        before = [(ex.id, ex.text, ex.tokens, ex.scores(m).tolist()) for ex in s for m in s.methods]
    rewrite(str(path))
    with open_store(path) as s:
        verify(s)
        assert [(ex.id, ex.text, ex.tokens, ex.scores(m).tolist()) for ex in s for m in s.methods] == before
        assert s.digest_rows(0, len(s)).shape == (len(s), len(s._flats))


def test_swapped_digest_chunks_are_refused(tmp_path):
    path = tmp_path / "d.h5"
    _make(path, n_examples=2200, heads="cls")
    swap_chunks(path, schema.DIGESTS)
    with open_store(path) as s, pytest.raises(StoreError, match="cannot be read .*digest"):
        verify(s)


def test_swapped_chunks_of_metric_numbers_are_refused(intact, tmp_path):
    """A metric record's numbers (written by eval later) carry a digest in its text."""
    path = tmp_path / "m.h5"
    shutil.copy(intact, path)
    rng = np.random.default_rng(3)
    n = 400
    add_metrics(str(path), [MetricData("rollout", name, _noise(rng, n, "f4"), {}, {}, True,
                                       curves=_noise(rng, (n, 12), "f4"), levels=np.tile(np.arange(12), (n, 1)))
                            for name in ("aopc", "lodds")])
    with open_store(path) as s:
        verify(s)
    swap_chunks(path, schema.METRIC_NUMBERS)
    with open_store(path) as s, pytest.raises(StoreError, match="metric 'aopc' of 'rollout' cannot be read .*digest"):
        verify(s)


# ---------------------------------------------------------------------------------------------- the commands
def test_attr_tui_and_eval_refuse_swapped_chunks_in_one_line(intact, tmp_path, monkeypatch):
    import tui.app
    from tui.cli import main as tui_main

    path = tmp_path / "swapped.h5"
    shutil.copy(intact, path)
    swap_equal_chunks(path, schema.HEADS)
    opened = []  # an app that would start on the swapped store: recorded, not run

    class App:
        def run(self):
            opened.append(1)

    monkeypatch.setattr(tui.app, "create_app", lambda *a, **k: App())
    res = CliRunner().invoke(tui_main, [str(path)])
    assert not opened
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 1 and len(lines) == 1 and "Traceback" not in res.output, res.output
    assert lines[0].startswith("attr-tui: error: ") and f"/{schema.HEADS} cannot be read" in lines[0]
    line = one_line(invoke("eval", path, "--metrics", "sufficiency"))
    assert f"/{schema.HEADS} cannot be read" in line and "digest" in line


@pytest.fixture(scope="module")
def runs(tiny_model_dirs, tmp_path_factory):
    """A store and two shard stores of the tiny model with every per-head attention matrix (--heads, all)."""
    root = tmp_path_factory.mktemp("runs")
    data = root / "d.jsonl"
    rng = np.random.default_rng(0)
    words = "the a movie film was is great bad boring fine long short".split()
    data.write_text("".join('{"id": "e%d", "text": "%s", "label": %d}\n'
                            % (i, " ".join(rng.choice(words, 14)), i % 2) for i in range(64)))
    args = [data, "--model", tiny_model_dirs["bert"], "--methods", "rollout", "--matrices", "all", "--heads",
            "--device", "cpu", "-q"]
    ok(invoke(*args, "-o", root / "full.h5"))
    for k in (0, 1):
        ok(invoke(*args, "-o", root / "out.h5", "--shard", f"{k}/2"))
    return args, root


@pytest.mark.usefixtures("one_thread")
def test_resume_and_merge_commands_refuse_swapped_chunks_in_one_line(runs, tmp_path):
    args, root = runs
    full = tmp_path / "full.h5"
    shutil.copy(root / "full.h5", full)
    swap_chunks(full, schema.HEADS)
    before = full.read_bytes()
    line = one_line(invoke(*args, "-o", full, "--resume"))
    assert f"/{schema.HEADS} cannot be read" in line and "digest" in line and str(full) in line
    assert full.read_bytes() == before
    shards = [tmp_path / f"out.shard-{k}-of-2.h5" for k in (0, 1)]
    for k, p in enumerate(shards):
        shutil.copy(root / p.name, p)
    swap_chunks(shards[0], schema.HEADS)
    line = one_line(invoke("merge", tmp_path / "merged.h5", *shards))
    assert f"/{schema.HEADS} cannot be read" in line and "digest" in line and str(shards[0]) in line
    assert not (tmp_path / "merged.h5").exists()
