"""attr-compute's guards around a run (issue 13): evidence flags never disturb the stored predictions, checkpoints
without a trained task head are refused, --resume refuses result-changing options, bad outputs and missing model
directories get one clear line, evidence metrics need evidence. Tiny models from conftest, in process (CliRunner)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cli_results import invoke, ok, one_line
from store import open_store

WORDS = "the movie was great but long and boring film good bad not very a plot story loved hated fun dull".split()

pytestmark = pytest.mark.usefixtures("one_thread")


# --- 1. --evidence-column never changes what is stored about the prediction -----------------------------------------


def evidence_rows(n: int, short_spans: bool) -> list[dict]:
    """Sentence pairs of varied lengths with evidence spans anywhere: in the text or the pair, at the start (ends 1
    and 2, below the batch size), in the middle and at the very end (ends far past the batch size), several or none."""
    rows = []
    for i in range(n):
        text = " ".join(WORDS[(i * 5 + 3 * k) % len(WORDS)] for k in range(2 + i % 9))
        pair = " ".join(WORDS[(i * 3 + 2 * k) % len(WORDS)] for k in range(1 + i % 5))
        if short_spans:
            spans = [[0, 1 + i % 2]] if i % 3 else [[1, 0, 1 + i % 2]]
        else:
            kind = i % 5
            spans = {0: [[0, 1 + i % 2]],  # ends at 1 or 2
                     1: [[len(text) - 3, len(text)]],  # ends at the text's end
                     2: [[1, 0, len(pair)]],  # the whole pair segment
                     3: [[2, 5], [1, len(pair) - 1, len(pair)]],  # both segments
                     4: []}[kind]
        rows.append({"id": f"p{i}", "sentence1": text, "sentence2": pair, "label": i % 2, "evidence": spans})
    return rows


def expected_flags(ex, spans) -> np.ndarray:
    want = np.zeros(ex.n_tokens, dtype=bool)
    for span in spans:
        seg, a, b = (0, *span) if len(span) == 2 else span
        for t, ((s, e), g) in enumerate(zip(ex.spans, ex.segment)):
            want[t] |= bool(g == seg and s < b and a < e)
    return want


@pytest.mark.parametrize("short_spans", [True, False], ids=["spans-ending-below-batch-size", "spans-anywhere"])
@pytest.mark.parametrize("target", ["predicted", "label"])
def test_evidence_column_changes_nothing_else(tiny_model_dirs, tmp_path, short_spans, target):
    rows = evidence_rows(23, short_spans)
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["--model", tiny_model_dirs["bert"], "--device", "cpu", "--batch-size", 3, "--methods",
              "rollout,normxlogit", "--target", target, "-q"]
    ok(invoke("run", data, "-o", tmp_path / "plain.h5", *common))
    ok(invoke("run", data, "-o", tmp_path / "ev.h5", "--evidence-column", "evidence", *common))
    with open_store(tmp_path / "plain.h5") as plain, open_store(tmp_path / "ev.h5") as ev:
        assert len(plain) == len(ev) == len(rows)
        assert plain[0].evidence is None
        for i, row in enumerate(rows):
            a, b = plain[i], ev[i]
            assert (b.id, b.row, b.text, b.pair, b.label) == (a.id, a.row, a.text, a.pair, a.label) == (
                row["id"], i, row["sentence1"], row["sentence2"], row["label"])
            assert b.tokens == a.tokens and np.array_equal(b.token_ids, a.token_ids)
            assert np.array_equal(b.spans, a.spans) and np.array_equal(b.segment, a.segment)
            assert b.pred == a.pred and b.target == a.target and b.explain_pos == a.explain_pos, i
            np.testing.assert_array_equal(b.probs, a.probs, err_msg=f"example {i}")
            for m in ("rollout", "normxlogit"):
                np.testing.assert_array_equal(b.scores(m), a.scores(m), err_msg=f"{m} example {i}")
                np.testing.assert_array_equal(b.layer_scores(m), a.layer_scores(m))
            np.testing.assert_array_equal(b.matrices("rollout"), a.matrices("rollout"))
            np.testing.assert_array_equal(b.evidence, expected_flags(b, row["evidence"]), err_msg=f"example {i}")
            assert b.evidence.any() == bool(row["evidence"])
        # every example has its own probabilities, so a row of another example would be seen
        assert len({tuple(ex.probs) for ex in ev}) == len(rows)


# --- 4. a checkpoint without a trained task head is refused -----------------------------------------------------------


def write_headless(path: Path, kind: str) -> Path:
    """A tiny BertForMaskedLM or bare BertModel saved with save_pretrained, with the tiny models' tokenizer."""
    from transformers import BertForMaskedLM, BertModel
    from transformers.utils import logging as hf_logging

    from conftest import tiny_config, write_tiny_model_dir

    write_tiny_model_dir(path)  # the tokenizer (and a classifier, replaced below)
    (path / "model.safetensors").unlink()
    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    cls = {"mlm": BertForMaskedLM, "bare": BertModel}[kind]
    cls(tiny_config("bert")).save_pretrained(path)
    return path


