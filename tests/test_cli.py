"""Tests for ``attr-compute`` (compute.cli): real runs on tiny models, one-line errors, interrupts and --resume.

Runs use click's CliRunner on ``compute.cli.main`` in this process; a real process (``python -m compute.cli``) is
used where one is needed: killing a run, signals, tracebacks with --debug.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cli_results import invoke, ok
from store import StoreError, open_store

REPO = Path(__file__).resolve().parents[1]
from compute.methods import REGISTRY  # noqa: E402

# What --methods all (the default) computes where no dependency parser is installed (CI): everything but mask_lrp,
# which needs parses for its head statistics (tests/test_head_pass.py runs it).
METHODS = tuple(n for n in REGISTRY if n != "mask_lrp")
LAYER_VIEW_METHODS = tuple(n for n, m in REGISTRY.items() if m.has_layer_views)
MATRIX_METHODS = tuple(n for n, m in REGISTRY.items() if m.has_matrices)
CLASS_METHODS = tuple(n for n, m in REGISTRY.items() if m.class_specific and n in METHODS)
# The interrupt/resume tests exercise the store, not the methods: the cheap ones keep them fast.
LIGHT = ("raw_attention", "rollout", "norm", "logat", "normxlogit")
N_LAYERS = 3  # of the tiny models in conftest
WINDOW = 8  # RunConfig.window: batches per commit

VOCAB_WORDS = ("the movie was great but long and boring film good bad not very a i it is this acting plot story "
               "loved hated fun dull slow").split()

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True, scope="module")
def _no_parser():
    """The same machine as CI whether or not spaCy is installed here (module scope: before the shared runs)."""
    import compute.parses as parses

    def missing():
        raise parses.AttrscopeError(parses.SPACY_HINT)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parses, "_load_spacy", missing)
        yield


@pytest.fixture(autouse=True)
def _keep_sigterm():
    """``attr-compute run`` installs a SIGTERM handler; give this process its own back after each test."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


# --- helpers --------------------------------------------------------------------------------------------------------


def sentence(i: int, n_words: int) -> str:
    words = [VOCAB_WORDS[(i * 7 + 3 * k) % len(VOCAB_WORDS)] for k in range(n_words)]
    return " ".join(words) + ("!" if i % 3 == 0 else ".")


def write_jsonl(path: Path, n: int, lengths=None, ids: bool = True) -> list[dict]:
    """``n`` labelled rows of varied (unsorted) lengths."""
    lengths = lengths or (lambda i: 1 + (i * 7) % 11)
    rows = []
    for i in range(n):
        row = {"text": sentence(i, lengths(i)), "label": (i * 5) % 3 % 2}
        if ids:
            row = {"id": f"s-{i}", **row}
        rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return rows



def compute(data, model, out, *extra):
    """A successful in-process run; returns the click Result. Every method (--methods all: what this module's
    checks of the stored arrays cover) unless ``extra`` names the methods."""
    if "--methods" not in extra:
        extra = (*extra, "--methods", "all")
    res = invoke("run", data, "--model", model, "-o", out, "--device", "cpu", *extra)
    assert res.exit_code == 0, (res.exit_code, res.stderr, res.exception)
    return res


def error_line(stderr: str) -> str:
    """stderr of a failed command: exactly one non-empty line, the error, without a traceback."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("attr-compute: error:"), stderr
    assert "Traceback" not in stderr
    return lines[0]


def check_example(ex, methods=METHODS, matrices="cls", n_layers=N_LAYERS, num_labels=2) -> None:
    """Every per-token array of a stored example is aligned with its tokens."""
    n = ex.n_tokens
    assert n >= 2 and len(ex.tokens) == n and len(ex.token_ids) == n
    assert ex.spans.shape == (n, 2) and len(ex.segment) == n
    assert ex.text
    assert ex.probs.shape == (num_labels,)
    for m in methods:
        assert ex.scores(m).shape == (n,), m
        ls = ex.layer_scores(m)
        if m in LAYER_VIEW_METHODS:
            assert ls.shape == (n_layers, n), m
        else:
            assert ls is None
        mat = ex.matrices(m)
        if m in MATRIX_METHODS and matrices == "all":
            assert mat.shape == (n_layers, n, n), m
        elif m in MATRIX_METHODS and matrices == "cls":
            assert mat.shape == (n_layers, 1, n), m
        else:
            assert mat is None, m


def model_outputs(model_dir: Path, token_ids: list[np.ndarray]):
    """The model's own probabilities for the stored tokens, one unpadded example at a time (plain transformers)."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, attn_implementation="eager").eval()
    probs = []
    with torch.no_grad():
        for ids in token_ids:
            t = torch.as_tensor(np.asarray(ids, dtype=np.int64))[None]
            probs.append(torch.softmax(model(input_ids=t, attention_mask=torch.ones_like(t)).logits[0], -1).numpy())
    return np.stack(probs)


