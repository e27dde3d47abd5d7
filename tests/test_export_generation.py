"""``attr-compute export`` of a generation store: one row per example x step x method x position (the positions
before the step's token), with ``step`` and ``target`` beside the token table's columns; every value against the
Example API (not the table code)."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from cli_results import invoke, ok
from generation_stores import write_generation_store

from store import open_store

pq = pytest.importorskip("pyarrow.parquet")

COLUMNS = ["example", "id", "step", "target", "position", "token", "label", "pred", "method", "score"]


def _read(path) -> dict[str, list]:
    """The file's columns as lists: Parquet as stored, CSV parsed as a researcher would (empty cell = NaN)."""
    if str(path).endswith(".parquet"):
        return pq.read_table(path).to_pydict()
    with open(path, newline="", encoding="utf-8") as fh:
        header, *body = list(csv.reader(fh))
    cols = {k: [r[j] for r in body] for j, k in enumerate(header)}
    for k in cols:
        if k in ("example", "step", "position", "label", "pred"):
            cols[k] = [int(x) for x in cols[k]]
        elif k not in ("id", "target", "token", "method"):
            cols[k] = [float(x) if x else float("nan") for x in cols[k]]
    return cols


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("genexport") / "g.h5"
    write_generation_store(path)
    return path


def _expected(path, methods, layers):
    rows = []
    with open_store(path) as s:
        V = max(int(s.method_info(m)["n_layer_views"]) for m in methods) if layers else 0
        for ex in s:
            for t in range(ex.n_steps):
                for m in methods:
                    scores, views = ex.step_scores(m)[t], ex.layer_scores(m, step=t)
                    for p in range(ex.step_position(t)):
                        row = {"example": ex.index, "id": ex.id, "step": t, "target": ex.generated_tokens[t],
                               "position": p, "token": ex.tokens[p], "label": -1, "pred": ex.pred, "method": m,
                               "score": scores[p]}
                        for v in range(V):
                            row[f"layer_{v + 1}"] = views[v, p] if views is not None else np.nan
                        rows.append(row)
    return rows


def _assert_rows(got: dict, want: list[dict]):
    assert list(got) == list(want[0])
    assert len(got["score"]) == len(want)
    for k in got:
        exp = [r[k] for r in want]
        if k == "score" or k.startswith("layer_"):
            np.testing.assert_array_equal(np.asarray(got[k], np.float32), np.asarray(exp, np.float32), err_msg=k)
            assert np.isfinite(np.asarray(got["score"], np.float32)).all()  # no cell after a step's token
        else:
            assert got[k] == exp, k


@pytest.mark.parametrize("ext", ["parquet", "csv"])
@pytest.mark.parametrize("layers", [False, True])
def test_generation_rows_equal_the_store(store_path, tmp_path, ext, layers):
    out = tmp_path / f"t.{ext}"
    ok(invoke("export", str(store_path), "-o", str(out), *(["--layers"] if layers else [])))
    got = _read(out)
    want = _expected(store_path, ["attention", "grad", "ig"], layers)
    assert list(got)[:len(COLUMNS)] == COLUMNS
    # example 0: steps of 4, 5, 6 sources, example 1: 5 .. 10, example 2: none (T = 0), example 3: 3, 4, 5; 3 methods
    assert len(want) == 3 * (15 + 45 + 12)
    _assert_rows(got, want)


def test_chunks_and_methods_do_not_change_the_rows(store_path, tmp_path):
    whole, parts = tmp_path / "a.parquet", tmp_path / "b.parquet"
    ok(invoke("export", str(store_path), "-o", str(whole), "--methods", "grad,attention"))
    ok(invoke("export", str(store_path), "-o", str(parts), "--methods", "grad,attention", "--chunk-size", "1"))
    assert _read(whole) == _read(parts)
    _assert_rows(_read(whole), _expected(store_path, ["grad", "attention"], False))


def test_an_empty_range_has_the_columns_and_dtypes(store_path):
    with open_store(store_path) as s:
        empty, full = s.token_table(hi=0), s.token_table(lo=0, hi=1)
        assert list(empty) == list(full) == COLUMNS
        assert all(empty[k].dtype == full[k].dtype and len(empty[k]) == 0 for k in empty)
