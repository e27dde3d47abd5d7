"""Perturbation metrics (METHODS.md 8.1, 8.2) on hand-made predictors whose answers are known: a bag-of-words
"model" (p(class 1) = sigmoid of the summed weights of the present, attended tokens), probability tables keyed by
length, and literal Python re-implementations of the ALTI and AttCAT reference loops."""

from __future__ import annotations

import math

import numpy as np
import pytest

from compute.errors import AttrscopeError
from compute.metrics import aopc, lodds
from compute.metrics import perturbation as pt
from compute.metrics.accuracy import PerturbedAccuracy
from compute.metrics.aopc import AOPC
from compute.metrics.base import EvalExample
from compute.metrics.comprehensiveness import Comprehensiveness
from compute.metrics.lodds import LOdds
from compute.metrics.sufficiency import Sufficiency

PAD, CLS, SEP, MASK = 0, 101, 102, 103
VOCAB = 200


class Bag:
    """p(1) = sigmoid(sum of weights of the attended tokens); [PAD], [MASK], [CLS], [SEP] weigh 0. Counts calls and
    keeps what it was given."""

    def __init__(self, w: np.ndarray):
        self.w = np.asarray(w, dtype=np.float64)
        self.calls = 0
        self.seqs: list[np.ndarray] = []
        self.attend = None

    def logit(self, seq, att=None):
        v = self.w[np.asarray(seq)]
        return float(v.sum() if att is None else v[np.asarray(att)].sum())

    def __call__(self, sequences, attend=None):
        self.calls += 1
        self.seqs, self.attend = [np.asarray(s) for s in sequences], attend
        z = np.array([self.logit(s, None if attend is None else attend[i]) for i, s in enumerate(sequences)])
        p1 = 1.0 / (1.0 + np.exp(-z))
        return np.stack([1.0 - p1, p1], axis=1)


class ByLength:
    """p(class 0) looked up by sequence length: crafted non-monotone curves."""

    def __init__(self, table: dict):
        self.table = table
        self.calls = 0

    def __call__(self, sequences, attend=None):
        self.calls += 1
        p = np.array([self.table[len(s)] for s in sequences])
        return np.stack([p, 1.0 - p], axis=1)


def sig(z):
    return 1.0 / (1.0 + math.exp(-z))


def example(middle, scores_middle, label=1, pred=1, special_scores=(0.0, 0.0), index=0):
    ids = np.array([CLS, *middle, SEP], dtype=np.int64)
    n = len(ids)
    special = np.zeros(n, dtype=bool)
    special[[0, n - 1]] = True
    scores = np.array([special_scores[0], *scores_middle, special_scores[1]], dtype=np.float64)
    return EvalExample(index=index, id=f"ex{index}", token_ids=ids, special=special, scores=scores, label=label,
                       pred=pred, explain_pos=0)


