"""Store format 1.4: the task (root attr ``task``, the index's task fields, /examples/task) written and read for every
task, carried through resume, rewrite and merge, checked against damage; older stores read as classification."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from store import ENCODING_VERSION, StoreError, StoreWriter, merge, open_store
from store import resume as resume_store
from store.copying import rewrite
from task_stores import LABELS, OPTIONS, layouts, task_examples, write_task_store

TASKS = list(LABELS)
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def expected_info(task: str, ex) -> dict:
    """Example.task_info of an ExampleData, by the contract (docs/store.md)."""
    words = ex.task_info or {}
    qa = task == "qa"
    return {"task": task, "target_token": ex.target_token, "foil_token": ex.foil_token,
            "target_word": words.get("target"), "foil_word": words.get("foil"),
            "prefers_target": (ex.output > 0) if ex.foil_token >= 0 else None,
            "output": float(np.float32(ex.output)), "gold_value": None if math.isnan(ex.gold_value) else ex.gold_value,
            "span": (ex.explain_pos, ex.span_end) if qa else None, "pred_span": (ex.pred, ex.pred_end) if qa else None,
            "answer": words.get("answer")}


def assert_task_fields(got, exp, task: str) -> None:
    assert (got.target_token, got.foil_token, got.span_end, got.pred_end) == \
           (exp.target_token, exp.foil_token, exp.span_end, exp.pred_end)
    assert got.explain_pos == exp.explain_pos and got.pred == exp.pred and got.target == exp.target
    assert got.label == (None if exp.label < 0 else exp.label)
    np.testing.assert_array_equal(got.output, np.float32(exp.output))
    assert got.gold_value == (None if math.isnan(exp.gold_value) else pytest.approx(exp.gold_value))
    assert got.task_words == (exp.task_info or {})
    np.testing.assert_array_equal(got.probs, np.asarray(exp.probs, dtype=np.float32))  # NaN where there is no foil
    assert got.tokens == exp.tokens
    info = got.task_info
    want = expected_info(task, exp)
    assert info.keys() == want.keys()
    for key, value in want.items():
        if key == "output":
            np.testing.assert_array_equal(info[key], value)
        elif key == "gold_value" and value is not None:
            assert info[key] == pytest.approx(value)
        else:
            assert info[key] == value, key
    if exp.evidence is not None:
        np.testing.assert_array_equal(got.evidence, exp.evidence)


@pytest.mark.parametrize("task", TASKS)
def test_every_task_field_round_trips(tmp_path, task):
    path = tmp_path / f"{task}.h5"
    exs = write_task_store(path, task)
    with open_store(path) as s:
        assert s.format_version == ENCODING_VERSION == "2.1.0"
        assert s.task == {"name": task, "options": OPTIONS.get(task, {})} and s.task_name == task
        assert s.labels == LABELS[task] and s.num_labels == len(LABELS[task])
        assert "task" not in s.model_info  # the task is not model provenance
        assert len(s) == len(exs)
        for i, exp in enumerate(exs):
            assert_task_fields(s[i], exp, task)
        np.testing.assert_array_equal(s.index_column("span_end"), [e.span_end for e in exs])


def test_task_info_reads_each_task_as_the_contract_says(tmp_path):
    """Spelled out for one example of each kind (the generic check above derives the expectation)."""
    write_task_store(tmp_path / "m.h5", "masked-token")
    write_task_store(tmp_path / "q.h5", "qa")
    write_task_store(tmp_path / "r.h5", "regression")
    with open_store(tmp_path / "m.h5") as s:
        first, second, third = s[0].task_info, s[1].task_info, s[2].task_info
        assert (first["target_word"], first["foil_word"], first["prefers_target"]) == ("are", "is", True)
        assert first["output"] == pytest.approx(math.log(0.6 / 0.1), rel=1e-6) and s[0].explain_pos == 6
        assert (second["foil_word"], second["foil_token"], second["prefers_target"]) == (None, -1, None)
        assert third["prefers_target"] is False and third["span"] is None and third["answer"] is None
        assert math.isnan(s[1].probs[1]) and s[1].probs[0] == pytest.approx(0.4)
    with open_store(tmp_path / "q.h5") as s:
        info = s[1].task_info
        assert info["span"] == (9, 10) and info["pred_span"] == (10, 10) and info["answer"] == "northern France"
        assert s[1].tokens[9:11] == ["northern", "france"] and info["target_word"] is None
        assert info["prefers_target"] is None and info["gold_value"] is None
    with open_store(tmp_path / "r.h5") as s:
        assert s[0].task_info["gold_value"] == 4.0 and s[0].task_info["output"] == 3.75
        assert s[1].task_info["gold_value"] is None and s[1].task_words == {}
        assert s.task["options"] == {"regression_rank": "ascending"}


def test_unicode_task_words_are_stored_as_utf8_json(tmp_path):
    exs = task_examples("masked-token")
    exs[0].task_info = {"target": "naïve", "foil": "日本"}
    write_task_store(tmp_path / "u.h5", "masked-token", exs)
    with h5py.File(tmp_path / "u.h5", "r") as f:
        blob = bytes(f["examples/task"][()])
    assert "naïve".encode("utf-8") in blob and "日本".encode("utf-8") in blob
    with open_store(tmp_path / "u.h5") as s:
        assert s[0].task_info["target_word"] == "naïve" and s[0].task_info["foil_word"] == "日本"
        assert s[1].task_words == {"target": "wrote"}


def test_a_store_created_without_a_task_is_a_classification_store(tmp_path):
    path = tmp_path / "c.h5"
    exs = write_task_store(path, "classification", task_attr=False)
    with open_store(path) as s:
        assert s.task == {"name": "classification", "options": {}}
        for i, exp in enumerate(exs):
            assert_task_fields(s[i], exp, "classification")
            assert s[i].task_info["output"] == pytest.approx(1.25 - i)


def test_writer_refuses_an_unknown_task(tmp_path):
    with pytest.raises(StoreError, match="unknown task 'translation'"):
        StoreWriter.create(str(tmp_path / "x.h5"), n_layers=2, n_heads=2, labels={0: "a"}, methods=layouts(),
                           provenance={}, task={"name": "translation", "options": {}})
    assert not (tmp_path / "x.h5").exists()


# --- stores written before format 1.4 ---------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["store-1.2.h5", "store-1.3.h5"])
def test_older_stores_read_as_classification_with_the_defaults(fixture):
    with open_store(FIXTURES / fixture) as s:
        assert s.task == {"name": "classification", "options": {}} and s.task_name == "classification"
        assert len(s) == 10
        for ex in s:
            assert (ex.target_token, ex.foil_token, ex.span_end, ex.pred_end) == (-1, -1, -1, -1)
            assert math.isnan(ex.output) and ex.gold_value is None and ex.task_words == {}
            info = ex.task_info
            assert info["task"] == "classification" and info["prefers_target"] is None and info["span"] is None
        rows = s.index_rows(0, 10)
        assert rows.dtype.names[-13:] == ("target_token", "foil_token", "span_end", "pred_end", "output",
                                          "gold_value", "task_off", "task_len", "probs", "prompt_len", "n_steps",
                                          "step_off", "grid_off")
        np.testing.assert_array_equal(rows["task_len"], 0)
        np.testing.assert_array_equal(rows["prompt_len"], -1)  # 2.0's step fields: no generation
        for key in ("n_steps", "step_off", "grid_off"):
            np.testing.assert_array_equal(rows[key], 0)


@pytest.mark.parametrize("fixture", ["store-1.2.h5", "store-1.3.h5"])
def test_resuming_an_older_store_writes_the_current_format_with_the_defaults(tmp_path, fixture):
    path = tmp_path / "old.h5"
    shutil.copy(FIXTURES / fixture, path)
    with open_store(path) as s:
        before = [(ex.id, ex.pred, ex.probs.tolist(), ex.tokens) for ex in s]
    rewrite(str(path))
    with open_store(path) as s:
        assert s.format_version == ENCODING_VERSION and s.task_name == "classification" and s.complete
        assert [(ex.id, ex.pred, ex.probs.tolist(), ex.tokens) for ex in s] == before
        assert all(math.isnan(ex.output) and ex.task_words == {} and ex.target_token == -1 for ex in s)
    with h5py.File(path, "r") as f:
        assert f["examples/task"].shape == (0,) and "task" in f.attrs


# --- resume, merge ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["masked-token", "qa", "regression"])
def test_resume_carries_the_task_fields(tmp_path, task):
    path = tmp_path / "r.h5"
    exs = task_examples(task)
    write_task_store(path, task, exs[:1], complete=False)
    w = resume_store(str(path))
    w.append(exs[1:])
    w.close(complete=True)
    with open_store(path) as s:
        assert s.task == {"name": task, "options": OPTIONS.get(task, {})} and len(s) == len(exs)
        for i, exp in enumerate(exs):
            assert_task_fields(s[i], exp, task)


@pytest.mark.parametrize("task", ["next-token", "qa"])
def test_merge_carries_the_task_and_gives_the_single_store_bit_for_bit(tmp_path, task):
    exs = task_examples(task)
    shards = [tmp_path / "a.h5", tmp_path / "b.h5"]
    write_task_store(shards[0], task, exs[:1])
    write_task_store(shards[1], task, exs[1:])
    out = tmp_path / "merged.h5"
    merge(str(out), [str(p) for p in shards], {"task": task})
    with open_store(out) as s:
        assert s.task_name == task and len(s) == len(exs)
        for i, exp in enumerate(exs):
            assert_task_fields(s[i], exp, task)
    whole = tmp_path / "whole.h5"
    write_task_store(whole, task, exs)
    with h5py.File(out, "r") as a, h5py.File(whole, "r") as b:
        for name in ("examples/index", "examples/task", "examples/ids", "tokens/ids"):
            x, y = a[name][()], b[name][()]
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), name


def test_merge_refuses_shards_of_different_tasks(tmp_path):
    write_task_store(tmp_path / "a.h5", "masked-token")
    exs = task_examples("next-token")
    for k, ex in enumerate(exs):
        ex.row = 10 + k
    write_task_store(tmp_path / "b.h5", "next-token", exs)
    with pytest.raises(StoreError, match="differs .* in its task"):
        merge(str(tmp_path / "m.h5"), [str(tmp_path / "a.h5"), str(tmp_path / "b.h5")], {})
    assert not (tmp_path / "m.h5").exists()


# --- damage -------------------------------------------------------------------------------------------------------


def test_a_flipped_byte_in_the_task_words_is_reported(tmp_path):
    path = tmp_path / "q.h5"
    write_task_store(path, "qa")
    with h5py.File(path, "r") as f:
        info = f["examples/task"].id.get_chunk_info(0)
    data = bytearray(path.read_bytes())
    data[info.byte_offset + info.size // 2] ^= 0x10
    path.write_bytes(bytes(data))
    with open_store(path) as s:
        assert s[0].tokens[0] == "[CLS]"  # the rest reads ...
        with pytest.raises(StoreError, match="damaged.*examples/task"):
            s[0].task_info  # ... the damaged words are refused, not shown


def test_task_words_shorter_than_the_index_says_are_refused(tmp_path):
    """The extent check covers /examples/task: a store whose task words end before the committed rows need."""
    path = tmp_path / "m.h5"
    write_task_store(path, "masked-token", complete=False)
    with h5py.File(path, "r+") as f:
        f["examples/task"].resize((5,))
    with pytest.raises(StoreError, match="damaged.*examples/task.*5 entries"):
        open_store(path)


def _edit_row(path, i: int, **fields) -> None:
    with h5py.File(path, "r+") as f:
        idx = f["examples/index"][:]
        for key, value in fields.items():
            idx[i][key] = value
        f["examples/index"][i] = idx[i]


@pytest.mark.parametrize("task, fields", [
    ("qa", {"span_end": 99}),  # past the example's tokens
    ("qa", {"span_end": 3}),  # before the span's start
    ("qa", {"pred": 40}),
    ("masked-token", {"target_token": -1}),  # a language model example explains a target word
    ("masked-token", {"foil_token": 2003, "probs": [0.5, np.nan]}),  # a foil without its probability
    ("classification", {"pred": 5}),
    ("regression", {"task_len": 1 << 20}),  # words past the end of /examples/task
], ids=["qa-span-past-end", "qa-span-before-start", "qa-pred", "lm-no-target", "lm-foil-nan", "class-pred",
        "task-words-past-end"])
def test_index_rows_that_contradict_the_task_are_refused(tmp_path, task, fields):
    path = tmp_path / "x.h5"
    write_task_store(path, task)
    _edit_row(path, 1 if task != "regression" else 0, **fields)
    with open_store(path) as s:
        with pytest.raises(StoreError, match="damaged.*examples/index"):
            s[0]
    if task != "regression":
        untouched = tmp_path / "ok.h5"
        write_task_store(untouched, task)
        with open_store(untouched) as s:
            s[1]  # the same store without the edit reads


@pytest.mark.parametrize("task, fields, why", [
    ("qa", {"span_end": 40}, "span_end or pred_end outside the tokens"),
    ("qa", {"pred": -1}, "the predicted span outside the tokens"),
    ("next-token", {"target_token": -1}, "no target token"),
    ("masked-token", {"probs": np.array([0.5, np.nan])}, "a foil without a finite p\\(foil\\)"),
    ("regression", {"probs": np.array([np.inf])}, "the value not finite"),
    ("classification", {"pred": 2}, "label or pred not one of the 2 classes"),
])
def test_writer_refuses_examples_that_contradict_the_task(tmp_path, task, fields, why):
    """What a reader would take for damage is refused when it is written, naming the example."""
    exs = task_examples(task)
    for key, value in fields.items():
        setattr(exs[0], key, value)
    with pytest.raises(ValueError, match=f"example ex0: {why} \\(task {task}\\)"):
        write_task_store(tmp_path / "x.h5", task, exs)
    with open_store(tmp_path / "x.h5") as s:
        assert len(s) == 0  # nothing was committed