# --- successful runs ------------------------------------------------------------------------------------------------

N_ROWS = 20


@pytest.fixture(scope="module", params=["bert", "distilbert"])
def default_run(request, tiny_model_dirs, tmp_path_factory):
    """One run with every method (compute) and the default matrices (cls), --batch-size 2 so windows are
    length-sorted."""
    arch = request.param
    tmp = tmp_path_factory.mktemp(f"run-{arch}")
    rows = write_jsonl(tmp / "data.jsonl", N_ROWS)
    out = tmp / "out.h5"
    res = compute(tmp / "data.jsonl", tiny_model_dirs[arch], out, "--batch-size", 2)
    return {"arch": arch, "model": tiny_model_dirs[arch], "rows": rows, "out": out, "result": res, "tmp": tmp}


def test_run_succeeds_and_reports(default_run):
    res, out = default_run["result"], default_run["out"]
    assert res.exit_code == 0
    assert "Traceback" not in res.stderr
    flat = "".join(res.stderr.split())  # rich may wrap long paths
    assert "attr-tui" in res.stderr and out.name in flat  # the summary says where the store is and what opens it
    with open_store(out) as s:
        assert len(s) == N_ROWS and s.complete
        assert s.methods == list(METHODS)
        assert s.n_layers == N_LAYERS and s.labels == {0: "negative", 1: "positive"}
        assert s.summary["examples"] == N_ROWS and s.summary["examples_this_run"] == N_ROWS
        assert s.config["config"]["methods"] == list(METHODS)


def test_default_methods_are_the_missions_and_skip_silently(tiny_model_dirs, tmp_path):
    """Issue 38.13: without --methods a run computes the mission's methods (ALTI, GlobEnc, AttCAT, Mask-LRP,
    NormXLogit), and where no dependency parser is installed leaves mask_lrp out without a word: nobody asked for it.
    --methods all still says what it skips."""
    from compute.methods import DEFAULT_METHODS

    assert DEFAULT_METHODS == ("alti", "globenc", "attcat", "mask_lrp", "normxlogit")
    write_jsonl(tmp_path / "d.jsonl", 4)
    res = ok(invoke("run", tmp_path / "d.jsonl", "--model", tiny_model_dirs["bert"], "-o", tmp_path / "o.h5",
                    "--device", "cpu"))
    assert "skipping" not in res.stderr and "mask_lrp" not in res.stderr, res.stderr
    with open_store(tmp_path / "o.h5") as s:
        assert s.methods == ["alti", "globenc", "attcat", "normxlogit"]
    res = compute(tmp_path / "d.jsonl", tiny_model_dirs["bert"], tmp_path / "all.h5", "--methods", "all",
                  "--limit", 1)
    assert "--methods all: skipping mask_lrp" in res.stderr


def test_run_keeps_dataset_order(default_run):
    rows = default_run["rows"]
    # the first window (2 x 8 rows) really is unsorted by length, so the runner had to restore the order
    first = [len(r["text"].split()) for r in rows[: 2 * WINDOW]]
    assert first != sorted(first, reverse=True) and first != sorted(first)
    with open_store(default_run["out"]) as s:
        assert [e.row for e in s] == list(range(N_ROWS))
        assert s.ids() == [r["id"] for r in rows]
        assert [e.text for e in s] == [r["text"] for r in rows]
        assert [e.label for e in s] == [r["label"] for r in rows]