def weights(seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(0.0, 1.5, VOCAB)
    w[[PAD, CLS, SEP, MASK]] = 0.0
    return w


def dataset(w, n_examples=24, seed=1, score=lambda w_tok: w_tok):
    """Random examples labelled by the bag model itself (label = pred), scored by ``score`` of the token weights."""
    rng = np.random.default_rng(seed)
    bag = Bag(w)
    out = []
    for i in range(n_examples):
        mid = rng.integers(1, 100, int(rng.integers(6, 30)))
        pred = int(bag.logit(np.array([CLS, *mid, SEP])) > 0)
        sign = 1.0 if pred == 1 else -1.0  # the oracle explains the predicted class
        out.append(example(mid, score(sign * w[mid]), label=pred, pred=pred, special_scores=(5.0, 5.0), index=i))
    return out


def mean(metric, examples, predictor):
    return metric.summary(metric.evaluate(examples, predictor))["mean"]


# --------------------------------------------------------------------------------------------------------------- levels
def test_level_lists_match_methods_md():
    assert pt.alti_levels(np.array([7]))[0].tolist() == [0, 1, 1, 1, 2, 4]
    assert pt.ninths_levels(np.array([12]))[0].tolist() == [1, 3, 4, 5, 7, 8, 9, 11, 12]
    assert pt.tenths_levels(np.array([12]))[0].tolist() == [1, 2, 3, 4, 6, 7, 8, 9, 10]
    ns = np.arange(0, 400)
    alti = [[0] + [math.ceil(m * b) for b in (0.01, 0.05, 0.1, 0.2, 0.5)] for m in ns]
    assert pt.alti_levels(ns).tolist() == alti
    assert pt.ninths_levels(ns).tolist() == [[round(i / 9 * n) for i in range(1, 10)] for n in ns]
    assert pt.tenths_levels(ns).tolist() == [[int(n * i / 10) for i in range(1, 10)] for n in ns]


def test_running_min_and_max_on_a_crafted_sequence():
    p = np.array([[0.8, 0.9, 0.5, 0.6, 0.3, 0.4], [np.nan] * 6])
    np.testing.assert_allclose(pt.running(p, "min")[0], [0.8, 0.8, 0.5, 0.5, 0.3, 0.3])
    np.testing.assert_allclose(pt.running(p, "max")[0], [0.8, 0.9, 0.9, 0.9, 0.9, 0.9])
    assert np.isnan(pt.running(p, "min")[1]).all()


# -------------------------------------------------------------------------------------------------------------- ranking
def test_ranking_is_stable_dense_descending_without_protected_positions():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    exs = [example(rng.integers(1, 50, k), rng.integers(0, 4, k).astype(float), special_scores=(9, 9), index=i)
           for i, k in enumerate([1, 5, 12, 30])]
    P = pt.pad_examples(exs)
    pos = np.arange(P.tokens.shape[1])
    ends = ((pos == 0) | (pos == P.n[:, None] - 1)) & P.valid
    order, rank_of, m = pt.ranked_order(P.scores, P.valid, ends)
    for e, ex in enumerate(exs):  # the ALTI REF, literally
        n = len(ex.scores)
        rank = scipy_stats.rankdata(ex.scores, method="dense")
        ref = [p for p in sorted(range(n), key=lambda p: -rank[p]) if p not in (0, n - 1)]
        assert order[e, :m[e]].tolist() == ref and m[e] == n - 2
        assert (order[e, m[e]:] == -1).all()
        assert all(rank_of[e, p] == r for r, p in enumerate(ref)) and rank_of[e, [0, n - 1]].tolist() == [-1, -1]


def test_skip_last_drops_the_position_ranked_last_overall():
    ex = example([11, 12, 13, 14], [4.0, 1.0, 3.0, 2.0], special_scores=(9.0, 9.0))
    P = pt.pad_examples([ex])
    order, _, m = pt.ranked_order(P.scores, P.valid, P.special, skip_last=True)
    assert order[0, :m[0]].tolist() == [1, 3, 4]  # position 2 (score 1) is last overall: never selected
    # Specials ranked last: the quirk costs nothing.
    ex = example([11, 12, 13, 14], [4.0, 1.0, 3.0, 2.0], special_scores=(-9.0, -9.0))
    P = pt.pad_examples([ex])
    order, _, m = pt.ranked_order(P.scores, P.valid, P.special, skip_last=True)
    assert order[0, :m[0]].tolist() == [1, 3, 4, 2]
    order, _, m = pt.ranked_order(P.scores, P.valid, P.special, descending=False)
    assert order[0, :m[0]].tolist() == [2, 4, 3, 1]


# --------------------------------------------------------------------------------------- comprehensiveness / sufficiency
def tiny():
    """[CLS] a b c [SEP] with weights a 2, b -1, c 0.5 and scores 3, 1, 2: ranking a, c, b; m = 3, j = 0,1,1,1,1,2."""
    w = np.zeros(VOCAB)
    w[[1, 2, 3]] = [2.0, -1.0, 0.5]
    return [example([1, 2, 3], [3.0, 1.0, 2.0], special_scores=(10.0, 10.0))], Bag(w)


def test_comprehensiveness_and_sufficiency_exact_values():
    exs, bag = tiny()
    res = Comprehensiveness().evaluate(exs, bag)
    f = sig(1.5)
    assert res.levels[0].tolist() == [0, 1, 1, 1, 1, 2]
    np.testing.assert_allclose(res.curves[0], [f, sig(-0.5), sig(-0.5), sig(-0.5), sig(-0.5), sig(-1)], rtol=1e-12)
    np.testing.assert_allclose(res.values[0], (4 * (f - sig(-0.5)) + (f - sig(-1))) / 6, rtol=1e-12)
    res = Sufficiency().evaluate(exs, bag)
    np.testing.assert_allclose(res.curves[0], [0.5, sig(2), sig(2), sig(2), sig(2), sig(2.5)], rtol=1e-12)
    np.testing.assert_allclose(res.values[0], (4 * (f - sig(2)) + (f - sig(2.5))) / 6, rtol=1e-12)


def test_deletion_keeps_original_order_and_readds_cls_sep():
    exs, bag = tiny()
    Comprehensiveness().evaluate(exs, bag)
    got = sorted(s.tolist() for s in bag.seqs)
    assert got == sorted([[CLS, 1, 2, 3, SEP], [CLS, 2, 3, SEP], [CLS, 2, SEP]])  # repeated levels run once
    assert all(len(a) == len(s) and a.all() for a, s in zip(bag.attend, bag.seqs))
    Sufficiency().evaluate(exs, bag)
    assert sorted(s.tolist() for s in bag.seqs) == sorted(
        [[CLS, SEP], [CLS, 1, SEP], [CLS, 1, 3, SEP], [CLS, 1, 2, 3, SEP]])


def test_running_curves_and_eraser_variant_on_crafted_probabilities():
    # m = 7 (n = 9): comp levels 0,1,1,1,2,4 -> lengths 9,8,8,8,7,5; suff -> 2,3,3,3,4,6 and the full input (9).
    ex = [example(range(11, 18), np.arange(7, 0, -1.0), label=0, pred=0)]
    comp_p = ByLength({9: 0.9, 8: 0.95, 7: 0.4, 5: 0.6})
    res = Comprehensiveness().evaluate(ex, comp_p)
    np.testing.assert_allclose(res.curves[0], [0.9, 0.9, 0.9, 0.9, 0.4, 0.4])
    np.testing.assert_allclose(res.values[0], 1.0 / 6)
    res = Comprehensiveness(variant="eraser").evaluate(ex, comp_p)
    np.testing.assert_allclose(res.curves[0], [0.9, 0.95, 0.95, 0.95, 0.4, 0.6])
    np.testing.assert_allclose(res.values[0], 0.65 / 6)
    suff_p = ByLength({2: 0.5, 3: 0.3, 4: 0.7, 6: 0.6, 9: 0.9})
    res = Sufficiency().evaluate(ex, suff_p)
    np.testing.assert_allclose(res.curves[0], [0.5, 0.5, 0.5, 0.5, 0.7, 0.7])  # level 0 enters the running max
    np.testing.assert_allclose(res.values[0], 1.6 / 6)
    res = Sufficiency(variant="eraser").evaluate(ex, suff_p)
    np.testing.assert_allclose(res.values[0], 2.3 / 6)


def alti_reference(ex, predict, sufficiency):
    """ALTI aupc.py + evaluation.ipynb, literally (Python loops, scipy dense ranks)."""
    from scipy.stats import rankdata

    n = len(ex.token_ids)
    rank = rankdata(ex.scores, method="dense")
    ranked = [p for p in sorted(range(n), key=lambda p: -rank[p]) if p not in (0, n - 1)]
    m = len(ranked)
    levels = [0] + [math.ceil(m * b) for b in (0.01, 0.05, 0.1, 0.2, 0.5)]

    def p_of(kept):
        seq = [ex.token_ids[0]] + [ex.token_ids[q] for q in sorted(kept)] + [ex.token_ids[n - 1]]
        return predict([np.array(seq)])[0, ex.pred]

    comp, suff, cur_c, cur_s = [], [], 1.0, 0.0
    for j in levels:
        cur_c = min(p_of(ranked[j:]), cur_c)
        cur_s = max(p_of(ranked[:j]), cur_s)
        comp.append(cur_c)
        suff.append(cur_s)
    curve = suff if sufficiency else comp
    return sum(comp[0] - curve[t] for t in range(1, 6)) / 6


@pytest.mark.parametrize("cls", [Comprehensiveness, Sufficiency])
def test_alti_metrics_match_a_literal_reference_with_ties(cls):
    pytest.importorskip("scipy")
    w = weights(4)
    exs = dataset(w, n_examples=10, seed=5, score=lambda s: np.round(s))  # rounded: many ties
    bag = Bag(w)
    got = cls().evaluate(exs, bag).values
    ref = [alti_reference(ex, Bag(w), cls is Sufficiency) for ex in exs]
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-15)


