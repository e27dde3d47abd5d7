"""The LRP family (METHODS.md 5, 6.2-6.3, 11.6, 11.7) on tiny random float64 models of the post-LN architectures:
the batched closed-form rules against a naive one-example reference (tests/reference.py: activations recomputed from
the weights, every rule in its textbook four-product form), Mask-LRP with an all-ones mask equal to TransAtt,
GAE's identity with zero gradients, relevance conservation, and batch invariance in float32."""

from __future__ import annotations

import numpy as np
import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from conftest import ARCHS, PRE_LN_ARCHS, assert_batch_invariant, random_batch
from conftest import TINY_LENGTHS
from conftest import captured_tiny as setup

import reference as R
from compute.adapters import adapter_for
from compute.errors import AttrscopeError
from compute.methods import get_method
from compute.methods._internals.gradients import Explained
from compute.methods._internals.relevance import linear_relprop, relevance

LRP_METHODS = ("lrp", "partial_lrp", "transatt", "mask_lrp", "gae")
LENGTHS = TINY_LENGTHS


def random_mask(L, H, seed=3):
    g = np.random.default_rng(seed)
    m = (g.random((L, H)) < 0.5).astype(int)
    m[0, 0] = 1
    return m.tolist()


def test_linear_rule_equals_the_four_product_form():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(5, 7, 16, generator=g, dtype=torch.float64)
    W = torch.randn(12, 16, generator=g, dtype=torch.float64)
    Rout = torch.rand(5, 7, 12, generator=g, dtype=torch.float64)
    ours = linear_relprop(Rout, X, W, X @ W.T)
    ref = R._lin_rel(Rout.numpy().reshape(-1, 12), X.numpy().reshape(-1, 16), W.numpy()).reshape(5, 7, 16)
    np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-10, atol=1e-13)
    # alpha1-beta0 conserves each output's relevance (no bias in Z)
    np.testing.assert_allclose(ours.sum(-1).numpy(), Rout.sum(-1).numpy(), rtol=1e-8)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("masked", [False, True], ids=["plain", "head_mask"])
def test_methods_equal_the_naive_reference(arch, masked):
    """Every stored vector, layer view and matrix of lrp, partial_lrp, transatt (mask_lrp with a random mask) and
    gae equals the one-example float64 reference, for each example of a padded batch."""
    model, ad, batch, cap = setup(arch)
    L, H = ad.n_layers, ad.n_heads
    mask = random_mask(L, H) if masked else None
    names = ("mask_lrp",) if masked else ("lrp", "partial_lrp", "transatt", "gae")
    res = {nm: get_method(nm, **({"head_mask": mask} if nm == "mask_lrp" else {})).compute(cap, ad, cap.pred)
           for nm in names}
    for b, n in enumerate(LENGTHS):
        ids = batch["input_ids"][b, :n].tolist()
        types = batch["token_type_ids"][b, :n].tolist() if "token_type_ids" in batch else None
        ref = R.lrp_reference(model, ids, int(cap.pred[b]), head_mask=mask, token_type_ids=types)
        want = R.lrp_methods(ref)
        for nm in names:
            final, views, mats = want["transatt" if nm == "mask_lrp" else nm]
            got = res[nm]
            scale = max(np.abs(views).max(), 1e-12)
            np.testing.assert_allclose(got.scores[b, :n].numpy(), final, rtol=1e-7, atol=1e-9 * scale, err_msg=nm)
            np.testing.assert_allclose(got.layer_scores[b, :, :n].numpy(), views, rtol=1e-7, atol=1e-9 * scale,
                                       err_msg=nm)
            if mats is not None:
                np.testing.assert_allclose(got.matrices[b, :, :n, :n].numpy(), mats, rtol=1e-7,
                                           atol=1e-9 * max(np.abs(mats).max(), 1e-12), err_msg=nm)
            assert (got.scores[b, n:] == 0).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_mask_lrp_with_all_ones_mask_is_transatt_exactly(arch):
    """11.6: Mask-LRP with M = all ones equals TransAtt (bit for bit: multiplying by 1 changes nothing)."""
    _, ad, _, cap = setup(arch)
    ones = [[1] * ad.n_heads for _ in range(ad.n_layers)]
    t = get_method("transatt").compute(cap, ad, cap.pred)
    m = get_method("mask_lrp", head_mask=ones).compute(cap, ad, cap.pred)
    for field in ("scores", "layer_scores", "matrices"):
        assert torch.equal(getattr(t, field), getattr(m, field)), field