def test_run_arrays_aligned_with_tokens(default_run):
    with open_store(default_run["out"]) as s:
        for ex in s:
            check_example(ex, matrices="cls")
            assert ex.explain_pos == 0 and ex.tokens[0] == "[CLS]" and ex.tokens[-1] == "[SEP]"
            assert not ex.truncated and ex.n_orig_tokens == ex.n_tokens


def test_run_predictions_are_the_models(default_run):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_run["model"])
    with open_store(default_run["out"]) as s:
        exs = list(s)
        for ex, row in zip(exs, default_run["rows"]):
            assert ex.token_ids.tolist() == tok(row["text"])["input_ids"]  # the tokens are the tokenizer's
            assert ex.tokens == tok.convert_ids_to_tokens(ex.token_ids.tolist())
        probs = model_outputs(default_run["model"], [ex.token_ids for ex in exs])
    assert [ex.pred for ex in exs] == probs.argmax(-1).tolist()
    assert [ex.target for ex in exs] == [ex.pred for ex in exs]  # default target: predicted
    np.testing.assert_allclose(np.stack([ex.probs for ex in exs]), probs, atol=1e-5)


@pytest.mark.parametrize("arch", ["bert", "distilbert"])
def test_matrices_all_and_target_all(tiny_model_dirs, tmp_path, arch):
    rows = write_jsonl(tmp_path / "d.jsonl", 6)
    out = tmp_path / "all.h5"
    compute(tmp_path / "d.jsonl", tiny_model_dirs[arch], out, "--matrices", "all", "--target", "all",
            "--batch-size", 4, "-q")
    with open_store(out) as s:
        assert len(s) == len(rows)
        for ex in s:
            check_example(ex, matrices="all")
            n = ex.n_tokens
            for m in CLASS_METHODS:
                cs = ex.class_scores(m)
                assert cs.shape == (2, n)
                np.testing.assert_allclose(cs[ex.pred], ex.scores(m), atol=1e-5)
            for m in ("raw_attention", "rollout", "norm"):
                assert ex.class_scores(m) is None
            # the cls row of the full matrices is what the methods explain: raw attention of the last layer
            np.testing.assert_allclose(ex.matrices("raw_attention")[-1, ex.explain_pos],
                                       ex.scores("raw_attention"), atol=2e-3)
        assert s.method_info("logat")["params"]["target"] == "all"


@pytest.mark.parametrize("arch", ["bert", "distilbert"])
def test_matrices_none_target_label_limit(tiny_model_dirs, tmp_path, arch):
    rows = write_jsonl(tmp_path / "d.jsonl", 12)
    out = tmp_path / "none.h5"
    compute(tmp_path / "d.jsonl", tiny_model_dirs[arch], out, "--matrices", "none", "--target", "label",
            "--limit", 7, "-q")
    with open_store(out) as s:
        assert len(s) == 7
        assert [e.row for e in s] == list(range(7))
        assert [e.text for e in s] == [r["text"] for r in rows[:7]]
        for ex in s:
            check_example(ex, matrices="none")
            assert ex.target == ex.label
            for m in METHODS:
                assert ex.class_scores(m) is None
        # the gold label is not always the prediction, so --target label did change what is explained
        assert s.config["config"]["target"] == "label"


def test_truncation_is_recorded(tiny_model_dirs, tmp_path):
    lengths = [2, 14, 3, 20]
    write_jsonl(tmp_path / "d.jsonl", 4, lengths=lambda i: lengths[i])
    out = tmp_path / "trunc.h5"
    compute(tmp_path / "d.jsonl", tiny_model_dirs["bert"], out, "--max-length", 10, "--methods", "rollout,norm", "-q")
    with open_store(out) as s:
        assert s.config["config"]["max_length"] == 10
        short, long1, short2, long2 = list(s)
        for ex in (long1, long2):
            assert ex.truncated and ex.n_tokens == 10 and ex.n_orig_tokens > 10
            assert ex.tokens[-1] == "[SEP]"
            check_example(ex, methods=("rollout", "norm"))
        for ex in (short, short2):
            assert not ex.truncated and ex.n_orig_tokens == ex.n_tokens < 10
        assert long2.n_orig_tokens > long1.n_orig_tokens
        probs = model_outputs(tiny_model_dirs["bert"], [ex.token_ids for ex in s])
        assert [ex.pred for ex in s] == probs.argmax(-1).tolist()