# ---------------------------------------------------------------------------------------------- oracle beats reverse
@pytest.mark.parametrize("make, better", [
    (lambda: Comprehensiveness(), "higher"), (lambda: Comprehensiveness(variant="eraser"), "higher"),
    (lambda: Sufficiency(), "lower"), (lambda: Sufficiency(variant="eraser"), "lower"),
    (lambda: AOPC(), "higher"), (lambda: AOPC(preset="attcat"), "higher"),
    (lambda: AOPC(preset="masklrp", pad_id=PAD), "higher"), (lambda: AOPC(preset="normxlogit", mask_id=MASK), "higher"),
    (lambda: LOdds(), "lower"), (lambda: LOdds(preset="attcat", pad_id=PAD), "lower"),
    (lambda: LOdds(preset="normxlogit", mask_id=MASK), "lower"),
    (lambda: PerturbedAccuracy(mask_id=MASK), "lower"), (lambda: PerturbedAccuracy(preset="attcat"), "lower"),
])
def test_oracle_ranking_beats_its_reverse(make, better):
    w = weights()
    oracle, reverse = dataset(w), dataset(w, score=lambda s: -s)
    metric = make()
    a, b = mean(metric, oracle, Bag(w)), mean(metric, reverse, Bag(w))
    assert (a > b) if better == "higher" else (a < b), (a, b)
    assert metric.higher_is_better == (better == "higher")


