"""The gradient family and AttCAT (METHODS.md 2.4, 4, 11.8, 11.10, 11.11) on tiny random float64 models of every
architecture: definitions against autograd through Hugging Face's own outputs, linearity in the target, IG
completeness, Cauchy-Schwarz, per-class scores, the reference-code options, and batch invariance in float32."""

from __future__ import annotations

import pytest
import torch
from conftest import ARCHS, MASK_ID, PRE_LN_ARCHS, alone_vs_batch_tol, assert_batch_invariant
from conftest import TINY_LENGTHS
from conftest import captured_tiny as setup

from compute.errors import AttrscopeError
from compute.methods import get_method
from compute.methods._internals.gradients import GradientPass, Explained, quadrature

ALL_ARCHS = ARCHS + PRE_LN_ARCHS
GRADIENT_METHODS = ("grad_l2", "gxi_l2", "gxi_mean", "ig_l2", "ig_mean", "cat", "attcat", "grads", "attgrads")
LENGTHS = TINY_LENGTHS


def hf_pass(model, batch, b, n):
    """Example b alone through Hugging Face's forward with output_hidden_states / output_attentions (the graph kept):
    (logits [1, C], hidden_states, attentions)."""
    one = {k: v[b:b + 1, :n] for k, v in batch.items()}
    if model.config.model_type == "distilbert":
        one.pop("token_type_ids", None)
    with torch.enable_grad():
        out = model(**one, output_hidden_states=True, output_attentions=True)
    return out.logits, out.hidden_states, out.attentions