def test_methods_command_lists_every_method():
    res = invoke("methods")
    assert res.exit_code == 0
    listed = [ln.split()[0] for ln in res.stdout.splitlines() if ln.strip()]
    assert listed == list(REGISTRY)


def test_gradient_methods_with_attcat_preset(tiny_model_dirs, tmp_path):
    """--preset attcat: gold label, specials masked as keys (their AttCAT score is 0), recorded in the params; the IG
    options and the per-example completeness delta land in the store."""
    write_jsonl(tmp_path / "d.jsonl", 6)
    out = tmp_path / "g.h5"
    compute(tmp_path / "d.jsonl", tiny_model_dirs["bert"], out, "--methods", "grad_l2,ig_l2,ig_mean,attcat",
            "--preset", "attcat", "--ig-steps", 4, "--ig-rule", "riemann", "-q")
    with open_store(out) as s:
        assert s.method_info("attcat")["params"]["mask_specials"] is True
        ig = s.method_info("ig_l2")["params"]
        assert (ig["steps"], ig["rule"], ig["baseline"], ig["target"]) == (4, "riemann", "mask", "label")
        for ex in s:
            check_example(ex, methods=("grad_l2", "ig_l2", "ig_mean", "attcat"))
            assert ex.target == ex.label
            special = ex.segment < 0
            assert special.sum() == 2 and (ex.scores("attcat")[special] == 0).all()
            d = ex.example_values("ig_l2")["ig_delta"]
            assert np.isfinite(d) and d == ex.example_values("ig_mean")["ig_delta"]
            assert ex.example_values("grad_l2") == {}
            np.testing.assert_allclose(ex.scores("grad_l2").sum(), 1, rtol=1e-5)


# --- errors ---------------------------------------------------------------------------------------------------------


@pytest.fixture
def gpt2_dir(tmp_path):
    """A saved sequence classifier of an architecture attrscope cannot explain (T5, an encoder-decoder), without a
    tokenizer."""
    from transformers import T5Config, T5ForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    cfg = T5Config(d_model=8, d_kv=4, d_ff=16, num_layers=1, num_heads=2, vocab_size=50, pad_token_id=0,
                   decoder_start_token_id=0)
    path = tmp_path / "t5"
    T5ForSequenceClassification(cfg).save_pretrained(path)
    return path


def _error_case(case: str, tmp_path: Path, model: Path, gpt2_dir_factory):
    """(args, exit code, words the message must contain) for one error case."""
    data = tmp_path / "data.jsonl"
    write_jsonl(data, 3)
    if case == "missing dataset":
        return [tmp_path / "nope.jsonl", "--model", model], 1, ["nope.jsonl", "not found"]
    if case == "empty dataset":
        (tmp_path / "empty.jsonl").write_text("")
        return [tmp_path / "empty.jsonl", "--model", model], 1, ["empty.jsonl", "empty"]
    if case == "no text column":
        (tmp_path / "cols.csv").write_text("foo,bar\nx,1\ny,0\n")
        return [tmp_path / "cols.csv", "--model", model], 1, ["text column", "foo", "--text-column"]
    if case == "unknown method":
        return [data, "--model", model, "--methods", "rollout,bogus"], 2, ["bogus", "rollout", "normxlogit"]
    if case == "unsupported architecture":
        from compute.adapters import SUPPORTED_MODEL_TYPES

        return [data, "--model", gpt2_dir_factory()], 1, ["'t5'", "encoder-decoder", *SUPPORTED_MODEL_TYPES]
    if case == "no config.json":
        (tmp_path / "noconf").mkdir()
        return [data, "--model", tmp_path / "noconf"], 1, ["config.json", "noconf"]
    if case == "resume and overwrite":
        return [data, "--model", model, "--resume", "--overwrite"], 2, ["--resume", "--overwrite"]
    if case == "unknown option":
        return [data, "--model", model, "--bogus-option"], 2, ["--bogus-option"]
    if case == "bad choice":
        return [data, "--model", model, "--matrices", "some"], 2, ["--matrices", "some"]
    if case == "resume without store":
        return [data, "--model", model, "--resume"], 1, ["--resume", "does not exist"]
    if case == "zero ig steps":
        return [data, "--model", model, "--ig-steps", 0], 2, ["--ig-steps", "at least 1"]
    raise AssertionError(case)


