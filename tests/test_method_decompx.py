"""DecompX (docs/methods.md) on tiny float64 models of every post-LN architecture: the decomposition of the explained
token's vector sums to that vector after every layer and the logit shares sum to the logits (biases are shared
among the tokens, so nothing is left over), with GELU and with linear activations; the batched propagation equals a
per-example re-implementation written here from the paper's equations (a loop over layers, plain per-source
vectors, the model's own modules); --target all equals one class at a time. (Pre-LN blocks:
tests/test_decompx_pre_ln.py.)"""

from __future__ import annotations

import pytest
import torch
from conftest import ARCHS, random_batch, tiny_model

from compute.adapters import adapter_for
from compute.methods import get_method

LENGTHS = [7, 3, 5, 1]


def _run(arch, model=None, lengths=LENGTHS, **params):
    model = model or tiny_model(arch)
    ad = adapter_for(model)
    batch = random_batch(arch, lengths)
    m = get_method("decompx", **params)
    with torch.no_grad():
        cap = ad.capture(batch, m.needs)
        res = m.compute(cap, ad, cap.pred)
    return model, ad, batch, cap, m, res


def _bias(module, size, like):
    b = getattr(module, "bias", None)
    return torch.zeros(size, dtype=like.dtype) if b is None else b


def shared(vectors, bias):
    """Add bias to the [n, D] vectors of one receiving token in proportion to |<vector_j, bias>|."""
    w = (vectors @ bias).abs()
    return vectors + (w / w.sum())[:, None] * bias if w.sum() > 0 else vectors


def ln_parts(parts, state, ln):
    """LayerNorm of a sum of parts: each part centred and scaled by the real state's sigma, beta shared."""
    sigma = torch.sqrt(state.var(unbiased=False) + ln.eps)
    out = ln.weight * (parts - parts.mean(-1, keepdim=True)) / sigma
    return shared(out, ln.bias)


def slope(pre, post):
    return post / pre  # no pre-activation of these random models is exactly 0


@torch.no_grad()
def decompx_reference(model, ad, ids: list[int]):
    """([L, n, d] parts of the explained token (position 0) after every layer, [n, C] logit shares) for one example."""
    x_ids = torch.tensor([ids])
    enc = ad.forward_inputs({"input_ids": x_ids, "attention_mask": torch.ones_like(x_ids)})
    out = model(**enc, output_hidden_states=True, output_attentions=True)
    n = len(ids)
    H = ad.n_heads
    parts = None  # parts[i][j]: token j's part of token i's vector, [n, n, d]
    cls_rows = []
    for l, layer in enumerate(ad.layers()):
        x = out.hidden_states[l][0]
        A = out.attentions[l][0]  # [H, n, n]
        value, o, ln1, ln2 = ad.value_module(layer), ad.out_proj(layer), ad.ln1(layer), ad.ln2(layer)
        lin1, act, lin2 = ad.ffn_parts(layer)
        d = x.shape[-1]
        dh = d // H
        v_real = value(x)  # [n, d] with the value bias
        s_real = o(torch.cat([A[h] @ v_real[:, h * dh:(h + 1) * dh] for h in range(H)], -1)) + x
        y_real = ln1(s_real)
        h_real = lin1(y_real)
        t_real = y_real + lin2(act(h_real))
        new = torch.zeros(n, n, d, dtype=x.dtype)
        for i in range(n):
            z = torch.zeros(n, d, dtype=x.dtype)
            for j in range(n):
                if parts is None:  # layer 1: token j's value (bias included) and token i's own input
                    vj = v_real[j]
                    mixed = torch.cat([A[h, i, j] * vj[h * dh:(h + 1) * dh] for h in range(H)])
                    z[j] = mixed @ o.weight.T + (x[i] if i == j else 0)
                else:  # token j's parts of every token k, through W_V (no bias), attention and W_O
                    vk = parts[:, j] @ value.weight.T  # [n(k), d]
                    mixed = torch.cat([A[h, i] @ vk[:, h * dh:(h + 1) * dh] for h in range(H)])
                    z[j] = mixed @ o.weight.T + parts[i, j]
            bias = _bias(o, d, x) if parts is None else o.weight @ value.bias + _bias(o, d, x)
            y = ln_parts(shared(z, bias), s_real[i], ln1)
            first = shared(y @ lin1.weight.T, lin1.bias) * slope(h_real[i], act(h_real[i]))
            f = shared(first @ lin2.weight.T, lin2.bias)
            new[i] = ln_parts(y + f, t_real[i], ln2)
        parts = new
        cls_rows.append(parts[0].clone())
    dense, act, classifier = ad.head_parts()
    pre = dense(out.hidden_states[-1][0, 0])
    pooled = shared(parts[0] @ dense.weight.T, dense.bias) * slope(pre, act(pre))
    return torch.stack(cls_rows), shared(pooled @ classifier.weight.T, classifier.bias)


