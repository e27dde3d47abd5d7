"""What a writer of a store owes the user besides its numbers: --resume keeps what the store holds, one writer per
store (a lock file beside it), time-based commits (tiny models from conftest, in process)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cli_results import invoke, ok
from store import open_store

WORDS = "the movie was great but long and boring film good bad not very a plot story loved hated fun dull".split()


def write_data(path: Path, n: int) -> Path:
    rows = [{"id": f"e{i}", "text": " ".join(WORDS[(i * 5 + 3 * k) % len(WORDS)] for k in range(4 + i % 7)),
             "label": i % 2} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def metric_table(path: Path) -> dict:
    with open_store(path) as s:
        return {(m, name): s.metric_values(m, name).copy() for m in s.metric_methods for name in s.metric_names(m)}


@pytest.fixture
def complete_store(tiny_model_dirs, tmp_path):
    data = write_data(tmp_path / "d.jsonl", 6)
    out = tmp_path / "s.h5"
    args = [data, "--model", tiny_model_dirs["bert"], "-o", out, "--device", "cpu", "--methods", "norm", "-q"]
    ok(invoke(*args, "--metrics", "comprehensiveness"))
    ok(invoke("eval", out, "--metrics", "sufficiency", "--device", "cpu", "-q"))
    before = metric_table(out)
    assert sorted(before) == [("norm", "comprehensiveness"), ("norm", "sufficiency")]
    return {"args": args, "out": out, "before": before}


def assert_same_metrics(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for key, values in want.items():
        np.testing.assert_array_equal(got[key], values, err_msg=str(key))


def test_resume_of_a_complete_store_keeps_its_metrics(complete_store):
    res = ok(invoke(*complete_store["args"][:-1], "--resume"))  # not quiet: nothing is said about metrics
    assert_same_metrics(metric_table(complete_store["out"]), complete_store["before"])
    with open_store(complete_store["out"]) as s:
        assert s.complete and len(s) == 6
    assert "recomput" not in res.stderr


def test_resume_with_metrics_adds_them_and_says_which_are_recomputed(complete_store):
    res = ok(invoke(*complete_store["args"][:-1], "--resume", "--metrics", "comprehensiveness,aopc"))
    got = metric_table(complete_store["out"])
    assert sorted(got) == [("norm", "aopc"), ("norm", "comprehensiveness"), ("norm", "sufficiency")]
    for key in (("norm", "comprehensiveness"), ("norm", "sufficiency")):  # same model, same numbers
        np.testing.assert_array_equal(got[key], complete_store["before"][key], err_msg=str(key))
    lines = [ln for ln in res.stderr.splitlines() if "recomput" in ln]
    assert len(lines) == 1 and "comprehensiveness" in lines[0] and "sufficiency" not in lines[0] \
        and "aopc" not in lines[0], res.stderr