ERROR_CASES = ["missing dataset", "empty dataset", "no text column", "unknown method", "unsupported architecture",
               "no config.json", "resume and overwrite", "unknown option", "bad choice", "resume without store",
               "zero ig steps"]


@pytest.mark.parametrize("case", ERROR_CASES)
def test_errors_are_one_line_and_leave_no_store(case, tmp_path, tiny_model_dirs, request):
    args, code, words = _error_case(case, tmp_path, tiny_model_dirs["bert"],
                                    lambda: request.getfixturevalue("gpt2_dir"))
    before = set(tmp_path.rglob("*"))
    out = tmp_path / "out.h5"
    res = invoke("run", *args, "-o", out, "--device", "cpu")
    assert res.exit_code == code, (res.exit_code, res.stderr, res.exception)
    line = error_line(res.stderr)
    for w in words:
        assert w in line, (w, line)
    assert res.stdout == ""
    assert not out.exists()
    assert set(tmp_path.rglob("*")) == before  # nothing else left behind either


def test_existing_output_is_not_touched(tiny_model_dirs, tmp_path):
    write_jsonl(tmp_path / "d.jsonl", 3)
    out = tmp_path / "out.h5"
    out.write_bytes(b"precious")
    res = invoke("run", tmp_path / "d.jsonl", "--model", tiny_model_dirs["bert"], "-o", out, "--device", "cpu")
    assert res.exit_code == 1
    line = error_line(res.stderr)
    assert "already exists" in line and "--overwrite" in line and "--resume" in line
    assert out.read_bytes() == b"precious"
    # --overwrite replaces it
    compute(tmp_path / "d.jsonl", tiny_model_dirs["bert"], out, "--overwrite", "--methods", "norm", "-q")
    with open_store(out) as s:
        assert len(s) == 3


def test_usage_error_without_run_word(tmp_path):
    """The default command takes the options too: ``attr-compute --bogus`` is a one-line usage error."""
    res = invoke("--bogus")
    assert res.exit_code == 2
    assert "--bogus" in error_line(res.stderr)


def test_resume_with_other_options_is_refused(tiny_model_dirs, tmp_path):
    write_jsonl(tmp_path / "d.jsonl", 5)
    out = tmp_path / "r.h5"
    model = tiny_model_dirs["bert"]
    compute(tmp_path / "d.jsonl", model, out, "--methods", "rollout,norm", "-q")
    before = out.read_bytes()
    for extra, key in ((["--methods", "norm"], "methods"), (["--methods", "rollout,norm", "--matrices", "all"],
                                                            "matrices")):
        res = invoke("run", tmp_path / "d.jsonl", "--model", model, "-o", out, "--device", "cpu", "--resume", *extra)
        assert res.exit_code == 1
        line = error_line(res.stderr)
        assert "--resume" in line and key in line and "--overwrite" in line
        assert out.read_bytes() == before
    # a different dataset file is refused too
    write_jsonl(tmp_path / "other.jsonl", 6)
    res = invoke("run", tmp_path / "other.jsonl", "--model", model, "-o", out, "--device", "cpu", "--resume",
                 "--methods", "rollout,norm")
    assert res.exit_code == 1 and "dataset" in error_line(res.stderr)
    assert out.read_bytes() == before


# --- real processes -------------------------------------------------------------------------------------------------


def _env() -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONUNBUFFERED="1", COLUMNS="100")
    return env


def test_debug_shows_traceback(tiny_model_dirs, tmp_path):
    out = tmp_path / "out.h5"
    cmd = [sys.executable, "-m", "compute.cli", "run", str(tmp_path / "missing.jsonl"), "--model",
           str(tiny_model_dirs["bert"]), "-o", str(out), "--device", "cpu", "--debug"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=120)
    assert p.returncode == 1
    assert "Traceback" in p.stderr and "AttrscopeError" in p.stderr and "missing.jsonl" in p.stderr
    assert not out.exists()


