"""Ranking metrics without a model (kendall, spearman, precision_at_k, dot_product, average_precision, jaccard_25,
seed_spearman) on hand-made examples whose values are known; scipy.stats, when installed, is an independent check."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from compute.errors import UsageError
from compute.metrics.average_precision import EvidenceAveragePrecision, expected_random_ap
from compute.metrics.base import EvalExample, MetricResult
from compute.metrics.dot_product import EvidenceDotProduct
from compute.metrics.jaccard import Jaccard25, SeedSpearman
from compute.metrics.kendall import KendallTau, tau_b
from compute.metrics.precision_at_k import PrecisionAtK
from compute.metrics.spearman import SpearmanWithSaliency, average_ranks, dense_ranks, spearman_rho

try:
    from scipy import stats
except ImportError:  # scipy is not a project dependency
    stats = None
needs_scipy = pytest.mark.skipif(stats is None, reason="scipy is not installed")


def ex(scores, *, special=None, label=0, pred=0, explain_pos=0, **kw) -> EvalExample:
    scores = np.asarray(scores, dtype=np.float64)
    n = scores.size
    if special is None:
        special = np.zeros(n, dtype=bool)
    return EvalExample(index=0, id="x", token_ids=np.arange(n, dtype=np.int64), special=np.asarray(special, bool),
                       scores=scores, label=label, pred=pred, explain_pos=explain_pos, **kw)


def values(metric, examples) -> np.ndarray:
    return metric.evaluate(examples, None).values


# --- Kendall ---------------------------------------------------------------------------------------------------------

A = np.array([0.5, 0.1, 0.9, 0.3])
B = np.array([0.2, 0.8, 0.4, 0.6])


def test_kendall_identical_is_one_both_forms():
    cs = np.stack([A, A])
    for form in ("argsort", "rank"):
        assert values(KendallTau(form=form), [ex(A, class_scores=cs)])[0] == pytest.approx(1.0)


def test_kendall_reversed_is_minus_one_rank_form():
    cs = np.stack([A, -A])
    assert values(KendallTau(form="rank"), [ex(A, class_scores=cs)])[0] == pytest.approx(-1.0)


def test_kendall_argsort_form_differs_from_rank_form():
    # argsort(-A) = [2, 0, 3, 1], argsort(-B) = [1, 3, 2, 0]: 3 concordant and 3 discordant pairs -> 0.
    # On the scores: 1 concordant pair (0, 2), 5 discordant -> -4/6.
    cs = np.stack([A, B])
    assert values(KendallTau(form="argsort"), [ex(A, class_scores=cs)])[0] == pytest.approx(0.0)
    assert values(KendallTau(form="rank"), [ex(A, class_scores=cs)])[0] == pytest.approx(-2 / 3)


@needs_scipy
def test_kendall_matches_scipy_on_argsort_arrays_and_scores():
    rng = np.random.default_rng(0)
    for n in (2, 5, 17, 64):
        a = rng.normal(size=n)
        b = np.round(rng.normal(size=n), 1)  # ties in the scores
        cs = np.stack([a, b])
        ref_arg = stats.kendalltau(np.argsort(-a), np.argsort(-b))[0]
        ref_rank = stats.kendalltau(a, b)[0]
        assert values(KendallTau(form="argsort"), [ex(a, class_scores=cs)])[0] == pytest.approx(ref_arg, abs=1e-12)
        assert values(KendallTau(form="rank"), [ex(a, class_scores=cs)])[0] == pytest.approx(ref_rank, abs=1e-12)


@needs_scipy
def test_tau_b_ties_match_scipy():
    x = np.array([1, 1, 2, 3, 3, 3, 4], float)
    y = np.array([2, 1, 1, 5, 5, 0, 4], float)
    assert tau_b(x, y[None])[0] == pytest.approx(stats.kendalltau(x, y)[0], abs=1e-12)


def test_tau_b_constant_is_nan():
    assert np.isnan(tau_b(np.ones(4), np.arange(4.0)[None])[0])


def test_kendall_argsort_uses_numpy_default_kind_with_ties():
    """The 2-D argsort the metric uses orders ties like the REF's per-vector np.argsort(-a)."""
    a = np.array([1.0, 2.0, 1.0, 2.0, 1.0, 0.5, 2.0, 1.0])
    b = np.array([0.3, 0.3, 0.1, 0.3, 0.2, 0.3, 0.1, 0.0])
    ref = tau_b(np.argsort(-a).astype(float), np.argsort(-b).astype(float)[None])[0]
    assert values(KendallTau(), [ex(a, class_scores=np.stack([a, b]))])[0] == pytest.approx(ref)


