"""DecompX and decompx_nohead on pre-LN blocks (docs/methods.md 6.3) on tiny random float64 models of every pre-LN
family with a block description: the explained token's parts sum to every layer's output (the last layer's through
the final norm: the model's last hidden state) and the logit shares to the model's logits; on GPT-2 (LayerNorm,
biases, Conv1D, a plain GELU MLP), Llama (RMSNorm, a SwiGLU MLP) and Mixtral (the chosen experts, the routing fixed)
the batched propagation equals a per-example loop over layers, receiving and source tokens written here from the
definition; what stays refused is refused in one line. (Padding and batch invariance: tests/test_families.py and
tests/test_methods_preln.py run every method defined for the family.)"""

from __future__ import annotations

import pytest
import torch
from conftest import random_batch, tiny_model, tiny_task_model
from families import FAMILIES, VARIANTS, family_capture, family_model, model_task

from compute.adapters import adapter_for
from compute.errors import AttrscopeError
from compute.methods import get_method
from compute.methods._internals.decomposition import NEEDS
from compute.methods._internals.token_vectors import propagate

LENGTHS = [7, 3, 5, 1]


def _unclipped(family):
    """``family``'s tiny model without its config's clip_qkv (OLMo, OLMoE, MPT: the clamp DecompX refuses)."""
    def make(task=None):
        model = family_model(family, task)
        if family == "mpt":  # MPT's attention keeps its own copy
            model.config.attn_config.clip_qkv = None
            for block in model.transformer.blocks:
                block.attn.clip_qkv = None
        else:  # OLMo's and OLMoE's attention read it from the config at every forward
            model.config.clip_qkv = None
        return model
    return make


def _models():
    """(name, make(task=None)): a tiny random float64 model of every family and block arrangement (Falcon's)."""
    yield "gpt2", lambda task=None: tiny_model("gpt2", layers=2) if task is None else \
        tiny_task_model("gpt2", task, layers=2)
    yield "llama", lambda task=None: tiny_model("llama", layers=2) if task is None else \
        tiny_task_model("llama", task, layers=2)
    for family in (*FAMILIES, *VARIANTS):
        yield family, lambda task=None, family=family: family_model(family, task)
    # without clip_qkv: OLMo's LayerNorm without gain or bias (its final norm's too), OLMoE's experts, MPT
    for family in ("olmo", "olmoe", "mpt"):
        yield f"{family}_unclipped", _unclipped(family)


MODELS = dict(_models())


def _task(name):
    return model_task(MODELS[name]())


TASKS = {name: _task(name) for name in MODELS}
PRE_LN = [name for name, make in MODELS.items() if adapter_for(make(), TASKS[name]).pre_ln]
# its head (dense, act, norm) undescribed; clamped values
REFUSED = {"modernbert": "head", "olmo": "clip_qkv", "olmoe": "clip_qkv", "mpt": "clip_qkv"}
RUNS = [name for name in PRE_LN if name not in REFUSED]


def _capture(model, lengths=LENGTHS):
    ad = adapter_for(model, model_task(model))
    batch = random_batch("bert", lengths)
    with torch.no_grad():
        cap = family_capture(ad, batch, NEEDS)
    return ad, batch, cap


def _captured(name):
    model = MODELS[name]()
    return (model, *_capture(model))


@pytest.fixture(scope="module", params=RUNS)
def pre_ln(request):
    return _captured(request.param)


# a sequence head's every class (Cohere, Granite, OLMoE have a causal LM only)
CLASSIFIERS = [name for name in RUNS if TASKS[name] == "classification"]


@pytest.fixture(scope="module", params=CLASSIFIERS)
def classifier(request):
    return _captured(request.param)