class Proc:
    """``python -m compute.cli run DATA --model M -o OUT --batch-size 1 --device cpu ...`` in a real process (a later
    --batch-size in ``extra`` wins), its output in files (a pipe nobody reads could fill up and stall it)."""

    def __init__(self, data: Path, model: Path, out: Path, *extra):
        self.data, self.out = data, out
        cmd = [sys.executable, "-m", "compute.cli", "run", str(data), "--model", str(model), "-o", str(out),
               "--batch-size", "1", "--device", "cpu", *extra]
        self._stdout = open(out.with_suffix(".stdout"), "w+")
        self._stderr = open(out.with_suffix(".stderr"), "w+")
        self.p = subprocess.Popen(cmd, stdout=self._stdout, stderr=self._stderr, text=True, cwd=data.parent,
                                  env=_env())

    @property
    def returncode(self):
        return self.p.returncode

    def running(self) -> bool:
        return self.p.poll() is None

    def stderr(self) -> str:
        self._stderr.flush()
        return Path(self._stderr.name).read_text()

    def check_running(self) -> None:
        if not self.running():
            raise AssertionError(f"attr-compute ended (rc {self.returncode}) before it was interrupted: "
                                 f"{self.stderr()[-2000:]}")

    def stop(self, sig=signal.SIGKILL) -> str:
        """Send ``sig`` (if it still runs), wait for the process to end, return its stderr."""
        try:
            if self.running():
                self.p.send_signal(sig)
            self.p.wait(timeout=60)
        finally:
            if self.running():
                self.p.kill()
                self.p.wait()
            self._stdout.close()
            self._stderr.close()
        return Path(self._stderr.name).read_text()


def _consistency_problems(s, start: int = 0) -> list[str]:
    """Problems of the visible examples ``start..`` of an open store (an empty list when all is well)."""
    problems = []
    for i in range(start, len(s)):
        ex = s[i]
        n = ex.n_tokens
        if ex.row != i or ex.id != str(i):
            problems.append(f"example {i}: row {ex.row}, id {ex.id!r}")
        if not ex.text:
            problems.append(f"example {i}: empty text")
        if len(ex.tokens) != n or len(ex.token_ids) != n or n < 2:
            problems.append(f"example {i}: {len(ex.tokens)} tokens for n={n}")
        for m in s.methods:
            if ex.scores(m).shape != (n,):
                problems.append(f"example {i}: {m} scores {ex.scores(m).shape}")
            ls = ex.layer_scores(m)
            if m in LAYER_VIEW_METHODS and ls.shape != (N_LAYERS, n):
                problems.append(f"example {i}: {m} layer_scores {ls.shape}")
            if not np.isfinite(ex.scores(m)).all():
                problems.append(f"example {i}: {m} scores not finite")
        if ex.tokens[0] != "[CLS]" or ex.tokens[-1] != "[SEP]":
            problems.append(f"example {i}: tokens {ex.tokens}")
    return problems


def _committed(out: Path, on_store=None) -> int | None:
    """Committed examples in the store at ``out`` (None while it cannot be opened yet); ``on_store`` looks at it."""
    try:
        s = open_store(out)
    except StoreError:  # not created yet, or not yet in SWMR mode
        return None
    with s:
        if on_store is not None:
            on_store(s)
        return len(s)


