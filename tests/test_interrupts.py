"""Stopping attr-compute and attr-compute eval when asked (compute.interrupts): the stop flag and its safe points in
process, then real processes stopped with SIGINT and SIGTERM in the middle of a long method or metric, resumed, and
compared with uninterrupted runs."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from compute import interrupts
from cli_results import invoke, ok
from store import StoreError, open_store

REPO = Path(__file__).resolve().parents[1]
WORDS = "the movie was great but long and boring film good bad not very a plot story loved hated fun dull".split()
STOP_WITHIN = 5.0  # seconds from the signal to the end of the process

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _keep_handlers():
    """In-process runs install their own handlers; give this process its own back after each test."""
    before = {sig: signal.getsignal(sig) for sig in interrupts.SIGNALS}
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)



# --- the flag and its safe points, in process ------------------------------------------------------------------------


def test_first_signal_waits_for_a_check_second_stops_at_once():
    before = signal.getsignal(signal.SIGINT)
    with interrupts.on_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # the handler runs; nothing is raised
        with pytest.raises(interrupts.Interrupted):
            interrupts.check()
        with pytest.raises(interrupts.Interrupted):  # the second signal raises where it lands
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    interrupts.check()  # outside the run: nothing pending, the handlers restored
    assert signal.getsignal(signal.SIGINT) is before


def test_a_commit_is_never_cut():
    with interrupts.on_signals():
        with interrupts.critical():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            finished = True  # even the second signal waits for the end of the section
        assert finished
        with pytest.raises(interrupts.Interrupted):
            interrupts.check()


def test_every_encoder_layer_checks_in_forward_only():
    from conftest import random_batch, tiny_model

    model = tiny_model("bert")
    batch = random_batch("bert", [6, 4])
    layers = model.bert.encoder.layer
    with interrupts.on_signals(), interrupts.layer_checks(layers):
        ran = []
        layers[1].register_forward_pre_hook(lambda m, a: ran.append(1))
        X = model.bert.embeddings(batch["input_ids"]).detach().requires_grad_(True)
        logits = model(inputs_embeds=X, attention_mask=batch["attention_mask"]).logits
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        (g,) = torch.autograd.grad(logits.sum(), X)  # the backward runs no forward hook: it finishes
        assert torch.isfinite(g).all()
        with pytest.raises(interrupts.Interrupted):
            model(**batch)
        assert ran == [1]  # stopped at the first layer of the second forward, before layer 2
    with torch.no_grad():  # the hooks are gone with the run
        model(**batch)
    assert all(not layer._forward_pre_hooks for layer in layers[:1])


@pytest.mark.parametrize("method,where", [("ig_l2", "integrated_gradients"), ("alti", "dense_l1_proximities"),
                                          ("transatt", "propagate"), ("norm_res", "over_layers")])
def test_safe_points_inside_methods(method, where):
    """A stop asked for while a method runs ends it at its own safe point (the deepest frame that raised is in the
    method's loop: IG chunks, ALTI source blocks, LRP layers, groups of layers), not at the next batch."""
    from compute.adapters import adapter_for
    from compute.methods import get_method
    from conftest import MASK_ID, random_batch, tiny_model

    model = tiny_model("bert")
    ad = adapter_for(model)
    ad.mask_token_id = MASK_ID
    m = get_method(method, **({"memory_mb": 1} if method == "alti" else {}))
    batch = random_batch("bert", [9, 5])
    with torch.no_grad():
        cap = ad.capture(batch, m.needs)
    if method == "transatt":  # its gradient pass (forward and backward) is done; the relevance pass remains
        from compute.methods._internals.gradients import gradient_pass

        gradient_pass(cap, ad, m.spec).grads(cap.pred)
    with interrupts.on_signals():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        with pytest.raises(interrupts.Interrupted) as info:
            if method == "alti":  # one layer's matrix: past the check between layers, into the source blocks
                m.layer_matrix(cap, ad, 0)
            else:
                m.compute(cap, ad, cap.pred)
    frames = [f.name for f in info.traceback]
    assert frames[-1] == "check" and frames[-2] == where, frames


def test_metric_batches_check():
    from compute.evaluate import ModelPredictor
    from conftest import tiny_model

    predictor = ModelPredictor(tiny_model("bert"), pad_id=0, batch_size=2)
    sequences = [np.arange(2, 9 + i) for i in range(6)]
    assert predictor(sequences[:2]).shape == (2, 2)
    with interrupts.on_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
        with pytest.raises(interrupts.Interrupted):
            predictor(sequences)
    assert predictor.forwarded == 2  # no new batch ran


# --- real processes -------------------------------------------------------------------------------------------------


def _env() -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONUNBUFFERED="1", COLUMNS="200", PYTHONPATH=str(REPO))
    return env


