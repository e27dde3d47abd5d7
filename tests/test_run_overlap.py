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
    """Every dataset of a store but the provenance and the digests, by path. The digests follow the data's bytes,
    which within a tolerance may differ: each store's own are checked against its data (verify)."""
    import h5py

    from store import open_store, verify

    with open_store(path) as s:
        verify(s)
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    out.pop("provenance", None)
    out.pop("examples/digests")
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
    real, tried, sizes = runner.launch_batch, set(), []

    def first_attempt_fails(lm, methods, enc, *args, **kwargs):
        key = tuple(enc["input_ids"].shape)
        sizes.append(key[0])
        if key[0] > 1 and key not in tried:  # the first attempt of every batch of two or more runs out of memory
            tried.add(key)
            raise error
        return real(lm, methods, enc, *args, **kwargs)

    monkeypatch.setattr(runner, "launch_batch", first_attempt_fails)
    out = tmp_path / "split.h5"
    ok(invoke("run", data, "--model", tiny_model_dirs["bert"], "-o", out, *OOM_RUN))
    # every batch of two or more failed at first and was retried in halves, down to ones
    assert max(sizes) >= 3 and all((s + 1) // 2 in sizes for s in sizes if s > 1) and 1 in sizes
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

    def never_fits(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(runner, "launch_batch", never_fits)
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


# --- --batch-size auto on CUDA: the memory model, on a fake device ---------------------------------------------------
GB = 2**30


class FakeGPU:
    """Allocations of a fake device, as torch.cuda's allocator would count them. Per stage (the forward pass, each
    method): bytes kept per example once it is done (the capture, a result) and bytes it holds while it runs
    (``fixed`` + ``each`` per example of what it runs on; a stage in ``grows`` = (k, extra) holds ``extra`` more
    per example beyond k examples: a chunk budget that trial batches do not reach). A method whose cost grows
    faster than n runs on parts of ``part_tokens[name] // n`` examples, each on a copy of the part's capture. Out of
    memory above ``capacity``."""

    def __init__(self, capacity, stages, heavy=(), grows=None, base=1 * GB, n=40):
        self.capacity, self.stages, self.heavy, self.grows = capacity, stages, heavy, grows or {}
        self.base, self.n = base, n
        self.alloc = self.top = base
        self.runs = []  # (batch size, {stage: examples it ran on at once})

    # DeviceMemory's readings
    def reset_peak(self):
        self.top = self.alloc

    def allocated(self):
        return self.alloc

    def peak(self):
        return self.top

    def limit(self):
        return self.capacity

    def total(self):
        return self.capacity

    def run(self, size, part_tokens=None, probe=None):
        from compute.run.dispatch import Probe

        probe = probe or Probe()
        self.alloc, self.top, ran = self.base, self.base, {}
        self.runs.append((size, ran))
        capture = self.stages["forward"][0]
        for stage, (kept, fixed, each) in self.stages.items():
            probe.begin(stage)
            b = min(size, part_tokens[stage] // self.n) if part_tokens and stage in part_tokens else size
            ran[stage] = b
            held = fixed + each * b + (capture * b if b < size else 0)
            if stage in self.grows and b > self.grows[stage][0]:
                held += self.grows[stage][1] * (b - self.grows[stage][0])
            self.top = max(self.top, self.alloc + held)
            if self.top > self.capacity:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory")
            self.alloc += kept * size
            probe.end(stage)


class FakeMethod:
    def __init__(self, exponent=1, declared=0):
        self.cost_exponent, self.params, self._declared = exponent, {}, declared

    def memory_per_example(self, shape, params):
        return self._declared


MB = 2**20
STAGES = {"forward": (10 * MB, 0, 20 * MB), "rollout": (1 * MB, 0, 30 * MB), "decompx": (1 * MB, 64 * MB, 200 * MB),
          "grad_l2": (1 * MB, 0, 50 * MB)}
SHAPE = None


def cuda_batching(gpu, methods, limit=1024, tokens_asked=None):
    from compute.methods._internals.base import Shape
    from compute.run.auto_batch import cuda_batching

    return cuda_batching(gpu.run, gpu, methods, Shape(n=gpu.n, layers=12, heads=12, d=768, d_ff=3072), limit,
                         tokens_asked, "cuda:0")


def test_auto_on_cuda_models_memory_from_two_trials_and_confirms_once():
    gpu = FakeGPU(40 * GB, STAGES, heavy={"decompx"})
    methods = {"rollout": FakeMethod(), "decompx": FakeMethod(exponent=2), "grad_l2": FakeMethod()}
    got = cuda_batching(gpu, methods)
    # grad_l2 runs last: 1 GB + 12 MB kept per example by the stages before it + its own 50 MB per example
    best = (40 * GB - 1 * GB) // (62 * MB)
    assert [size for size, _ in gpu.runs] == [1, 2, best]  # two trials and one confirming batch
    # decompx runs on parts of at most AUTO_PART_TOKENS // n = 204 examples, never on the whole batch
    assert got.size == 1024 and got.tokens == best * 40
    confirm = gpu.runs[-1][1]
    assert confirm["rollout"] == confirm["grad_l2"] == best and confirm["decompx"] == got.part_tokens["decompx"] // 40
    assert max(ran["decompx"] for _, ran in gpu.runs) <= 8192 // 40
    assert "from trial batches of 1 and 2, confirmed" in got.how


@pytest.mark.parametrize("capacity_gb", [4, 9, 20])
def test_auto_on_cuda_picks_the_largest_batch_the_model_lets_fit_and_it_fits(capacity_gb):
    gpu = FakeGPU(capacity_gb * GB, STAGES, heavy={"decompx"})
    methods = {"rollout": FakeMethod(), "decompx": FakeMethod(exponent=2), "grad_l2": FakeMethod()}
    got = cuda_batching(gpu, methods)
    size, part = got.tokens // gpu.n, got.part_tokens["decompx"] // gpu.n
    assert len(gpu.runs) == 3 and gpu.runs[-1][0] == size  # the confirming batch was the one chosen, and it fit

    def fits(b, p):
        try:
            FakeGPU(capacity_gb * GB, STAGES, heavy={"decompx"}).run(b, {"decompx": p * gpu.n})
            return True
        except torch.cuda.OutOfMemoryError:
            return False

    # the largest batch (its light stages are exactly linear, so the model is exact) and the largest part beside it
    assert fits(size, part) and not fits(size + 1, 1)
    assert part == min(size, 8192 // gpu.n) or not fits(size, part + 1)


def test_auto_on_cuda_plans_with_a_declared_slope_the_trials_cannot_see_and_lowers_a_batch_that_does_not_fit():
    # decompx's chunk holds the same memory for 1 and 2 examples; beyond 2 it grows 200 MB per example
    stages = {**STAGES, "decompx": (1 * MB, 64 * MB, 0)}
    methods = {"rollout": FakeMethod(), "decompx": FakeMethod(exponent=2, declared=200 * MB), "grad_l2": FakeMethod()}
    gpu = FakeGPU(12 * GB, stages, grows={"decompx": (2, 200 * MB)})
    declared = cuda_batching(gpu, methods)
    assert len(gpu.runs) == 3 and gpu.runs[-1][1]["decompx"] > 2  # the declared slope planned a part that fits
    undeclared = FakeGPU(12 * GB, stages, grows={"decompx": (2, 200 * MB)})
    cuda_batching(undeclared, {**methods, "decompx": FakeMethod(exponent=2)})
    assert len(undeclared.runs) > 3  # without it the first confirming batch ran out of memory

    # undeclared, a growth the trials do not see makes the confirming batch run out of memory: lowered by quarters
    blind = FakeGPU(20 * GB, stages, grows={"grad_l2": (2, 50 * MB)})
    got = cuda_batching(blind, {"rollout": FakeMethod(), "decompx": FakeMethod(exponent=2), "grad_l2": FakeMethod()})
    sizes = [size for size, _ in blind.runs]
    assert sizes[:2] == [1, 2] and len(sizes) >= 4 and all(b == a * 3 // 4 for a, b in zip(sizes[2:], sizes[3:]))
    assert got.tokens // blind.n == sizes[-1] and declared.tokens // gpu.n > 2


def test_auto_on_cuda_honours_batch_tokens_and_one_example():
    gpu = FakeGPU(40 * GB, STAGES)
    methods = {"rollout": FakeMethod(), "decompx": FakeMethod(exponent=2), "grad_l2": FakeMethod()}
    got = cuda_batching(gpu, methods, tokens_asked=4000)
    assert got.tokens == 100 * 40 and gpu.runs[-1][0] == 100  # --batch-tokens 4000: at most 100 of 40 tokens
    one = FakeGPU(40 * GB, STAGES)
    got = cuda_batching(one, methods, limit=1)
    assert [size for size, _ in one.runs] == [1] and (got.size, got.tokens) == (1, 40)
    tiny = FakeGPU(1 * GB + 5 * MB, STAGES)
    with pytest.raises(Exception, match="out of memory on a single example of 40 tokens"):
        cuda_batching(tiny, methods)


def test_auto_batching_runs_copies_of_the_longest_example_on_cuda(monkeypatch):
    """The wiring without a GPU: a fake model on a 'cuda' device; launch_batch drives the fake device's memory."""
    from types import SimpleNamespace

    import compute.run.auto_batch as auto_batch
    from compute.run.batches import Tokenized
    from compute.tasks import TaskRows

    lengths = [5, 40, 12, 40, 7] * 100  # 500 examples, the longest 40 tokens
    tok = Tokenized([[1] * n for n in lengths], None, None, [[0] * n for n in lengths], lengths)
    cuda = torch.device("cuda")
    config = SimpleNamespace(hidden_size=32, intermediate_size=64, vocab_size=120)
    lm = SimpleNamespace(model=SimpleNamespace(parameters=lambda: iter([SimpleNamespace(device=cuda,
                                                                                          dtype=torch.float32)]),
                                               config=config),
                         tokenizer=SimpleNamespace(pad_token_id=0),
                         adapter=SimpleNamespace(n_layers=3, n_heads=4, n_kv_heads=4, decoder=False))
    gpu, seen = FakeGPU(40 * GB, {"forward": STAGES["forward"], "rollout": STAGES["rollout"]}), []

    def fake_launch(lm, methods, rows, task_rows, target_mode, num_labels, keep, timings, lengths, parts, probe,
                    first_part_only, heads="none"):
        assert first_part_only == (parts is not None)  # the confirming batch runs one part of each part-wise method
        seen.append((rows, lengths))
        gpu.run(len(rows), parts, probe)
        return SimpleNamespace(result=lambda: None)

    monkeypatch.setattr(auto_batch, "encode", lambda tok, rows, pad_id, device: list(rows))
    monkeypatch.setattr(auto_batch, "launch_batch", fake_launch)
    got = auto_batch.auto_batching(lm, {"rollout": FakeMethod()}, tok, TaskRows.plain([0] * len(lengths)),
                                   "predicted", 2, True, 8192, None, memory=gpu)
    assert all(set(rows) == {1} and set(lengths) == {40} for rows, lengths in seen)  # the (first) longest
    assert got.size == 500 and got.tokens == 500 * 40 and "40 tokens" in got.how


def test_batch_size_auto_on_cpu_is_the_fixed_default_and_recorded(tiny_model_dirs, tmp_path):
    data = write_rows(tmp_path / "d.jsonl", 5)
    out = tmp_path / "o.h5"
    ok(invoke("run", data, "--model", tiny_model_dirs["bert"], "-o", out, "--device", "cpu", "--methods", "rollout",
              "--batch-size", "auto", "-q"))
    with open_store(out) as s:
        assert s.config["batch_size"] == {"asked": "auto", "used": 32, "tokens": 8192, "part_tokens": {},
                                          "how": "fixed on cpu"}
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
    import compute.run.auto_batch as auto_batch
    import compute.runner as runner

    data = write_rows(tmp_path / "d.jsonl", 30)
    run = ("--model", tiny_model_dirs["bert"], "--device", "cpu", "--methods", "rollout,norm", "-q")
    fixed = tmp_path / "fixed.h5"
    ok(invoke("run", data, "-o", fixed, *run, "--batch-size", 3))

    out = tmp_path / "auto.h5"
    monkeypatch.setattr(auto_batch, "CPU_AUTO_BATCH_SIZE", 3)  # auto finds 3 this time (on CUDA: the free memory)
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
    monkeypatch.setattr(auto_batch, "CPU_AUTO_BATCH_SIZE", 5)  # now auto would find another size
    sizes, batches = [], runner.batches
    monkeypatch.setattr(runner, "batches",
                        lambda lengths, size, *rest: (sizes.append(size), batches(lengths, size, *rest))[1])
    ok(invoke("run", data, "-o", out, *run, "--batch-size", "auto", "--resume"))
    assert set(sizes) == {3}
    a, b = stored_arrays(fixed), stored_arrays(out)
    assert a.keys() == b.keys()
    for name in a:  # as bytes: the index's NaN fields (gold_value of a classifier) equal themselves
        assert a[name].dtype == b[name].dtype and a[name].tobytes() == b[name].tobytes(), name


# --- --batch-size auto on the CPU with --batch-memory-mb -----------------------------------------------------------
def test_cpu_batch_within_finds_the_largest_batch_of_a_linear_memory_cost():
    from compute.run.auto_batch import cpu_batch_within

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
    from compute.run.auto_batch import cpu_batch_within

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


# --- --batch-tokens ------------------------------------------------------------------------------------------------
def test_batch_tokens_bounds_every_batch_is_recorded_and_is_part_of_the_resume_identity(tiny_model_dirs, tmp_path,
                                                                                      monkeypatch):
    import compute.runner as runner

    data = write_rows(tmp_path / "d.jsonl", 30)
    shapes, real = [], runner.launch_batch

    def spy(lm, methods, enc, *args, **kwargs):
        shapes.append(tuple(enc["input_ids"].shape))
        return real(lm, methods, enc, *args, **kwargs)

    monkeypatch.setattr(runner, "launch_batch", spy)
    out = tmp_path / "o.h5"
    run = ("--model", tiny_model_dirs["bert"], "--device", "cpu", "--methods", "rollout,alti", "-q", "--batch-size", 8)
    ok(invoke("run", data, "-o", out, *run, "--batch-tokens", 24))
    assert all(b * n <= 24 or b == 1 for b, n in shapes) and max(b for b, _ in shapes) > 1
    assert sum(b for b, _ in shapes) == 30
    with open_store(out) as s:
        assert s.config["batch_size"]["tokens"] == 24 and s.config["config"]["batch_tokens"] == 24
    line = one_line(invoke("run", data, "-o", out, *run, "--batch-tokens", 48, "--resume"))
    assert "--batch-tokens 24" in line
