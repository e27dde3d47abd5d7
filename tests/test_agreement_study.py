"""benchmarks/agreement_study.py (docs/agreement-report.md) in a tiny configuration: the grammar's items are what
the report says they are, and one whole run gives a trained model, a Linzen-layout test file, a store and figures
that agree with the store read back independently."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import numpy as np
import pytest

from store import open_store

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "agreement_study.py"


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("agreement_study", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def number_of(study, noun: str) -> int:
    for sg, pl in study.NOUNS:
        if noun in (sg, pl):
            return int(noun == pl)
    raise AssertionError(noun)


def test_each_condition_places_subject_attractor_and_verb(study):
    rng = random.Random(3)
    verbs = {f: pair for pair, _ in study.MAIN_VERBS for f in pair}
    subject_positions = set()
    for condition in study.CONDITIONS:
        for _ in range(50):
            s = study.sentence(rng, condition)
            words, subj, verb = s["words"], s["subj"], s["verb"]
            subject_positions.add(subj)
            assert words[0] == "the" and words[-1] == "." and subj in (1, 2)
            plural = number_of(study, words[subj])
            assert words[verb] == s["target"] == verbs[s["target"]][plural]
            assert s["foil"] == verbs[s["target"]][1 - plural]
            if condition == "none":
                assert verb == subj + 1 and s["attractor"] == -1
                continue
            # the intervening noun: last before the verb (pp) or before the clause's verb (rc)
            noun = verb - 1 if condition.startswith("pp") else verb - 2
            if condition.startswith("pp"):
                assert words[subj + 1] in study.PREPOSITIONS
            else:  # an object relative clause whose verb agrees with its own noun
                assert words[subj + 1] == "that"
                rc = [pair for pair in study.RC_VERBS if words[verb - 1] in pair][0]
                assert words[verb - 1] == rc[number_of(study, words[noun])]
            if condition.endswith("same"):
                assert s["attractor"] == -1 and number_of(study, words[noun]) == plural
            else:
                assert s["attractor"] == noun and number_of(study, words[noun]) == 1 - plural
    assert subject_positions == {1, 2}  # an adjective moves the subject half the time


def test_training_batches_always_mask_the_verb_and_skip_held_out_sentences(study):
    vocab = {w: i for i, w in enumerate(study.vocabulary())}
    held_out = {" ".join(study.sentence(random.Random(0), c)["words"]) for c in study.CONDITIONS}
    ids, att, y = study.mlm_batch(random.Random(0), vocab, 32, held_out, mask_rate=0.0)
    # mask_rate 0: the verb is the only predicted word, and it is [MASK] in the input
    assert ((y != -100).sum(1) == 1).all()
    rows, cols = np.nonzero((y != -100).numpy())
    assert (ids[rows, cols] == vocab["[MASK]"]).all()
    assert {study.vocabulary()[int(t)] for t in y[rows, cols]} <= {f for pair, _ in study.MAIN_VERBS for f in pair}
    inverse = study.vocabulary()
    for b in range(32):  # the sentence with the verb put back is never a held-out one
        words = [inverse[int(t)] if y[b, p] == -100 else inverse[int(y[b, p])]
                 for p, t in enumerate(ids[b]) if att[b, p]]
        assert " ".join(words[1:-1]) not in held_out


def test_a_tiny_run_writes_every_output(study, tmp_path):
    out = tmp_path / "study"
    assert study.main(["--out", str(out), "--steps", "20", "--per-condition", "3", "--layers", "2", "--hidden", "32",
                       "--batch", "16"]) == 0
    assert (out / "model" / "config.json").exists() and (out / "model" / "tokenizer.json").exists()
    rows = study.read_test_tsv(out / "test.tsv")
    assert len(rows) == 15 and [r["condition"] for r in rows] == [c for c in study.CONDITIONS for _ in range(3)]
    for r in rows:  # the Linzen layout: 1-based indices pointing at subj and verb; the evidence is the subject
        words = r["orig_sentence"].split()
        assert words[int(r["subj_index"]) - 1] == r["subj"] and words[int(r["verb_index"]) - 1] == r["verb"]
        (a, b), = json.loads(r["evidence"])
        assert r["orig_sentence"][a:b] == r["subj"]
    res = json.loads((out / "results.json").read_text())
    assert res["n"] == 15 and res["n_attractor"] == 6
    assert res["train"]["steps"] == 20 and np.isfinite(res["train"]["final_loss"])
    assert res["attr_compute"]["command"].startswith("attr-compute ")
    assert set(res["methods"]) == set(study.METHODS.split(","))
    assert set(res["layers"]) == set(study.ANALYSED_LAYERS)
    for m, layers in res["layers"].items():
        assert len(layers["ap_mask_excluded"]) == 2 and len(layers["subject_above_attractor"]) == 2, m
    # the figures against the store read back here
    with open_store(out / "agreement.h5") as s:
        assert len(s) == 15 and s.task["name"] == "masked-token"
        prefers = np.array([s[i].task_info["prefers_target"] for i in range(15)])
        with_attractor = np.array([int(r["attractor_index"]) > 0 for r in rows])
        assert res["accuracy"]["all"] == pytest.approx(prefers.mean())
        assert res["accuracy"]["with_attractor"] == pytest.approx(prefers[with_attractor].mean())
        assert res["accuracy"]["without_attractor"] == pytest.approx(prefers[~with_attractor].mean())
        above = []
        for i, r in enumerate(rows):
            ex = s[i]
            assert ex.tokens[ex.explain_pos] == "[MASK]"
            subj = int(r["subj_index"])  # word-level tokenizer: word k (1-based) is token k after [CLS]
            assert np.nonzero(ex.evidence)[0].tolist() == [subj]
            if int(r["attractor_index"]):
                sc = ex.scores("alti")
                above.append(sc[subj] > sc[int(r["attractor_index"])])
        assert res["methods"]["alti"]["subject_above_attractor"] == pytest.approx(np.mean(above))
        stored = s.metric_values("alti", "average_precision")
        assert res["methods"]["alti"]["store_average_precision"] == pytest.approx(np.nanmean(stored))
    table = (out / "results.md").read_text()
    assert "| with attractor |" in table and "| `alti` |" in table and "view 2" in table


def test_the_linzen_file_prepared_for_bert_base_runs_with_the_reports_command(study, tmp_path):
    """--prepare-linzen on the bundled rows in the Linzen layout: the foils by rule, the subject as evidence, rows
    whose foil is not one token dropped; the report's attr-compute command on it (a random word-level masked LM over
    the file's words stands in for bert-base-uncased); --analyse reads the store back."""
    import argparse

    src = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "agreement_linzen.tsv"
    source_rows = study.read_test_tsv(src)
    assert [study.other_number(v, p) for v, p in [("flies", "VBZ"), ("fly", "VBP"), ("watches", "VBZ"),
                                                  ("watch", "VBP"), ("are", "VBP"), ("plays", "VBZ")]] == [
        "fly", "flies", "watch", "watches", "is", "play"]
    foils = ["hangs", "live", "barks", "show", "works", "sing", "faces", "stays", "like", "sings", "sit", "makes"]
    words = sorted({w for r in source_rows for w in r["orig_sentence"].split()} | set(foils[1:]))  # not "hangs"
    vocab = study.SPECIALS + words
    args = argparse.Namespace(hidden=32, layers=2, heads=2, init_range=0.02)
    model_dir = tmp_path / "mlm"
    study.save_model(study.build_model(len(vocab), args), vocab, model_dir)

    prepared = tmp_path / "agr_foil.tsv"
    assert study.main(["--prepare-linzen", str(src), "--tokenizer", str(model_dir), "--out", str(prepared)]) == 0
    rows = study.read_test_tsv(prepared)
    assert [r["id"] for r in rows] == [f"r{i}" for i in range(1, 12)]  # row 0's foil "hangs" is not a token
    assert [r["foil"] for r in rows] == foils[1:]
    for r, src_row in zip(rows, source_rows[1:]):
        assert {k: r[k] for k in src_row} == src_row  # the file's own columns are kept as they were

    store = tmp_path / "agr.h5"
    study.run_attr_compute(study.attr_compute_args(prepared, model_dir, store))
    with open_store(store) as s:
        assert len(s) == 11 and set(s.methods) == set(study.METHODS.split(","))
        prefers = []
        for ex, r in zip(s, rows):
            assert ex.id == r["id"] and ex.tokens[ex.explain_pos] == "[MASK]"
            assert ex.task_info["target_word"] == r["verb"] and ex.task_info["foil_word"] == r["foil"]
            assert [ex.tokens[i] for i in np.nonzero(ex.evidence)[0]] == [r["subj"]]
            prefers.append(ex.task_info["prefers_target"])
    out = tmp_path / "figures"
    assert study.main(["--analyse", str(store), "--data", str(prepared), "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    attracted = np.array([int(r["n_diff_intervening"]) > 0 for r in rows])
    assert res["n"] == 11 and res["n_attractor"] == attracted.sum()
    assert res["accuracy"]["all"] == pytest.approx(np.mean(prefers))
    assert res["accuracy"]["with_attractor"] == pytest.approx(np.mean(np.array(prefers)[attracted]))
    assert sum(c["n"] for c in res["conditions"].values()) == 11
    assert all(v["subject_above_attractor"] == [] for v in res["layers"].values())  # no attractor positions here
    assert "subject > attractor per layer" not in (out / "results.md").read_text()