@torch.no_grad()
def test_parts_sum_to_every_layer_output_and_to_the_logits(pre_ln):
    model, ad, batch, cap = pre_ln
    P = propagate(cap, ad, None)
    b, e = torch.arange(len(LENGTHS)), cap.explain_pos
    lm = ad.task == "next-token"  # a causal LM only: the predicted word's logit at the explained token
    logits = cap.output.logits[b, e] if lm else model(**ad.forward_inputs(batch)).logits
    # 1e-5: HF computes RMSNorm (and Mixtral its routing weights) in float32 inside a float64 model; the LayerNorm
    # families hold to 1e-7 (measured: docs/methods.md 6.3)
    for l in range(ad.n_layers):
        torch.testing.assert_close(P.rows[:, l].sum(1), cap.hidden_states[l + 1][b, e], rtol=0, atol=1e-5,
                                   msg=f"layer {l}")
    if not lm:
        torch.testing.assert_close(P.logits.sum(1), logits, rtol=0, atol=1e-5)
    dx, nohead = (get_method(name).compute(cap, ad, cap.pred) for name in ("decompx", "decompx_nohead"))
    torch.testing.assert_close(dx.scores.sum(1), logits[b, cap.pred], rtol=0, atol=1e-5)
    norms = torch.linalg.vector_norm(P.rows, dim=-1)  # [B, L, n]
    torch.testing.assert_close(nohead.scores, norms[:, -1], rtol=0, atol=0)
    torch.testing.assert_close(nohead.layer_scores, norms, rtol=0, atol=0)
    torch.testing.assert_close(dx.layer_scores, norms, rtol=0, atol=0)
    for i, k in enumerate(LENGTHS):
        assert not P.rows[i, :, k:].any() and not dx.scores[i, k:].any()  # pads take no part
        assert lm or not P.logits[i, k:].any()
        if k > 2:  # the explained (last) token's vector has parts from the tokens before it
            assert (norms[i, :, :k - 1] > 1e-3).any()
    assert (dx.scores < 0).any() and (dx.scores > 0).any()  # signed shares


@torch.no_grad()
def test_each_example_alone_equals_the_padded_batch(pre_ln):
    """Padding and batch invariance in float64 (tests/test_families.py checks every method in float32 on the
    families' own configs; this covers the arrangements and unclipped models above too)."""
    model, ad, batch, cap = pre_ln
    for name in ("decompx", "decompx_nohead"):
        m = get_method(name)
        together = m.compute(cap, ad, cap.pred)
        for b, k in enumerate(LENGTHS):
            alone_cap = family_capture(ad, {key: v[b:b + 1, :k] for key, v in batch.items()}, NEEDS)
            alone = m.compute(alone_cap, ad, cap.pred[b:b + 1])
            torch.testing.assert_close(together.scores[b, :k], alone.scores[0], rtol=0, atol=1e-5, msg=name)
            torch.testing.assert_close(together.layer_scores[b, :, :k], alone.layer_scores[0], rtol=0, atol=1e-5,
                                       msg=name)


@torch.no_grad()
def test_all_classes_equal_one_class_at_a_time(classifier):
    model, ad, batch, cap = classifier
    m = get_method("decompx")
    every = m.compute_classes(cap, ad, 2)
    for c in range(2):
        torch.testing.assert_close(every[:, c], m.compute(cap, ad, torch.full((len(LENGTHS),), c)).scores,
                                   rtol=0, atol=0)