def _poll(proc: Proc, until: int, timeout: float = 120.0, on_store=None, interval: float = 0.05) -> int:
    """Wait until the store of ``proc`` holds at least ``until`` committed examples; returns the count seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc.check_running()
        n = _committed(proc.out, on_store)
        if n is not None and n >= until:
            return n
        time.sleep(interval)
    proc.stop()
    raise AssertionError(f"no {until} committed examples in {proc.out} after {timeout} s")


N_LONG = 1200  # rows of the run that is killed and resumed: it cannot finish between its first commit and the kill
N_HUGE = 3000  # rows of runs that are only interrupted: they cannot finish before the signal


def test_consistent_prefix_while_writing(tiny_model_dirs, tmp_path):
    """While ``attr-compute`` writes, every store opened (fresh each time, then one reader that refreshes) shows a
    consistent prefix: whole windows, rows in order, every array aligned with the tokens.

    The two phases do not overlap: in one process HDF5 shares an open file between handles, so a second handle
    opened while the first is open sees the first one's (older) view."""
    data = tmp_path / "huge.jsonl"
    write_jsonl(data, N_HUGE, ids=False)
    proc = Proc(data, tiny_model_dirs["bert"], tmp_path / "live.h5", "-q")
    lengths, problems = [], []

    def look(s):
        lengths.append(len(s))
        problems.extend(_consistency_problems(s))

    live = None
    try:
        # phase 1: fresh opens, each checks every visible example (a look takes longer as the store grows)
        _poll(proc, until=1, on_store=look, interval=0.01)
        while len(lengths) < 4 or len(set(lengths)) < 2:
            proc.check_running()
            time.sleep(0.02)
            _committed(proc.out, look)
        # phase 2: one reader stays open and picks up new commits with refresh()
        live = open_store(proc.out)
        first = len(live)
        problems.extend(_consistency_problems(live))
        checked, refreshes = first, 0
        while len(live) < first + 2 * WINDOW:
            proc.check_running()
            time.sleep(0.02)
            before = len(live)
            n = live.refresh()
            refreshes += 1
            lengths.append(n)
            assert n >= before
            problems.extend(_consistency_problems(live, start=checked))
            checked = n
    finally:
        proc.stop()
        if live is not None:
            live.close()
    assert problems == []
    assert lengths == sorted(lengths)  # never shrinks
    assert all(n % WINDOW == 0 for n in lengths)  # whole windows only
    assert refreshes >= 1 and checked >= first + 2 * WINDOW


@pytest.fixture(scope="module")
def interrupted_runs(tiny_model_dirs, tmp_path_factory):
    """Three runs started together (their start-up is most of the time): one on N_LONG rows (batch size 16, so a commit
    every 128 examples) killed with SIGKILL, one each stopped with SIGTERM and SIGINT, as soon as each has committed."""
    tmp = tmp_path_factory.mktemp("interrupted")
    write_jsonl(tmp / "long.jsonl", N_LONG, lengths=lambda i: 1 + (i * 7) % 13, ids=False)
    write_jsonl(tmp / "huge.jsonl", N_HUGE, ids=False)
    model = tiny_model_dirs["bert"]
    procs = {
        "SIGKILL": (Proc(tmp / "long.jsonl", model, tmp / "killed.h5", "--methods", ",".join(LIGHT),
                         "--batch-size", "16"), signal.SIGKILL),  # as in the brief: no -q
        "SIGTERM": (Proc(tmp / "huge.jsonl", model, tmp / "term.h5", "-q"), signal.SIGTERM),
        "SIGINT": (Proc(tmp / "huge.jsonl", model, tmp / "int.h5", "-q"), signal.SIGINT),
    }
    runs, waiting = {}, dict(procs)
    deadline = time.monotonic() + 180
    try:
        while waiting:
            assert time.monotonic() < deadline, f"no commit in {list(waiting)} after 180 s"
            for name, (proc, sig) in list(waiting.items()):
                proc.check_running()
                if (_committed(proc.out) or 0) >= 1:
                    runs[name] = {"out": proc.out, "model": model, "data": proc.data, "stderr": proc.stop(sig),
                                  "rc": proc.returncode, "proc": proc}
                    del waiting[name]
            time.sleep(0.01)
    finally:
        for proc, _ in procs.values():
            if proc.running():
                proc.stop()
    return runs


