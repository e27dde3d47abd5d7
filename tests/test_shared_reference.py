"""Acceptance on the shared MiniLM-SST2 model over all of SST-2 dev: what attr-compute stores equals an independent
float64 computation of each definition, one example at a time (tests/reference.py), within 1e-4 relative: every
example's prediction, and the values of every EVERY-th (default 2: 436 examples; the whole set took 43 s of the
suite; ATTRSCOPE_REFERENCE_EVERY=1 checks all 872)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from conftest import SHARED_MODEL, SST2_DEV, needs_shared

import reference as R
from store import open_store

pytestmark = [needs_shared, pytest.mark.slow, pytest.mark.shared]
EVERY = int(os.environ.get("ATTRSCOPE_REFERENCE_EVERY", "2"))


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.abs(b).max(), 1e-12))


@pytest.fixture(scope="module")
def model64():
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(
        SHARED_MODEL, attn_implementation="eager").to(torch.float64).eval()


def test_store_holds_all_dev_examples_with_the_models_predictions(shared_dev_store, model64):
    from transformers import AutoModelForSequenceClassification

    model32 = AutoModelForSequenceClassification.from_pretrained(SHARED_MODEL, attn_implementation="eager").eval()
    with open_store(shared_dev_store) as s:
        assert len(s) == 872 and s.complete
        assert s.n_layers == 6 and s.n_heads == 12
        assert [ex.row for ex in s] == list(range(872))
        labels = [int(line.rsplit("\t", 1)[1]) for line in SST2_DEV.read_text().splitlines()[1:]]
        assert [ex.label for ex in s] == labels
        for ex in s:
            with torch.no_grad():
                logits = model32(input_ids=torch.tensor([ex.token_ids.tolist()])).logits[0]
            assert ex.pred == int(logits.argmax())
            np.testing.assert_allclose(ex.probs, torch.softmax(logits, -1).numpy(), atol=1e-5)
            n = len(ex.tokens)
            assert ex.tokens[0] == "[CLS]" and ex.tokens[-1] == "[SEP]"
            for m in s.methods:
                assert ex.scores(m).shape == (n,)
                if m != "norm":
                    assert ex.layer_scores(m).shape == (6, n)
            for m in ("raw_attention", "rollout"):
                assert ex.matrices(m).shape == (6, n, n)
        accuracy = np.mean([ex.correct for ex in s])
        assert accuracy == pytest.approx(774 / 872)  # the model card's figure


def test_every_stored_value_equals_the_float64_reference(shared_dev_store, model64):
    worst: dict[str, float] = {}

    def check(key, got, want, tol=1e-4):
        err = _rel(got, want)
        worst[key] = max(worst.get(key, 0.0), err)
        assert err <= tol, f"{key}: relative error {err:.2e}"

    with open_store(shared_dev_store) as s:
        for ex in (s[i] for i in range(0, len(s), EVERY)):
            logits, att, hs = R.forward64(model64, ex.token_ids.tolist())
            assert int(np.argmax(logits)) == ex.pred
            pos, t = ex.explain_pos, ex.target
            assert pos == 0 and t == ex.pred
            f, v, M = R.raw_attention(att, pos)
            check("raw_attention", ex.scores("raw_attention"), f)
            check("raw_attention/layers", ex.layer_scores("raw_attention"), v)
            check("raw_attention/matrices", ex.matrices("raw_attention"), M, tol=2e-3)  # float16 storage
            f, v, M = R.rollout(att, pos)
            check("rollout", ex.scores("rollout"), f)
            check("rollout/layers", ex.layer_scores("rollout"), v)
            check("rollout/matrices", ex.matrices("rollout"), M, tol=2e-3)
            check("norm", ex.scores("norm"), R.norm(hs))
            f, v = R.logat(model64, hs, t)
            check("logat", ex.scores("logat"), f)
            check("logat/layers", ex.layer_scores("logat"), v)
            f, v = R.normxlogit(model64, hs, t)
            check("normxlogit", ex.scores("normxlogit"), f)
            check("normxlogit/layers", ex.layer_scores("normxlogit"), v)
    print("worst relative errors:", {k: f"{v:.1e}" for k, v in worst.items()})


def test_alone_and_in_a_padded_batch_agree_on_the_shared_model(shared_dev_store, tmp_path):
    """The same examples computed one per batch agree with the 32-example, length-sorted batches to 1e-5."""
    from compute.runner import RunConfig, run

    alone = tmp_path / "alone.h5"
    run(RunConfig(dataset=str(SST2_DEV), model=str(SHARED_MODEL), limit=40, batch_size=1, output=str(alone),
                  methods="raw_attention,rollout,norm,logat,normxlogit", matrices="all", store_dtype="float32"))
    with open_store(alone) as a, open_store(shared_dev_store) as b:
        for i in range(len(a)):
            ea, eb = a[i], b[i]
            assert ea.tokens == eb.tokens and ea.pred == eb.pred
            for m in a.methods:
                scale = max(float(np.abs(ea.scores(m)).max()), 1.0)
                np.testing.assert_allclose(ea.scores(m), eb.scores(m), rtol=1e-5, atol=1e-5 * scale)
                if ea.layer_scores(m) is not None:
                    np.testing.assert_allclose(ea.layer_scores(m), eb.layer_scores(m), rtol=1e-5, atol=1e-5 * scale)
