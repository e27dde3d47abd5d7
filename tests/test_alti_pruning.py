"""ALTI's exact pruning of the L1 proximities (compute/methods/_internals/l1_proximity.py): the sign split, the
Cauchy-Schwarz bound, the pruned form equal to the dense one on every architecture and variant (float64, every number
of dense steps, blocks and chunks forced small), the cost choice, and float32 agreement on the shared model."""

from __future__ import annotations

import pytest
import torch
from conftest import ARCHS, PRE_LN_ARCHS, SHARED_MODEL, SST2_DEV, needs_shared, random_batch, tiny_model

from compute.adapters import adapter_for
from compute.methods import get_method
from compute.methods._internals import l1_proximity as L1
from compute.methods._internals.decomposition import NEEDS, attention_vectors, layer_parts, operand_weights, operands

LENGTHS = [13, 4, 9, 1]  # padded, with a one-token example


@pytest.fixture(scope="module", params=ARCHS + PRE_LN_ARCHS)
def captured(request):
    arch = request.param
    model = tiny_model(arch)
    ad = adapter_for(model)
    with torch.no_grad():
        cap = ad.capture(random_batch(arch, LENGTHS), NEEDS)
    return arch, ad, cap


def _kinds(ad):
    return ["res"] if ad.pre_ln else ["resln", "enc"]


def _target(p, kind):
    """The vectors ALTI compares with, scaled as the kernel expects (alti.Alti.contributions)."""
    W, diag, scale = operand_weights(p, kind)
    y = {"res": p.t, "resln": p.y, "enc": p.y2}[kind]
    return W, diag, y if scale is None else y * scale[..., None]