def test_one_predictor_call_per_evaluate():
    w = weights()
    exs = dataset(w, n_examples=7)
    for metric in (Comprehensiveness(), Sufficiency(), AOPC(), LOdds(preset="masklrp", pad_id=PAD),
                   PerturbedAccuracy(mask_id=MASK)):
        bag = Bag(w)
        metric.evaluate(exs, bag)
        assert bag.calls == 1, metric.name


# ----------------------------------------------------------------------------------------------- AOPC / LOdds details
def attcat_reference_counts(ex, k_levels, skip_last):
    """AttCAT / Mask-LRP selection loop: descending ranking of all n positions, skip specials, stop before the last."""
    n = len(ex.scores)
    order = sorted(range(n), key=lambda p: -ex.scores[p])
    scan = order[:n - 1] if skip_last else order
    out = []
    for k in k_levels:
        picked = []
        for p in scan:
            if len(picked) == k:
                break
            if not ex.special[p]:
                picked.append(p)
        out.append(picked)
    return out


def test_skip_last_quirk_lowest_ranked_token_never_perturbed():
    w = weights()
    # n_total = 12: ninths 1,3,4,5,7,8,9,11,12; 10 perturbable tokens, 9 with the quirk.
    mid = np.arange(21, 31)
    ex = example(mid, np.arange(10, 0, -1.0), special_scores=(20.0, 20.0))
    bag = Bag(w)
    res = AOPC(preset="masklrp", pad_id=PAD).evaluate([ex], bag)
    assert res.levels[0].tolist() == [1, 3, 4, 5, 7, 8, 9, 9, 9]
    lowest = mid[-1]
    assert all(lowest in s.tolist() for s in bag.seqs)
    picked = attcat_reference_counts(ex, [1, 3, 4, 5, 7, 8, 9, 11, 12], skip_last=True)
    assert [len(p) for p in picked] == res.levels[0].tolist()
    for p in picked:  # the sequence of each level is in what the predictor saw
        expect = ex.token_ids.copy()
        expect[p] = PAD
        assert any(np.array_equal(expect, s) for s in bag.seqs)
    res = AOPC(preset="masklrp", pad_id=PAD, skip_last=False).evaluate([ex], bag)
    assert res.levels[0].tolist() == [1, 3, 4, 5, 7, 8, 9, 10, 10]
    assert any(lowest not in s.tolist() for s in bag.seqs)
    assert AOPC(levels="tenths").settings["skip_last"] is False and AOPC().settings["skip_last"] is True


def test_protected_positions_are_never_perturbed():
    w = weights()
    exs = dataset(w, n_examples=5)
    for metric in (AOPC(preset="attcat"), LOdds(preset="attcat", pad_id=PAD), Comprehensiveness(), Sufficiency()):
        bag = Bag(w)
        metric.evaluate(exs, bag)
        assert all(s[0] == CLS and s[-1] == SEP for s in bag.seqs), metric.name
    # NormXLogit protects [CLS] only: a top-scored [SEP] is masked from level 1 on; [CLS] never.
    bag = Bag(w)
    res = AOPC(preset="normxlogit", mask_id=MASK).evaluate(exs, bag)
    assert all(s[0] == CLS for s in bag.seqs)
    assert sum(s[-1] == MASK for s in bag.seqs) > 0
    assert res.levels[0].tolist() == pt.tenths_levels(np.array([len(exs[0].token_ids)]))[0].tolist()


