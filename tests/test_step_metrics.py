"""Point 5 of issue 37, the store's side: a generation store keeps each metric's value per generated token (step)
beside the per-example mean, in the store's step order (``step_off``), in the metric record's numbers; readers
(``Store.metric_steps``, ``Example.step_metric``), a record without them (older stores), the checks, the copies
(rewrite / resume, shard merge) and the metrics export. Synthetic stores (tests/generation_stores.py): no model."""

from __future__ import annotations

import csv

import h5py
import numpy as np
import pytest
from cli_results import invoke, ok
from generation_stores import write_generation_store

from compute.export import metrics_path
from store import MetricData, StoreError, add_metrics, open_store, schema
from store.copying import rewrite

STEPS = [3, 6, 0, 3]  # tests/generation_stores.PROMPTS: T per example (the third ended at once)
S = sum(STEPS)


def _steps(seed: float) -> np.ndarray:
    v = (np.arange(S, dtype=np.float64) + seed) / 7.0
    v[[1, 9]] = np.nan  # steps the metric does not define
    return v


def _mean(v: np.ndarray) -> np.ndarray:
    out, a = [], 0
    for T in STEPS:
        part = v[a:a + T]
        out.append(np.nanmean(part) if np.isfinite(part).any() else np.nan)
        a += T
    return np.asarray(out)


def _record(method: str, name: str, seed: float, steps: bool = True) -> MetricData:
    v = _steps(seed)
    return MetricData(method, name, _mean(v), {"metric": name}, {"mean": 0.0}, True, "d",
                      steps=v if steps else None)


@pytest.fixture()
def gen(tmp_path):
    path = tmp_path / "g.h5"
    write_generation_store(path)
    return path


def _assert_steps(path, method, name, want):
    with open_store(path) as s:
        np.testing.assert_array_equal(s.metric_steps(method, name), want.astype(np.float32))
        np.testing.assert_array_equal(s.metric_steps(method, name, 1, 3), want[3:9].astype(np.float32))
        a = 0
        for i, T in enumerate(STEPS):
            got = s[i].step_metric(method, name)
            assert got.shape == (T,) and got.dtype == np.float32
            np.testing.assert_array_equal(got, want[a:a + T].astype(np.float32))
            a += T
        np.testing.assert_array_equal(s.metric_values(method, name), _mean(want).astype(np.float32))
        assert np.isnan(s.metric_values(method, name)[2])  # T = 0: no step, no mean


def test_per_step_values_are_kept_beside_the_mean(gen):
    add_metrics(str(gen), [_record("grad", "comprehensiveness", 0.0), _record("ig", "aopc", 3.0)])
    with open_store(gen) as s:
        assert s.format_version == schema.ENCODING_VERSION == "2.1.0"
        s.check_metric_digest("grad", "comprehensiveness")
        np.testing.assert_array_equal(s.metric_info("grad", "comprehensiveness")["steps"],
                                      _steps(0.0).astype(np.float32))
    _assert_steps(gen, "grad", "comprehensiveness", _steps(0.0))
    _assert_steps(gen, "ig", "aopc", _steps(3.0))
    add_metrics(str(gen), [_record("grad", "comprehensiveness", 5.0)])  # a later record replaces the earlier
    _assert_steps(gen, "grad", "comprehensiveness", _steps(5.0))


def test_a_record_without_steps_reads_as_before(gen):
    """A record written without them (every record before format 2.1) reads its means; its steps are None."""
    add_metrics(str(gen), [_record("grad", "sufficiency", 1.0, steps=False)])
    with h5py.File(gen, "r+") as f:
        f.attrs["encoding-version"] = "2.0.0"
    with open_store(gen) as s:
        assert s.format_version == "2.0.0" and not s.warnings
        assert s.metric_steps("grad", "sufficiency") is None and s.metric_info("grad", "sufficiency")["steps"] is None
        assert s[1].step_metric("grad", "sufficiency") is None
        np.testing.assert_array_equal(s.metric_values("grad", "sufficiency"), _mean(_steps(1.0)).astype(np.float32))
        with pytest.raises(KeyError, match="not in the store"):
            s[0].step_metric("grad", "aopc")


def test_steps_of_the_wrong_length_or_store_write_nothing(gen, tmp_path):
    bad = _record("grad", "aopc", 0.0)
    bad.steps = bad.steps[:-1]
    with pytest.raises(StoreError, match=f"{S - 1} per-step values for the {S} generated tokens"):
        add_metrics(str(gen), [_record("ig", "aopc", 0.0), bad])
    with open_store(gen) as s:
        assert s.metric_methods == []
    from test_export import _store  # a classification store

    plain = tmp_path / "plain.h5"
    _store(plain, n_examples=3, metrics=False)
    with pytest.raises(StoreError, match="not a generation store"):
        add_metrics(str(plain), [MetricData("rollout", "aopc", np.zeros(3), {}, {}, True, steps=np.zeros(3))])
    with open_store(plain) as s:
        assert s.metric_methods == []
        with pytest.raises(ValueError, match="no generated tokens"):
            s.metric_steps("rollout", "aopc")