def test_kendall_averages_over_other_classes():
    cs = np.stack([A, A, -A])  # class 0 vs 1: +1, vs 2: -1 -> mean 0
    assert values(KendallTau(form="rank"), [ex(A, class_scores=cs, label=0)])[0] == pytest.approx(0.0)
    cs = np.stack([A, B, A])  # class 2 explained: vs 0 -> 1, vs 1 -> -2/3
    assert values(KendallTau(form="rank"), [ex(A, class_scores=cs, label=2)])[0] == pytest.approx((1 - 2 / 3) / 2)


def test_kendall_class_setting_and_missing_inputs():
    cs = np.stack([A, B, -A])
    # label 2 vs pred 0: different classes explained
    by_label = values(KendallTau(form="rank"), [ex(A, class_scores=cs, label=2, pred=0)])[0]
    by_pred = values(KendallTau(form="rank", cls="predicted"), [ex(A, class_scores=cs, label=2, pred=0)])[0]
    assert by_label == pytest.approx((-1 + 2 / 3) / 2)
    assert by_pred == pytest.approx((-2 / 3 - 1) / 2)
    v = values(KendallTau(), [ex(A), ex(A, class_scores=cs, label=-1), ex(A, class_scores=A[None])])
    assert np.isnan(v).all()  # no class scores, no gold label, a single class


def test_kendall_exclude_specials():
    a = np.array([9.0, 0.5, 0.1, 0.9, 0.3, -9.0])
    b = np.array([9.0, 0.2, 0.8, 0.4, 0.6, -9.0])
    special = np.array([1, 0, 0, 0, 0, 1], bool)
    cs = np.stack([a, b])
    assert values(KendallTau(form="rank", exclude_specials=True),
                  [ex(a, class_scores=cs, special=special)])[0] == pytest.approx(-2 / 3)
    assert values(KendallTau(form="rank"), [ex(a, class_scores=cs, special=special)])[0] > -2 / 3


def test_bad_setting_is_a_usage_error():
    with pytest.raises(UsageError):
        KendallTau(form="ranks")
    with pytest.raises(UsageError):
        EvidenceDotProduct(exclude="mask")


# --- Spearman with saliency ------------------------------------------------------------------------------------------


def test_rank_helpers():
    x = np.array([3.0, 1.0, 3.0, 2.0, 3.0])
    assert average_ranks(x).tolist() == [4.0, 1.0, 4.0, 2.0, 4.0]
    assert dense_ranks(x).tolist() == [3.0, 1.0, 3.0, 2.0, 3.0]


def test_spearman_hand_value_with_ties():
    # a ranks (average): [1.5, 1.5, 3, 4]; b ranks: [1, 3, 2, 4]; centred: [-1, -1, .5, 1.5], [-1.5, .5, -.5, 1.5]
    # cov = 1.5 - .5 - .25 + 2.25 = 3; var_a = 1 + 1 + .25 + 2.25 = 4.5; var_b = 2.25 + .25 + .25 + 2.25 = 5
    a = np.array([1.0, 1.0, 2.0, 5.0])
    b = np.array([0.1, 0.7, 0.3, 0.9])
    want = 3 / np.sqrt(4.5 * 5)
    got = values(SpearmanWithSaliency(), [ex(a, other_scores={"gxi_l2": b})])[0]
    assert got == pytest.approx(want)
    if stats is not None:
        assert got == pytest.approx(stats.spearmanr(a, b)[0])


@needs_scipy
def test_spearman_matches_scipy_random():
    rng = np.random.default_rng(1)
    for n in (3, 10, 64):
        a, b = np.round(rng.normal(size=(2, n)), 1)
        assert spearman_rho(a, b) == pytest.approx(stats.spearmanr(a, b)[0], abs=1e-12)


def test_spearman_setting_specials_and_undefined():
    a = np.array([5.0, 1.0, 2.0, 3.0, -5.0])
    b = np.array([-5.0, 1.0, 2.0, 3.0, 5.0])
    special = np.array([1, 0, 0, 0, 1], bool)
    e = ex(a, special=special, other_scores={"ig_l2": b})
    assert values(SpearmanWithSaliency(saliency="ig_l2", exclude_specials=True), [e])[0] == pytest.approx(1.0)
    assert values(SpearmanWithSaliency(saliency="ig_l2"), [e])[0] < 1.0
    v = values(SpearmanWithSaliency(), [e, ex(a, other_scores={"gxi_l2": np.ones(5)})])
    assert np.isnan(v).all()  # saliency missing; constant saliency
    res = SpearmanWithSaliency().summary(MetricResult(values=np.array([0.5, np.nan, 0.7])))
    assert res["n"] == 2 and res["mean"] == pytest.approx(0.6) and res["std"] == pytest.approx(0.1)


# --- Precision@K -----------------------------------------------------------------------------------------------------