def test_replacement_keeps_length_and_attends_every_position():
    w = weights()
    ex = example(np.arange(31, 41), np.arange(10.0), special_scores=(50.0, 50.0))
    for attend in ("all", "original"):
        bag = Bag(w)
        AOPC(perturbation="pad", pad_id=PAD, attend=attend).evaluate([ex], bag)
        assert all(len(s) == len(ex.token_ids) for s in bag.seqs)
        assert all(a.dtype == bool and len(a) == len(s) and a.all() for a, s in zip(bag.attend, bag.seqs))
        assert any((s == PAD).sum() == 9 for s in bag.seqs)  # level 9 with the quirk: 9 of 10 replaced
    with pytest.raises(AttrscopeError):
        pt.attend_masks([np.arange(3)], "none")


def test_aopc_and_lodds_values_from_their_curves():
    exs, bag = tiny()
    exs[0].label = 1
    res = AOPC(preset="attcat").evaluate(exs, bag)  # deletion, |p0 - pk|, ninths of n = 5, skip_last
    p0 = sig(1.5)
    # Ranking over all 5 positions: [CLS] 10, [SEP] 10, a 3, c 2, b 1 -> b is last overall: never deleted.
    assert res.levels[0].tolist() == [1, 1, 2, 2, 2, 2, 2, 2, 2]
    pk = np.array([sig(-0.5)] * 2 + [sig(-1.0)] * 7)
    np.testing.assert_allclose(res.curves[0], pk, rtol=1e-12)
    np.testing.assert_allclose(res.values[0], np.abs(p0 - pk).mean(), rtol=1e-12)
    res = LOdds(preset="attcat", pad_id=PAD).evaluate(exs, bag)
    np.testing.assert_allclose(res.values[0], np.log(pk / p0).mean(), rtol=1e-12)
    np.testing.assert_allclose(res.curves[0], np.log(pk / p0), rtol=1e-12)


def test_undefined_examples_give_nan_not_an_error():
    w = weights()
    only_specials = example([], [], index=1)
    one = example([5], [1.0], special_scores=(5.0, 5.0), index=2)
    unlabelled = example([5, 6, 7], [1.0, 2.0, 3.0], label=-1, index=3)
    exs = dataset(w, n_examples=2) + [only_specials, one, unlabelled]
    for metric in (Comprehensiveness(), Sufficiency(), AOPC(), LOdds(), AOPC(preset="attcat"),
                   PerturbedAccuracy(mask_id=MASK)):
        res = metric.evaluate(exs, Bag(w))
        assert np.isnan(res.values[2]) and np.isnan(res.curves[2]).all() and (res.levels[2] == -1).all(), metric.name
        assert np.isfinite(res.values[:2]).all()
        # A single ranked token is the last ranked one: the AttCAT quirk leaves nothing to perturb.
        assert np.isnan(res.values[3]) == (metric.settings.get("skip_last") is True and
                                           metric.settings.get("protect") == "cls_sep"), metric.name
        label_needed = metric.name == "accuracy" or metric.settings.get("cls") == "label"
        assert np.isnan(res.values[4]) == label_needed, metric.name
    bag = Bag(w)
    res = AOPC().evaluate([only_specials], bag)
    assert np.isnan(res.values).all() and bag.calls == 0
    assert AOPC().evaluate([], bag).values.shape == (0,) and bag.calls == 0


def test_accuracy_counts_levels_where_the_gold_label_survives():
    exs, bag = tiny()  # gold 1; tenths of n = 5: 0,1,1,2,2,3,3,4,4 masked (only [CLS] protected)
    res = PerturbedAccuracy(mask_id=MASK).evaluate(exs, bag)
    assert res.levels[0].tolist() == [0, 1, 1, 2, 2, 3, 3, 4, 4]
    # Ranking without [CLS]: [SEP] 10, a 3, c 2, b 1. Masking [SEP] keeps z = 1.5; then a goes: z = -0.5 (wrong) ...
    # level counts 0,1,1 -> z 1.5 (right); 2,2 -> -0.5; 3,3 -> -1; 4,4 -> 0 (argmax of [0.5, 0.5] = class 0).
    np.testing.assert_array_equal(res.curves[0], [1, 1, 1, 0, 0, 0, 0, 0, 0])
    np.testing.assert_allclose(res.values[0], 3 / 9)