class Proc:
    """``python -m compute.cli ARGS`` in a real process, its output in a file."""

    def __init__(self, args: list, log: Path):
        self.args = [str(a) for a in args]
        self.log = open(log, "w+")
        self.p = subprocess.Popen([sys.executable, "-m", "compute.cli", *self.args], stdout=self.log,
                                  stderr=subprocess.STDOUT, text=True, cwd=log.parent, env=_env())

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def wait_for(self, ready, what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                raise AssertionError(f"ended (rc {self.p.returncode}) before {what}: {self.output()[-2000:]}")
            if ready():
                return
            time.sleep(0.02)
        self.p.kill()
        raise AssertionError(f"no {what} after {timeout} s")

    def stop(self, sig) -> tuple[int, float, str]:
        """Send ``sig``; (exit code, seconds until the process ended, its output)."""
        t0 = time.monotonic()
        self.p.send_signal(sig)
        try:
            self.p.wait(timeout=30)
        finally:
            if self.p.poll() is None:
                self.p.kill()
                self.p.wait()
        seconds = time.monotonic() - t0
        self.log.close()
        return self.p.returncode, seconds, Path(self.log.name).read_text()


def committed(out: Path) -> int:
    try:
        with open_store(out) as s:
            return len(s)
    except StoreError:  # not created yet
        return 0


def error_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("attr-compute: error: interrupted"), output[-2000:]
    assert "Traceback" not in output, output[-3000:]
    return lines[-1]


# A run whose first window (8 short rows, batch size 1) commits in a few seconds and whose next examples, long ones,
# keep integrated gradients busy for seconds: the signal lands inside the method (test_safe_points_inside_methods
# shows, independently of timing, that the methods stop there).
IG = ["--methods", "ig_l2,rollout", "--ig-steps", "600", "--batch-size", "1", "--device", "cpu", "-q"]
N_SHORT = 8


@pytest.fixture(scope="module")
def ig_data(tiny_model_dirs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ig")
    rows = [{"id": f"s{i}", "text": " ".join(WORDS[(i + k) % 20] for k in range(2 + i % 3)), "label": i % 2}
            for i in range(N_SHORT)]
    rows += [{"id": f"long{i}", "text": " ".join(WORDS[(i + k) % 20] for k in range(60)), "label": 1} for i in range(3)]
    data = tmp / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = tiny_model_dirs["bert"]
    reference = tmp / "reference.h5"
    ok(invoke("run", data, "--model", model, "-o", reference, *IG))
    return {"data": data, "model": model, "reference": reference, "n": len(rows)}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_run_stops_inside_a_long_method_and_resumes(ig_data, tmp_path, sig):
    out = tmp_path / "run.h5"
    args = ["run", ig_data["data"], "--model", ig_data["model"], "-o", out, *IG, "--overwrite"]
    proc = Proc(args, tmp_path / "run.log")
    proc.wait_for(lambda: committed(out) >= N_SHORT, "first window committed")
    rc, seconds, output = proc.stop(sig)
    assert rc == 130, output[-2000:]
    assert seconds < STOP_WITHIN, seconds
    line = error_line(output)
    assert f"store '{out}' keeps its {N_SHORT} of {ig_data['n']} examples" in line, line
    # the resume line is the same command with --resume instead of --overwrite
    command = shlex.split(line.split("finish it with: ", 1)[1])
    assert command == ["attr-compute", *[str(a) for a in args if a != "--overwrite"], "--resume"]
    with open_store(out) as s:
        assert len(s) == N_SHORT and not s.complete
        assert [e.id for e in s] == [f"s{i}" for i in range(N_SHORT)]

    ok(invoke(*command[1:]))
    with open_store(out) as s, open_store(ig_data["reference"]) as ref:
        assert s.complete and len(s) == len(ref) == ig_data["n"]
        assert s.summary["resumed_from"] == N_SHORT
        for a, b in zip(s, ref):
            assert (a.id, a.tokens, a.pred, a.target) == (b.id, b.tokens, b.pred, b.target)
            np.testing.assert_array_equal(a.probs, b.probs)
            for m in ("ig_l2", "rollout"):
                np.testing.assert_allclose(a.scores(m), b.scores(m), rtol=1e-6, atol=1e-9, err_msg=f"{m} {a.id}")
            np.testing.assert_allclose(a.example_values("ig_l2")["ig_delta"], b.example_values("ig_l2")["ig_delta"],
                                       rtol=1e-6, atol=1e-9)


# An eval whose first result (spearman, no model) is quick and whose second (aopc, one perturbed sequence per forward
# over a few hundred examples, about 7 s) is not: the signal lands inside the metric.
N_EVAL = 300
EVAL = ["--metrics", "spearman,aopc", "--methods", "norm", "--saliency", "norm", "--metric-batch-size", "1",
        "--device", "cpu"]


def with_word_tokens(model_dir: Path, path: Path) -> Path:
    """A copy of a tiny model directory whose tokenizer knows its words. (conftest's tokenizer passes vocab_file=,
    which transformers 5 ignores: every word is [UNK] there, and all perturbed sequences of a length would be one.)"""
    from transformers import BertTokenizerFast

    shutil.copytree(model_dir, path)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (path / name).unlink(missing_ok=True)
    words = (path / "vocab.txt").read_text().splitlines()
    BertTokenizerFast(vocab={w: i for i, w in enumerate(words)}, do_lower_case=True).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def eval_stores(tiny_model_dirs, tmp_path_factory):
    import random

    tmp = tmp_path_factory.mktemp("eval")
    model = with_word_tokens(tiny_model_dirs["bert"], tmp / "model")
    rng = random.Random(0)
    data = tmp / "d.jsonl"
    data.write_text("".join(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(40 + i % 20)),
                                        "label": i % 2}) + "\n" for i in range(N_EVAL)))
    plain = tmp / "plain.h5"
    ok(invoke("run", data, "--model", model, "-o", plain, "--methods", "norm,rollout", "--device", "cpu", "-q"))
    reference = tmp / "reference.h5"
    shutil.copy(plain, reference)
    ok(invoke("eval", reference, *EVAL, "-q"))
    return {"plain": plain, "reference": reference}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_eval_stops_inside_a_metric_keeps_the_finished_ones(eval_stores, tmp_path, sig):
    out = tmp_path / "e.h5"
    shutil.copy(eval_stores["plain"], out)
    args = ["eval", out, *EVAL]
    proc = Proc(args, tmp_path / "eval.log")
    proc.wait_for(lambda: "metric norm/spearman: done" in proc.output(), "the first metric finished")
    rc, seconds, output = proc.stop(sig)
    assert rc == 130, output[-2000:]
    assert seconds < STOP_WITHIN, seconds
    line = error_line(output)
    assert "1 of 2 metric results were finished and written (norm/spearman)" in line, line
    assert f"store '{out}' stays valid" in line
    command = shlex.split(line.split("compute the rest with: ", 1)[1])
    assert command == ["attr-compute", *[str(a) for a in args]]
    with open_store(out) as s, open_store(eval_stores["reference"]) as ref:
        assert s.complete and s.metric_methods == ["norm"]
        assert list(s.metrics("norm")) == ["spearman"]
        np.testing.assert_array_equal(s.metrics("norm")["spearman"], ref.metrics("norm")["spearman"])
        for i in (0, len(s) - 1):  # the examples are untouched
            np.testing.assert_array_equal(s[i].scores("norm"), ref[i].scores("norm"))

    ok(invoke(*command[1:], "-q"))
    with open_store(out) as s, open_store(eval_stores["reference"]) as ref:
        assert sorted(s.metrics("norm")) == ["aopc", "spearman"]
        for k in ("aopc", "spearman"):
            np.testing.assert_array_equal(s.metrics("norm")[k], ref.metrics("norm")[k])


