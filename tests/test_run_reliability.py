"""What a writer of a store owes the user besides its numbers: --resume keeps what the store holds, one writer per
store (a lock file beside it), time-based commits (tiny models from conftest, in process)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cli_results import invoke, ok, one_line
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


# --- one writer per store ---------------------------------------------------------------------------------------------


@pytest.fixture
def live_pid():
    """A live process of this host (the other writer)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    yield p.pid
    p.kill()
    p.wait()


def hold(store: Path, pid: int, host: str | None = None) -> Path:
    lock = Path(str(store) + ".lock")
    lock.write_text(json.dumps({"pid": pid, "host": host or socket.gethostname()}))
    return lock


@pytest.fixture(scope="module")
def small_store(tiny_model_dirs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lock")
    data = write_data(tmp / "d.jsonl", 4)
    args = [data, "--model", tiny_model_dirs["bert"], "--device", "cpu", "--methods", "norm", "-q"]
    ok(invoke(*args, "-o", tmp / "ref.h5"))
    return {"args": args, "ref": tmp / "ref.h5"}


def test_a_second_writer_is_refused_naming_the_holder(small_store, tmp_path, live_pid):
    out = tmp_path / "s.h5"
    shutil.copy(small_store["ref"], out)
    before = out.read_bytes()
    lock = hold(out, live_pid)
    holder = f"is being written by process {live_pid} on {socket.gethostname()} (lock file '{lock}')"
    for args in ([*small_store["args"], "-o", out, "--overwrite"], [*small_store["args"], "-o", out, "--resume"],
                 ["eval", out, "--metrics", "sufficiency", "--device", "cpu", "-q"]):
        line = one_line(invoke(*args))
        assert f"store '{out.resolve()}' {holder}" in line or f"store '{out}' {holder}" in line, line
    assert out.read_bytes() == before and lock.exists()  # untouched, the holder's lock kept
    merged = tmp_path / "m.h5"
    hold(merged, live_pid)
    assert "is being written by process" in one_line(invoke("merge", merged, out))
    assert not merged.exists()


def test_a_stale_lock_is_taken_over_and_every_exit_removes_the_lock(small_store, tmp_path, live_pid):
    out = tmp_path / "s.h5"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock = hold(out, int(dead.stdout))  # its process has ended: stale
    ok(invoke(*small_store["args"], "-o", out))
    assert not lock.exists()
    with open_store(out) as s:
        assert s.complete and len(s) == 4
    one_line(invoke(*small_store["args"], "-o", out, "--resume", "--metrics", "nope"), 2)  # refused in the plan
    assert not lock.exists()
    one_line(invoke("eval", out, "--metrics", "comprehensiveness", "--device", "cpu", "--model", tmp_path / "none"))
    assert not lock.exists()  # refused after the lock was taken
    other_host = hold(out, live_pid, host="elsewhere.example")  # cannot be checked from here: refused, kept
    assert "process" in one_line(invoke("eval", out, "--metrics", "sufficiency", "--device", "cpu"))
    assert other_host.exists()


def test_the_lock_is_the_file_s_whatever_path_names_it(small_store, tmp_path, live_pid):
    """A store reached through a symlink is locked as the file it points to: a writer of the target refuses one of
    the link and the other way round; --overwrite and merge through a link write the target and keep the link."""
    (tmp_path / "data").mkdir()
    target, link = tmp_path / "data" / "s.h5", tmp_path / "link.h5"
    shutil.copy(small_store["ref"], target)
    link.symlink_to(target)
    before = target.read_bytes()
    lock = hold(target, live_pid)  # the target's writer is another process
    for args in ([*small_store["args"], "-o", link, "--overwrite"], [*small_store["args"], "-o", link, "--resume"],
                 ["eval", link, "--metrics", "sufficiency", "--device", "cpu", "-q"]):
        assert "is being written by process" in one_line(invoke(*args))
    assert target.read_bytes() == before and link.is_symlink() and lock.exists()
    lock.unlink()
    # the lock taken through the link is the target's: a writer of the target is refused while it is held
    from store.lock import lock_path, writer_lock

    assert lock_path(str(link)) == lock_path(str(target)) == str(target.resolve()) + ".lock"
    probe = ("import sys; from store.lock import writer_lock\n"
             "try:\n    with writer_lock(sys.argv[1]): print('taken')\n"
             "except Exception as e: print(type(e).__name__)")
    with writer_lock(str(link)):
        got = subprocess.run([sys.executable, "-c", probe, str(target)], capture_output=True, text=True, check=True)
        assert got.stdout.strip() == "StoreError"
    ok(invoke(*small_store["args"], "-o", link, "--overwrite", "--methods", "rollout"))
    assert link.is_symlink() and os.path.samefile(link, target)
    assert sorted(os.listdir(tmp_path / "data")) == ["s.h5"]
    with open_store(target) as s:
        assert s.complete and len(s) == 4 and s.methods == ["rollout"]
    merged_target, merged_link = tmp_path / "data" / "m.h5", tmp_path / "m.h5"
    merged_link.symlink_to(merged_target)  # dangling until the merge writes its target
    shard = tmp_path / "shard.h5"
    ok(invoke(*small_store["args"], "-o", shard, "--shard", "0/1"))
    ok(invoke("merge", merged_link, tmp_path / "shard.shard-0-of-1.h5"))
    assert merged_link.is_symlink() and os.path.samefile(merged_link, merged_target)
    with open_store(merged_target) as s:
        assert s.complete and len(s) == 4


# --- commits by time as well as by window -----------------------------------------------------------------------------

COMMIT = ["--device", "cpu", "--methods", "rollout,norm", "--matrices", "all", "--batch-size", "2", "-q"]  # 16-row windows


@pytest.fixture(scope="module")
def window_run(tiny_model_dirs, tmp_path_factory):
    """A run of 40 rows committed by window only (--commit-seconds far beyond the run), the reference."""
    tmp = tmp_path_factory.mktemp("commit")
    data = write_data(tmp / "d.jsonl", 40)
    args = [data, "--model", tiny_model_dirs["bert"], *COMMIT]
    ok(invoke(*args, "-o", tmp / "ref.h5", "--commit-seconds", "100000"))
    return {"args": args, "ref": tmp / "ref.h5"}


def assert_same_examples(path: Path, ref: Path) -> None:
    with open_store(path) as s, open_store(ref) as r:
        assert s.complete and len(s) == len(r) == 40
        for a, b in zip(s, r):
            assert (a.id, a.tokens, a.pred, a.target) == (b.id, b.tokens, b.pred, b.target)
            np.testing.assert_array_equal(a.probs, b.probs)
            for m in ("rollout", "norm"):
                np.testing.assert_array_equal(a.scores(m), b.scores(m), err_msg=f"{m} {a.id}")
                np.testing.assert_array_equal(a.layer_scores(m), b.layer_scores(m), err_msg=f"{m} {a.id}")
            np.testing.assert_array_equal(a.matrices("rollout"), b.matrices("rollout"), err_msg=a.id)


def test_commit_seconds_commits_inside_a_window_with_the_same_numbers(window_run, tmp_path, monkeypatch):
    from compute.run.write import WindowWriter

    sizes = []
    submit = WindowWriter.submit
    monkeypatch.setattr(WindowWriter, "submit", lambda self, exs: (sizes.append(len(exs)), submit(self, exs))[1])
    ok(invoke(*window_run["args"], "-o", tmp_path / "s.h5", "--commit-seconds", "0"))  # whenever rows are ready
    assert sum(sizes) == 40 and len(sizes) > 3 and any(n not in (16, 8) for n in sizes), sizes  # inside windows
    assert_same_examples(tmp_path / "s.h5", window_run["ref"])
    sizes.clear()
    ok(invoke(*window_run["args"], "-o", tmp_path / "w.h5", "--commit-seconds", "100000"))
    assert sizes == [16, 16, 8]  # by window only


@pytest.mark.parametrize("stored", [5, 16, 27])
def test_resume_mid_window_gives_the_numbers_of_an_uninterrupted_run(window_run, tmp_path, stored):
    """A store cut inside a window (what a stop after a time-based commit leaves): --resume finishes it with the
    batches of the uninterrupted run, bit for bit."""
    from store.copying import _example_data, _new_store_like

    out = tmp_path / "s.h5"
    with open_store(window_run["ref"]) as ref:
        f, w = _new_store_like(ref, str(out), ref.config)
        with f:
            w.append([_example_data(ref[i], list(w.methods.values())) for i in range(stored)])
    ok(invoke(*window_run["args"], "-o", out, "--resume", "--commit-seconds", "100000"))
    with open_store(out) as s:
        assert s.summary["resumed_from"] == stored
    assert_same_examples(out, window_run["ref"])