HEADLESS_MISSING = {"mlm": ["bert.pooler.dense.bias", "bert.pooler.dense.weight", "classifier.bias",
                            "classifier.weight"],
                    "bare": ["classifier.bias", "classifier.weight"]}


@pytest.mark.parametrize("kind", ["mlm", "bare"])
def test_checkpoint_without_task_head_is_refused(tmp_path, kind):
    model = write_headless(tmp_path / kind, kind)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": " ".join(WORDS[i:i + 4]), "label": i % 2}) + "\n" for i in range(5)))
    out = tmp_path / "out.h5"
    plain = ["run", data, "--model", model, "-o", out, "--device", "cpu", "--methods", "rollout,norm", "-q"]
    # without --task the head decides: a masked LM is a masked-token model (whose data need a mask), a bare encoder
    # has no head to tell
    line = one_line(invoke(*plain))
    if kind == "mlm":
        assert "has no mask token '[MASK]'" in line
    else:
        assert "cannot tell the model's task from its head (BertModel): pass --task" in line
    args = plain + ["--task", "classification"]
    line = one_line(invoke(*args))
    missing = HEADLESS_MISSING[kind]
    assert "no trained classification head" in line and "--allow-random-head" in line and str(model) in line
    assert "ForSequenceClassification" in line  # what to pass instead
    if len(missing) > 3:
        assert ", ".join(missing[:3]) + f" and {len(missing) - 3} more" in line
    else:
        assert ", ".join(missing) in line
    assert not out.exists()

    # --allow-random-head runs it and says so in the store's provenance
    ok(invoke(*args, "--allow-random-head"))
    with open_store(out) as s:
        assert len(s) == 5
        assert s.config["model"]["random_head"] == missing
        assert s.config["config"]["allow_random_head"] is True

    # eval reloads the model: refused the same way, and runs with the flag
    line = one_line(invoke("eval", out, "--metrics", "comprehensiveness", "--device", "cpu", "-q"))
    assert "no trained classification head" in line and "--allow-random-head" in line
    with open_store(out) as s:
        assert s.metric_methods == []
    ok(invoke("eval", out, "--metrics", "comprehensiveness", "--device", "cpu", "-q", "--allow-random-head"))
    with open_store(out) as s:
        assert sorted(s.metric_methods) == ["norm", "rollout"]


def test_trained_checkpoint_records_no_random_head(tiny_model_dirs, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"text": "the movie was great", "label": 1}) + "\n")
    ok(invoke("run", data, "--model", tiny_model_dirs["bert"], "-o", tmp_path / "o.h5", "--device", "cpu",
              "--methods", "norm", "-q"))
    with open_store(tmp_path / "o.h5") as s:
        assert s.config["model"]["random_head"] is None and s.config["config"]["allow_random_head"] is False


# --- 5. --resume refuses options that change the numbers; outputs and model paths; evidence metrics ----------------