# ------------------------------------------------------------------------------------------------------------ settings
def test_settings_are_recorded_with_defaults_and_presets():
    s = AOPC().settings
    assert s == {"levels": "ninths", "perturbation": "delete", "protect": "cls_sep", "cls": "predicted",
                 "side": "top", "attend": "all", "skip_last": True, "pad_id": None, "mask_id": None,
                 "absolute": False, "preset": None}
    s = AOPC(preset="normxlogit", mask_id=MASK, side="bottom").settings
    assert s["levels"] == "tenths" and s["side"] == "bottom" and s["mask_id"] == MASK and s["preset"] == "normxlogit"
    assert aopc.PRESETS["attcat"]["absolute"] is True and aopc.PRESETS["attcat"]["perturbation"] == "delete"
    assert lodds.PRESETS["attcat"]["perturbation"] == "pad" and "absolute" not in LOdds().settings
    assert PerturbedAccuracy().settings["perturbation"] == "mask" and "cls" not in PerturbedAccuracy().settings
    assert Comprehensiveness().settings == {"variant": "alti"}
    for bad in ({"levels": "fifths"}, {"nope": 1}, {"preset": "eraser"}):
        with pytest.raises(AttrscopeError):
            AOPC(**bad)
    with pytest.raises(AttrscopeError):
        Sufficiency(variant="deyoung")
    with pytest.raises(AttrscopeError, match="pad_id"):
        AOPC(perturbation="pad").evaluate(dataset(weights(), 2), Bag(weights()))


# ------------------------------------------------------------------------------------------------------------- DecompX
def decompx_reference(ex, predict, ratios=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)):
    """DecompX REF (experiments/notebooks/v3/analysis_v3.ipynb, top_k_masking, compute_aopc, compute_accuracy) for
    one example, written literally: [CLS]/[SEP] removed from an ascending argsort, the last floor(m * r) masked by
    [MASK]; p of the unmasked input's argmax class; accuracy against the gold label."""
    ids = np.asarray(ex.token_ids)
    base = predict([ids])[0]
    c = int(base.argmax())
    rank = np.asarray(ex.scores).argsort()
    rank = rank[~np.isin(rank, np.flatnonzero((ids == CLS) | (ids == SEP)))]
    drops, correct = [], []
    for r in ratios:
        count = int(np.floor(len(rank) * r))
        masks = rank[-count:] if count else []
        seq = np.array([MASK if j in masks else ids[j] for j in range(len(ids))])
        p = predict([seq])[0]
        drops.append(base[c] - p[c])
        correct.append(float(p.argmax() == ex.label))
    return np.mean(drops), np.mean(correct)


def test_decompx_levels_count_the_ranked_tokens_as_its_reference_does():
    ms = np.arange(0, 300)
    ref = [[int(np.floor(m * r)) for r in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)] for m in ms]
    assert pt.ranked_tenths_levels(ms).tolist() == ref
    # [CLS] + 7 tokens + [SEP]: floor(7 r), not int(9 i / 10) of the whole length
    ex = example(np.arange(31, 38), np.arange(7.0), special_scores=(50.0, 50.0))
    bag = Bag(weights())
    res = AOPC(preset="decompx", mask_id=MASK).evaluate([ex], bag)
    assert res.levels[0].tolist() == [0, 1, 2, 2, 3, 4, 4, 5, 6]
    assert all(s[0] == CLS and s[-1] == SEP for s in bag.seqs)  # top-scored specials never masked
    assert sorted(int((s == MASK).sum()) for s in bag.seqs) == [0, 1, 2, 3, 4, 5, 6]  # equal levels run once


def test_decompx_aopc_and_accuracy_match_a_literal_reference():
    w = weights()
    exs = dataset(w, n_examples=20, seed=3, score=lambda wt: wt + np.random.default_rng(7).normal(0, 1, len(wt)))
    for i, ex in enumerate(exs):
        ex.label = i % 2  # some gold labels disagree with the prediction
    bag = Bag(w)
    aopc_res = AOPC(preset="decompx", mask_id=MASK).evaluate(exs, bag)
    acc_res = PerturbedAccuracy(preset="decompx", mask_id=MASK).evaluate(exs, bag)
    assert aopc_res.values.shape == acc_res.values.shape == (20,)
    for ex, a, acc in zip(exs, aopc_res.values, acc_res.values):
        ref_a, ref_acc = decompx_reference(ex, Bag(w))
        np.testing.assert_allclose(a, ref_a, rtol=1e-12, atol=1e-15)
        assert acc == ref_acc
    assert PerturbedAccuracy(preset="decompx").settings["levels"] == "ranked_tenths"
