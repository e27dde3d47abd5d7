"""Acceptance of the faithfulness metrics on the shared MiniLM-SST2 model: what

    attr-compute dev_subset.tsv --model minilm-sst2 --methods alti,rollout --metrics comprehensiveness,sufficiency

stores for alti and rollout equals an independent computation of the ALTI reference procedure (METHODS.md 8.1;
tests/reference.py: dense ranks, ceil levels, one perturbed input at a time through plain transformers, running
min / max, divided by 6) within 1e-3, on every EVERY-th SST-2 dev example (default 16: 55 examples; set
ATTRSCOPE_METRICS_EVERY=1 for all 872)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import SHARED_MODEL, SST2_DEV, needs_shared

import reference as R
from store import open_store

pytestmark = [needs_shared, pytest.mark.slow, pytest.mark.shared]
EVERY = int(os.environ.get("ATTRSCOPE_METRICS_EVERY", "16"))


def test_comprehensiveness_and_sufficiency_equal_the_alti_reference(tmp_path):
    from transformers import AutoModelForSequenceClassification

    from compute.runner import RunConfig, run

    lines = SST2_DEV.read_text(encoding="utf-8").splitlines(keepends=True)
    subset = tmp_path / "dev_subset.tsv"
    subset.write_text(lines[0] + "".join(lines[1::EVERY]), encoding="utf-8")
    out = tmp_path / "metrics.h5"
    run(RunConfig(dataset=str(subset), model=str(SHARED_MODEL), methods="alti,rollout", matrices="none",
                  output=str(out), metrics="comprehensiveness,sufficiency"))
    model = AutoModelForSequenceClassification.from_pretrained(SHARED_MODEL, attn_implementation="eager").eval()
    worst = {}
    with open_store(out) as s:
        for method in ("alti", "rollout"):
            got = s.metrics(method)
            diffs = {"comprehensiveness": [], "sufficiency": []}
            for i, ex in enumerate(s):
                comp, suff = R.alti_comp_suff(model, ex.token_ids.tolist(), ex.scores(method), ex.pred)
                diffs["comprehensiveness"].append(abs(float(got["comprehensiveness"][i]) - comp))
                diffs["sufficiency"].append(abs(float(got["sufficiency"][i]) - suff))
            for k, d in diffs.items():
                worst[f"{method}/{k}"] = max(d)
            summ = s.metric_summaries(method)
            np.testing.assert_allclose(summ["comprehensiveness"]["summary"]["mean"],
                                       float(np.mean(got["comprehensiveness"])), rtol=1e-5)
    print(f"worst |stored - reference| over {len(s)} examples:", {k: f"{v:.1e}" for k, v in worst.items()})
    assert max(worst.values()) < 1e-3