def test_sign_split_is_exact():
    """|a| - |a - t| = s t - 2 max(0, s t - |a|), s = sign(a) with s = +1 at a = 0, for every sign and a = 0."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(10_000, generator=g, dtype=torch.float64)
    a[::7] = 0
    t = 3 * torch.randn(10_000, generator=g, dtype=torch.float64)
    t[::11] = 0
    s = torch.where(a >= 0, 1.0, -1.0).to(a.dtype)
    torch.testing.assert_close(s * t - 2 * (s * t - a.abs()).clamp_min(0), a.abs() - (a - t).abs(), rtol=0, atol=1e-14)


@torch.no_grad()
def test_pair_bound_covers_every_component(captured):
    """b_ij >= max_k |T_ijk| for every pair off the diagonal (the vectors built whole), 0 on it, on every layer."""
    arch, ad, cap = captured
    for l in range(ad.n_layers):
        p = layer_parts(cap, ad, l)
        for kind in _kinds(ad):
            W, _, _ = operand_weights(p, kind)
            B, H, n, _ = p.A.shape
            d = W.shape[0]
            U = torch.matmul(W.view(d, H, d // H).transpose(0, 1), p.v.permute(0, 2, 3, 1))
            bound = L1.pair_bounds(p.A, U.square().sum(1).amax(1).sqrt())
            U_, _, _ = operands(p, kind)
            T = attention_vectors(p, slice(0, n), U_, None, None)  # without the residual: off-diagonal vectors
            largest = T.abs().amax(-1)
            off = ~torch.eye(n, dtype=torch.bool)
            assert torch.all(largest[:, off] <= bound[:, off] * (1 + 1e-12) + 1e-300), (arch, l, kind)
            assert torch.all(bound.diagonal(dim1=1, dim2=2) == 0)
            sample = torch.tensor([0, n // 2, n - 1])
            torch.testing.assert_close(L1.pair_bounds(p.A, U.square().sum(1).amax(1).sqrt(), sample),
                                       bound[:, sample], rtol=0, atol=0)


@torch.no_grad()
@pytest.mark.parametrize("steps", [0, 1, 3, None])
def test_pruned_equals_dense(captured, steps):
    """Every query, source and pad position, every layer and kind: the pruned sums equal the dense ones to 1e-12 (no
    component is lost to the bound), with the query blocks and the one-by-one chunks forced to a single row/entry."""
    arch, ad, cap = captured
    for l in range(ad.n_layers):
        p = layer_parts(cap, ad, l)
        for kind in _kinds(ad):
            W, diag, a = _target(p, kind)
            dense = L1.dense_l1_proximities(p, W, diag, a, 1 << 20)
            for memory in (1 << 20, 1):
                pruned = L1.pruned_l1_proximities(p, W, diag, a, memory, force=True, steps=steps)
                torch.testing.assert_close(pruned, dense, rtol=1e-12, atol=1e-12, msg=f"{arch} layer {l} {kind}")


@torch.no_grad()
@pytest.mark.parametrize("variant", [{}, {"eps_quirk": True, "pairwise_eps": 1e-6}, {"ln2": True}])
def test_method_paths_agree(captured, variant):
    """The whole method (final scores, layer views, matrices) through either form, with the reference's quirks and
    ALTI+LN2 (post-LN only): equal to 1e-12; causal models keep exact zeros above the diagonal (but under the
    reference's pairwise epsilon, which gives every pair a distance of eps per component)."""
    arch, ad, cap = captured
    if ad.pre_ln and variant.get("ln2"):
        pytest.skip("ALTI+LN2 is not defined for pre-LN models")
    dense = get_method("alti", l1_path="dense", **variant).compute(cap, ad, cap.pred)
    pruned = get_method("alti", l1_path="pruned", **variant).compute(cap, ad, cap.pred)
    for what in ("scores", "layer_scores", "matrices"):
        torch.testing.assert_close(getattr(pruned, what), getattr(dense, what), rtol=1e-12, atol=1e-12,
                                   msg=f"{arch} {what}")
    if arch == "gpt2" and not variant:
        n = cap.mask.shape[1]
        assert torch.all(pruned.matrices[..., torch.ones(n, n, dtype=torch.bool).triu(1)] == 0)


def test_unknown_path_is_refused():
    with pytest.raises(ValueError, match="l1_path"):
        get_method("alti", l1_path="fast")


def test_choose_steps_prices_both_forms():
    """Costs in steps: t + TAIL_COST * (entries left one by one per pair) beside the dense d / 34 per pair."""
    d, n = 768, 512
    fixed = L1.fixed_steps(n, d)
    assert fixed == pytest.approx(3 + 768 * 768 / (384 * 512))
    # 90% of the pairs need one component, 10% need 20: one step leaves 0.1 * 19 entries per pair
    hist = torch.zeros(21)
    hist[1], hist[20] = 90, 10
    assert L1.choose_steps(hist, n, d) == 1  # 1 + 6 * 1.9 = 12.4 < 20 steps, and 12.4 + 7.5 < 22.6
    # everything needs 20: twenty steps (20) beat none (6 * 20), but not the dense form (22.6 < 7.5 + 20)
    hist = torch.zeros(21)
    hist[20] = 1
    assert L1.choose_steps(hist, n, d) is None
    assert L1.choose_steps(hist, n, d, force=True) == 20
    # nothing can exceed: no step at all
    assert L1.choose_steps(torch.tensor([5.0, 0.0, 0.0]), n, d) == 0
    # a narrow model's dense form is cheap: the same histogram goes dense
    hist = torch.zeros(21)
    hist[1], hist[20] = 90, 10
    assert L1.choose_steps(hist, n, 384) is None


@torch.no_grad()
def test_auto_keeps_short_batches_dense(monkeypatch):
    """Below PROBE_MIN_TOKENS the dense form runs without a probe (the pruned one is never entered)."""
    model = tiny_model("bert")
    ad = adapter_for(model)
    cap = ad.capture(random_batch("bert", [9, 5]), NEEDS)

    def fail(*args, **kwargs):
        raise AssertionError("probed")

    monkeypatch.setattr(L1, "pruned_l1_proximities", fail)
    get_method("alti").compute(cap, ad, cap.pred)
    monkeypatch.setattr(L1, "PROBE_MIN_TOKENS", 2)
    with pytest.raises(AssertionError, match="probed"):
        get_method("alti").compute(cap, ad, cap.pred)


@torch.no_grad()
@pytest.mark.parametrize("dense_cost", [1e-6, 1e6])
def test_auto_probe_either_way_equals_dense(captured, monkeypatch, dense_cost):
    """"auto" with the probe forced on (every length): whichever form its sampled rows and the whole histogram choose
    (the dense form priced at nothing, or at a fortune), the numbers are the dense ones."""
    arch, ad, cap = captured
    monkeypatch.setattr(L1, "PROBE_MIN_TOKENS", 1)
    monkeypatch.setattr(L1, "DENSE_PER_DIM", dense_cost)
    chosen = []
    pruned = L1.pruned_l1_proximities
    monkeypatch.setattr(L1, "pruned_l1_proximities", lambda *a, **k: chosen.append(pruned(*a, **k)) or chosen[-1])
    dense = get_method("alti", l1_path="dense").compute(cap, ad, cap.pred)
    auto = get_method("alti").compute(cap, ad, cap.pred)
    torch.testing.assert_close(auto.matrices, dense.matrices, rtol=1e-12, atol=1e-12)
    assert len(chosen) == ad.n_layers
    assert all((c is None) == (dense_cost < 1) for c in chosen)  # priced at nothing: the probe says dense


def test_probing_only_on_long_cpu_batches():
    assert L1.worth_probing(L1.PROBE_MIN_TOKENS, "cpu") and L1.worth_probing(512, "cpu")
    assert not L1.worth_probing(L1.PROBE_MIN_TOKENS - 1, "cpu")
    assert not L1.worth_probing(512, "cuda") and not L1.worth_probing(512, "mps")


@needs_shared
@pytest.mark.shared
@torch.no_grad()
def test_pruned_matches_dense_on_the_shared_model_in_float32():
    """A 300-token SST-2 text through the shared MiniLM (float32): the pruned matrices and final scores equal the
    dense ones to 1e-5 (float32 rounding of two summation orders)."""
    from compute.models import load_model

    lm = load_model(str(SHARED_MODEL), device=torch.device("cpu"))
    texts = [line.split("\t")[0] for line in SST2_DEV.read_text().splitlines()[1:40]]
    batch = dict(lm.tokenizer([" ".join(texts)], truncation=True, max_length=300, return_tensors="pt"))
    cap = lm.adapter.capture(batch, NEEDS)
    dense = get_method("alti", l1_path="dense").compute(cap, lm.adapter, cap.pred)
    pruned = get_method("alti", l1_path="pruned").compute(cap, lm.adapter, cap.pred)
    assert cap.mask.shape[1] == 300
    assert (pruned.matrices - dense.matrices).abs().max() < 1e-5
    assert (pruned.scores - dense.scores).abs().max() < 1e-5
