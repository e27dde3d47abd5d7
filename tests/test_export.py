"""``attr-compute export``: every value of the exported rows against the store (read through the Example API, not
the table code), chunking, Parquet and CSV, the metrics file, and the one-line errors that leave no file behind."""

from __future__ import annotations

import csv
import os
import sys

import numpy as np
import pytest
from cli_results import invoke, ok, one_line

from compute.export import metrics_path
from store import ExampleData, MethodLayout, MetricData, StoreWriter, add_metrics, open_store

pq = pytest.importorskip("pyarrow.parquet")

L = 3
# Tokens a CSV writer must quote, and text outside ASCII.
WORDS = ["the", "a,b", 'say "hi"', "x\ny", "tédious", "🎬", "", "long"]
FIXED = ["example", "id", "position", "token", "label", "pred", "method", "score"]


def _store(path, n_examples=11, metrics=True):
    rng = np.random.default_rng(7)
    layouts = [MethodLayout("rollout", signed=False, n_layer_views=L, description="rollout"),
               MethodLayout("logat", signed=True, n_layer_views=L - 1, description="logat"),
               MethodLayout("norm", signed=False, description="norm")]
    w = StoreWriter.create(str(path), n_layers=L, n_heads=2, labels={0: "neg", 1: "pos"}, methods=layouts,
                           provenance={"model": "synthetic"}, attrs={"model_id": "synthetic"})
    exs = []
    for i in range(n_examples):
        n = int(rng.integers(2, 9))
        toks = ["[CLS]"] + [WORDS[j] for j in rng.integers(0, len(WORDS), n - 2)] + ["[SEP]"]
        res = {"rollout": {"scores": rng.random(n), "layer_scores": rng.random((L, n))},
               "logat": {"scores": rng.normal(size=n), "layer_scores": rng.normal(size=(L - 1, n))},
               "norm": {"scores": rng.random(n)}}
        exs.append(ExampleData(row=i, id=f"ex,{i}", text=" ".join(toks), pair=None, token_ids=np.arange(n),
                               tokens=toks, spans=np.full((n, 2), -1), segment=np.zeros(n), label=-1 if i % 4 == 3
                               else int(rng.integers(0, 2)), pred=int(rng.integers(0, 2)), probs=np.array([0.4, 0.6]),
                               target=0, explain_pos=0, n_orig_tokens=n, truncated=False, results=res))
    w.append(exs[:4])
    w.append(exs[4:])
    w.close(complete=True)
    if metrics:  # rollout has two metrics, logat one of them, norm none: the table fills NaN
        add_metrics(str(path), [
            MetricData("rollout", "aopc@attcat", rng.normal(size=n_examples), {}, {}, True, "aopc"),
            MetricData("rollout", "comprehensiveness", np.where(np.arange(n_examples) == 2, np.nan,
                                                                rng.random(n_examples)), {}, {}, True, "comp"),
            MetricData("logat", "comprehensiveness", rng.random(n_examples), {}, {}, True, "comp")])
    return path


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    return _store(tmp_path_factory.mktemp("export") / "s.h5")


def _cli(*args):
    return invoke("export", *args)


def _read(path) -> dict[str, list]:
    """The file's columns as lists: Parquet as stored, CSV parsed as a researcher would (empty cell = NaN)."""
    if str(path).endswith(".parquet"):
        return pq.read_table(path).to_pydict()
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    header, body = rows[0], rows[1:]
    cols = {k: [r[j] for r in body] for j, k in enumerate(header)}
    for k in cols:
        if k in ("example", "position", "label", "pred"):
            cols[k] = [int(x) for x in cols[k]]
        elif k not in ("id", "token", "method"):
            cols[k] = [float(x) if x else float("nan") for x in cols[k]]
    return cols