def test_moved_step_values_are_refused_by_verify(gen):
    add_metrics(str(gen), [_record("grad", "aopc", 0.0)])
    with open_store(gen) as s:
        info = json_text(s, "grad", "aopc")
    with h5py.File(gen, "r+") as f:  # the steps' numbers replaced (each chunk keeps a valid checksum)
        ds = f[schema.METRIC_NUMBERS]
        off = info["steps"]["off"]
        ds[off:off + 2] = ds[off:off + 2][::-1] + 1
    from store import verify

    with open_store(gen) as s:
        with pytest.raises(StoreError, match="metric 'aopc' of 'grad'.*per-step values"):
            s.check_metric_digest("grad", "aopc")
        with pytest.raises(StoreError, match="per-step values"):
            verify(s)


def json_text(s, method, name) -> dict:
    _, row = s._metric(method, name)
    return s._metric_json(row, name)


def test_a_complete_store_checks_their_count(gen):
    add_metrics(str(gen), [_record("grad", "aopc", 0.0)])
    with open_store(gen) as s:
        info = json_text(s, "grad", "aopc")
        _, row = s._metric("grad", "aopc")
        text_off = int(row["text_off"])
    assert info["steps"] == {"off": info["steps"]["off"], "n": S, "digest": info["steps"]["digest"]}
    raw = json_text_bytes(gen, text_off, int(row["text_len"]))
    with h5py.File(gen, "r+") as f:  # the record's step count made wrong, its text the same length
        f[schema.METRIC_TEXT][text_off:text_off + len(raw)] = np.frombuffer(
            raw.replace(f'"n": {S}'.encode(), f'"n": {S - 1}'.encode()), np.uint8)
    with pytest.raises(StoreError, match=f"metric 'aopc' of 'grad'.*{S - 1} per-step values for the {S}"):
        open_store(gen)


def json_text_bytes(path, off, ln) -> bytes:
    with h5py.File(path, "r") as f:
        return bytes(f[schema.METRIC_TEXT][off:off + ln])


def test_a_rewrite_keeps_them(gen):
    """rewrite (an old store's upgrade) and resume of a complete store copy the records through copy_committed."""
    add_metrics(str(gen), [_record("grad", "aopc", 2.0), _record("ig", "aopc", 0.0, steps=False)])
    rewrite(str(gen))
    _assert_steps(gen, "grad", "aopc", _steps(2.0))
    with open_store(gen) as s:
        assert s.metric_steps("ig", "aopc") is None


def test_merged_shards_join_them_in_order(tmp_path):
    """compute.merge's metric join: each shard's steps concatenated in shard order (its examples' order)."""
    from generation_stores import generation_examples

    from compute.merge import _merged_metrics

    exs = generation_examples()
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    write_generation_store(a, exs[:2])
    write_generation_store(b, exs[2:])
    v = _steps(0.0)
    split = STEPS[0] + STEPS[1]
    from compute.metrics import get_metric

    settings = {**get_metric("aopc").settings, "preset": None, "metric": "aopc"}
    for path, part, means in ((a, v[:split], _mean(v)[:2]), (b, v[split:], _mean(v)[2:])):
        add_metrics(str(path), [MetricData("grad", "aopc", means, settings, {}, True, "d", steps=part)])
    merged, dropped = _merged_metrics([{"path": str(a)}, {"path": str(b)}])
    assert not dropped and len(merged) == 1
    np.testing.assert_array_equal(merged[0].steps, v.astype(np.float32))
    np.testing.assert_array_equal(merged[0].values, _mean(v).astype(np.float32))


def _csv(path) -> dict[str, list]:
    with open(path, newline="", encoding="utf-8") as fh:
        header, *body = list(csv.reader(fh))
    return {k: [r[j] for r in body] for j, k in enumerate(header)}


def test_the_metrics_export_has_a_row_per_step(gen, tmp_path):
    """example -> step (-1: the example's mean, then each step with its target) -> method; NaN where a record has no
    per-step values or a method lacks the metric."""
    add_metrics(str(gen), [_record("grad", "comprehensiveness", 0.0), _record("grad", "aopc", 4.0),
                           _record("ig", "aopc", 1.0, steps=False)])
    out = tmp_path / "x.csv"
    ok(invoke("export", gen, "-o", out, "--metrics"))
    got = _csv(metrics_path(str(out)))
    assert list(got) == ["example", "id", "step", "target", "method", "comprehensiveness", "aopc"]
    want = []
    with open_store(gen) as s:
        for ex in s:
            for t in range(-1, ex.n_steps):
                for m in ("grad", "ig"):
                    row = [str(ex.index), ex.id, str(t), "" if t < 0 else ex.generated_tokens[t], m]
                    for name in ("comprehensiveness", "aopc"):
                        if name not in s.metric_names(m):
                            v = np.nan
                        elif t < 0:
                            v = s.metric_values(m, name)[ex.index]
                        else:
                            steps = ex.step_metric(m, name)
                            v = np.nan if steps is None else steps[t]
                        row.append("" if np.isnan(v) else str(np.float32(v)))
                    want.append(row)
    assert [list(r) for r in zip(*got.values())] == want
    assert len(want) == (len(STEPS) + S) * 2
    with open_store(gen) as s:  # the same table through the API, in chunks or whole
        whole = s.metric_table()
        chunks = list(s.iter_metric_tables(chunk=3))
    assert list(whole) == list(got) and len(whole["step"]) == len(want)
    for k in whole:
        joined = np.concatenate([c[k] for c in chunks])
        assert (joined.tolist() == whole[k].tolist() if joined.dtype == object
                else np.array_equal(joined, whole[k], equal_nan=True))
