"""Every task end to end, offline, on tiny saved models: attr-compute -> a store with the task's fields -> the
metrics -> attr-tui opens it at 80x24 and shows the task; the refusals are one line; a pair-classification run on the
shared model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from cli_results import invoke, ok, one_line
from conftest import SHARED_MODEL, needs_shared, write_tiny_task_model_dir
from store import open_store
from test_tui import async_test, screen_text, settle

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "tasks"

ROWS = {
    "regression": [{"sentence1": "the movie was great", "sentence2": "the film was good", "label": 4.5},
                   {"sentence1": "the plot was dull", "sentence2": "i loved it", "label": 0.5}],
    "masked-token": [{"id": "m1", "text": "the movie [MASK] great", "target": "was", "foil": "is"},
                     {"id": "m2", "text": "it [MASK] a fun film", "target": "is", "foil": "was"},
                     {"id": "m3", "text": "the acting [MASK] slow"}],  # no target: the model's own top word
    "next-token": [{"id": "n1", "text": "the movie was", "target": "good", "foil": "bad"},
                   {"id": "n2", "text": "i loved the", "target": "film"},
                   {"id": "n3", "text": "the plot is very"}],
    "qa": [{"id": "q1", "question": "what was the movie", "context": "the movie was great but long",
            "answers": {"text": ["great"], "answer_start": [14]}},
           {"id": "q2", "question": "what was slow", "context": "the plot was slow and the acting was dull",
            "answers": {"text": ["the plot"], "answer_start": [0]}}],
}
MODELS = {"regression": ("bert", "regression"), "masked-token": ("bert", "masked-token"),
          "next-token": ("gpt2", "next-token"), "qa": ("bert", "qa")}
METRICS = {"regression": "comprehensiveness,sufficiency,aopc", "masked-token": "comprehensiveness,aopc",
           "next-token": "comprehensiveness,sufficiency", "qa": "precision_at_k"}


@pytest.fixture(scope="module")
def task_stores(tmp_path_factory):
    """One store per task (the main run of each: --methods all, the task's metrics)."""
    root = tmp_path_factory.mktemp("tasks")
    out = {}
    for task, rows in ROWS.items():
        arch, head = MODELS[task]
        model = write_tiny_task_model_dir(root / f"model-{task}", arch, head)
        data = root / f"{task}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        store = root / f"{task}.h5"
        res = ok(invoke(data, "--model", model, "-o", store, "--device", "cpu", "--ig-steps", "4",
                        "--metrics", METRICS[task], "--matrices", "all", "--methods", "all"))
        out[task] = (store, model, data, res)
    return out


@pytest.mark.parametrize("task", list(ROWS))
def test_each_task_runs_end_to_end_into_a_store(task_stores, task):
    store, _, _, res = task_stores[task]
    with open_store(store) as s:
        assert s.complete and len(s) == len(ROWS[task])
        assert s.task["name"] == task  # detected from the saved head (--task auto)
        assert s.config["config"]["task"] == "auto" and s.config["model"]["task"] == task
        for i in range(len(s)):
            ex, row = s[i], ROWS[task][i]
            info = ex.task_info
            assert info["task"] == task
            n = len(ex.token_ids)
            for m in s.methods:
                sc = ex.scores(m)
                assert sc.shape == (n,) and np.isfinite(sc).all(), m
            if task == "regression":
                assert list(s.labels.values()) == ["value"]
                assert info["gold_value"] == pytest.approx(row["label"])
                assert info["output"] == pytest.approx(float(ex.probs[0]), rel=1e-6)
                assert ex.pred == 0 and ex.target == 0
            elif task in ("masked-token", "next-token"):
                assert list(s.labels.values()) == ["target", "foil"]
                pos = ex.explain_pos
                if task == "masked-token":
                    assert ex.tokens[pos] == "[MASK]"
                else:
                    assert pos == n - 1
                if "target" in row:
                    assert info["target_word"] == row["target"]
                else:  # the model's top word is explained
                    assert info["target_token"] == ex.pred and info["target_word"] == info.get("predicted", info["target_word"])
                if "foil" in row:
                    assert info["foil_word"] == row["foil"]
                    assert info["prefers_target"] == (info["output"] > 0)
                    assert not math.isnan(float(ex.probs[1]))
                else:
                    assert info["foil_token"] == -1 and math.isnan(float(ex.probs[1]))
            else:  # qa
                assert list(s.labels.values()) == ["start", "end"]
                start, end = info["span"]
                assert start == ex.explain_pos and start <= end
                assert info["pred_span"] == (ex.pred, info["pred_span"][1])
                gold = np.nonzero(ex.evidence)[0]
                answer = row["answers"]["text"][0]
                assert " ".join(ex.tokens[gold[0]:gold[-1] + 1]) == answer
        assert set(s.methods) >= {"alti", "rollout", "attcat", "grad_l2"}
        if task in ("masked-token", "qa", "classification"):  # DecompX reads a sequence head or a word's logit
            assert "decompx" not in s.methods
            assert "skipping" in res.stderr and "decompx" in res.stderr
        else:
            assert "decompx" in s.methods
        # ALTI-Logit reads a logit at one token: a class's, a word's (minus the foil's), not qa's start + end
        assert ("alti_logit" in s.methods) == (task != "qa")
        if task in ("regression", "masked-token", "qa", "next-token"):  # the LRP rules start at these heads
            assert {"lrp", "transatt", "mask_lrp"} <= set(s.methods)
        else:
            assert not {"lrp", "transatt", "mask_lrp"} & set(s.methods)


@pytest.mark.parametrize("task", list(ROWS))
def test_each_tasks_metrics_are_written(task_stores, task):
    store = task_stores[task][0]
    with open_store(store) as s:
        for metric in METRICS[task].split(","):
            values = s.metric_values("alti", metric)
            assert len(values) == len(ROWS[task])
            assert np.isfinite(values).any(), metric


@pytest.mark.parametrize("task,method", [("masked-token", "decompx"), ("qa", "logat")])  # next-token: all defined
def test_methods_undefined_for_the_task_are_one_line(task_stores, task, method, tmp_path):
    _, model, data, _ = task_stores[task]
    line = one_line(invoke(data, "--model", model, "-o", tmp_path / "x.h5", "--methods", f"alti,{method}"))
    assert f"method '{method}' is not defined for --task {task}" in line and "alti" in line
    assert not (tmp_path / "x.h5").exists()


def test_word_target_errors_are_one_line_before_a_store(task_stores, tmp_path):
    _, model, _, _ = task_stores["masked-token"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "the movie [MASK] great", "target": "moviegoers"}) + "\n")
    line = one_line(invoke(bad, "--model", model, "-o", tmp_path / "x.h5", "--methods", "alti"))
    assert "'moviegoers' is" in line and "tokens" in line
    assert not (tmp_path / "x.h5").exists()
    line = one_line(invoke(bad, "--model", model, "-o", tmp_path / "x.h5", "--task", "qa"), code=1)
    assert "has no trained qa head: qa_outputs" in line and "ForQuestionAnswering checkpoint" in line
    line = one_line(invoke(bad, "--model", model, "-o", tmp_path / "x.h5", "--target", "all"), code=2)
    assert "--target all has no meaning for --task masked-token" in line