@pytest.mark.parametrize("arch", ARCHS + PRE_LN_ARCHS)
def test_gae_with_zero_gradients_is_the_identity_row(arch):
    """11.6: with dF/dA = 0 (a classifier with zero weights: logits = bias) A_bar = 0 and R = I."""
    model, ad, _, cap = setup(arch)
    head = ad.model.score if arch in PRE_LN_ARCHS else (
        ad.model.classifier.out_proj if arch in ("roberta", "electra") else ad.model.classifier)
    with torch.no_grad():
        head.weight.zero_()
    with torch.no_grad():
        cap = ad.capture(random_batch(arch, list(LENGTHS)), frozenset())
    res = get_method("gae").compute(cap, ad, cap.pred)
    want = torch.zeros_like(res.scores)
    want[torch.arange(len(LENGTHS)), cap.explain_pos] = 1
    assert torch.equal(res.scores, want)
    assert torch.equal(res.layer_scores, want[:, None].expand_as(res.layer_scores))


@pytest.mark.parametrize("arch", ARCHS)
def test_relevance_is_conserved_down_to_the_input(arch):
    """11.7: the one-hot start's total (1) arrives at the encoder input, and at every layer's input: every rule
    conserves its total up to safe_divide's 1e-9 (the add rule by construction, alpha1-beta0 and LRP-0 because the
    denominators are exactly the summed contributions). With a head mask the total shrinks (REF); renormalised it
    is conserved again (the paper's variant)."""
    _, ad, _, cap = setup(arch)
    spec = Explained()
    rel = relevance(cap, ad, spec, cap.pred)
    ones = torch.ones(len(LENGTHS), dtype=torch.float64)
    torch.testing.assert_close(rel.input.sum((1, 2)), ones, rtol=0, atol=1e-6)
    for per_layer in rel.inputs:
        torch.testing.assert_close(per_layer.sum(-1), ones, rtol=0, atol=1e-6)
    half = torch.ones(ad.n_layers, ad.n_heads, dtype=torch.float64)
    half[:, ::2] = 0
    masked = relevance(cap, ad, spec, cap.pred, half)
    assert (masked.input.sum((1, 2)) < 1 - 1e-3).all()
    renorm = relevance(cap, ad, spec, cap.pred, half, renormalise=True)
    torch.testing.assert_close(renorm.input.sum((1, 2)), ones, rtol=0, atol=1e-6)


def test_rollout_uses_masked_option_changes_only_the_rollout_input():
    model, ad, batch, cap = setup("bert")
    mask = random_mask(ad.n_layers, ad.n_heads)
    a = get_method("mask_lrp", head_mask=mask).compute(cap, ad, cap.pred)
    b = get_method("mask_lrp", head_mask=mask, rollout_uses_masked=True).compute(cap, ad, cap.pred)
    assert not torch.allclose(a.scores, b.scores)
    ids = batch["input_ids"][0, :LENGTHS[0]].tolist()
    types = batch["token_type_ids"][0, :LENGTHS[0]].tolist() if "token_type_ids" in batch else None
    ref = R.lrp_reference(model, ids, int(cap.pred[0]), head_mask=mask, rollout_uses_masked=True,
                          token_type_ids=types)
    np.testing.assert_allclose(b.scores[0, :LENGTHS[0]].numpy(), R.lrp_methods(ref)["transatt"][0], rtol=1e-7,
                               atol=1e-12)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", LRP_METHODS)
def test_batch_invariance_float32(arch, name):
    params = {"head_mask": random_mask(3, 4)} if name == "mask_lrp" else None
    assert_batch_invariant(arch, name, params=params)


@pytest.mark.parametrize("arch", PRE_LN_ARCHS)
def test_gae_batch_invariance_on_decoders(arch):
    assert_batch_invariant(arch, "gae")


def test_mask_lrp_mask_of_wrong_shape_is_one_line_error():
    _, ad, _, _ = setup("bert")
    with pytest.raises(AttrscopeError, match="layers x"):
        get_method("mask_lrp", head_mask=[[1, 0]]).check_architecture(ad)


