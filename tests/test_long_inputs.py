"""Long inputs end to end (issue 36 point 6, the compute side): --max-length up to the model's positions, a document of
thousands of tokens through attr-compute with --matrices cls on a tiny Llama that takes 8,192 positions, and the
export of that store reading only the token rows it writes."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from cli_results import invoke, ok, one_line
from conftest import WORDS
from families import write_long_model_dir
from store import open_store

LONG_WORDS, MAX_LENGTH = 2600, 2100  # the document is cut to --max-length (2 of its tokens are [CLS] and [SEP])
METHODS = ("rollout", "norm", "grad_l2")


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    """Its tokenizer declares 512 tokens (as some checkpoints' do), the model takes 8,192 positions."""
    return write_long_model_dir(tmp_path_factory.mktemp("long") / "model", positions=8192, model_max_length=512)


@pytest.fixture(scope="module")
def long_data(tmp_path_factory):
    rng = random.Random(0)
    rows = [{"text": " ".join(rng.choice(WORDS[:20]) for _ in range(n)), "label": i % 2, "id": f"doc{i}"}
            for i, n in enumerate((LONG_WORDS, 30))]
    path = tmp_path_factory.mktemp("long") / "docs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def long_store(long_model, long_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("long") / "long.h5"
    ok(invoke(long_data, "--model", long_model, "--device", "cpu", "--methods", ",".join(METHODS), "--matrices", "cls",
              "--max-length", MAX_LENGTH, "-o", out, "-q"))
    return out


def test_max_length_beyond_the_model_positions_is_one_line_naming_the_limit(long_model, long_data, tmp_path):
    out = tmp_path / "o.h5"
    line = one_line(invoke(long_data, "--model", long_model, "--device", "cpu", "--methods", "norm",
                           "--max-length", 8193, "-o", out), code=2)
    assert line == ("attr-compute: error: --max-length 8193 exceeds the model's 8192 positions "
                    "(max_position_embeddings): use at most 8192")
    assert not out.exists()


def test_a_long_document_runs_end_to_end_up_to_the_model_positions_not_the_tokenizer_limit(long_store):
    """--max-length 2,100 on a model of 8,192 positions whose tokenizer declares 512: the document is cut at 2,100
    tokens, not 512, and every method's scores and explained rows span them."""
    with open_store(long_store) as s:
        assert len(s) == 2 and s.complete
        long, short = s[0], s[1]
        assert (long.id, len(long.tokens), long.truncated, long.n_orig_tokens) == ("doc0", MAX_LENGTH, True,
                                                                                   LONG_WORDS + 2)
        assert (len(short.tokens), short.truncated) == (32, False)
        assert s.config["config"]["max_length"] == MAX_LENGTH
        for ex in (long, short):
            n = len(ex.tokens)
            for name in METHODS:
                scores = ex.scores(name)
                assert scores.shape == (n,) and np.isfinite(scores).all()
            assert (ex.scores("norm") >= 0).all() and (ex.scores("grad_l2") >= 0).all()
            # --matrices cls: each layer's M^l = (A_bar + I) row-normalised, only the explained (last real) token's
            # row, kept in float16; the views are the rows of the products M^l ... M^1, the scores the last one
            rows, views = ex.matrices("rollout"), ex.layer_scores("rollout")
            assert rows.shape == (2, 1, n) and views.shape == (2, n)
            np.testing.assert_allclose(rows.sum(-1), 1.0, atol=2e-3)
            np.testing.assert_allclose(views.sum(-1), 1.0, atol=2e-3)
            np.testing.assert_allclose(views[0], rows[0, 0], rtol=2e-3, atol=1e-6)  # M^1's row
            np.testing.assert_array_equal(ex.scores("rollout"), views[-1])


def test_the_export_of_a_long_store_reads_each_token_row_once_and_no_matrices(long_store, tmp_path, monkeypatch):
    import store.reader as reader

    reads = []
    real = reader.Store._read

    def spy(self, name, sel, expect=None):
        out = real(self, name, sel, expect)
        reads.append((name, int(np.size(out))))
        return out

    monkeypatch.setattr(reader.Store, "_read", spy)
    out = tmp_path / "long.csv"
    ok(invoke("export", long_store, "-o", out, "--methods", "rollout,norm"))
    tokens = MAX_LENGTH + 32
    with open(out) as fh:
        assert sum(1 for _ in fh) == 1 + 2 * tokens  # the header and a row per token and method
    read = {}
    for name, size in reads:
        read[name] = read.get(name, 0) + size
    assert not [name for name in read if "matri" in name or "layer" in name or "grad_l2" in name]
    assert {name: size for name, size in read.items() if name.endswith("scores")} == {
        "methods/rollout/scores": tokens, "methods/norm/scores": tokens}


def test_auto_on_the_cpu_refuses_a_long_input_the_memory_model_says_does_not_fit_before_measuring(
        long_model, long_data, tmp_path, monkeypatch):
    """--batch-memory-mb is the CPU's budget: rollout at 2,100 tokens (its head means streamed layer by layer, 2 x
    2,100^2 in float32, beside a layer's 4 heads of attention and rollout's products: about 0.2 GiB) does not fit
    100 MB; refused in one line naming rollout and the memory model's longest input, before any batch is measured and
    before the store is made."""
    import torch

    from compute import memory
    from compute import memory_model as mm
    from compute.models import load_model
    from compute.run.auto_batch import model_shape

    def never(work):
        raise AssertionError("a batch was measured")

    monkeypatch.setattr(memory, "peak_bytes", never)
    out = tmp_path / "o.h5"
    line = one_line(invoke(long_data, "--model", long_model, "--device", "cpu", "--methods", "norm,rollout",
                           "--max-length", MAX_LENGTH, "--batch-size", "auto", "--batch-memory-mb", 100, "-o", out))
    assert not out.exists()
    shape = model_shape(load_model(str(long_model), device=torch.device("cpu")), 2)
    room = 100 << 20
    longest = mm.longest(lambda n: sum(mm.per_batch("rollout", shape, mm.Run(n, 4, mm.Budgets.cpu()))) <= room)
    assert 1000 < longest < MAX_LENGTH
    # norm too: the forward's one layer of eager attention (4 x 2,100^2, scores and softmax) is about 140 MB
    assert ": rollout needs about 0.2 GiB" in line and f"of {MAX_LENGTH} tokens, beyond --batch-memory-mb 100 (the memory model" in line
    assert line.endswith(f"the longest input that fits is about {longest} tokens; lower --max-length to {longest}, "
                         "or leave out norm and rollout")