def test_sigkill_then_resume(interrupted_runs, tmp_path):
    run = interrupted_runs["SIGKILL"]
    out, data, model = run["out"], run["data"], run["model"]
    assert run["rc"] == -signal.SIGKILL
    with open_store(out) as s:  # the killed writer's store opens and holds a prefix of whole windows
        k = len(s)
        assert 16 * WINDOW <= k < N_LONG and k % (16 * WINDOW) == 0
        assert not s.complete
        assert [e.row for e in s] == list(range(k))
        assert _consistency_problems(s) == []

    # The resume runs with the same options (--resume refuses another batch size); results agree to 1e-5 with an
    # uninterrupted run of the same data.
    res = compute(data, model, out, "--batch-size", 16, "--methods", ",".join(LIGHT), "--resume", "-q")
    assert res.stdout.strip() == str(out)
    with open_store(out) as s:
        assert len(s) == N_LONG and s.complete
        assert [e.row for e in s] == list(range(N_LONG))  # no duplicates, no gaps, in order
        assert s.ids() == [str(i) for i in range(N_LONG)]
        assert s.summary["resumed_from"] == k and s.summary["examples_this_run"] == N_LONG - k
        assert _consistency_problems(s) == []
        around = list(range(k - 3, k + 3))
        # the results across the boundary equal those of an uninterrupted run of the same data
        fresh_out = tmp_path / "fresh.h5"
        compute(data, model, fresh_out, "--batch-size", 16, "--methods", ",".join(LIGHT), "--limit", k + 3, "-q")
        with open_store(fresh_out) as f:
            for i in around:
                a, b = s[i], f[i]
                assert a.text == b.text and a.tokens == b.tokens and a.pred == b.pred
                np.testing.assert_allclose(a.probs, b.probs, rtol=1e-5, atol=1e-6)
                for m in LIGHT:
                    np.testing.assert_allclose(a.scores(m), b.scores(m), rtol=1e-5, atol=1e-5, err_msg=f"{m} example {i}")
                    if m in LAYER_VIEW_METHODS:
                        np.testing.assert_allclose(a.layer_scores(m), b.layer_scores(m), rtol=1e-5, atol=1e-5)
                    if m in MATRIX_METHODS:
                        np.testing.assert_allclose(a.matrices(m), b.matrices(m), atol=1e-3)

    # --resume on a complete store finishes at once and adds nothing
    compute(data, model, out, "--batch-size", 16, "--methods", ",".join(LIGHT), "--resume", "-q")
    with open_store(out) as s:
        assert len(s) == N_LONG and s.complete
        assert [e.row for e in s] == list(range(N_LONG))
        assert s.summary["examples_this_run"] == 0 and s.summary["resumed_from"] == N_LONG


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_signal_interrupts_cleanly(interrupted_runs, sig):
    run = interrupted_runs[sig]
    assert run["rc"] == 130, run["stderr"]
    line = error_line(run["stderr"])
    assert "interrupted" in line and "--resume" in line
    with open_store(run["out"]) as s:
        k = len(s)
        assert 0 < k < N_HUGE and k % WINDOW == 0
        assert s.complete is False
        assert [e.row for e in s] == list(range(k))
        assert _consistency_problems(s) == []


# --- the bundled demo ----------------------------------------------------------------------------------------------

DEMO_WEIGHTS = REPO / "examples" / "demo-classifier" / "task_weights.safetensors"


@pytest.mark.slow
@pytest.mark.skipif(not (REPO / "compute" / "demo.py").exists() or not DEMO_WEIGHTS.exists(),
                    reason="the bundled demo classifier (compute/demo.py and its task weights) is not present")
def test_bare_default_run(tmp_path):
    """The README's first command: the mission's methods (mask_lrp where a parser is installed), nothing said about
    methods nobody asked for, a store that attr-tui opens on ALTI."""
    from compute.methods import DEFAULT_METHODS

    p = subprocess.run([sys.executable, "-m", "compute.cli", "--device", "cpu"], capture_output=True, text=True,
                       cwd=tmp_path, env=_env(), timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    text = p.stdout + p.stderr
    assert "skipping" not in text
    stores = list(tmp_path.glob("*.h5"))
    assert len(stores) == 1
    assert stores[0].name in "".join(text.split()) and "attr-tui" in text
    with open_store(stores[0]) as s:
        assert len(s) > 0 and s.complete
        assert s.methods == [m for m in DEFAULT_METHODS if m != "mask_lrp" or m in s.methods]
        assert s.methods[0] == "alti"  # the app opens on the store's first method


def test_compute_never_imports_textual():
    """compute/ is headless: the CLI and the batch loop load no UI framework (rich's progress bar is not textual)."""
    import subprocess
    import sys

    code = ("import sys, compute.cli, compute.runner, compute.ui, compute.methods, compute.adapters; "
            "print(sorted(m for m in sys.modules if m == 'textual' or m.startswith('textual.') or m == 'tui'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