@pytest.mark.parametrize("arch", ARCHS)
def test_decompx_equals_the_per_example_reference(arch):
    model, ad, batch, cap, m, res = _run(arch, lengths=[6, 3, 5])
    with torch.no_grad():
        every = m.compute_classes(cap, ad, 2)
        nohead = get_method("decompx_nohead").compute(cap, ad, cap.pred)
    for b, n in enumerate([6, 3, 5]):
        rows, logits = decompx_reference(model, ad, batch["input_ids"][b, :n].tolist())
        torch.testing.assert_close(every[b, :, :n], logits.T, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(res.scores[b, :n], logits[:, int(cap.pred[b])], rtol=1e-9, atol=1e-12)
        norms = torch.linalg.vector_norm(rows, dim=-1)  # [L, n]
        torch.testing.assert_close(res.layer_scores[b, :, :n], norms, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(nohead.layer_scores[b, :, :n], norms, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(nohead.scores[b, :n], norms[-1], rtol=1e-9, atol=1e-12)
        assert not res.scores[b, n:].any() and not res.layer_scores[b, :, n:].any()


def _linear_activations(model, ad):
    """The same model with every feed-forward and head activation replaced by the identity."""
    for layer in ad.layers():
        if hasattr(layer, "intermediate"):
            layer.intermediate.intermediate_act_fn = torch.nn.Identity()
        else:
            layer.ffn.activation = torch.nn.Identity()
    if hasattr(model, "bert"):
        model.bert.pooler.activation = torch.nn.Identity()
    elif hasattr(model, "pre_classifier"):
        pass  # DistilBERT's head applies torch.relu itself (adapters.head_parts): left as it is
    elif hasattr(model.classifier, "activation"):
        model.classifier.activation = torch.nn.Identity()
    return model


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("activation", ["gelu", "linear"])
def test_decompx_parts_sum_to_the_vector_and_the_logit(arch, activation):
    """Sum over tokens of the explained token's parts = its hidden state after every layer, and of the logit shares
    = the logits (biases shared: no bias term is left over). Exact with linear activations; with GELU too, since
    the zero-origin slope act(h)/h maps the sum h to act(h): the stated tolerance 1e-10 covers float64 rounding."""
    model = tiny_model(arch)
    if activation == "linear":
        ad = adapter_for(model)
        _linear_activations(model, ad)
    model, ad, batch, cap, m, res = _run(arch, model=model)
    from compute.methods._internals.token_vectors import propagate

    with torch.no_grad():
        P = propagate(cap, ad, 64)
        logits = model(**ad.forward_inputs(batch)).logits
    e = cap.explain_pos
    b = torch.arange(len(LENGTHS))
    for l in range(ad.n_layers):
        torch.testing.assert_close(P.rows[:, l].sum(1), cap.hidden_states[l + 1][b, e], rtol=0, atol=1e-10)
    torch.testing.assert_close(P.logits.sum(1), logits, rtol=0, atol=1e-10)
    torch.testing.assert_close(res.scores.sum(1), logits[b, cap.pred], rtol=0, atol=1e-10)
    assert (P.logits < 0).any() and (P.logits > 0).any()  # signed shares


@torch.no_grad()
def test_decompx_feed_forward_blocks_do_not_change_the_result():
    import compute.methods._internals.token_vectors as tv

    _, ad, batch, _, m, whole = _run("bert")
    real = tv.CPU_BLOCK_BYTES
    try:
        tv.CPU_BLOCK_BYTES = 1  # one source token per feed-forward block
        cap2 = ad.capture(batch, m.needs)  # a fresh batch memo
        blocked = get_method("decompx").compute(cap2, ad, cap2.pred)
    finally:
        tv.CPU_BLOCK_BYTES = real
    torch.testing.assert_close(blocked.scores, whole.scores, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(blocked.layer_scores, whole.layer_scores, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("k", [None, 3])
@torch.no_grad()
def test_decompx_work_buffers_do_not_change_the_result(k, monkeypatch):
    """Every work tensor taken from the reused buffers (token_vectors.Buffers; by default only those of 32 MB or
    more), with the feed-forward block in blocks of one receiving row, whole and in blocks of k source tokens: the
    same numbers as fresh tensors, while a handful of buffers serve every layer (none handed out while in use)."""
    import compute.methods._internals.token_vectors as tv

    model, ad, batch, _, m, _ = _run("bert", model=tiny_model("bert", layers=3))
    monkeypatch.setattr(tv, "CPU_BLOCK_BYTES", 1)
    if k is not None:
        monkeypatch.setattr(tv, "source_blocks", lambda *a: k)

    def run():
        cap = ad.capture(batch, m.needs)  # a fresh batch memo
        return m.compute(cap, ad, cap.pred), m.compute_classes(cap, ad, 2)

    fresh, fresh_classes = run()
    pools, taken, take = [], [], tv.Buffers.take

    def spy(self, shape, *live):
        out = take(self, shape, *live)
        taken.append(out is not None)
        if self.pool not in pools:
            pools.append(self.pool)
        return out

    monkeypatch.setattr(tv, "REUSED_BYTES", 0)
    monkeypatch.setattr(tv.Buffers, "take", spy)
    reused, reused_classes = run()
    assert taken and all(taken)
    assert len(pools) == 1 and 1 < len(pools[0]) <= 4  # one propagation: a pool of a few buffers
    assert torch.equal(reused.scores, fresh.scores) and torch.equal(reused.layer_scores, fresh.layer_scores)
    assert torch.equal(reused_classes, fresh_classes)


def test_ln_share_in_place_is_ln_share():
    from compute.methods._internals.fused import ln_share, ln_share_

    g = torch.Generator().manual_seed(0)
    v, gain, beta = (torch.randn(*s, generator=g) for s in ((3, 5, 8), (3, 1, 8), (8,)))
    expected = ln_share(v, gain, beta)
    ln_share_(v, gain, beta)
    assert torch.equal(v, expected)


def blocks_of_sources(monkeypatch, k: int, run):
    """``run()`` with the decomposition in blocks of k source tokens (token_vectors.source_blocks), and the most
    source columns any attention step read: (result, widest)."""
    import compute.methods._internals.token_vectors as tv

    widths, attention = [], tv._attention

    def spy(step, X, *a, **kw):
        widths.append(X.shape[1])
        return attention(step, X, *a, **kw)

    monkeypatch.setattr(tv, "_attention", spy)
    monkeypatch.setattr(tv, "source_blocks", lambda *a: k)
    return run(), max(widths)


@pytest.mark.parametrize("k", [1, 3])
@torch.no_grad()
def test_decompx_source_blocks_do_not_change_the_result(k, monkeypatch):
    """Blocks of k source tokens through every layer (the stage's bias shares summed in passes before) give the
    whole decomposition's every output, and no attention step holds more than k sources."""
    model, ad, batch, _, m, whole = _run("bert", model=tiny_model("bert", layers=3))
    every = m.compute_classes(ad.capture(batch, m.needs), ad, 2)

    def blocked():
        cap = ad.capture(batch, m.needs)  # a fresh batch memo
        return m.compute(cap, ad, cap.pred), m.compute_classes(cap, ad, 2)

    (res, classes), widest = blocks_of_sources(monkeypatch, k, blocked)
    assert widest == k
    torch.testing.assert_close(res.scores, whole.scores, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(res.layer_scores, whole.layer_scores, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(classes, every, rtol=1e-10, atol=1e-12)


def test_the_memory_model_blocks_decompx_as_the_propagation_does():
    """compute.memory_model's DecompX block (k source tokens within the state budget) is token_vectors.source_blocks'
    at batch 1, whole below the budget and in blocks above it."""
    from dataclasses import replace

    from compute import memory_model as mm
    from compute.methods._internals.token_vectors import source_blocks

    shape = mm.ModelShape("tiny-but-long Llama", layers=4, d=256, heads=8, kv_heads=8, d_ff=1024, vocab=100)
    for n, budget in ((256, 4 << 30), (256, 64 << 20), (2048, 4 << 30), (4096, 20 * 10**9)):
        run = mm.Run(n, 4, replace(mm.Budgets.cpu(), decompx_state=budget))
        assert mm.decompx_block_tokens(shape, run) == source_blocks(1, n, 256, 4, budget)
    assert source_blocks(1, 256, 256, 4, 64 << 20) == 51 < 256 == source_blocks(1, 256, 256, 4, 4 << 30)
