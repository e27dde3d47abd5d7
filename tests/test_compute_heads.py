"""``attr-compute --heads``: every head's attention probabilities in the store, equal to the model's own
``output_attentions`` for the example alone, whether it ran alone or in a padded batch; the resume identity; the
option's checks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from cli_results import invoke, ok, one_line

from conftest import SHARED_MODEL, SST2_DEV, needs_shared
from store import open_store

TEXTS = ["the movie was great", "a dull film", "i loved the acting but the plot was slow and the story not very good",
         "bad", "it is fun", "this film was long and boring but the acting is good"]

pytestmark = pytest.mark.usefixtures("one_thread")


def write_data(path):
    path.write_text("".join(json.dumps({"text": t, "label": i % 2}) + "\n" for i, t in enumerate(TEXTS)))
    return path


def run_args(data, model, out, *extra):
    return ("run", data, "--model", model, "-o", out, "--device", "cpu", "--methods", "rollout", "-q", *extra)


def own_attentions(model_dir, text: str) -> np.ndarray:
    """[L, H, n, n]: the model's own output_attentions for ``text`` alone (no padding)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(**tok(text, return_tensors="pt"), output_attentions=True)
    return torch.stack(out.attentions)[:, 0].numpy()


@pytest.mark.parametrize("matrices", ["all", "cls"])
@pytest.mark.parametrize("batch_size", [1, 6])
def test_heads_are_the_models_own_attention_alone_and_in_a_padded_batch(tiny_model_dirs, tmp_path, matrices,
                                                                        batch_size):
    model = tiny_model_dirs["bert"]
    out = tmp_path / "h.h5"
    ok(invoke(*run_args(write_data(tmp_path / "d.jsonl"), model, out, "--heads", "--matrices", matrices,
                        "--store-dtype", "float32", "--batch-size", batch_size)))
    with open_store(out) as s:
        assert s.heads == matrices and s.heads_dtype == "float32" and len(s) == len(TEXTS)
        assert s.config["config"]["heads"] is True
        lengths = [s[i].n_tokens for i in range(len(s))]
        assert len(set(lengths)) > 3  # the batch of 6 is padded to its longest
        for i, text in enumerate(TEXTS):
            ex = s[i]
            own = own_attentions(model, text)
            assert own.shape == (3, 4, ex.n_tokens, ex.n_tokens)
            want = own if matrices == "all" else own[:, :, ex.explain_pos]
            np.testing.assert_allclose(ex.heads(), want, rtol=0, atol=1e-5, err_msg=f"example {i}")
            np.testing.assert_allclose(ex.head_rows(), own[:, :, ex.explain_pos], rtol=0, atol=1e-5)


@needs_shared
@pytest.mark.shared
def test_heads_of_the_shared_sst2_model_in_a_padded_batch(tmp_path):
    """The real 6-layer, 12-head BERT: its first 8 SST-2 dev sentences in one padded batch."""
    out = tmp_path / "sst2.h5"
    ok(invoke("run", SST2_DEV, "--model", SHARED_MODEL, "-o", out, "--device", "cpu", "--methods", "rollout", "-q",
              "--limit", 8, "--batch-size", 8, "--heads", "--matrices", "all", "--store-dtype", "float32"))
    with open_store(out) as s:
        assert (s.heads, s.n_layers, s.n_heads, len(s)) == ("all", 6, 12, 8)
        assert len({s[i].n_tokens for i in range(8)}) > 1
        for i in range(8):
            np.testing.assert_allclose(s[i].heads(), own_attentions(SHARED_MODEL, s[i].text), rtol=0, atol=1e-5,
                                       err_msg=f"example {i}")


def test_a_store_without_heads_has_none(tiny_model_dirs, tmp_path):
    out = tmp_path / "plain.h5"
    ok(invoke(*run_args(write_data(tmp_path / "d.jsonl"), tiny_model_dirs["bert"], out)))
    with open_store(out) as s:
        assert s.heads == "none" and s[0].heads() is None and s.config["config"]["heads"] is False


def test_heads_in_float16_round_the_models_attention(tiny_model_dirs, tmp_path):
    model = tiny_model_dirs["bert"]
    out = tmp_path / "h.h5"
    ok(invoke(*run_args(write_data(tmp_path / "d.jsonl"), model, out, "--heads")))
    with open_store(out) as s:
        assert (s.heads, s.heads_dtype) == ("cls", "float16")
        own = own_attentions(model, TEXTS[2])[:, :, s[2].explain_pos]
        np.testing.assert_array_equal(s[2].heads(), own.astype(np.float16).astype(np.float32))


def test_resume_refuses_another_heads(tiny_model_dirs, tmp_path):
    model, data = tiny_model_dirs["bert"], write_data(tmp_path / "d.jsonl")
    for made, other in ((("--heads",), ()), ((), ("--heads",))):
        out = tmp_path / f"r{len(made)}.h5"
        ok(invoke(*run_args(data, model, out, *made)))
        before = out.read_bytes()
        line = one_line(invoke(*run_args(data, model, out, "--resume", *other)))
        assert "--resume" in line and "--heads" in line and "--overwrite" in line
        assert ("made with --heads on, not off" if made else "made with --heads off, not on") in line
        assert out.read_bytes() == before
        ok(invoke(*run_args(data, model, out, "--resume", *made)))  # the same --heads resumes


def test_heads_without_matrices_is_a_usage_error(tiny_model_dirs, tmp_path):
    out = tmp_path / "n.h5"
    line = one_line(invoke(*run_args(write_data(tmp_path / "d.jsonl"), tiny_model_dirs["bert"], out, "--heads",
                                     "--matrices", "none")), code=2)
    assert "--heads" in line and "--matrices cls" in line and not out.exists()


def test_merged_shards_keep_the_heads_of_a_single_run(tiny_model_dirs, tmp_path):
    model, data = tiny_model_dirs["bert"], write_data(tmp_path / "d.jsonl")
    args = ("--heads", "--matrices", "all", "--batch-size", 1)
    ok(invoke(*run_args(data, model, tmp_path / "full.h5", *args)))
    for k in (0, 1):
        ok(invoke(*run_args(data, model, tmp_path / "out.h5", *args, "--shard", f"{k}/2")))
    shards = [tmp_path / f"out.shard-{k}-of-2.h5" for k in (0, 1)]
    ok(invoke("merge", tmp_path / "out.h5", *shards))
    with open_store(tmp_path / "out.h5") as merged, open_store(tmp_path / "full.h5") as full:
        assert merged.heads == full.heads == "all" and len(merged) == len(full) == len(TEXTS)
        for i in range(len(full)):
            np.testing.assert_array_equal(merged[i].heads(), full[i].heads(), err_msg=f"example {i}")
    # a shard made without --heads is another plan
    ok(invoke(*run_args(data, model, tmp_path / "plain.h5", "--matrices", "all", "--batch-size", 1, "--shard", "1/2")))
    line = one_line(invoke("merge", tmp_path / "m2.h5", shards[0], tmp_path / "plain.shard-1-of-2.h5"))
    assert "--heads" in line and not (tmp_path / "m2.h5").exists()
