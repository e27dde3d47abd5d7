"""A write that fails (a full disk, a file-size limit) ends the writer in one line and keeps the committed prefix,
readable and resumable to the numbers of an uninterrupted run: the store's writer, and attr-compute run.

The failure is real, not mocked: the writing process runs under a file-size limit (RLIMIT_FSIZE, any user), so HDF5's
own write calls fail with EFBIG wherever they land; where this machine lets a test mount a small tmpfs, the same is
checked with a real ENOSPC."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from cli_results import invoke, ok
from store import open_store
from store import resume as resume_store
from test_store import assert_example, create, example

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
BATCH, N_BATCHES = 32, 8

# Writes the batches of test_store.example under whatever limit the parent set, and says how it ended.
FILL = textwrap.dedent("""
    import os, sys
    sys.path[:0] = [sys.argv[3], sys.argv[2]]
    from store import StoreError
    from test_store import create, example
    batch, n_batches = int(sys.argv[4]), int(sys.argv[5])
    w = None
    try:
        w = create(sys.argv[1])
        for b in range(n_batches):
            w.append([example(i) for i in range(b * batch, (b + 1) * batch)])
        peak = os.path.getsize(sys.argv[1])  # before the finished store is compacted (store/compact.py)
        w.close(complete=True)
        print("complete", peak)
    except StoreError as err:
        print("error:", err)
        if w is not None:
            w.close()  # after a failed write: nothing more is written, nothing raised
""")


def _limited(limit: int):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return preexec


def fill(path: Path, tmp_path: Path, limit: int | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "fill.py"
    script.write_text(FILL)
    return subprocess.run([sys.executable, str(script), str(path), str(TESTS), str(REPO), str(BATCH), str(N_BATCHES)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          preexec_fn=None if limit is None else _limited(limit))


def assert_failed_cleanly(out: subprocess.CompletedProcess, path: Path, reason: str) -> int:
    """One line naming the store and the reason, no traceback, no segfault; the committed examples (returned) read
    back equal to what was written, and the store is not marked complete."""
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    assert out.stderr == "", out.stderr[-3000:]  # not even h5py's "Exception ignored" lines
    line = out.stdout.strip()
    prefix = f"error: cannot write store '{path}': {reason}: the "
    assert line.startswith(prefix) and line.endswith(" examples committed before are kept"), line
    n = int(line[len(prefix):].split()[0])
    assert 0 < n < BATCH * N_BATCHES and n % BATCH == 0, line
    with open_store(path) as s, s.sequential():
        assert len(s) == n and not s.complete
        for i, got in enumerate(s):
            assert_example(got, example(i))
    return n


def finish_and_compare(path: Path, n: int) -> None:
    """--resume's store layer: the rest appended after the failure gives every example as written, complete."""
    w = resume_store(str(path))
    assert w.n_committed == n
    for b in range(n // BATCH, N_BATCHES):
        w.append([example(i) for i in range(b * BATCH, (b + 1) * BATCH)])
    w.close(complete=True)
    with open_store(path) as s, s.sequential():
        assert s.complete and len(s) == BATCH * N_BATCHES
        for i, got in enumerate(s):
            assert_example(got, example(i))


@pytest.fixture(scope="module")
def full_size(tmp_path_factory) -> int:
    """The bytes of the uninterrupted store as the writing left it: what a limit must cut (the finished store is
    compacted to less, store/compact.py)."""
    tmp = tmp_path_factory.mktemp("full")
    out = fill(tmp / "full.h5", tmp)
    status, peak = out.stdout.split()
    assert status == "complete" and out.stderr == "", out.stderr[-3000:]
    assert os.path.getsize(tmp / "full.h5") < int(peak)
    return int(peak)


@pytest.mark.parametrize("share", [0.3, 0.55, 0.8])
def test_a_failed_write_keeps_the_committed_prefix_and_resumes(tmp_path, full_size, share):
    path = tmp_path / "cut.h5"
    out = fill(path, tmp_path, limit=int(full_size * share))
    n = assert_failed_cleanly(out, path, os.strerror(27))  # EFBIG: File too large
    finish_and_compare(path, n)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 600 KB tmpfs (root only; the test skips where mounting is not allowed)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mnt)], capture_output=True)
    if made.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_full_disk_keeps_the_committed_prefix_and_resumes(tmp_path, small_tmpfs, full_size):
    assert full_size > 800_000  # the store does not fit
    path = small_tmpfs / "cut.h5"
    n = assert_failed_cleanly(fill(path, tmp_path), path, os.strerror(28))  # ENOSPC: No space left on device
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_tmpfs)], check=True)  # space freed
    finish_and_compare(path, n)