def _expected_tokens(path, methods, layers):
    """The token table built from the Example API: example -> method -> position."""
    rows = []
    with open_store(path) as s:
        V = max(int(s.method_info(m)["n_layer_views"]) for m in methods) if layers else 0
        for ex in s:
            for m in methods:
                views = ex.layer_scores(m)
                for p, tok in enumerate(ex.tokens):
                    row = {"example": ex.index, "id": ex.id, "position": p, "token": tok,
                           "label": -1 if ex.label is None else ex.label, "pred": ex.pred, "method": m,
                           "score": ex.scores(m)[p]}
                    for v in range(V):
                        row[f"layer_{v + 1}"] = views[v, p] if views is not None and v < len(views) else np.nan
                    rows.append(row)
    return rows


def _assert_rows(got: dict, want: list[dict]):
    assert list(got) == list(want[0])
    assert len(got["score"]) == len(want)
    for k in got:
        exp = [r[k] for r in want]
        if k in ("score",) or k.startswith("layer_") or k not in FIXED:
            # float32 in the store: the file holds the same float32 value (CSV: its shortest exact digits)
            np.testing.assert_array_equal(np.asarray(got[k], dtype=np.float32), np.asarray(exp, dtype=np.float32),
                                          err_msg=k)
        else:
            assert got[k] == exp, k


@pytest.mark.parametrize("ext", ["parquet", "csv"])
@pytest.mark.parametrize("layers", [False, True])
def test_token_rows_equal_the_store(store_path, tmp_path, ext, layers):
    out = tmp_path / f"t.{ext}"
    r = _cli(store_path, "-o", out, "--chunk-size", 3, *(["--layers"] if layers else []))
    ok(r)
    got = _read(out)
    _assert_rows(got, _expected_tokens(store_path, ["rollout", "logat", "norm"], layers))
    assert ("layer_3" in got) == layers and "layer_4" not in got
    if layers:  # logat has 2 views: its layer_3 is NaN, norm's are all NaN
        at = [k for k, m in enumerate(got["method"]) if m == "logat"]
        assert np.isnan(np.asarray(got["layer_3"])[at]).all() and not np.isnan(np.asarray(got["layer_2"])[at]).any()
    assert f"{out}: {len(got['score'])} rows from 11 examples" in r.output
    assert sorted(os.listdir(tmp_path)) == [f"t.{ext}"]  # no temporary file left


@pytest.mark.parametrize("ext", ["parquet", "csv"])
def test_chunk_size_does_not_change_the_file(store_path, tmp_path, ext, monkeypatch):
    monkeypatch.setattr("compute.export.CSV_BLOCK", 7)  # CSV text formatted in blocks inside a chunk too

    def export(chunk):
        out = tmp_path / f"c{chunk}.{ext}"
        assert _cli(store_path, "-o", out, "--layers", "--metrics", "--chunk-size", chunk).exit_code == 0
        return _read(out), _read(metrics_path(str(out)))

    one = export(10_000)
    for chunk in (1, 4):
        got = export(chunk)
        for a, b in zip(got, one):
            assert list(a) == list(b)
            for k in a:
                np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)
    if ext == "parquet":  # one row group per chunk: the file really was written in pieces
        assert pq.ParquetFile(tmp_path / "c4.parquet").num_row_groups == 3
        assert pq.ParquetFile(tmp_path / "c10000.parquet").num_row_groups == 1


@pytest.mark.parametrize("ext", ["parquet", "csv"])
def test_methods_choose_and_order_the_rows(store_path, tmp_path, ext):
    out = tmp_path / f"m.{ext}"
    r = _cli(store_path, "-o", out, "--methods", "norm,rollout", "--layers", "--chunk-size", 5)
    ok(r)
    _assert_rows(_read(out), _expected_tokens(store_path, ["norm", "rollout"], True))