@torch.no_grad()
def test_feed_forward_blocks_do_not_change_the_result(pre_ln, monkeypatch):
    import compute.methods._internals.token_vectors as tv

    model, ad, batch, cap = pre_ln
    whole = propagate(cap, ad, None)
    cap.memo.clear()
    monkeypatch.setattr(tv, "CPU_BLOCK_BYTES", 1)  # one source token per block of the MLP
    blocked = propagate(cap, ad, None)
    torch.testing.assert_close(blocked.rows, whole.rows, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(blocked.logits, whole.logits, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("family", sorted(REFUSED))
@pytest.mark.parametrize("name", ["decompx", "decompx_nohead"])
def test_what_stays_refused_is_one_line(family, name):
    model = family_model(family)
    ad = adapter_for(model, model_task(model))
    with pytest.raises(AttrscopeError, match=REFUSED[family]) as err:
        get_method(name).check_architecture(ad)
    assert "\n" not in str(err.value) and ad.config.model_type in str(err.value) and name in str(err.value)


# --- a per-example reference: loops over layers, receiving and source tokens, plain [n_sources, d] parts ----------
def share(V, b):
    """The bias b added to the parts V [n_src, D] of one state in proportion to |<V_j, b>| (absdot)."""
    w = (V @ b).abs()
    return V + (w / w.sum())[:, None] * b if w.sum() > 0 else V


def norm_parts(V, state, norm, rms):
    """A norm of the real ``state`` [d] applied to its parts V at the real state's scale, its bias shared."""
    eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", None))
    if rms:
        return V * norm.weight / torch.sqrt(state.square().mean() + eps)
    out = norm.weight * (V - V.mean(-1, keepdim=True)) / torch.sqrt(state.var(unbiased=False) + eps)
    return share(out, norm.bias)


def mlp_parts(family, mlp, U, u):
    """The MLP of the parts U [n_src, d] of a token whose real MLP input is u [d]."""
    if family == "gpt2":  # Conv1D: y = x W + b; GELU at its zero-origin slope
        pre = u @ mlp.c_fc.weight + mlp.c_fc.bias
        theta = mlp.act(pre) / pre
        return share((share(U @ mlp.c_fc.weight, mlp.c_fc.bias) * theta) @ mlp.c_proj.weight, mlp.c_proj.bias)
    if family == "llama":  # the gate of the real input frozen
        return (mlp.act_fn(mlp.gate_proj.weight @ u) * (U @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T
    _, weights, chosen = mlp.gate(u[None])  # Mixtral: the router's choice and weights fixed
    out = torch.zeros_like(U)
    ex = mlp.experts
    for w, k in zip(weights[0], chosen[0]):
        gate, up = ex.gate_up_proj[k].chunk(2)
        out += w * (ex.act_fn(gate @ u) * (U @ up.T)) @ ex.down_proj[k].T
    return out


@torch.no_grad()
def reference(family, model, ad, cap, b, k):
    """([L, k, d] the parts of example b's explained (last real) token after every layer, [k, C] its logit
    shares) from the batch's captured real states, one token and layer at a time."""
    H, dh = ad.n_heads, model.config.hidden_size // ad.n_heads
    rms = family != "gpt2"
    X = [torch.zeros(k, cap.hidden_states[0].shape[-1], dtype=torch.float64) for _ in range(k)]
    for i in range(k):
        X[i][i] = cap.hidden_states[0][b, i]
    rows = []
    for l, layer in enumerate(ad.layers()):
        x_real, h_real, u_real = cap.hidden_states[l][b], cap.ln2_in[l][b], cap.ln2_out[l][b]
        A = cap.attentions[l][b]  # [H, n, n]
        if family == "gpt2":
            attn, ln1, ln2 = layer.attn, layer.ln_1, layer.ln_2
            d = x_real.shape[-1]
            Wv, bv = attn.c_attn.weight[:, 2 * d:].T, attn.c_attn.bias[2 * d:]
            Wo, bo = attn.c_proj.weight.T, attn.c_proj.bias
        else:
            attn, ln1, ln2 = layer.self_attn, layer.input_layernorm, layer.post_attention_layernorm
            Wv = attn.v_proj.weight.unflatten(0, (-1, dh)).repeat_interleave(H // ad.n_kv_heads, 0).flatten(0, 1)
            bv, Wo, bo = torch.zeros(Wv.shape[0], dtype=Wv.dtype), attn.o_proj.weight, torch.zeros(Wv.shape[1])
        V = [norm_parts(X[t], x_real[t], ln1, rms) @ Wv.T for t in range(k)]  # [n_src, H dh] per token
        new = []
        for i in range(k):
            z = torch.zeros_like(V[0])
            for t in range(k):
                for h in range(H):
                    z[:, h * dh:(h + 1) * dh] += A[h, i, t] * V[t][:, h * dh:(h + 1) * dh]
            h_i = X[i] + share(z @ Wo.T, Wo @ bv + bo.to(Wo.dtype))
            U = norm_parts(h_i, h_real[i], ln2, rms)
            new.append(h_i + mlp_parts(family, layer.mlp, U, u_real[i]))
        X = new
        rows.append(X[k - 1])
    final = model.transformer.ln_f if family == "gpt2" else model.model.norm
    last = cap.ln2_in[-1][b, k - 1] + layer.mlp(cap.ln2_out[-1][b, k - 1][None, None])[0, 0]  # before the norm
    rows[-1] = norm_parts(rows[-1], last, final, rms)
    return torch.stack(rows), rows[-1] @ model.score.weight.T


@pytest.mark.parametrize("family", ["gpt2", "llama", "mixtral"])
@torch.no_grad()
def test_propagation_equals_the_per_token_reference(family):
    model = family_model(family) if family == "mixtral" else tiny_model(family, layers=2)
    ad, batch, cap = _capture(model)
    P = propagate(cap, ad, None)
    for b, k in enumerate(LENGTHS):
        rows, logits = reference(family, model, ad, cap, b, k)
        torch.testing.assert_close(P.rows[b, :, :k], rows, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(P.logits[b, :k], logits, rtol=1e-9, atol=1e-10)


# the families of the block descriptions that declare their MLP as a Sublayer (OPT, BLOOM, MPT, Granite's multiplier),
# parallel blocks (GPT-J, Cohere, Falcon), logit scales (Cohere, Granite), OLMoE's experts
NEXT_TOKEN = ["gpt2", "llama", "gemma2", "phi", "mixtral", "opt", "gptj", "cohere", "granite", "olmoe_unclipped",
              "bloom", "falcon", "falcon_rw", "falcon_7b", "falcon_1ln", "mpt_unclipped"]


@pytest.mark.parametrize("family", NEXT_TOKEN)
@torch.no_grad()
def test_next_token_shares_sum_to_the_word_logit(family):
    """--task next-token: each token's share of the target word's logit less the foil's (the LM head's row; Phi's
    head bias shared; Gemma 2's soft cap at its zero-origin slope; Cohere's and Granite's logit scales) sums to the
    model's own logits."""
    model = MODELS[family]("next-token")
    ad = adapter_for(model, "next-token")
    batch = random_batch("bert", LENGTHS)
    with torch.no_grad():
        cap = ad.capture(batch, NEEDS)
    target, foil = torch.tensor([5, 6, 7, 8]), torch.tensor([9, -1, 10, 11])
    cap.foil = foil
    res = get_method("decompx").compute(cap, ad, target)
    b, e = torch.arange(len(LENGTHS)), cap.explain_pos
    logits = cap.output.logits[b, e]  # [B, V]
    want = logits[b, target] - torch.where(foil >= 0, logits[b, foil.clamp_min(0)], 0)
    torch.testing.assert_close(res.scores.sum(1), want, rtol=0, atol=1e-5)
    for i, k in enumerate(LENGTHS):
        assert not res.scores[i, k:].any()
    nohead = get_method("decompx_nohead").compute(cap, ad, target)
    torch.testing.assert_close(nohead.layer_scores, res.layer_scores, rtol=0, atol=0)


@pytest.mark.parametrize("k", [1, 3])
@torch.no_grad()
def test_source_blocks_do_not_change_the_result(pre_ln, k, monkeypatch):
    """Blocks of k source tokens through every layer give the whole decomposition (every layer's explained row and
    the logits), no attention step holding more than k sources (pre-LN stages run from one attention to the next,
    N1's beta shared in the stage before)."""
    from test_method_decompx import blocks_of_sources

    model, ad, batch, cap = pre_ln
    cap.memo.clear()
    whole = propagate(cap, ad, None)
    cap.memo.clear()
    blocked, widest = blocks_of_sources(monkeypatch, k, lambda: propagate(cap, ad, None))
    cap.memo.clear()
    assert widest == k
    torch.testing.assert_close(blocked.rows, whole.rows, rtol=1e-10, atol=1e-12)
    if whole.logits is not None:
        torch.testing.assert_close(blocked.logits, whole.logits, rtol=1e-10, atol=1e-12)