def test_mask_sep_masks_the_separator_as_a_key():
    """Mask-LRP's explanation pass (METHODS.md 6.5): [SEP] gets no attention in the pass the methods read."""
    from compute.methods._internals.gradients import gradient_pass

    _, ad, _, cap = setup("bert")
    gp = gradient_pass(cap, ad, Explained(mask_sep=True))
    b = torch.arange(len(LENGTHS))
    last = cap.lengths - 1
    for A in gp.attentions:
        sep_col = A[b, :, :, last]  # [B, H, n]
        assert (sep_col[cap.lengths > 1] == 0).all()


@pytest.mark.parametrize("name", ("lrp", "transatt"))
def test_float32_model_runs_the_rules_on_a_float64_twin(name):
    """The LRP rules divide by sums that pass near zero (residual adds, Q.K^T scores), where float32 rounding of the
    forward is amplified without bound, so dtype="float64" runs a float32 model's LRP on a float64 copy: the result
    equals the float64 model's to rounding. "mixed" runs the same float64 forward with the rules in float32, and
    "model" keeps the reference's float32 computation."""
    _, ad32, batch, _ = setup("bert", dtype=torch.float32)
    _, ad64, _, _ = setup("bert", dtype=torch.float64)
    with torch.no_grad():
        cap32, cap64 = ad32.capture(batch, frozenset()), ad64.capture(batch, frozenset())
    got = get_method(name, dtype="float64").compute(cap32, ad32, cap64.pred)
    want = get_method(name, dtype="float64").compute(cap64, ad64, cap64.pred)
    assert got.scores.dtype == torch.float64
    torch.testing.assert_close(got.layer_scores, want.layer_scores, rtol=1e-9, atol=1e-12)
    mixed = get_method(name, dtype="mixed").compute(cap32, ad32, cap64.pred)
    assert mixed.scores.dtype == torch.float32
    torch.testing.assert_close(mixed.layer_scores, want.layer_scores.float(), rtol=1e-4,
                               atol=1e-4 * float(want.layer_scores.abs().max()))
    plain = get_method(name, dtype="model").compute(cap32, ad32, cap64.pred)
    assert plain.scores.dtype == torch.float32


@pytest.mark.parametrize("name", ("lrp", "partial_lrp", "transatt", "mask_lrp"))
def test_auto_precision_is_float64_for_every_lrp_method(name):
    """--lrp-dtype auto (the default) is float64 for the four methods (issue 26: float32, and float32 rules on a
    float64 forward, miss 1e-3 of the scale on the shared model or a random BERT-base; docs/method-details.md, LRP precision): the
    stored params name it, and the result is that of --lrp-dtype float64."""
    _, ad32, batch, _ = setup("bert", dtype=torch.float32)
    params = {"head_mask": random_mask(3, 4)} if name == "mask_lrp" else {}
    with torch.no_grad():
        cap = ad32.capture(batch, frozenset())
    m = get_method(name, **params)
    assert m.params["dtype"] == "float64"
    got = m.compute(cap, ad32, cap.pred)
    cap.memo.clear()
    ran = get_method(name, dtype="float64", **params).compute(cap, ad32, cap.pred)
    assert got.scores.dtype == torch.float64
    torch.testing.assert_close(got.layer_scores, ran.layer_scores, rtol=0, atol=0)