@pytest.mark.parametrize("ext", ["parquet", "csv"])
def test_metrics_file_has_one_row_per_example_and_method(store_path, tmp_path, ext):
    out = tmp_path / f"x.{ext}"
    r = _cli(store_path, "-o", out, "--metrics", "--chunk-size", 2)
    ok(r)
    mpath = tmp_path / f"x.metrics.{ext}"
    assert metrics_path(str(out)) == str(mpath) and mpath.exists()
    got = _read(mpath)
    assert list(got) == ["example", "id", "method", "aopc@attcat", "comprehensiveness"]
    with open_store(store_path) as s:
        methods = ["rollout", "logat"]  # norm has no metrics: no rows
        assert got["method"] == methods * len(s)
        assert got["example"] == [i for i in range(len(s)) for _ in methods]
        assert got["id"] == [s[i].id for i in range(len(s)) for _ in methods]
        for name in ("aopc@attcat", "comprehensiveness"):
            want = np.stack([s.metric_values(m, name) if name in s.metric_names(m) else np.full(len(s), np.nan)
                             for m in methods], axis=1).reshape(-1)
            np.testing.assert_array_equal(np.asarray(got[name], dtype=np.float32), want.astype(np.float32), name)
        assert np.isnan(got["aopc@attcat"][1]) and np.isnan(got["comprehensiveness"][4])  # logat; rollout's NaN