# --- attr-compute run on a disk that fills ---------------------------------------------------------------------------

WORDS = "the movie was great but long and boring film good bad not very a plot story loved hated fun dull".split()
RUN = ["--methods", "rollout,norm", "--matrices", "all", "--batch-size", "1", "--device", "cpu", "-q"]  # 8-row windows


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "COLUMNS": "200", "PYTHONPATH": str(REPO)}


def compute(args: list, cwd: Path, limit: int | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compute.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=_env(), preexec_fn=None if limit is None else _limited(limit))


@pytest.fixture(scope="module")
def run_data(tiny_model_dirs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    rows = [{"id": f"r{i}", "text": " ".join(WORDS[(3 * i + k) % 20] for k in range(12 + i % 7)), "label": i % 2}
            for i in range(32)]
    data = tmp / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reference = tmp / "reference.h5"
    ok(invoke(data, "--model", tiny_model_dirs["bert"], "-o", reference, *RUN))
    return {"data": data, "model": tiny_model_dirs["bert"], "reference": reference, "n": len(rows)}


def test_run_on_a_full_disk_says_one_line_and_resumes_to_the_same_numbers(run_data, tmp_path):
    out = tmp_path / "run.h5"
    args = [run_data["data"], "--model", run_data["model"], "-o", out, *RUN]
    cut = compute(args, tmp_path, limit=os.path.getsize(run_data["reference"]) // 2)
    assert cut.returncode == 1, (cut.returncode, cut.stderr[-3000:])
    lines = [ln for ln in cut.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in cut.stderr, cut.stderr[-3000:]
    head = f"attr-compute: error: cannot write store '{out}': File too large: the "
    assert lines[0].startswith(head), lines[0]
    n = int(lines[0][len(head):].split()[0])
    assert 0 < n < run_data["n"] and n % 8 == 0, lines[0]  # whole windows
    again = lines[0].split("; free space and finish it with: ", 1)[1]
    assert again.endswith(" --resume") and str(out) in again, again
    with open_store(out) as s, open_store(run_data["reference"]) as ref:
        assert len(s) == n and not s.complete
        assert [e.id for e in s] == [e.id for e in ref][:n]

    ok(invoke(*args, "--resume"))
    with open_store(out) as s, open_store(run_data["reference"]) as ref:
        assert s.complete and len(s) == len(ref) == run_data["n"] and s.summary["resumed_from"] == n
        for a, b in zip(s, ref):
            assert (a.id, a.tokens, a.pred, a.target) == (b.id, b.tokens, b.pred, b.target)
            np.testing.assert_array_equal(a.probs, b.probs)
            for m in ("rollout", "norm"):
                np.testing.assert_array_equal(a.scores(m), b.scores(m), err_msg=f"{m} {a.id}")
                np.testing.assert_array_equal(a.layer_scores(m), b.layer_scores(m), err_msg=f"{m} {a.id}")
            np.testing.assert_array_equal(a.matrices("rollout"), b.matrices("rollout"))


# --- appending to a damaged copy ---------------------------------------------------------------------------------------

APPEND_METRIC = textwrap.dedent("""
    import os, sys
    sys.path[:0] = [sys.argv[3], sys.argv[2]]
    import numpy as np
    from store import MetricData, StoreError, add_metrics, open_store
    try:
        n = len(open_store(sys.argv[1]))
        add_metrics(sys.argv[1], [MetricData("rollout", "x", np.zeros(n), {}, {}, True, "d")])
        print("ok")
    except StoreError as err:
        print("error:", err)
""")


def test_appending_metrics_to_damaged_copies_ends_in_seconds(tmp_path):
    """Copy 34 of seed 1 hung in HDF5's SWMR write path (metadata reads retried 100 times with growing sleeps, deaf
    to SIGTERM); the write open now caps them as reading does. Each copy ends, in a StoreError or with the metric."""
    from store_fuzz import make_target, mutate

    target = tmp_path / "target.h5"
    make_target(str(target), n_examples=40)
    data = target.read_bytes()
    rng = np.random.default_rng(1)
    script = tmp_path / "append.py"
    script.write_text(APPEND_METRIC)
    for k in range(35):
        damaged = mutate(data, ("flip", "zero")[k % 2], rng)
        if k < 30:
            continue
        copy = tmp_path / f"copy{k}.h5"
        copy.write_bytes(damaged)
        try:
            out = subprocess.run([sys.executable, str(script), str(copy), str(TESTS), str(REPO)], capture_output=True,
                                 text=True, timeout=20)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"copy {k}: no end after 20 s") from None
        assert out.returncode == 0 and out.stderr == "", (k, out.returncode, out.stderr[-2000:])
        assert out.stdout.strip() == "ok" or out.stdout.startswith("error: store "), (k, out.stdout)


MERGE = textwrap.dedent("""
    import os, sys
    sys.path[:0] = [sys.argv[3], sys.argv[2]]
    from store import StoreError
    from store.copying import merge
    try:
        merge(sys.argv[1], sys.argv[4:], {"merged": True})
        print("merged")
    except StoreError as err:
        print("error:", err)
""")


def test_merge_on_a_full_disk_says_one_line_and_leaves_nothing(tmp_path):
    shards = []
    for k, rows in enumerate((range(0, 96), range(96, 192))):
        path = tmp_path / f"shard{k}.h5"
        w = create(path)
        for lo in range(rows.start, rows.stop, BATCH):
            w.append([example(i) for i in range(lo, lo + BATCH)])
        w.close(complete=True)
        shards.append(str(path))
    script = tmp_path / "merge.py"
    script.write_text(MERGE)
    out = tmp_path / "merged.h5"
    limit = os.path.getsize(shards[0])  # half the merged store
    done = subprocess.run([sys.executable, str(script), str(out), str(TESTS), str(REPO), *shards], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, preexec_fn=_limited(limit))
    assert done.returncode == 0 and done.stderr == "", (done.returncode, done.stderr[-3000:])
    assert done.stdout.strip() == f"error: cannot write store '{out}': File too large: nothing was written there"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merge.py", "shard0.h5", "shard1.h5"]


def test_export_on_a_full_disk_says_one_line_and_leaves_nothing(tmp_path):
    store = tmp_path / "s.h5"
    w = create(store)
    w.append([example(i) for i in range(64)])
    w.close(complete=True)
    out = tmp_path / "out" / "x.csv"
    out.parent.mkdir()
    done = subprocess.run([sys.executable, "-m", "compute.cli", "export", str(store), "-o", str(out), "--layers"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**os.environ,
                          "PYTHONPATH": str(REPO)}, preexec_fn=_limited(20_000))
    assert done.returncode == 1, (done.returncode, done.stderr[-3000:])
    assert done.stderr.strip() == (f"attr-compute: error: cannot write '{out}': File too large: nothing was written "
                                   f"('{out}' is as it was); free space and export again"), done.stderr[-3000:]
    assert list(out.parent.iterdir()) == []


def test_a_full_disk_refuses_the_lock_in_one_line_and_leaves_no_lock(small_tmpfs):
    """eval on a store of a full disk: the lock file is made but its holder cannot be written (it was an internal
    error, OSError ENOSPC)."""
    from store.errors import StoreError
    from store.lock import lock_path, writer_lock

    store = small_tmpfs / "s.h5"
    with open(small_tmpfs / "filler", "wb") as fh:  # every block of the disk taken
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass
    with pytest.raises(StoreError) as err:
        with writer_lock(str(store)):
            pass
    assert str(err.value) == (f"cannot create store '{store}': its lock file '{lock_path(str(store))}' cannot be "
                              f"made ({os.strerror(28)}): free space, or choose another output (-o, OUT)")
    assert not os.path.exists(lock_path(str(store)))