@pytest.fixture(scope="module")
def small_store(tiny_model_dirs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    data = tmp / "d.jsonl"
    data.write_text("".join(json.dumps({"text": " ".join(WORDS[i:i + 3 + i % 4]), "label": i % 2}) + "\n"
                            for i in range(7)))
    out = tmp / "r.h5"
    ok(invoke("run", data, "--model", tiny_model_dirs["bert"], "-o", out, "--device", "cpu", "--methods",
              "rollout,alti,ig_l2", "--batch-size", 4, "-q"))
    return {"data": data, "out": out, "model": tiny_model_dirs["bert"]}


@pytest.mark.parametrize("option,value,said", [
    ("--batch-size", "3", "made with --batch-size 4, not 3: rerun with --batch-size 4"),
    ("--dtype", "bfloat16", "made with --dtype float32, not bfloat16: rerun with --dtype float32"),
    # memory budgets default to the device's (no value): the store was made without the option
    ("--memory-mb", "16", "made without --memory-mb, not with --memory-mb 16: rerun without --memory-mb"),
    ("--ig-memory-mb", "64", "made without --ig-memory-mb, not with --ig-memory-mb 64: rerun without --ig-memory-mb")])
def test_resume_with_another_numeric_option_is_refused(small_store, option, value, said):
    before = small_store["out"].read_bytes()
    res = invoke("run", small_store["data"], "--model", small_store["model"], "-o", small_store["out"], "--device",
                 "cpu", "--methods", "rollout,alti,ig_l2", "--batch-size", 4, "--resume", option, value)
    line = one_line(res)
    assert said in line and "--overwrite" in line, line
    assert small_store["out"].read_bytes() == before


def test_resume_with_the_same_options_goes_on(small_store):
    ok(invoke("run", small_store["data"], "--model", small_store["model"], "-o", small_store["out"], "--device",
              "cpu", "--methods", "rollout,alti,ig_l2", "--batch-size", 4, "--resume", "-q"))


def test_output_that_cannot_be_created(tiny_model_dirs, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"text": "the movie was great", "label": 1}) + "\n")
    common = ["--model", tiny_model_dirs["bert"], "--device", "cpu", "--methods", "norm", "-q"]
    line = one_line(invoke("run", data, "-o", "/proc/out.h5", *common))
    assert "cannot create store '/proc/out.h5'" in line and "-o" in line
    assert not Path("/proc/out.h5").exists()
    # a directory, with or without --overwrite: refused before anything loads, the directory untouched
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "keep.txt").write_text("x")
    for extra in ([], ["--overwrite"], ["--resume"]):
        line = one_line(invoke("run", data, "-o", folder, *common, *extra))
        assert f"-o '{folder}' is a directory" in line and "run.h5" in line, line
        assert (folder / "keep.txt").read_text() == "x"


@pytest.mark.parametrize("spec", ["./no/such/dir", "/abs/missing", "../x", "~/x-attrscope-missing", "a/b/c"])
def test_missing_model_directory(tmp_path, spec):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"text": "the movie was great", "label": 1}) + "\n")
    line = one_line(invoke("run", data, "--model", spec, "-o", tmp_path / "o.h5", "--device", "cpu"))
    assert f"model directory '{spec}' does not exist" in line and "cache" not in line and "hub cannot" not in line
    assert not (tmp_path / "o.h5").exists()


@pytest.mark.parametrize("metric", ["precision_at_k", "dot_product", "average_precision"])
def test_evidence_metrics_need_evidence(small_store, tmp_path, metric):
    before = small_store["out"].read_bytes()
    line = one_line(invoke("eval", small_store["out"], "--metrics", f"comprehensiveness,{metric}", "--device", "cpu"))
    assert f"metric '{metric}' needs evidence" in line and "--evidence-column" in line
    assert small_store["out"].read_bytes() == before  # nothing written, not even the other metric
    # in a run: a usage error before the model loads (a model that does not exist is never reached)
    line = one_line(invoke("run", small_store["data"], "--model", "/abs/missing", "-o", tmp_path / "o.h5",
                           "--metrics", metric), 2)
    assert f"metric '{metric}' needs evidence" in line and "--evidence-column" in line


@pytest.mark.parametrize("keep", [100, 0.6])
def test_resume_of_a_damaged_store_fails_before_the_model_loads(small_store, tmp_path, keep):
    # a truncated copy (scp cut short): the store's problem is named, not the model's, and nothing is written
    whole = small_store["out"].read_bytes()
    cut = tmp_path / "cut.h5"
    cut.write_bytes(whole[:keep if isinstance(keep, int) else int(len(whole) * keep)])
    before = cut.read_bytes()
    line = one_line(invoke("run", small_store["data"], "--model", "/abs/missing", "-o", cut, "--device", "cpu",
                           "--methods", "rollout,alti,ig_l2", "--batch-size", 4, "--resume"))
    assert f"store '{cut}'" in line and ("incomplete" in line or "damaged" in line), line
    assert "model" not in line.split(":")[0], line
    assert cut.read_bytes() == before


@pytest.mark.parametrize("command", ["eval", "resume"])
def test_a_damaged_store_is_named_before_torch_loads(small_store, tmp_path, command):
    # torch alone takes 1-2 s to import: the one line must come before it, so it comes within a second or two
    import subprocess
    import sys

    cut = tmp_path / "cut.h5"
    cut.write_bytes(small_store["out"].read_bytes()[:4096])
    argv = (["eval", str(cut), "--metrics", "comprehensiveness"] if command == "eval"
            else [str(small_store["data"]), "-o", str(cut), "--resume", "--methods", "rollout"])
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print('torch loaded' if 'torch' in sys.modules else 'no torch'))\n"
            f"sys.argv = ['attr-compute', *{argv!r}]\n"
            "from compute.cli import main\nmain()\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"attr-compute: error: store '{cut}' is incomplete: 4,096 bytes of the "
        f"{small_store['out'].stat().st_size:,} it should have (a partial copy?): copy it again"], res.stderr
    assert res.stdout.strip() == "no torch"