# The run's summary printed by a process that signals itself while printing it, once or twice: every stop after the
# store is complete says so (exit 130), never "nothing was written", never a silent kill.
_SIGNAL_IN_SUMMARY = """
import os, signal, sys, time
import compute.ui

SIG, TIMES = int(sys.argv[1]), int(sys.argv[2])

def summary_then_signals(summary):
    print("summary begins", flush=True)
    for _ in range(TIMES):
        os.kill(os.getpid(), SIG)
        time.sleep(0.2)
    print("summary ends", flush=True)

compute.ui.print_summary = summary_then_signals
from compute.cli import main
sys.argv = ["attr-compute", *sys.argv[3:]]
main()
"""


@pytest.mark.parametrize("sig,times", [(signal.SIGINT, 2), (signal.SIGTERM, 2), (signal.SIGTERM, 1)],
                         ids=["SIGINT-twice", "SIGTERM-twice", "SIGTERM-once"])
def test_a_stop_during_the_final_summary_says_the_store_is_complete(ig_data, tmp_path, sig, times):
    out = tmp_path / "run.h5"
    args = [ig_data["data"], "--model", ig_data["model"], "-o", out, "--methods", "rollout", "--device", "cpu"]
    p = subprocess.run([sys.executable, "-c", _SIGNAL_IN_SUMMARY, str(int(sig)), str(times), *map(str, args)],
                       capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=120)
    assert p.returncode == 130, (p.returncode, p.stdout[-1000:], p.stderr[-2000:])
    assert "summary begins" in p.stdout and "Traceback" not in p.stderr, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert lines[-1] == f"attr-compute: error: interrupted after the run finished: store '{out}' is already complete", lines
    with open_store(out) as s:
        assert s.complete and len(s) == ig_data["n"]


def test_a_stop_while_eval_prints_its_table_says_the_metrics_are_kept(eval_stores, tmp_path):
    out = tmp_path / "e.h5"
    shutil.copy(eval_stores["plain"], out)
    code = _SIGNAL_IN_SUMMARY.replace("compute.ui.print_summary = summary_then_signals",
                                      "import compute.cli\ncompute.cli._metrics_table = lambda *a: summary_then_signals(a)")
    p = subprocess.run([sys.executable, "-c", code, str(int(signal.SIGTERM)), "2", "eval", str(out),
                        "--metrics", "sufficiency", "--device", "cpu"],
                       capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=120)
    assert p.returncode == 130 and "summary begins" in p.stdout, (p.returncode, p.stdout[-1000:], p.stderr[-2000:])
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert lines[-1] == f"attr-compute: error: interrupted after eval finished: store '{out}' holds every metric asked for"
    with open_store(out) as s:
        assert "sufficiency" in s.metric_names(s.metric_methods[0])