@pytest.mark.parametrize("arch", ARCHS)
def test_cat_layer_one_is_gradient_times_input_and_cat_matches_autograd(arch):
    """11.8: CAT^1 equals the autograd gradient x input at the embedding output; every CAT^l and AttCAT^l term equals
    <dF/dh^l, h^l> (x attention received) computed from HF's own hidden states and attentions, example by example."""
    model, ad, batch, cap = setup(arch)
    cat = get_method("cat").compute(cap, ad, cap.pred)
    att = get_method("attcat").compute(cap, ad, cap.pred)
    for b, n in enumerate(LENGTHS):
        logits, hs, attn = hf_pass(model, batch, b, n)
        y = logits[0, cap.pred[b]]
        grads = torch.autograd.grad(y, hs[:-1])
        for l, (g, h, A) in enumerate(zip(grads, hs[:-1], attn)):
            term = (g * h).sum(-1)[0]
            torch.testing.assert_close(cat.layer_scores[b, l, :n], term, rtol=1e-9, atol=1e-12)
            alpha = A[0].mean(0).mean(0)  # mean over heads, then over query rows: attention received
            torch.testing.assert_close(att.layer_scores[b, l, :n], term * alpha, rtol=1e-9, atol=1e-12)
        assert (cat.scores[b, n:] == 0).all() and (att.scores[b, n:] == 0).all()
    torch.testing.assert_close(cat.scores, cat.layer_scores.sum(1))


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_attcat_is_linear_in_the_target(arch):
    """11.8: AttCAT(y_a) + AttCAT(y_b) == AttCAT(y_a + y_b)."""
    model, ad, batch, cap = setup(arch)
    m = get_method("attcat")
    gp = GradientPass(cap, ad, Explained())
    B = len(LENGTHS)
    a, b = torch.zeros(B, dtype=torch.long), torch.ones(B, dtype=torch.long)
    wrt = [gp.X, *gp.hidden_states, *gp.attentions]
    g = torch.autograd.grad((gp.logits[:, 0] + gp.logits[:, 1]).sum(), wrt, retain_graph=True)
    L1 = len(gp.hidden_states)
    both = m.from_grads(gp, {"X": g[0], "hidden": g[1:1 + L1], "attentions": g[1 + L1:]}, cap).scores
    sep = m.from_grads(gp, gp.grads(a), cap).scores + m.from_grads(gp, gp.grads(b), cap).scores
    torch.testing.assert_close(both, sep, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_gradient_baselines_against_autograd(arch):
    """grad_l2, gxi_l2, gxi_mean (METHODS.md 2.4) from the gradient at HF's embedding output; 11.11: Grad_l2 >= 0,
    GxI_l2 <= ||E_j|| ||dF/dE_j|| (Cauchy-Schwarz)."""
    model, ad, batch, cap = setup(arch)
    res = {name: get_method(name).compute(cap, ad, cap.pred).scores for name in ("grad_l2", "gxi_l2", "gxi_mean")}
    for b, n in enumerate(LENGTHS):
        logits, hs, _ = hf_pass(model, batch, b, n)
        (g,) = torch.autograd.grad(logits[0, cap.pred[b]], hs[0])
        E, g = hs[0][0].detach(), g[0]
        gn = g.norm(dim=-1)
        tol = alone_vs_batch_tol(arch, 1e-9, 1e-12)
        torch.testing.assert_close(res["grad_l2"][b, :n], gn / gn.sum(), **tol)
        torch.testing.assert_close(res["gxi_l2"][b, :n], (E * g).norm(dim=-1), **tol)
        torch.testing.assert_close(res["gxi_mean"][b, :n], (E * g).abs().mean(-1), **tol)
        assert (res["grad_l2"][b] >= 0).all()
        assert (res["gxi_l2"][b, :n] <= E.norm(dim=-1) * gn * (1 + 1e-12)).all()
        assert (res["grad_l2"][b, n:] == 0).all()


@pytest.mark.parametrize("arch", ["bert", "distilbert", "gpt2"])
def test_ig_completeness_shrinks_with_steps(arch):
    """11.10: sum_jk IG_jk ~ F(x) - F(x'), |delta| shrinking as the quadrature gets finer; ig_l2 and ig_mean share
    one integration and store the same delta."""
    _, ad, _, cap = setup(arch)
    baseline = "zero" if arch == "gpt2" else "mask"

    def delta(steps, rule):
        r = get_method("ig_l2", steps=steps, rule=rule, baseline=baseline).compute(cap, ad, cap.pred)
        return r.example_values["ig_delta"].abs().max().item()

    gl = [delta(s, "gausslegendre") for s in (2, 8, 32, 128)]
    assert all(b <= a or b < 1e-12 for a, b in zip(gl, gl[1:])) and gl[-1] < 1e-6
    riemann = [delta(s, "riemann") for s in (8, 128)]
    assert riemann[1] < 0.5 * riemann[0]  # first order, and far slower than Gauss-Legendre
    a = get_method("ig_l2", steps=8, baseline=baseline).compute(cap, ad, cap.pred).example_values["ig_delta"]
    b = get_method("ig_mean", steps=8, baseline=baseline).compute(cap, ad, cap.pred).example_values["ig_delta"]
    torch.testing.assert_close(a, b)


def test_ig_equals_a_naive_path_integral():
    """IG per dimension = (x - x') * sum_k w_k grad(x' + a_k (x - x')), one node at a time through HF's forward with
    inputs_embeds replaced by the path point (the baseline = the [MASK] sequence's embedding output)."""
    model, ad, batch, cap = setup("bert", num_labels=2)
    steps = 6
    ig = get_method("ig_mean", steps=steps, memory_mb=1).compute(cap, ad, cap.pred)  # tiny budget: many chunks
    alphas, weights = quadrature(steps, "gausslegendre")
    emb = model.bert.embeddings
    for b, n in enumerate(LENGTHS):
        ids = batch["input_ids"][b:b + 1, :n]
        masked = ids.clone()
        if n > 2:
            masked[0, 1:n - 1] = MASK_ID
        E, E0 = emb(input_ids=ids).detach(), emb(input_ids=masked).detach()
        total = torch.zeros_like(E)
        for a, w in zip(alphas, weights):
            X = (E0 + a * (E - E0)).requires_grad_(True)
            y = model.classifier(model.dropout(model.bert.pooler(model.bert.encoder(X).last_hidden_state)))
            total += w * torch.autograd.grad(y[0, cap.pred[b]], X)[0]
        torch.testing.assert_close(ig.scores[b, :n], ((E - E0) * total).abs().mean(-1)[0], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", GRADIENT_METHODS)
def test_per_class_scores_equal_single_target_runs(name):
    _, ad, _, cap = setup("bert", num_labels=3)
    params = {"steps": 4} if name.startswith("ig") else {}
    m = get_method(name, **params)
    joint = m.compute_classes(cap, ad, 3)
    for c in range(3):
        single = get_method(name, **params).compute(cap, ad, torch.full((len(LENGTHS),), c)).scores
        torch.testing.assert_close(joint[:, c], single, rtol=1e-9, atol=1e-12)


def test_ig_for_the_predicted_class_is_read_off_the_per_class_integrations(monkeypatch):
    """--target all integrates every class once; the scores and deltas of a mixed target are then gathered from
    those integrations (no extra one) and equal a fresh computation."""
    import compute.methods._internals.gradients as G

    _, ad, _, cap = setup("bert", num_labels=3)
    m = get_method("ig_l2", steps=4)
    m.compute_classes(cap, ad, 3)
    target = torch.tensor([2, 0, 1, 2])
    integrate = G.integrated_gradients
    monkeypatch.setattr(G, "integrated_gradients", lambda *a, **k: pytest.fail("integrated again"))
    gathered = m.compute(cap, ad, target)
    monkeypatch.setattr(G, "integrated_gradients", integrate)
    cap.memo.clear()
    fresh = get_method("ig_l2", steps=4).compute(cap, ad, target)
    torch.testing.assert_close(gathered.scores, fresh.scores, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(gathered.example_values["ig_delta"], fresh.example_values["ig_delta"])


def test_target_all_shares_one_backward_per_class_between_gradient_methods(monkeypatch):
    """The gradient methods of one batch share the gradient pass and, under --target all, each class's backward:
    per-target results are keyed by the identity of the class's target tensor (base.class_target), never by its
    values copied to the host."""
    import compute.methods._internals.gradients as G

    _, ad, _, cap = setup("bert", num_labels=3)
    calls = []
    real = G.output_grads
    monkeypatch.setattr(G, "output_grads", lambda *a, **k: calls.append(1) or real(*a, **k))
    joint = {name: get_method(name).compute_classes(cap, ad, 3) for name in ("grad_l2", "gxi_l2", "cat", "attcat")}
    assert len(calls) == 3  # one backward per class for all four methods
    for name, scores in joint.items():
        for c in range(3):
            fresh = get_method(name).compute(cap, ad, torch.full((len(LENGTHS),), c)).scores  # a new target: recomputed
            torch.testing.assert_close(scores[:, c], fresh, rtol=1e-12, atol=1e-14)
    assert len(calls) == 3 + 3 * 4  # new tensors are not taken for the class targets (identity, not values)


def test_ig_runs_its_path_and_its_ends_in_one_pass(monkeypatch):
    """Integrated gradients at a budget that holds every row: one forward of the model with grad (the steps and both
    ends of every example's path together), one backward; the delta is the completeness gap of F at the ends, which a
    separate forward of the ends confirms."""
    import compute.methods._internals.gradients as G

    model, ad, _, cap = setup("bert", num_labels=3)
    forwards, backwards = [], []
    handle = model.register_forward_hook(lambda m, i, o: forwards.append(torch.is_grad_enabled()))
    real = G.output_grads
    monkeypatch.setattr(G, "output_grads", lambda *a, **k: backwards.append(1) or real(*a, **k))
    try:
        res = get_method("ig_l2", steps=5).compute(cap, ad, cap.pred)
    finally:
        handle.remove()
    assert forwards.count(True) == 1 and len(backwards) == 1
    spec = G.Explained()
    E = G.embedding_output(ad, G.model_inputs(cap, spec))
    X0 = G.ig_baseline(cap, ad, spec, E, "mask")
    f = [G.select(G.forward_at(ad, cap.inputs, X, spec, grad=False), cap.pred, "logit") for X in (E, X0)]
    attr, _, gap = G.integrated_gradients(cap, ad, spec, cap.pred, steps=5, rule="gausslegendre", baseline="mask",
                                          memory_bytes=1 << 30)
    torch.testing.assert_close(res.example_values["ig_delta"], attr.sum((1, 2)) - (f[0] - f[1]), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gap, f[0] - f[1], rtol=1e-10, atol=1e-12)  # F(X) - F(X'), run_notes' denominator


def test_grads_and_attgrads_definitions():
    """grads: mean over heads and query rows of dF/dA^L, positive part, explained column 0. attgrads (ref): min-max
    normalised (mean_h A w_h)^+ with w_h the mean gradient of head h, explained row, own entry 0; gradsam: mean over
    layers, heads and query rows of A * ReLU(dF/dA)."""
    model, ad, batch, cap = setup("bert")
    grads = get_method("grads").compute(cap, ad, cap.pred).scores
    ref = get_method("attgrads").compute(cap, ad, cap.pred).scores
    sam = get_method("attgrads", variant="gradsam").compute(cap, ad, cap.pred).scores
    for b, n in enumerate(LENGTHS):
        logits, _, attn = hf_pass(model, batch, b, n)
        G = torch.autograd.grad(logits[0, cap.pred[b]], attn)
        A, GL = attn[-1][0].detach(), G[-1][0]
        expect = GL.mean(0).mean(0).clamp_min(0)
        expect[0] = 0
        torch.testing.assert_close(grads[b, :n], expect, rtol=1e-9, atol=1e-12)
        w = GL.mean((-2, -1))
        M = (A * w[:, None, None]).mean(0).clamp_min(0)
        span = M.max() - M.min()
        row = ((M - M.min()) / span)[0] if span > 0 else torch.zeros(n, dtype=M.dtype)
        row[0] = 0
        torch.testing.assert_close(ref[b, :n], row, rtol=1e-9, atol=1e-12)
        gs = torch.stack([(a[0].detach() * g[0].clamp_min(0)).mean(0).mean(0) for a, g in zip(attn, G)]).mean(0)
        torch.testing.assert_close(sam[b, :n], gs, rtol=1e-9, atol=1e-12)
        assert (ref[b] >= 0).all() and (ref[b] <= 1).all()


def test_double_embedding_quirk_explains_the_inputs_embeds_function():
    """14.4: with double_embedding the gradient is that of model(inputs_embeds=E), E the embedding output (position,
    type embeddings and LN applied twice) -- a different function from the deployed model."""
    model, ad, batch, cap = setup("bert", num_labels=2)
    clean = get_method("gxi_l2").compute(cap, ad, cap.pred).scores
    quirk = get_method("gxi_l2", double_embedding=True).compute(cap, ad, cap.pred).scores
    for b, n in enumerate(LENGTHS):
        E = model.bert.embeddings(input_ids=batch["input_ids"][b:b + 1, :n]).detach().requires_grad_(True)
        y = model(inputs_embeds=E).logits[0, cap.pred[b]]
        (g,) = torch.autograd.grad(y, E)
        torch.testing.assert_close(quirk[b, :n], (E * g).norm(dim=-1)[0].detach(), rtol=1e-9, atol=1e-12)
    assert not torch.allclose(clean, quirk)


def test_softmax_output_option():
    """ALTI's Captum wrapper explains the softmax probability: dp_c/dE = p_c (dy_c/dE - sum_k p_k dy_k/dE)."""
    _, ad, _, cap = setup("bert", num_labels=2)
    gp = GradientPass(cap, ad, Explained())
    gpp = GradientPass(cap, ad, Explained(output="prob"))
    p = torch.softmax(gp.logits.detach(), -1)
    c = cap.pred
    g = [gp.grads(torch.full_like(c, k))["X"] for k in range(2)]
    mix = sum(p[:, k, None, None] * g[k] for k in range(2))
    expect = p.gather(1, c[:, None])[:, :, None] * (torch.stack(g, 1)[torch.arange(len(c)), c] - mix)
    torch.testing.assert_close(gpp.grads(c)["X"], expect, rtol=1e-9, atol=1e-12)


def test_mask_specials_zeroes_special_tokens_in_attcat():
    """14.9 (--preset attcat): [CLS]/[SEP] masked as keys in the explanation pass receive no attention, so their
    AttCAT score is 0; the explained function changed, so other tokens' scores change too."""
    _, ad, _, cap = setup("bert")
    plain = get_method("attcat").compute(cap, ad, cap.pred).scores
    masked = get_method("attcat", mask_specials=True).compute(cap, ad, cap.pred).scores
    for b, n in enumerate(LENGTHS):
        if n > 2:
            assert masked[b, 0] == 0 and masked[b, n - 1] == 0
    # a sequence of specials only keeps them as keys (else attention would spread over the padding)
    torch.testing.assert_close(masked[3], plain[3])
    assert not torch.allclose(plain[0, 1:6], masked[0, 1:6])


def test_outputs_layer_option_uses_h1_to_hL():
    model, ad, batch, cap = setup("bert")
    out = get_method("cat", layers="outputs").compute(cap, ad, cap.pred)
    logits, hs, _ = hf_pass(model, batch, 0, LENGTHS[0])
    grads = torch.autograd.grad(logits[0, cap.pred[0]], hs[1:])
    for l, (g, h) in enumerate(zip(grads, hs[1:])):
        torch.testing.assert_close(out.layer_scores[0, l, :LENGTHS[0]], (g * h).sum(-1)[0], rtol=1e-9, atol=1e-12)


def test_mask_baseline_needs_a_mask_token():
    _, ad, _, cap = setup("gpt2")
    ad.mask_token_id = None
    with pytest.raises(AttrscopeError, match="--ig-baseline zero"):
        get_method("ig_l2").check_architecture(ad)
    get_method("ig_l2", baseline="zero").check_architecture(ad)


@pytest.mark.parametrize("arch", ALL_ARCHS)
@pytest.mark.parametrize("name", GRADIENT_METHODS)
def test_batch_invariance(arch, name):
    params = {"steps": 4} if name.startswith("ig") else {}
    if name.startswith("ig") and arch == "gpt2":
        params["baseline"] = "zero"
    assert_batch_invariant(arch, name, params=params)
