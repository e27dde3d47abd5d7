"""Generation stores (task "generate", format 2.0): per example the prompt and its generated tokens, per step the
probabilities and foils, per method a [T, n] array (row t valid before position prompt_len + t) and [T, V, n] layer
views; the digests cover them, a copy keeps them, an older store still reads (numpy and h5py only)."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from generation_stores import L, LABELS, TASK, generation_examples, layouts, write_generation_store
from store import ENCODING_VERSION, ExampleData, MethodLayout, StoreError, StoreWriter, open_store, schema
from store.copying import rewrite
from store.integrity import one_line
from store.verify import verify


def valid(exp: ExampleData) -> np.ndarray:
    n, P = len(exp.token_ids), exp.prompt_len
    return np.arange(n)[None, :] < (P + np.arange(n - P))[:, None]


def masked(a, ok) -> np.ndarray:
    """``a`` as the store keeps it: float32, NaN where ``ok`` ([T, n]) is False."""
    a = np.asarray(a, dtype=np.float32)
    return np.where(ok[:, None, :] if a.ndim == 3 else ok, a, np.float32(np.nan))


def assert_generation_example(got, exp: ExampleData) -> None:
    n, P = len(exp.token_ids), exp.prompt_len
    T = n - P
    assert (got.prompt_len, got.n_steps, got.n_tokens) == (P, T, n)
    assert got.tokens == exp.tokens and got.generated_tokens == exp.tokens[P:]
    np.testing.assert_array_equal(got.generated_ids, exp.token_ids[P:])
    np.testing.assert_array_equal(got.step_probs, np.asarray(exp.step_probs, np.float32))
    np.testing.assert_array_equal(got.step_outputs, np.asarray(exp.step_outputs, np.float32))
    foils = exp.step_foil_tokens
    np.testing.assert_array_equal(got.step_foil_tokens, np.full(T, -1) if foils is None else foils)
    np.testing.assert_array_equal(got.step_foil_probs, np.full(T, np.nan, np.float32) if exp.step_foil_probs is None
                                  else np.asarray(exp.step_foil_probs, np.float32))
    assert got.step_foil_words == ((exp.task_info or {}).get("foils") or [None] * T)
    ok = valid(exp)
    for m in ("attention", "grad", "ig"):
        res = exp.results[m]
        want = masked(res["step_scores"], ok)
        np.testing.assert_array_equal(got.step_scores(m), want)
        assert got.step_scores(m).shape == (T, n) and got.step_scores(m).dtype == np.float32
        for t in range(T):
            np.testing.assert_array_equal(got.scores(m, step=t), want[t])
            assert got.step_position(t) == P + t
            assert np.isfinite(want[t][:P + t]).all() and np.isnan(want[t][P + t:]).all()
        if "step_layer_scores" in res:
            layers = masked(res["step_layer_scores"], ok)
            np.testing.assert_array_equal(got.step_layer_scores(m), layers)
            for t in range(T):
                np.testing.assert_array_equal(got.layer_scores(m, step=t), layers[t])
        else:
            assert got.step_layer_scores(m) is None and (not T or got.layer_scores(m, step=0) is None)
    np.testing.assert_array_equal(got.matrices("attention"), exp.results["attention"]["matrices"].astype(np.float32))
    deltas = np.asarray(exp.results["ig"]["example_values"]["ig_delta"], np.float32)
    np.testing.assert_array_equal(got.step_values("ig")["ig_delta"], deltas)
    assert got.step_values("grad") == {}
    for t in range(T):
        assert got.example_values("ig", step=t) == {"ig_delta": float(deltas[t])}


def test_a_generation_store_round_trips(tmp_path):
    exs = write_generation_store(tmp_path / "g.h5")
    with open_store(tmp_path / "g.h5") as s:
        assert s.format_version == ENCODING_VERSION == "2.1.0" and s.complete and len(s) == len(exs)
        assert s.generation and s.task == TASK and s.task_name == "generate" and s.labels == LABELS
        assert all(s.method_info(m)["steps"] for m in s.methods)
        for i, exp in enumerate(exs):
            assert_generation_example(s[i], exp)
        np.testing.assert_array_equal(s.index_column("n_steps"), [3, 6, 0, 3])
        np.testing.assert_array_equal(s.index_column("step_off"), [0, 3, 9, 9])
        np.testing.assert_array_equal(s.index_column("grid_off"), [0, 21, 87, 87])  # T * n: 3 * 7, 6 * 11, 0
        verify(s)


def test_eos_at_the_first_step_stores_no_steps(tmp_path):
    write_generation_store(tmp_path / "g.h5")
    with open_store(tmp_path / "g.h5") as s:
        ex = s[2]
        assert (ex.n_steps, ex.prompt_len, ex.tokens) == (0, 1, ["Hello"])
        assert ex.step_scores("grad").shape == (0, 1) and ex.step_layer_scores("attention").shape == (0, L, 1)
        assert ex.step_probs.shape == (0,) and ex.generated_tokens == []
        with pytest.raises(IndexError, match="step 0 out of range: example 2 has 0 generated tokens"):
            ex.scores("grad", step=0)


def test_step_arguments_are_checked(tmp_path):
    write_generation_store(tmp_path / "g.h5")
    with open_store(tmp_path / "g.h5") as s:
        with pytest.raises(ValueError, match="generation store: its attributions are per generated token, pass step="):
            s[0].scores("grad")
        with pytest.raises(ValueError, match="pass step="):
            s[0].example_values("ig")
        with pytest.raises(IndexError, match="step 3 out of range"):
            s[0].layer_scores("attention", step=3)
    from synthetic import make_store

    make_store(str(tmp_path / "c.h5"))
    with open_store(tmp_path / "c.h5") as s:
        assert not s.generation and s[0].prompt_len == -1 and s[0].n_steps == 0
        with pytest.raises(ValueError, match="classification store: it has no steps"):
            s[0].scores("rollout", step=0)
        with pytest.raises(ValueError, match="classification store: it has no generated tokens"):
            s[0].step_probs


def test_the_scale_statistics_count_the_valid_cells(tmp_path):
    exs = write_generation_store(tmp_path / "g.h5")
    with open_store(tmp_path / "g.h5") as s:
        stored = s.scale_stats("grad")
        values = np.concatenate([masked(e.results["grad"]["step_scores"], valid(e)).ravel() for e in exs])
        values = values[np.isfinite(values)]
        assert stored["final"].count == values.size == (4 + 5 + 6) + (5 + 6 + 7 + 8 + 9 + 10) + (3 + 4 + 5)
        np.testing.assert_allclose(stored["final"].max_abs, np.abs(values).max(), rtol=1e-7)
        np.testing.assert_allclose(stored["final"].mean, values.astype(np.float64).mean(), rtol=1e-6)
        layer = np.concatenate([masked(e.results["attention"]["step_layer_scores"], valid(e))[:, 1].ravel()
                                for e in exs])
        assert stored is not None and s.scale_stats("attention")["layer 2"].count == np.isfinite(layer).sum()
        assert set(s.scale_stats("attention")) == {"final", "layer 1", "layer 2", "matrix 1", "matrix 2"}
    # the reader's own pass (a store without them) gives the same numbers
    write_generation_store(tmp_path / "open.h5", complete=False)
    with open_store(tmp_path / "open.h5") as s:
        assert s.scale_stats("grad") is None
        got = s.scale_stats("grad", compute=True)
        assert got["final"].count == stored["final"].count and got["final"].max_abs == stored["final"].max_abs


def test_the_digests_cover_the_generation_arrays(tmp_path):
    path = tmp_path / "g.h5"
    write_generation_store(path)
    with h5py.File(path, "r") as f:
        columns = json.loads(f[schema.DIGESTS].attrs["datasets"])
    for p in (schema.STEP_PROBS, schema.STEP_OUTPUT, schema.STEP_FOIL_IDS, schema.STEP_FOIL_PROBS,
              "methods/attention/step_scores", "methods/attention/step_layer_scores", "methods/attention/matrices",
              "methods/grad/step_scores", "methods/ig/step_scores", "methods/ig/example_values/ig_delta"):
        assert p in columns, p
    assert "methods/grad/scores" not in columns and "methods/attention/layer_scores" not in columns
    for dataset, where, read in [
        ("methods/grad/step_scores", 22, lambda ex: ex.step_scores("grad")),  # example 1's first row
        ("methods/attention/step_layer_scores", 3, lambda ex: ex.step_layer_scores("attention")),
        (schema.STEP_PROBS, 4, lambda ex: ex.step_probs),
        ("methods/ig/example_values/ig_delta", 5, lambda ex: ex.step_values("ig")),
    ]:
        bad = tmp_path / f"bad-{dataset.replace('/', '-')}.h5"
        bad.write_bytes(path.read_bytes())
        with h5py.File(bad, "r+") as f:  # rewritten through HDF5: the chunk's checksum is right, only the digest is not
            ds = f[dataset]
            ds[where] = ds[where] + 0.5
        example = 0 if dataset.endswith("step_layer_scores") else 1
        with open_store(bad) as s:
            with pytest.raises(StoreError) as info:
                read(s[example])
            msg = str(info.value)
            assert f"/{dataset}" in msg and f"example {example}'s bytes are not those written for it" in msg, msg
            assert "\n" not in msg
            with pytest.raises(StoreError, match=f"/{dataset}"):
                verify(s)


def test_a_copy_keeps_every_generation_array(tmp_path):
    """resume and merge copy examples through store/copying.py: the rewrite of a generation store is the same."""
    path = tmp_path / "g.h5"
    exs = write_generation_store(path)
    rewrite(str(path))
    with open_store(path) as s:
        assert s.generation and len(s) == len(exs)
        for i, exp in enumerate(exs):
            assert_generation_example(s[i], exp)


def _writer(tmp_path, name="w.h5", methods=None, task=TASK):
    return StoreWriter.create(str(tmp_path / name), n_layers=L, n_heads=2, labels=LABELS,
                              methods=methods or layouts(), provenance={}, task=task)


@pytest.mark.parametrize("change, message", [
    (dict(prompt_len=-1), r"prompt_len \+ n_steps not n_tokens"),
    (dict(prompt_len=9), r"prompt_len \+ n_steps not n_tokens"),
    (dict(step_probs=None), "no step_probs for its 3 generated tokens"),
    (dict(step_probs=np.ones(2)), r"step_probs has shape \(2,\), expected \(3,\)"),
    (dict(step_foil_tokens=np.ones(4)), r"step_foil_tokens has shape \(4,\), expected \(3,\)"),
])
def test_the_writer_refuses_a_generation_example_that_does_not_add_up(tmp_path, change, message):
    w = _writer(tmp_path)
    ex = generation_examples()[0]
    for key, value in change.items():
        setattr(ex, key, value)
    with pytest.raises(ValueError, match=message):
        w.append([ex])
    assert w.n_committed == 0
    w.close()
    with open_store(tmp_path / "w.h5") as s:
        assert len(s) == 0


@pytest.mark.parametrize("method, key, shape", [("grad", "step_scores", (3, 6)), ("attention", "step_layer_scores",
                                                                                  (3, 7, L))])
def test_the_writer_refuses_a_step_array_of_another_shape(tmp_path, method, key, shape):
    w = _writer(tmp_path)
    ex = generation_examples()[0]
    ex.results[method][key] = np.zeros(shape)
    with pytest.raises(ValueError, match=f"method '{method}', example gen0: {key} has shape"):
        w.append([ex])
    w.close()


def test_a_generation_store_keeps_no_class_scores_and_other_stores_no_steps(tmp_path):
    with pytest.raises(StoreError, match="a generation store keeps no class_scores"):
        _writer(tmp_path, methods=[MethodLayout("grad", signed=True, class_scores=True)])
    assert not (tmp_path / "w.h5").exists()
    w = _writer(tmp_path, "c.h5", methods=[MethodLayout("grad", signed=True)], task=None)
    ex = generation_examples()[0]
    ex.results = {"grad": {"scores": np.zeros(len(ex.token_ids))}}
    ex.probs, ex.pred = np.array([0.5, 0.5]), 1
    with pytest.raises(ValueError, match="step fields outside a generation store"):
        w.append([ex])
    w.close()


def test_a_damaged_step_offset_is_refused_in_one_line(tmp_path):
    path = tmp_path / "g.h5"
    write_generation_store(path)
    with h5py.File(path, "r+") as f:
        rows = f[schema.INDEX][()]
        rows["step_off"][1] += 1
        f[schema.INDEX][...] = rows
    with pytest.raises(StoreError) as info:
        with open_store(path) as s:
            s[1].step_probs
    msg = one_line(str(info.value))
    assert "damaged" in msg and "/examples/index" in msg and "\n" not in str(info.value), msg


def test_a_store_of_the_earlier_format_reads_as_before(tmp_path):
    """Format 1.6 (the writer of b3bbb1a, tests/fixtures/store-1.6.h5): read by this reader, no steps."""
    from test_store import FIXTURE_1_6, _fixture_example, assert_example

    with open_store(FIXTURE_1_6) as s:
        assert s.format_version == "1.6.0" and not s.generation and len(s) == 10
        for i in range(10):
            assert_example(s[i], _fixture_example(i))
            assert (s[i].prompt_len, s[i].n_steps) == (-1, 0)
        verify(s)
