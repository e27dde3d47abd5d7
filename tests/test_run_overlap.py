"""Issue 16, one process: writing overlaps compute (a writer thread fed by a bounded queue), a batch that runs out
of memory is halved and retried, --batch-size auto, and pinned non-blocking input copies on CUDA. No GPU here: the
CUDA paths are covered by their logic (an injected out-of-memory error, a fake memory function, a fake tensor)."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import torch

from cli_results import invoke, ok, one_line
from compute.run.write import WindowWriter
from store import StoreError, open_store
from store.writer import StoreWriter


class SlowWriter:
    """A StoreWriter stand-in: records what it appends, on which thread, slowly; fails at append number ``fail_at``."""

    def __init__(self, seconds=0.0, fail_at=None):
        self.appended, self.threads, self.seconds, self.fail_at = [], set(), seconds, fail_at

    def append(self, examples):
        self.threads.add(threading.current_thread().name)
        time.sleep(self.seconds)
        if self.fail_at is not None and len(self.appended) + 1 == self.fail_at:
            raise StoreError("cannot write store 'x.h5': No space left on device")
        self.appended.append(list(examples))


def test_windows_are_written_in_order_on_the_writer_thread_and_a_full_queue_is_waited_for():
    fake = SlowWriter(seconds=0.05)
    ww = WindowWriter(fake, depth=1)
    t0 = time.perf_counter()
    for w in range(6):
        ww.submit([w * 10, w * 10 + 1])
    submitted = time.perf_counter() - t0
    ww.finish()
    assert fake.appended == [[w * 10, w * 10 + 1] for w in range(6)]
    assert fake.threads == {"attrscope-writer"}
    # six appends of 0.05 s through a queue of one: the loop waited for most of them, and said so
    assert 0.15 < ww.wait_seconds and submitted <= ww.wait_seconds + 0.05
    assert ww.write_seconds >= 0.3 - 0.01
    ww.finish()  # idempotent


def test_a_fast_writer_costs_the_loop_no_wait():
    fake = SlowWriter()
    ww = WindowWriter(fake, depth=2)
    for w in range(3):
        ww.submit([w])
        time.sleep(0.02)  # the model computing the next window
    ww.finish()
    assert fake.appended == [[0], [1], [2]] and ww.wait_seconds < 0.02


def test_an_error_of_the_writer_thread_is_raised_in_the_main_thread_without_a_hang():
    fake = SlowWriter(seconds=0.01, fail_at=2)
    ww = WindowWriter(fake, depth=1)
    with pytest.raises(StoreError, match="No space left on device"):
        for w in range(50):  # more windows than the queue holds: submit must not block on a dead writer
            ww.submit([w])
        ww.finish()
    ww.finish()  # raised once, not again
    assert fake.appended == [[0]]  # nothing after the failed window


# --- end to end, through the CLI -----------------------------------------------------------------------------
def write_rows(path, n):
    words = "good bad fine awful great dull bright grim".split()
    with open(path, "w") as f:
        for i in range(n):
            text = " ".join(words[(i + k) % len(words)] for k in range(1 + i % 7))
            f.write(json.dumps({"id": f"r{i}", "text": text, "label": i % 2}) + "\n")
    return path


COMMON = ("--device", "cpu", "--methods", "rollout,norm,alti", "--matrices", "all", "-q")


def test_the_run_writes_on_the_writer_thread_and_reports_its_wait(tiny_model_dirs, tmp_path, monkeypatch):
    data = write_rows(tmp_path / "d.jsonl", 13)
    threads = set()
    append = StoreWriter.append

    def spy(self, examples):
        threads.add(threading.current_thread().name)
        return append(self, examples)

    monkeypatch.setattr(StoreWriter, "append", spy)
    out = tmp_path / "o.h5"
    ok(invoke("run", data, "--model", tiny_model_dirs["bert"], "-o", out, "--batch-size", 2, *COMMON))
    assert threads == {"attrscope-writer"}
    with open_store(out) as s:
        assert len(s) == 13
        summary = s.summary
    assert summary["write_wait_seconds"] >= 0 and summary["write_seconds"] > 0


def test_a_failing_write_is_one_line_and_keeps_the_windows_before(tiny_model_dirs, tmp_path, monkeypatch):
    data = write_rows(tmp_path / "d.jsonl", 13)
    append, calls = StoreWriter.append, []

    def failing(self, examples):
        calls.append(len(examples))
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return append(self, examples)

    monkeypatch.setattr(StoreWriter, "append", failing)
    out = tmp_path / "o.h5"
    # --batch-size 1 and the window of 8 batches: 13 rows are two windows (8 + 5)
    line = one_line(invoke("run", data, "--model", tiny_model_dirs["bert"], "-o", out, "--batch-size", 1, *COMMON))
    assert "No space left on device" in line and "--resume" in line
    with open_store(out) as s:
        assert len(s) == 8


# --- out of memory: the batch is halved and retried ----------------------------------------------------------
def stored_arrays(path) -> dict[str, np.ndarray]:
    """Every dataset of a store but the provenance, by path."""
    import h5py

    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    out.pop("provenance", None)
    return out


OOM_RUN = ("--device", "cpu", "--methods", "rollout,norm,alti,grad_l2", "--matrices", "all", "--store-dtype",
           "float32", "--batch-size", 4, "-q")


@pytest.fixture(scope="module")
def unsplit_store(tiny_model_dirs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("unsplit")
    data = write_rows(tmp / "d.jsonl", 11)
    out = tmp / "whole.h5"
    ok(invoke("run", data, "--model", tiny_model_dirs["bert"], "-o", out, *OOM_RUN))
    return data, out


@pytest.mark.parametrize("error", [torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                   RuntimeError("CUDA error: out of memory")], ids=["OutOfMemoryError", "RuntimeError"])
def test_a_batch_out_of_memory_is_halved_and_gives_the_unsplit_results(unsplit_store, tiny_model_dirs, tmp_path,
                                                                        monkeypatch, error):
    import compute.runner as runner

    data, whole = unsplit_store
    real, tried, sizes = runner.run_batch, set(), []

    def first_attempt_fails(lm, methods, enc, *args):
        key = tuple(enc["input_ids"].shape)
        sizes.append(key[0])
        if key[0] > 1 and key not in tried:  # the first attempt of every batch of two or more runs out of memory
            tried.add(key)
            raise error
        return real(lm, methods, enc, *args)

    monkeypatch.setattr(runner, "run_batch", first_attempt_fails)
    out = tmp_path / "split.h5"
    ok(invoke("run", data, "--model", tiny_model_dirs["bert"], "-o", out, *OOM_RUN))
    assert 4 in sizes and 2 in sizes and 1 in sizes  # 4 -> 2 + 2 -> 1 + 1 ...: every batch was split to ones
    a, b = stored_arrays(whole), stored_arrays(out)
    assert a.keys() == b.keys()
    for name in a:
        # a compound array (the index) field by field: its probabilities are floats of other batches too
        fields = a[name].dtype.names or (None,)
        for f in fields:
            x, y = (a[name], b[name]) if f is None else (a[name][f], b[name][f])
            if x.dtype.kind == "f":
                np.testing.assert_allclose(y, x, rtol=0, atol=1e-5, err_msg=f"{name} {f or ''}")
            else:
                assert np.array_equal(x, y), (name, f)


def test_out_of_memory_on_one_example_is_one_line(unsplit_store, tiny_model_dirs, tmp_path, monkeypatch):
    import compute.runner as runner

    def never_fits(*args):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(runner, "run_batch", never_fits)
    data, _ = unsplit_store
    line = one_line(invoke("run", data, "--model", tiny_model_dirs["bert"], "-o", tmp_path / "o.h5", *OOM_RUN))
    assert "out of memory on a single example" in line and "--max-length" in line


def test_run_halving_keeps_the_order_and_raises_other_errors_at_once():
    from compute.run.dispatch import run_halving

    calls, notes = [], []

    def run_rows(rows):
        calls.append(list(rows))
        if len(rows) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return f"out{rows}"

    parts = run_halving([5, 3, 9, 1, 7], run_rows, lambda i: 10, notes.append)
    assert [rows for rows, _ in parts] == [[5, 3], [9], [1, 7]]  # 5 -> 3 + 2 -> (2 + 1) + 2
    assert [out for _, out in parts] == ["out[5, 3]", "out[9]", "out[1, 7]"]
    assert notes[0] == "out of memory on a batch of 5: retrying it as 3 + 2"

    def broken(rows):
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        run_halving([1, 2, 3, 4], broken, lambda i: 10)


# --- --batch-size auto -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("free,per_example,limit", [(100, 7, 1024), (100, 1, 64), (6, 7, 8), (10**6, 3, 1000),
                                                    (96, 32, 1024), (33, 11, 3)])
def test_largest_fitting_finds_the_largest_batch_a_fake_memory_allows(free, per_example, limit):
    from compute.run.dispatch import largest_fitting

    tries = []

    def fits(b):  # a fake device: b examples need b * per_example units of memory
        tries.append(b)
        return b * per_example <= free

    expected = max([b for b in range(1, limit + 1) if b * per_example <= free], default=0)
    assert largest_fitting(fits, limit) == expected
    assert max(tries) <= limit and len(tries) <= 2 * limit.bit_length() + 1


def test_auto_batch_size_probes_cuda_with_the_longest_example(monkeypatch):
    """The CUDA probe, without a GPU: a fake model on a 'cuda' device, run_batch replaced by a fake memory."""
    from types import SimpleNamespace

    import compute.run.dispatch as dispatch
    from compute.run.batches import Tokenized
    from compute.tasks import TaskRows

    lengths = [5, 40, 12, 40, 7] * 100  # 500 examples, the longest 40 tokens
    tok = Tokenized([[1] * n for n in lengths], None, None, [[0] * n for n in lengths], lengths)
    cuda = torch.device("cuda")
    lm = SimpleNamespace(model=SimpleNamespace(parameters=lambda: iter([SimpleNamespace(device=cuda)])),
                         tokenizer=SimpleNamespace(pad_token_id=0))
    seen = []

    def fake_run_batch(lm, methods, enc, labels, *args):
        seen.append(enc)
        if len(enc) * max(lengths[i] for i in enc) > 40 * 37:  # room for 37 of the longest
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(dispatch, "encode", lambda tok, rows, pad_id, device: list(rows))
    monkeypatch.setattr(dispatch, "run_batch", fake_run_batch)
    rows = TaskRows.plain([0] * len(lengths))
    size, how = dispatch.auto_batch_size(lm, {}, tok, rows, "predicted", 2, True)
    assert size == 37 and "40 tokens" in how
    assert all(set(rows) == {1} for rows in seen)  # every probe is copies of the (first) longest example

    monkeypatch.setattr(dispatch, "run_batch", lambda *a: (_ for _ in ()).throw(RuntimeError("bad kernel")))
    with pytest.raises(RuntimeError, match="bad kernel"):  # only out-of-memory errors mean "does not fit"
        dispatch.auto_batch_size(lm, {}, tok, rows, "predicted", 2, True)


def test_batch_size_auto_on_cpu_is_the_fixed_default_and_recorded(tiny_model_dirs, tmp_path):
    data = write_rows(tmp_path / "d.jsonl", 5)
    out = tmp_path / "o.h5"
    ok(invoke("run", data, "--model", tiny_model_dirs["bert"], "-o", out, "--device", "cpu", "--methods", "rollout",
              "--batch-size", "auto", "-q"))
    with open_store(out) as s:
        assert s.config["batch_size"] == {"asked": "auto", "used": 32, "how": "fixed on cpu"}
        assert s.config["config"]["batch_size"] == "auto"


@pytest.mark.parametrize("value,message", [("many", "'many' is not a number or auto"), ("0", "at least 1")])
def test_a_bad_batch_size_is_a_usage_error(tiny_model_dirs, tmp_path, value, message):
    data = write_rows(tmp_path / "d.jsonl", 2)
    line = one_line(invoke("run", data, "--model", tiny_model_dirs["bert"], "-o", tmp_path / "o.h5",
                           "--batch-size", value), code=2)
    assert message in line


# --- pinned, non-blocking input copies on CUDA -------------------------------------------------------------------
class RecordingTensor:
    def __init__(self, calls):
        self.calls = calls

    def pin_memory(self):
        self.calls.append("pin_memory")
        return self

    def to(self, device, non_blocking=False):
        self.calls.append(("to", str(device), non_blocking))
        return self


@pytest.mark.parametrize("device,expected", [
    ("cuda", ["pin_memory", ("to", "cuda", True)]),
    ("cuda:1", ["pin_memory", ("to", "cuda:1", True)]),
    ("cpu", [("to", "cpu", False)]),
])
def test_inputs_go_to_cuda_from_pinned_memory_without_blocking_and_to_the_cpu_as_before(device, expected):
    from compute.padding import to_device

    calls = []
    to_device(RecordingTensor(calls), torch.device(device))
    assert calls == expected


def test_resume_of_an_auto_store_uses_the_recorded_size_and_equals_a_fixed_run_bitwise(tiny_model_dirs, tmp_path,
                                                                                       monkeypatch):
    import compute.run.dispatch as dispatch
    import compute.runner as runner

    data = write_rows(tmp_path / "d.jsonl", 30)
    run = ("--model", tiny_model_dirs["bert"], "--device", "cpu", "--methods", "rollout,norm", "-q")
    fixed = tmp_path / "fixed.h5"
    ok(invoke("run", data, "-o", fixed, *run, "--batch-size", 3))

    out = tmp_path / "auto.h5"
    monkeypatch.setattr(dispatch, "CPU_AUTO_BATCH_SIZE", 3)  # auto finds 3 this time (on CUDA: the free memory)
    append, calls = StoreWriter.append, []

    def second_fails(self, examples):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return append(self, examples)

    monkeypatch.setattr(StoreWriter, "append", second_fails)
    one_line(invoke("run", data, "-o", out, *run, "--batch-size", "auto"))
    with open_store(out) as s:
        assert len(s) == 24 and s.config["batch_size"]["used"] == 3  # one window: 8 batches of 3

    monkeypatch.setattr(StoreWriter, "append", append)
    monkeypatch.setattr(dispatch, "CPU_AUTO_BATCH_SIZE", 5)  # now auto would find another size
    sizes, windows = [], runner.windows
    monkeypatch.setattr(runner, "windows", lambda tok, size, window: (sizes.append(size), windows(tok, size, window))[1])
    ok(invoke("run", data, "-o", out, *run, "--batch-size", "auto", "--resume"))
    assert sizes == [3]
    a, b = stored_arrays(fixed), stored_arrays(out)
    assert a.keys() == b.keys()
    for name in a:  # as bytes: the index's NaN fields (gold_value of a classifier) equal themselves
        assert a[name].dtype == b[name].dtype and a[name].tobytes() == b[name].tobytes(), name


# --- --batch-size auto on the CPU with --batch-memory-mb -----------------------------------------------------------
def test_cpu_batch_within_finds_the_largest_batch_of_a_linear_memory_cost():
    from compute.run.dispatch import cpu_batch_within

    for base, per, budget, limit in ((50, 7, 400, 1024), (10, 100, 95, 64), (0, 3, 1000, 16), (5, 1, 5, 8)):
        sizes = []

        def peak(size, base=base, per=per):
            sizes.append(size)
            return base + per * size

        size, each = cpu_batch_within(peak, budget, limit)
        best = max([s for s in range(1, limit + 1) if base + per * s <= budget], default=0)
        # the bytes per example: the slope, or what one example takes when even one does not fit
        assert (size, each) == (best, per if best else base + per), (base, per, budget, limit)
        assert len(sizes) <= 4 and max(sizes) <= max(best, 2)  # a handful of runs, none larger than the answer


def test_cpu_batch_within_lowers_a_prediction_that_does_not_fit():
    from compute.run.dispatch import cpu_batch_within

    def peak(size):  # grows faster than the line through 1 and 2 predicts (attention is quadratic in memory)
        return 10 * size + (size * size if size > 2 else 0)

    size, _ = cpu_batch_within(peak, 400, 1024)
    # 40 predicted, lowered by quarters (30, 22, 16: 416 > 400) to 12: within a quarter of the best, 15 (375)
    assert size == 12 and peak(size) <= 400


def test_peak_bytes_measures_what_the_work_holds():
    from compute import memory

    if not memory.can_measure():
        pytest.skip("no /proc/self/clear_refs here")

    def hold(mb):
        x = torch.ones(mb << 18)  # mb MB of float32
        return float(x[-1])

    measured = memory.peak_bytes(lambda: hold(200))
    assert 190 << 20 <= measured <= 260 << 20
    assert memory.peak_bytes(lambda: None) < 20 << 20


def test_batch_memory_mb_sizes_the_batch_and_records_how(tiny_model_dirs, tmp_path):
    data = write_rows(tmp_path / "d.jsonl", 30)
    run = ("--model", tiny_model_dirs["bert"], "--device", "cpu", "--methods", "rollout,alti", "-q",
           "--batch-size", "auto")
    ok(invoke("run", data, "-o", tmp_path / "a.h5", *run, "--batch-memory-mb", "2000"))
    with open_store(tmp_path / "a.h5") as s:
        used = s.config["batch_size"]
        assert used["asked"] == "auto" and used["used"] == 30 and "within 2000 MB" in used["how"]
    line = one_line(invoke("run", data, "-o", tmp_path / "b.h5", *run, "--batch-memory-mb", "0"), code=2)
    assert "--batch-memory-mb must be at least 1" in line
    assert not (tmp_path / "b.h5").exists()
