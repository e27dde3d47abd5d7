"""Two stores of the same examples compared value by value (a merged or distributed run against one process)."""

from __future__ import annotations

import numpy as np
import pytest


def assert_same_store(merged, full, n_examples: int, metrics: list[str], n_metric_methods: int) -> None:
    """Every example's fields, scores, views, matrices and values bitwise equal (the runs used the same batches);
    the store-wide scales equal; the metrics equal to 1e-5 (they batch perturbed sequences of several examples)."""
    assert merged.complete and len(merged) == len(full) == n_examples
    assert merged.methods == full.methods and merged.labels == full.labels and merged.task == full.task
    assert merged.ids() == full.ids() == [f"ex{i}" for i in range(n_examples)]
    for i in range(n_examples):
        a, b = merged[i], full[i]
        assert (a.row, a.id, a.text, a.pair, a.label, a.pred, a.target, a.explain_pos) == \
               (b.row, b.id, b.text, b.pair, b.label, b.pred, b.target, b.explain_pos), i
        assert a.tokens == b.tokens and (a.n_orig_tokens, a.truncated) == (b.n_orig_tokens, b.truncated)
        assert (a.target_token, a.foil_token, a.span_end, a.pred_end, a.gold_value, a.task_words) == \
               (b.target_token, b.foil_token, b.span_end, b.pred_end, b.gold_value, b.task_words), i
        np.testing.assert_array_equal(a.output, b.output, err_msg=f"example {i}")  # NaN equals NaN here
        assert merged.heads == full.heads
        for x, y in ((a.token_ids, b.token_ids), (a.spans, b.spans), (a.segment, b.segment), (a.probs, b.probs),
                     (a.heads(), b.heads())):
            np.testing.assert_array_equal(x, y, err_msg=f"example {i}")
        for m in full.methods:
            np.testing.assert_array_equal(a.scores(m), b.scores(m), err_msg=f"{m} example {i}")
            for get in (a.layer_scores, a.matrices, a.class_scores):
                mine, theirs = get(m), getattr(b, get.__name__)(m)
                assert (mine is None) == (theirs is None), (m, get.__name__)
                if mine is not None:
                    np.testing.assert_array_equal(mine, theirs, err_msg=f"{m} {get.__name__} example {i}")
            assert a.example_values(m) == b.example_values(m)
    for m in full.methods:  # the store-wide scales (colour ranges of attr-tui), accumulated over the merge
        mine, theirs = merged.scale_stats(m), full.scale_stats(m)
        assert mine.keys() == theirs.keys() and theirs
        for view in theirs:
            a, b = mine[view], theirs[view]
            assert (a.count, a.min, a.max, a.max_abs) == (b.count, b.min, b.max, b.max_abs), (m, view)
            assert a.mean == pytest.approx(b.mean, rel=1e-9, abs=1e-12) and a.std == pytest.approx(b.std, rel=1e-9)
            np.testing.assert_array_equal(a.hist, b.hist)
    assert any(full[0].matrices(m) is not None and full[0].matrices(m).ndim == 3 for m in full.methods)
    # the metrics: values, curves and levels joined in dataset order, summaries recomputed over all examples
    assert merged.metric_methods == full.metric_methods and len(full.metric_methods) == n_metric_methods
    for m in full.metric_methods:
        assert merged.metric_names(m) == full.metric_names(m) == metrics
        for name in full.metric_names(m):
            np.testing.assert_allclose(merged.metric_values(m, name), full.metric_values(m, name),
                                       rtol=1e-5, atol=1e-6, err_msg=f"{m}/{name}")
            ma, fa = merged.metric_info(m, name), full.metric_info(m, name)
            assert ma["settings"] == fa["settings"] and ma["summary"].keys() == fa["summary"].keys()
            for key, value in fa["summary"].items():
                assert ma["summary"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (m, name, key)
            for key in ("curves", "levels"):
                assert (ma[key] is None) == (fa[key] is None)
                if fa[key] is not None:
                    np.testing.assert_allclose(ma[key], fa[key], rtol=1e-5, atol=1e-6, err_msg=f"{m}/{name}")
