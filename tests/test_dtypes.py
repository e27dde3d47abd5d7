"""Half-precision models (--dtype bfloat16 | float16): every method and the metrics through attr-compute, against the
float32 run of the same tiny model; the float32 arithmetic a half-precision model keeps (docs/precision.md)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from cli_results import invoke, ok, one_line
from compute import models
from compute.methods import REGISTRY
from compute.methods._internals.gradients import FLOAT16_GRAD_SCALE, output_grads
from compute.metrics.spearman import spearman_rho
from conftest import WORDS
from store import open_store

HALF = ("bfloat16", "float16")
METRICS = "comprehensiveness,sufficiency,aopc"
N_EXAMPLES = 8
# The LRP rules divide by sums that pass near zero: their result is not continuous in the weights, and a
# half-precision model has other (rounded) weights (docs/method-details.md: LRP precision; lrp Spearman down to 0 here). They are held
# to finiteness and alignment here, and to the float32 run of the rounded weights below; every other method to
# TOLERANCE x the largest |float32 score| of the method and MIN_SPEARMAN on every example.
LRP_FAMILY = ("lrp", "partial_lrp", "transatt", "mask_lrp")
TOLERANCE = {"bfloat16": 0.15, "float16": 0.02}  # largest seen: attcat 0.075 (bfloat16), cat 0.0087 (float16)
# per example, over 3 to 10 tokens (one swap of two near ties: 0.9); the smallest seen: grads 0.885 (bfloat16),
# grad_l2 0.943 (float16); the mean over the examples of every method is at least 0.95
MIN_SPEARMAN = {"bfloat16": 0.85, "float16": 0.9}
# attgrads' default (last-layer Grad-CAM) is zero on every example of this tiny model: Grad-SAM has values to compare
ATTGRADS = ("--attgrads-variant", "gradsam")


@pytest.fixture(scope="module")
def stores(tiny_model_dirs, tmp_path_factory, one_thread):
    """The same run (every method, then metrics) with a float32, a bfloat16 and a float16 model."""
    tmp = tmp_path_factory.mktemp("dtypes")
    data = tmp / "d.jsonl"
    data.write_text("".join(json.dumps({"text": " ".join(WORDS[i:i + 3 + i % 5]), "label": i % 2}) + "\n"
                            for i in range(N_EXAMPLES)))
    out = {}
    for dtype in ("float32", *HALF):
        out[dtype] = tmp / f"{dtype}.h5"
        ok(invoke("run", data, "--model", tiny_model_dirs["bert"], "-o", out[dtype], "--device", "cpu", "--dtype",
                  dtype, "--methods", "all", "--batch-size", 3, "--metrics", METRICS, "-q", *ATTGRADS))
    return {"data": data, "model": tiny_model_dirs["bert"], **out}


def _scores(path):
    with open_store(path) as s:
        return {m: [s[i].scores(m) for i in range(len(s))] for m in s.methods}, [s[i].tokens for i in range(len(s))]


@pytest.mark.parametrize("dtype", HALF)
def test_every_method_of_a_half_precision_run_is_finite_aligned_and_close_to_float32(stores, dtype):
    ref, ref_tokens = _scores(stores["float32"])
    got, tokens = _scores(stores[dtype])
    assert sorted(got) == sorted(REGISTRY) and sorted(ref) == sorted(REGISTRY)
    assert tokens == ref_tokens and len(tokens) == N_EXAMPLES
    for m in REGISTRY:
        scale = max(float(np.abs(r).max()) for r in ref[m])
        assert scale > 0, m
        rhos = []
        for i, (r, g) in enumerate(zip(ref[m], got[m])):
            assert g.shape == r.shape == (len(tokens[i]),), (m, i)
            assert np.isfinite(g).all(), (m, i)
            if m not in LRP_FAMILY:
                np.testing.assert_allclose(g, r, rtol=0, atol=TOLERANCE[dtype] * scale, err_msg=f"{m} example {i}")
            rho = spearman_rho(r, g)
            if rho == rho:  # NaN: constant scores (a one-token example, attgrads' zero rows)
                rhos.append(rho)
        if m not in LRP_FAMILY:
            assert rhos and min(rhos) >= MIN_SPEARMAN[dtype] and np.mean(rhos) >= 0.95, (m, rhos)


@pytest.mark.parametrize("dtype", HALF)
def test_the_lrp_rules_of_a_half_precision_model_are_those_of_its_rounded_weights(stores, dtype, tmp_path):
    """The LRP family runs on a float64 copy of the model: a half-precision run equals, to float64 rounding, the
    float32 run of a model whose weights are the half-precision ones (the same class explained: --target label)."""
    from transformers import AutoModelForSequenceClassification

    rounded = tmp_path / "rounded"
    shutil.copytree(stores["model"], rounded)
    model = AutoModelForSequenceClassification.from_pretrained(stores["model"])
    model.to(getattr(torch, dtype)).to(torch.float32).save_pretrained(rounded)
    out = {}
    for name, model_dir, d in (("half", stores["model"], dtype), ("rounded", rounded, "float32")):
        out[name] = tmp_path / f"{name}.h5"
        ok(invoke("run", stores["data"], "--model", model_dir, "-o", out[name], "--device", "cpu", "--dtype", d,
                  "--methods", "lrp,partial_lrp,transatt", "--target", "label", "--batch-size", 3, "-q"))
    half, _ = _scores(out["half"])
    ref, _ = _scores(out["rounded"])
    for m in ("lrp", "partial_lrp", "transatt"):
        scale = max(float(np.abs(r).max()) for r in ref[m])
        for i, (r, g) in enumerate(zip(ref[m], half[m])):
            np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-6 * scale, err_msg=f"{m} example {i}")


@pytest.mark.parametrize("dtype", HALF)
def test_the_store_records_the_dtype_and_the_metrics_are_close_to_float32(stores, dtype):
    with open_store(stores[dtype]) as s, open_store(stores["float32"]) as s32:
        assert s.config["config"]["dtype"] == dtype and s.config["model"]["dtype"] == dtype
        assert s32.config["config"]["dtype"] == "float32"
        assert sorted(s.metric_methods) == sorted(REGISTRY)
        for m in REGISTRY:
            for name in METRICS.split(","):
                v, v32 = s.metric_values(m, name), s32.metric_values(m, name)
                assert v.shape == (N_EXAMPLES,) and np.isfinite(v).all(), (m, name)
                # probabilities of perturbed inputs: the half model's own rounding, plus another top-k where two
                # scores are near ties
                np.testing.assert_allclose(v, v32, atol=0.1, err_msg=f"{m} {name}")


def test_eval_reloads_the_model_in_the_stores_dtype(stores, tmp_path, monkeypatch):
    seen = []
    load = models.load_model

    def spy(*args, **kwargs):
        seen.append(kwargs["dtype"])
        return load(*args, **kwargs)

    monkeypatch.setattr(models, "load_model", spy)
    path = tmp_path / "copy.h5"
    path.write_bytes(stores["float16"].read_bytes())
    ok(invoke("eval", path, "--metrics", "comprehensiveness", "--methods", "rollout", "--device", "cpu", "-q"))
    assert seen == ["float16"]
    with open_store(path) as s, open_store(stores["float16"]) as before:
        np.testing.assert_array_equal(s.metric_values("rollout", "comprehensiveness"),
                                      before.metric_values("rollout", "comprehensiveness"))


@pytest.mark.parametrize("dtype,other", [("float16", "bfloat16"), ("float16", "float32"), ("bfloat16", "float16")])
def test_resume_with_another_dtype_is_refused(stores, dtype, other):
    before = stores[dtype].read_bytes()
    res = invoke("run", stores["data"], "--model", stores["model"], "-o", stores[dtype], "--device", "cpu",
                 "--dtype", other, "--methods", "all", "--batch-size", 3, *ATTGRADS, "--resume")
    line = one_line(res)
    assert f"--dtype {dtype}, not {other}" in line, line
    assert stores[dtype].read_bytes() == before


# --- the float16 backward: loss scaling ------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1e-6, 1e-7, 1e-8])
def test_float16_gradients_under_the_smallest_normal_keep_their_digits(size):
    """A gradient made of two normal float16 factors (a x b) that is itself under float16's smallest normal
    (6.1e-5): a plain float16 backward rounds it to a multiple of 6e-8 (1e-8: to 0); the backward at F x 2**12
    keeps its digits and returns it in float32."""
    x = torch.linspace(1, 2, 64, dtype=torch.float16, requires_grad=True)
    a = torch.linspace(0.5, 1, 64).mul(1e-3).half()
    b = torch.tensor(size / 1e-3).half()
    y = (x * a * b).float().sum()
    want = a.float() * b.float()  # dy/dx
    (g,) = output_grads(y, [x], retain_graph=True)
    assert g.dtype == torch.float32
    torch.testing.assert_close(g, want, rtol=2e-3, atol=0)
    (plain,) = torch.autograd.grad(y, x)
    assert float(((plain.float() - want) / want).abs().max()) > 0.01


def test_float16_backward_that_overflows_runs_again_at_a_smaller_scale():
    x = torch.ones(8, dtype=torch.float16, requires_grad=True)
    y = (x * 1000.0).float().sum()  # dy/dx = 1000: 1000 x 2**12 overflows float16 (65504), 1000 x 16 does not
    assert 1000.0 * FLOAT16_GRAD_SCALE > 65504
    (g,) = output_grads(y, [x])
    torch.testing.assert_close(g, torch.full((8,), 1000.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_other_dtypes_are_differentiated_as_they_are(dtype):
    x = torch.linspace(1, 2, 16, dtype=dtype, requires_grad=True)
    y = (x * x).sum()
    (g,) = output_grads(y, [x], retain_graph=True)
    (plain,) = torch.autograd.grad(y, x)
    assert g.dtype == dtype and torch.equal(g, plain)


# --- the arithmetic after a half-precision forward runs in float32 -----------------------------------------------

CAPTURED = [n for n, cls in REGISTRY.items() if cls.needs]  # the methods that read the no-grad capture only


def _half_capture(dtype):
    from compute.adapters import adapter_for
    from conftest import MASK_ID, random_batch, tiny_model

    ad = adapter_for(tiny_model("bert", dtype=getattr(torch, dtype)))
    ad.mask_token_id = MASK_ID
    batch = random_batch("bert", [9, 6, 12])
    with torch.no_grad():
        cap = ad.capture(batch, frozenset().union(*(REGISTRY[n].needs for n in CAPTURED)))
    return ad, batch, cap


@pytest.mark.parametrize("dtype", HALF)
@torch.no_grad()
def test_methods_on_a_half_precision_capture_compute_in_float32(dtype):
    """The captured internals are widened to float32 before any method reads them: a method's result equals the same
    arithmetic in float64 on the same internals (and weights) to float32 rounding. Half-precision arithmetic would
    be off by 1e-3 (float16) to 1e-2 (bfloat16)."""
    import dataclasses

    from compute.methods import get_method

    ad, _, cap = _half_capture(dtype)
    assert cap.logits.dtype == torch.float32 and all(a.dtype == torch.float32 for a in cap.attentions)
    wide64 = {f.name: [t.double() for t in getattr(cap, f.name)] for f in dataclasses.fields(cap)
              if isinstance(getattr(cap, f.name), list)}
    cap64 = dataclasses.replace(cap, logits=cap.logits.double(), memo={}, **wide64)
    for name in CAPTURED:
        m = get_method(name)
        got = m.compute(cap, ad, cap.pred)
        ref = m.compute(cap64, ad, cap.pred)
        assert got.scores.dtype == torch.float32, name
        scale = float(ref.scores.abs().max())
        torch.testing.assert_close(got.scores.double(), ref.scores, rtol=1e-5, atol=1e-5 * scale, msg=name)


@pytest.mark.parametrize("dtype", HALF)
def test_integrated_gradients_of_a_half_precision_model_sum_their_steps_in_float32(dtype):
    """Path points, step weights and the sum over steps in float32 at least: the attribution equals a float64 sum
    of the same model's gradients at the same points (Gauss-Legendre nodes rounded to bfloat16 would move the
    points by up to 0.4 %, and a sum kept in the model's dtype loses the small steps)."""
    from compute.methods._internals.gradients import (Explained, embedding_output, forward_at, ig_baseline,
                                                     integrated_gradients, model_inputs, quadrature, select)

    ad, _, cap = _half_capture(dtype)
    spec, steps = Explained(), 8
    attr, delta, _ = integrated_gradients(cap, ad, spec, cap.pred, steps=steps, rule="gausslegendre",
                                          baseline="mask", memory_bytes=1 << 30)
    assert attr.dtype == delta.dtype == torch.float32
    inputs = model_inputs(cap, spec)
    E = embedding_output(ad, inputs)
    X0 = ig_baseline(cap, ad, spec, E, "mask")
    total = torch.zeros(E.shape, dtype=torch.float64)
    for alpha, weight in zip(*quadrature(steps, "gausslegendre")):
        X = (X0.double() + alpha * (E.double() - X0.double())).float().to(E.dtype).requires_grad_(True)
        with torch.enable_grad():
            (g,) = output_grads(select(forward_at(ad, inputs, X, spec), cap.pred, "logit").sum(), [X])
        total += weight * g.double()
    ref = (E.double() - X0.double()) * total
    torch.testing.assert_close(attr.double(), ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