def test_precision_at_k_counts_and_summary():
    special = np.array([1, 0, 0, 0, 0, 0, 1], bool)
    scores = np.array([9.0, 0.1, 0.8, 0.7, 0.2, 0.7, 9.0])  # without specials: order 2, 3, 5 (tie by position), 4, 1
    ev1 = np.array([0, 0, 1, 0, 0, 1, 0], bool)  # top-2 = {2, 3}: 1 hit; top-3: 2 hits
    ev2 = np.array([0, 1, 0, 0, 1, 0, 0], bool)  # ranked last two: 0 hits at K = 2
    m2 = PrecisionAtK(k=2)
    res = m2.evaluate([ex(scores, special=special, evidence=ev1), ex(scores, special=special, evidence=ev2),
                       ex(scores, special=special)], None)
    assert res.values[:2].tolist() == [1.0, 0.0] and np.isnan(res.values[2])
    s = m2.summary(res)
    assert s["mean_count"] == pytest.approx(0.5) and s["mean_evidence_len"] == pytest.approx(2.0)
    assert s["precision"] == pytest.approx(25.0) and s["n"] == 2
    assert values(PrecisionAtK(k=3), [ex(scores, special=special, evidence=ev1)])[0] == 2
    # specials kept: they take the first two places
    assert values(PrecisionAtK(k=2, exclude_specials=False), [ex(scores, special=special, evidence=ev1)])[0] == 0
    assert PrecisionAtK().settings == {"k": 20, "exclude_specials": True}


def test_precision_at_k_no_answer_token_is_nan():
    ev = np.array([1, 0, 0], bool)  # only on a special token
    assert np.isnan(values(PrecisionAtK(), [ex([1.0, 2.0, 3.0], special=[1, 0, 0], evidence=ev)])[0])


# --- Evidence alignment: dot product and AP --------------------------------------------------------------------------


def test_dot_product_softmax_and_sum():
    s = np.array([1.0, 2.0, 3.0, 4.0])
    ev = np.array([0, 0, 1, 0], bool)
    soft = values(EvidenceDotProduct(normalise="softmax"), [ex(s, evidence=ev)])[0]
    assert soft == pytest.approx(np.exp(3) / np.exp(s).sum())
    assert values(EvidenceDotProduct(normalise="sum"), [ex(s, evidence=ev)])[0] == pytest.approx(0.3)
    # auto: the caller's signed flag, else the data
    assert values(EvidenceDotProduct(signed=True), [ex(s, evidence=ev)])[0] == pytest.approx(soft)
    assert values(EvidenceDotProduct(signed=False), [ex(s, evidence=ev)])[0] == pytest.approx(0.3)
    m = EvidenceDotProduct()
    assert values(m, [ex(s, evidence=ev)])[0] == pytest.approx(0.3) and m.settings["signed"] is False
    m = EvidenceDotProduct()
    assert values(m, [ex(s - 2, evidence=ev)])[0] == pytest.approx(soft) and m.settings["signed"] is True


def test_dot_product_excludes_explained_position_and_reports_random():
    s = np.array([1.0, 2.0, 3.0, 4.0])  # position 3 = the <mask> target
    ev = np.array([0, 1, 1, 0], bool)
    m = EvidenceDotProduct(normalise="sum", exclude="explained")
    res = m.evaluate([ex(s, evidence=ev, explain_pos=3), ex(s), ex(s, evidence=np.zeros(4, bool))], None)
    assert res.values[0] == pytest.approx(5 / 6)
    assert np.isnan(res.values[1:]).all()
    assert m.summary(res)["random"] == pytest.approx(2 / 3)
    assert values(EvidenceDotProduct(normalise="sum"), [ex(s, evidence=ev, explain_pos=3)])[0] == pytest.approx(0.5)
    assert EvidenceDotProduct(exclude=["specials", "explained"]).settings["exclude"] == "explained+specials"


def test_average_precision_first_and_last():
    n = 7
    s = np.arange(n, 0, -1, dtype=float)  # position 0 ranked first, position n-1 last
    first = np.zeros(n, bool)
    first[0] = True
    last = np.zeros(n, bool)
    last[-1] = True
    v = values(EvidenceAveragePrecision(), [ex(s, evidence=first), ex(s, evidence=last), ex(s)])
    assert v[0] == pytest.approx(1.0) and v[1] == pytest.approx(1 / n) and np.isnan(v[2])


def test_average_precision_two_hits_and_ties():
    s = np.array([0.9, 0.5, 0.8, 0.5, 0.1])  # order 0, 2, 1, 3 (tie by position), 4
    ev = np.array([0, 0, 1, 1, 0], bool)  # evidence at ranks 2 and 4: (1/2 + 2/4) / 2
    assert values(EvidenceAveragePrecision(), [ex(s, evidence=ev)])[0] == pytest.approx(0.5)