def test_the_default_chunk_follows_a_row_budget(store_path, tmp_path, monkeypatch):
    monkeypatch.setattr("compute.export.CHUNK_ROWS", 40)
    with open_store(store_path) as s:
        tokens = sum(ex.n_tokens for ex in s)
    per_chunk = max(1, 40 * 11 // (tokens * 2))  # two methods, 11 examples
    assert _cli(store_path, "-o", tmp_path / "d.parquet", "--methods", "norm,logat").exit_code == 0
    assert pq.ParquetFile(tmp_path / "d.parquet").num_row_groups == -(-11 // per_chunk) > 1
    _assert_rows(_read(tmp_path / "d.parquet"), _expected_tokens(store_path, ["norm", "logat"], False))


def test_an_empty_store_exports_the_header(tmp_path):
    path = tmp_path / "e.h5"
    w = StoreWriter.create(str(path), n_layers=L, n_heads=2, labels={0: "neg", 1: "pos"},
                           methods=[MethodLayout("rollout", signed=False, n_layer_views=L, description="r")],
                           provenance={}, attrs={"model_id": "synthetic"})
    w.close(complete=True)
    for ext in ("parquet", "csv"):
        out = tmp_path / f"e.{ext}"
        assert _cli(path, "-o", out, "--layers").exit_code == 0
        assert list(_read(out)) == FIXED + ["layer_1", "layer_2", "layer_3"]
    t = pq.read_table(tmp_path / "e.parquet")
    assert t.num_rows == 0 and str(t.schema.field("score").type) == "float"


def _one_line_error(r, code, *words):
    line = one_line(r, code)
    assert all(w in line for w in words), line


def test_bad_input_is_one_line_and_writes_nothing(store_path, tmp_path):
    out = tmp_path / "o.parquet"
    _one_line_error(_cli(tmp_path / "missing.h5", "-o", out), 1, "not found")
    _one_line_error(_cli(store_path, "-o", tmp_path / "o.xlsx"), 2, "FILE.parquet or FILE.csv")
    _one_line_error(_cli(store_path, "-o", out, "--methods", "rollout,nope"), 2, "'nope'", "rollout, logat, norm")
    _one_line_error(_cli(store_path, "-o", out, "--methods", "norm", "--layers"), 1, "no layer views",
                    "leave out --layers")
    _one_line_error(_cli(store_path, "-o", out, "--methods", "norm", "--metrics"), 1, "no metrics",
                    "attr-compute eval")
    _one_line_error(_cli(store_path, "-o", tmp_path / "no" / "dir.csv"), 1, "does not exist")
    _one_line_error(_cli(store_path, "-o", out, "--chunk-size", 0), 2, "--chunk-size")
    damaged = tmp_path / "damaged.h5"
    damaged.write_bytes(store_path.read_bytes()[:4096])
    _one_line_error(_cli(damaged, "-o", out), 1, "damaged.h5")
    not_a_store = tmp_path / "plain.h5"
    not_a_store.write_text("hello")
    _one_line_error(_cli(not_a_store, "-o", out), 1, "plain.h5")
    assert sorted(os.listdir(tmp_path)) == ["damaged.h5", "plain.h5"]


def test_parquet_without_pyarrow_names_the_install(store_path, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    _one_line_error(_cli(store_path, "-o", tmp_path / "o.parquet"), 1, "pip install 'attrscope[parquet]'")
    assert _cli(store_path, "-o", tmp_path / "o.csv").exit_code == 0  # CSV needs no pyarrow
    assert sorted(os.listdir(tmp_path)) == ["o.csv"]


@pytest.mark.parametrize("ext", ["parquet", "csv"])
def test_a_failure_midway_leaves_no_file_and_keeps_the_old_one(store_path, tmp_path, monkeypatch, ext):
    from store import StoreError
    from store.reader import Store

    out = tmp_path / f"f.{ext}"
    out.write_text("previous export")
    real = Store.token_table
    calls = []

    def failing(self, *a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise StoreError(f"store '{self.path}' is damaged: /methods/rollout/scores: simulated")
        return real(self, *a, **k)

    monkeypatch.setattr(Store, "token_table", failing)
    _one_line_error(_cli(store_path, "-o", out, "--chunk-size", 2), 1, "simulated")
    assert len(calls) == 3  # two chunks were written before the failure
    assert out.read_text() == "previous export" and sorted(os.listdir(tmp_path)) == [f"f.{ext}"]


def test_sigterm_stops_at_the_next_chunk_and_leaves_nothing(store_path, tmp_path, monkeypatch):
    import signal

    from store.reader import Store

    real = Store.token_table
    calls = []

    def terminated(self, *a, **k):  # SIGTERM arrives while the second chunk is read
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, *a, **k)

    monkeypatch.setattr(Store, "token_table", terminated)
    _one_line_error(_cli(store_path, "-o", tmp_path / "s.parquet", "--chunk-size", 2), 130, "interrupted",
                    "run the same command again")
    assert len(calls) == 2 and os.listdir(tmp_path) == []


def _killed_export_part(target) -> str:
    """The part file an export SIGKILLed while writing ``target`` leaves (a child process, killed for real)."""
    import signal
    import subprocess

    code = ("import os, signal, sys; from compute.export import _temp_beside; "
            "print(_temp_beside(sys.argv[1]), flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    done = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == -signal.SIGKILL, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("ext", ["parquet", "csv"])
def test_a_later_export_removes_the_parts_killed_exports_left(store_path, tmp_path, ext):
    """Only the stale parts of this export's own targets go: a live writer's part and another target's stay."""
    out = tmp_path / f"x.{ext}"
    stale = [_killed_export_part(out), _killed_export_part(metrics_path(str(out)))]
    other = _killed_export_part(tmp_path / f"other.{ext}")
    from compute.export import _temp_beside

    live = tmp_path / os.path.basename(_temp_beside(str(out)))  # this process's: its writer is alive
    assert all(os.path.exists(p) for p in stale)
    ok(_cli(store_path, "-o", out, "--metrics"))
    assert sorted(os.listdir(tmp_path)) == sorted([f"x.{ext}", f"x.metrics.{ext}", os.path.basename(other),
                                                   live.name])


def test_a_store_whose_index_was_shortened_is_refused_not_exported_short(store_path, tmp_path):
    import h5py

    cut = tmp_path / "cut.h5"
    cut.write_bytes(store_path.read_bytes())
    with h5py.File(cut, "r+", locking=False) as f:  # still marked complete
        f["examples/index"].resize((5,))
    _one_line_error(_cli(cut, "-o", tmp_path / "o.csv"), 1, "cut.h5' is damaged", "the 5 committed examples")
    _one_line_error(invoke("report", cut), 1, "cut.h5' is damaged")
    assert os.listdir(tmp_path) == ["cut.h5"]


def test_a_store_without_methods_is_one_line_for_export_and_eval(tmp_path):
    """Not exit 0 with '0 rows' or '1 x 0 methods'."""
    path = tmp_path / "none.h5"
    w = StoreWriter.create(str(path), n_layers=L, n_heads=2, labels={0: "neg", 1: "pos"}, methods=[],
                           provenance={}, attrs={"model_id": "synthetic"})
    w.append([ExampleData(row=0, id="a", text="a", pair=None, token_ids=np.arange(3), tokens=["[CLS]", "a", "[SEP]"],
                          spans=np.full((3, 2), -1), segment=np.zeros(3), label=1, pred=1, probs=np.array([0.2, 0.8]),
                          target=1, explain_pos=0, n_orig_tokens=3, truncated=False, results={})])
    w.close(complete=True)
    for args in (("export", path, "-o", tmp_path / "o.csv"), ("eval", path, "--metrics", "comprehensiveness")):
        _one_line_error(invoke(*args), 1, "none.h5' holds no attribution methods", "--methods LIST")
    assert os.listdir(tmp_path) == ["none.h5"]


# Cells a spreadsheet would run as a formula (OWASP's CSV-injection list), and a terminal escape.
HOSTILE = ["=1+1", "+cmd|' /C calc'!A0", "-", "@SUM(A1)", "\tx", "\rx", "a\x1b[31mred", "-2", "safe", "mid=dle"]


def test_csv_cells_never_start_a_formula_and_parquet_keeps_the_strings(tmp_path):
    path = tmp_path / "h.h5"
    w = StoreWriter.create(str(path), n_layers=L, n_heads=2, labels={0: "neg", 1: "pos"},
                           methods=[MethodLayout("norm", signed=False, description="norm")],
                           provenance={}, attrs={"model_id": "synthetic"})
    n = len(HOSTILE)
    w.append([ExampleData(row=i, id=HOSTILE[i], text=" ".join(HOSTILE), pair=None, token_ids=np.arange(n),
                          tokens=HOSTILE, spans=np.full((n, 2), -1), segment=np.zeros(n), label=0, pred=1,
                          probs=np.array([0.4, 0.6]), target=0, explain_pos=0, n_orig_tokens=n, truncated=False,
                          results={"norm": {"scores": -np.arange(n, dtype=float) - 0.5}}) for i in range(2)])
    w.close(complete=True)
    add_metrics(str(path), [MetricData("norm", "comprehensiveness", np.array([-1.0, 2.0]), {}, {}, True, "c")])
    ok(_cli(path, "-o", tmp_path / "h.csv", "--metrics"))
    ok(_cli(path, "-o", tmp_path / "h.parquet", "--metrics"))
    neutral = ["'=1+1", "'+cmd|' /C calc'!A0", "'-", "'@SUM(A1)", "'\tx", "'\rx", "a\\u001b[31mred", "'-2", "safe",
               "mid=dle"]
    csv_rows, pq_rows = _read(tmp_path / "h.csv"), _read(tmp_path / "h.parquet")
    assert csv_rows["token"] == neutral * 2 and pq_rows["token"] == HOSTILE * 2
    assert csv_rows["id"] == [neutral[0]] * n + [neutral[1]] * n and pq_rows["id"] == [HOSTILE[0]] * n + [HOSTILE[1]] * n
    # numbers stay numbers: a negative score is not text to neutralise
    np.testing.assert_array_equal(csv_rows["score"], np.tile(-np.arange(n, dtype=np.float32) - 0.5, 2))
    metrics = _read(tmp_path / "h.metrics.csv")
    assert metrics["id"] == neutral[:2] and metrics["comprehensiveness"] == [-1.0, 2.0]
    assert _read(tmp_path / "h.metrics.parquet")["id"] == HOSTILE[:2]
    raw = (tmp_path / "h.csv").read_bytes()
    assert b"\x1b" not in raw and b"\n=" not in raw and b",=" not in raw and b",+" not in raw and b",@" not in raw