def test_a_masked_token_store_explains_target_minus_foil(task_stores):
    """The stored LogAt at the mask is the model's own logit difference (the output), as the identity says."""
    store = task_stores["masked-token"][0]
    with open_store(store) as s:
        ex = s[0]
        assert ex.scores("logat")[ex.explain_pos] == pytest.approx(ex.task_info["output"], rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("task", list(ROWS))
@async_test
async def test_the_tui_opens_each_task_store_and_shows_the_task(task_stores, task, monkeypatch):
    from tui.app import create_app

    monkeypatch.setenv("TERM", "xterm-256color")
    app = create_app(task_stores[task][0])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        text = screen_text(app)
    assert task in text
    first = ROWS[task][0]
    if task in ("masked-token", "next-token"):  # the first example's target and foil words
        assert f"target {first['target']}" in text and f"foil {first['foil']}" in text, text
    if task == "qa":
        assert "span" in text, text
    if task == "regression":
        assert "gold 4.5" in text or "gold 4.50" in text, text


@needs_shared
def test_pair_classification_on_the_shared_model(tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "label"}) + "\n"
                            for r in ROWS["regression"]))
    store = tmp_path / "pairs.h5"
    ok(invoke(data, "--model", SHARED_MODEL, "-o", store, "--methods", "alti,globenc,attcat,logat", "--device", "cpu",
              "--task", "classification"))
    with open_store(store) as s:
        assert s.task["name"] == "classification" and len(s) == 2
        ex = s[0]
        assert (ex.segment == 1).any() and ex.pair == ROWS["regression"][0]["sentence2"]
        assert ex.explain_pos == 0 and 0.0 < ex.probs.sum() < 1.0 + 1e-5


def test_the_bundled_task_examples_exist():
    names = {p.name for p in EXAMPLES.iterdir()}
    assert {"regression.jsonl", "masked_token.jsonl", "next_token.jsonl", "qa_squad.jsonl",
            "blimp_sample.jsonl"} <= names


def test_a_linzen_file_gives_its_subjects_as_evidence_without_a_flag(task_stores, tmp_path):
    """Linzen's agreement layout (verb and subject indices from 1) carries the evidence: the subject. A run with the
    evidence metrics needs no --evidence-column, stores the subject's tokens as evidence, and the metrics leave the
    mask itself out of the ranking (METHODS.md 8.7)."""
    _, model, _, _ = task_stores["masked-token"]
    data = tmp_path / "agr.tsv"
    data.write_text("orig_sentence\tverb_index\tverb\tsubj_index\tsubj\n"
                    "the movie was great\t3\twas\t2\tmovie\n"
                    "the acting was very slow\t3\twas\t2\tacting\n"
                    "i loved the story\t2\tloved\t1\ti\n")
    store = tmp_path / "agr.h5"
    ok(invoke(data, "--model", model, "-o", store, "--methods", "alti,logat",
              "--metrics", "average_precision,dot_product"))
    with open_store(store) as s:
        assert s.task["name"] == "masked-token"
        for i, subject in enumerate(["movie", "acting", "i"]):
            ex = s[i]
            assert ex.tokens[ex.explain_pos] == "[MASK]"
            assert [ex.tokens[j] for j in np.nonzero(ex.evidence)[0]] == [subject]
        for m in ("alti", "logat"):
            assert s.metric_info(m, "average_precision")["settings"]["exclude"] == "explained"
            assert np.isfinite(s.metric_values(m, "average_precision")).all()