def _precision_model():
    """A seeded random 12-layer BERT (hidden 64, 4 heads), float32, and a padded batch on which the LRP rules pass near
    their poles: float32 misses float64 by about 0.2 of the scale in all four methods."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(1)
    cfg = BertConfig(vocab_size=120, hidden_size=64, num_attention_heads=4, intermediate_size=256, num_hidden_layers=12,
                     max_position_embeddings=128, attn_implementation="eager")
    ad = adapter_for(BertForSequenceClassification(cfg).eval())
    return ad, random_batch("bert", [40, 33, 25, 18])


@pytest.mark.parametrize("name", ("lrp", "partial_lrp", "transatt", "mask_lrp"))
def test_the_default_precision_reproduces_float64_where_float32_does_not(name):
    """Issue 26's bound for the default: within 1e-3 of the method's scale (its largest |float64| score or layer view)
    of a float64 run, mean Spearman >= 0.9999, on a model where float32 misses it (checked here, so that the test
    means something). Fails on transatt and mask_lrp under the former default (the model's float32: 0.19)."""
    from scipy.stats import spearmanr

    ad, batch = _precision_model()
    params = {"head_mask": [[(l + h) % 2 for h in range(ad.n_heads)] for l in range(ad.n_layers)]} \
        if name == "mask_lrp" else {}
    runs = {}
    for dtype in ("default", "float64", "model"):
        with torch.no_grad():
            cap = ad.capture(batch, frozenset())  # its own memo: nothing shared between the runs
        m = get_method(name, **params) if dtype == "default" else get_method(name, dtype=dtype, **params)
        res = m.compute(cap, ad, cap.pred)
        runs[dtype] = torch.cat([res.scores[:, None], res.layer_scores], 1).double()  # [B, 1 + V, n]
    want = runs["float64"]
    scale = float(want.abs().max())
    assert float((runs["model"] - want).abs().max()) > 1e-3 * scale  # float32 fails here
    assert float((runs["default"] - want).abs().max()) <= 1e-3 * scale
    rho = [spearmanr(runs["default"][b, 0, 1:n], want[b, 0, 1:n]).correlation
           for b, n in enumerate(cap.lengths.tolist())]
    assert np.mean(rho) >= 0.9999, rho


def test_auto_precision_runs_a_half_precision_model_on_a_float64_copy():
    """transatt under auto on a bfloat16 model runs on a float64 copy of it: the result equals "float64" on a float32
    model with the rounded weights, and differs from the half-precision forward of --lrp-dtype model."""
    _, ad32, batch, _ = setup("bert", dtype=torch.float32)
    half = ad32.model.to(torch.bfloat16)

    ad16 = adapter_for(half)
    rounded = adapter_for(copy.deepcopy(half).to(torch.float32))
    with torch.no_grad():
        cap16, capr = ad16.capture(batch, frozenset()), rounded.capture(batch, frozenset())
    target = capr.pred
    got = get_method("transatt").compute(cap16, ad16, target)
    want = get_method("transatt", dtype="float64").compute(capr, rounded, target)
    torch.testing.assert_close(got.scores, want.scores, rtol=1e-9, atol=1e-12)
    halfway = get_method("transatt", dtype="model").compute(ad16.capture(batch, frozenset()), ad16, target)
    assert (halfway.scores.double() - want.scores).abs().max() > 1e-2 * want.scores.abs().max()


@pytest.mark.parametrize("arch", ARCHS)
def test_rollout_unhalved_doubles_every_map(arch):
    """The reference's Mask-LRP rolls out the attention relevance before the 1/2 of the A.V rule (cam1_preserve in its
    BERT.py): every per-layer map is exactly twice the default's (float64: a factor 2 is exact), and the rollout is
    that of the doubled maps. The default stays TransAtt with an all-ones mask (test above); unhalved it does not."""
    from compute.methods._internals.relevance import gradient_weighted_rollout

    _, ad, _, cap = setup(arch)
    for mask in (random_mask(ad.n_layers, ad.n_heads), [[1] * ad.n_heads for _ in range(ad.n_layers)]):
        a = get_method("mask_lrp", head_mask=mask).compute(cap, ad, cap.pred)
        b = get_method("mask_lrp", head_mask=mask, rollout_unhalved=True).compute(cap, ad, cap.pred)
        assert a.matrices.abs().max() > 0
        assert torch.equal(b.matrices, 2 * a.matrices)
        maps = list((2 * a.matrices).unbind(1))
        want = gradient_weighted_rollout(maps, cap.mask, cap.explain_pos)
        assert torch.equal(b.layer_scores, want) and torch.equal(b.scores, want[:, -1])
        assert not torch.allclose(b.scores, a.scores)
    t = get_method("transatt").compute(cap, ad, cap.pred)
    assert torch.equal(t.matrices, a.matrices) and not torch.allclose(t.scores, b.scores)


class _NoHostSync(TorchDispatchMode):
    """Fails on an op that copies a device scalar to the host (.item(), bool(t), int(t): a device sync on a GPU)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        assert func is not torch.ops.aten._local_scalar_dense.default, "a device-to-host sync in the LRP path"
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ("lrp", "partial_lrp", "mask_lrp"))
def test_the_relevance_pass_never_waits_for_the_device(monkeypatch, name):
    """No host sync inside a batch (issue 26): the propagation, its memo key (not target.tolist()) and the read-outs
    of lrp, partial_lrp and mask_lrp (whose gradients are prepared first: GradientPass keys them itself) run without
    .item(), .tolist(), bool() or int() of a tensor. tolist() never reaches the dispatcher on the CPU: patched."""
    _, ad, _, cap = setup("bert")
    m = get_method(name, **({"head_mask": random_mask(ad.n_layers, ad.n_heads)} if name == "mask_lrp" else {}))
    target = cap.pred
    m.head_mask(cap)  # made once per run (a host-to-device copy)
    from compute.methods._internals.gradients import gradient_pass

    gradient_pass(cap, ad, m.spec, lrp=True)  # the pass itself (the model's code) is not the rules' business

    def no_tolist(self):
        raise AssertionError("Tensor.tolist in the LRP path")

    monkeypatch.setattr(torch.Tensor, "tolist", no_tolist)
    with _NoHostSync(), torch.no_grad():
        rel = relevance(cap, ad, m.spec, target, m.head_mask(cap), rules_dtype=m.rules_dtype(ad), **m.options())
        if name != "mask_lrp":
            m.from_relevance(rel, gradient_pass(cap, ad, m.spec, lrp=True), target, cap)


def test_the_batch_shares_one_propagation_per_target_tensor(monkeypatch):
    """The memo is keyed by the target tensor (and the mask tensor): lrp, partial_lrp and transatt on one target run
    one propagation, each class of --target all one more (class targets shared by the methods), and a target
    changed in place is a new propagation with the new target's result."""
    import compute.methods._internals.relevance as rv

    _, ad, _, cap = setup("bert")
    calls = []
    propagate = rv.propagate
    monkeypatch.setattr(rv, "propagate", lambda *a, **k: calls.append(a[1].clone()) or propagate(*a, **k))
    target = cap.pred
    for name in ("lrp", "partial_lrp", "transatt"):
        get_method(name, dtype="float64").compute(cap, ad, target)
    assert len(calls) == 1
    for name in ("lrp", "partial_lrp", "transatt"):
        get_method(name, dtype="float64").compute_classes(cap, ad, 3)
    assert len(calls) == 4
    spec = get_method("lrp", dtype="float64").spec
    before = relevance(cap, ad, spec, target, rules_dtype=None).input.clone()  # the methods' call: memoised
    target.copy_((target + 1) % 3)
    after = relevance(cap, ad, spec, target, rules_dtype=None).input
    assert len(calls) == 5 and torch.equal(calls[-1], target)
    fresh = rv.propagate(gradient_pass_of(cap, ad), target.clone(), cap.explain_pos)
    assert torch.equal(after, fresh.input) and not torch.allclose(after, before)


def gradient_pass_of(cap, ad):
    from compute.methods._internals.gradients import gradient_pass

    return gradient_pass(cap, ad, get_method("lrp", dtype="float64").spec, lrp=True)


@pytest.mark.parametrize("arch", ("bert", "distilbert"))
def test_the_layer_groups_do_not_change_the_result(monkeypatch, arch):
    """The rules precompute for a group of layers at once, as many as GROUP_BYTES allows: groups of one layer (a long
    batch) and of two give the numbers of one group for all, to float64 rounding, with a head mask (renormalised too)."""
    import compute.methods._internals.relevance as rv

    _, ad, _, cap = setup(arch)
    mask = torch.as_tensor(random_mask(ad.n_layers, ad.n_heads), dtype=torch.float64)
    want = [rv.propagate(gradient_pass_of(cap, ad), cap.pred, cap.explain_pos, m, renormalise=r)
            for m, r in ((None, False), (mask, False), (mask, True))]
    for size in (1, 2):
        monkeypatch.setattr(rv, "_groups", lambda L, *_: [range(max(0, hi - size), hi) for hi in range(L, 0, -size)])
        for w, (m, r) in zip(want, ((None, False), (mask, False), (mask, True))):
            got = rv.propagate(gradient_pass_of(cap, ad), cap.pred, cap.explain_pos, m, renormalise=r)
            for field in ("input", "inputs", "attention"):
                torch.testing.assert_close(getattr(got, field), getattr(w, field), rtol=1e-12, atol=1e-15)
