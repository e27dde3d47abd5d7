"""The faithfulness metrics on the tasks beyond classification, on hand-made predictors whose answers are known: a
masked-token example whose explained mask moves when deletion removes tokens before it, replacement that keeps it in
place, and the model predictor's rows per task (the target's and foil's probability at the explained position, a
regression head's value)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from compute.evaluate import ModelPredictor
from compute.metrics.aopc import AOPC
from compute.metrics.base import EvalExample
from compute.metrics.comprehensiveness import Comprehensiveness

CLS, SEP, MASK = 101, 102, 103
TARGET, FOIL = 50, 51


def sig(z):
    return 1.0 / (1.0 + math.exp(-z))


class WordBag:
    """p(target) = sigmoid(sum of the weights of the tokens); asserts that every perturbed sequence still holds the
    mask where ``where`` says the explained position is, and that the words are the example's."""

    def __init__(self, w: dict):
        self.w = w
        self.where = None
        self.seqs = []

    def __call__(self, sequences, attend=None, where=None):
        assert where is not None and len(where) == len(sequences)
        self.where, self.seqs = np.asarray(where), [np.asarray(s) for s in sequences]
        out = []
        for s, (pos, target, foil) in zip(sequences, where):
            assert s[pos] == MASK, (list(s), pos)
            assert (target, foil) == (TARGET, FOIL)
            p = sig(sum(self.w.get(int(t), 0.0) for t in s))
            out.append([p, 1.0 - p])
        return np.array(out)


def mlm_example():
    # [CLS] 1 [MASK] 2 3 [SEP]; the mask (explained, never perturbed) is scored highest on purpose
    ids = np.array([CLS, 1, MASK, 2, 3, SEP])
    special = np.array([True, False, False, False, False, True])
    scores = np.array([0.0, 3.0, 10.0, 2.0, 1.0, 0.0])
    # the stored pred of a word task is the target's column (0), as evaluate gives it
    return EvalExample(index=0, id="m", token_ids=ids, special=special, scores=scores, label=-1, pred=0,
                       explain_pos=2, target_token=TARGET, foil_token=FOIL)


def test_comprehensiveness_on_a_masked_token_example_follows_the_moving_mask():
    bag = WordBag({1: 1.0, 2: 0.5, 3: -0.5})
    res = Comprehensiveness().evaluate([mlm_example()], bag)
    f = sig(1.0)
    assert res.levels[0].tolist() == [0, 1, 1, 1, 1, 2]  # 3 ranked tokens (the mask is protected)
    np.testing.assert_allclose(res.curves[0], [f, sig(0.0), sig(0.0), sig(0.0), sig(0.0), sig(-0.5)], rtol=1e-12)
    np.testing.assert_allclose(res.values[0], (4 * (f - sig(0.0)) + (f - sig(-0.5))) / 6, rtol=1e-12)
    got = {tuple(s.tolist()): int(w[0]) for s, w in zip(bag.seqs, bag.where)}
    assert got == {(CLS, 1, MASK, 2, 3, SEP): 2, (CLS, MASK, 2, 3, SEP): 1, (CLS, MASK, 3, SEP): 1}


def test_replacement_keeps_the_mask_where_it_was():
    bag = WordBag({1: 1.0, 2: 0.5, 3: -0.5, 0: 0.0})
    res = AOPC(perturbation="pad", pad_id=0).evaluate([mlm_example()], bag)
    assert (bag.where[:, 0] == 2).all()
    assert np.isfinite(res.values[0])
    assert all(len(s) == 6 for s in bag.seqs)


def test_model_predictor_rows_per_task():
    logits = torch.tensor([[[0.0, 1.0, 2.0], [3.0, 0.0, -1.0]], [[1.0, 1.0, 1.0], [0.5, 0.0, 0.0]]],
                          dtype=torch.float64)  # [R=2, n=2, V=3]
    pred = ModelPredictor.__new__(ModelPredictor)
    pred.task = "masked-token"
    rows = pred._rows(logits, np.array([[1, 0, 2], [0, 1, -1]]))
    p0 = torch.softmax(logits[0, 1], -1)
    p1 = torch.softmax(logits[1, 0], -1)
    np.testing.assert_allclose(rows[0], [p0[0], p0[2]], rtol=1e-12)
    assert rows[1, 0] == pytest.approx(float(p1[1])) and math.isnan(rows[1, 1])
    pred.task = "regression"
    value = torch.tensor([[2.5], [-1.0]], dtype=torch.float64)
    np.testing.assert_array_equal(pred._rows(value, None), [[2.5], [-1.0]])  # the value itself, no softmax
    pred.task = "classification"
    np.testing.assert_allclose(pred._rows(value[:, :1].repeat(1, 2), None), [[0.5, 0.5], [0.5, 0.5]])


def test_model_predictor_keeps_two_targets_of_one_sequence_apart():
    """The cache is keyed by the sequence and the explained words: a sequence explained for two targets is not
    answered from the other's row."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=16, attn_implementation="eager")).eval()
    pred = ModelPredictor(model, pad_id=0, batch_size=4, task="masked-token")
    seq = np.array([2, 5, 4, 3])
    out = pred([seq, seq], None, np.array([[2, 10, -1], [2, 11, 12]]))
    with torch.no_grad():
        p = torch.softmax(model(input_ids=torch.as_tensor(seq)[None]).logits[0, 2].double(), -1)
    np.testing.assert_allclose(out[0, 0], float(p[10]), rtol=1e-6)
    np.testing.assert_allclose(out[1], [float(p[11]), float(p[12])], rtol=1e-6)
    assert pred.forwarded == 2