def test_expected_random_ap_is_the_mean_over_all_rankings():
    for N, R in ((1, 1), (4, 1), (5, 2), (6, 3), (4, 4)):
        ev = np.zeros(N, bool)
        ev[:R] = True
        aps = []
        for perm in itertools.permutations(range(N)):
            scores = -np.asarray(perm, float)  # perm[i] = rank of position i
            aps.append(values(EvidenceAveragePrecision(), [ex(scores, evidence=ev)])[0])
        assert expected_random_ap(R, N) == pytest.approx(np.mean(aps))
    m = EvidenceAveragePrecision(random="prevalence")
    ev = np.array([1, 0, 0, 0, 0], bool)
    assert m.summary(m.evaluate([ex(np.arange(5.0), evidence=ev)], None))["random"] == pytest.approx(0.2)


# --- Robustness across seeds -----------------------------------------------------------------------------------------


def test_jaccard_identical_and_disjoint():
    a = np.arange(8, dtype=float)[::-1]  # top-2 (ceil(0.25 * 8)) = {0, 1}
    b = np.arange(8, dtype=float)  # top-2 = {6, 7}
    v = values(Jaccard25(), [ex(a, paired_scores=a, paired_pred=0), ex(a, paired_scores=b, paired_pred=0)])
    assert v.tolist() == [1.0, 0.0]


def test_jaccard_partial_overlap_and_ceil():
    a = np.array([5.0, 4.0, 3.0, 0.0, 0.0])  # n = 5: k = ceil(1.25) = 2 -> {0, 1}
    b = np.array([5.0, 0.0, 4.0, 0.0, 0.0])  # {0, 2}
    assert values(Jaccard25(), [ex(a, paired_scores=b, paired_pred=0)])[0] == pytest.approx(1 / 3)


def test_seed_spearman_identical_reversed_and_normalised():
    a = np.array([0.3, 0.1, 0.5, 0.2])
    assert values(SeedSpearman(), [ex(a, paired_scores=a, paired_pred=0)])[0] == pytest.approx(1.0)
    assert values(SeedSpearman(), [ex(a, paired_scores=-a, paired_pred=0)])[0] == pytest.approx(-1.0)
    # literal reading (d / n): 1 - 6 * 20 / 16 / (4 * 15) = 0.875 = 1 - 2 / n^2
    assert values(SeedSpearman(ranks="normalised"), [ex(a, paired_scores=-a, paired_pred=0)])[0] == \
        pytest.approx(1 - 2 / 16)
    if stats is not None:  # no ties: the formula is Spearman's rho
        b = np.array([0.2, 0.4, 0.1, 0.3])
        assert values(SeedSpearman(), [ex(a, paired_scores=b, paired_pred=0)])[0] == \
            pytest.approx(stats.spearmanr(a, b)[0])


def test_seed_spearman_dense_ranks_with_ties():
    a = np.array([2.0, 2.0, 1.0, 3.0])  # dense [2, 2, 1, 3]
    b = np.array([1.0, 2.0, 3.0, 4.0])  # dense [1, 2, 3, 4]: d = [1, 0, -2, -1], sum d^2 = 6
    assert values(SeedSpearman(), [ex(a, paired_scores=b, paired_pred=0)])[0] == pytest.approx(1 - 36 / 60)


def test_pairs_with_other_prediction_or_missing_are_nan():
    a = np.array([0.3, 0.1, 0.5, 0.2])
    cases = [ex(a, pred=1, paired_scores=a, paired_pred=0), ex(a), ex(a, paired_scores=a)]
    for metric in (Jaccard25(), SeedSpearman()):
        assert np.isnan(values(metric, cases)).all()
        assert values(type(metric)(same_pred=False), [cases[0]])[0] == pytest.approx(1.0)


def test_misaligned_vectors_raise():
    with pytest.raises(ValueError):
        Jaccard25().evaluate([ex([1.0, 2.0], paired_scores=np.ones(3), paired_pred=0)], None)


def test_empty_example_list_and_metadata():
    metrics = [KendallTau(), SpearmanWithSaliency(), PrecisionAtK(), EvidenceDotProduct(), EvidenceAveragePrecision(),
               Jaccard25(), SeedSpearman()]
    assert len({m.name for m in metrics}) == len(metrics)
    for m in metrics:
        assert m.evaluate([], None).values.shape == (0,)
        assert m.needs_model is False and m.description and m.reference
        assert isinstance(m.higher_is_better, bool)
    assert KendallTau().settings == {"cls": "label", "form": "argsort", "exclude_specials": False}
    assert KendallTau.higher_is_better is False
