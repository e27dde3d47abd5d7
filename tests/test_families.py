"""The families beyond the eight of conftest (compute/adapters/*.py: Qwen2, Qwen3, Mistral, Gemma, Gemma 2, Phi-3,
GPT-NeoX, OLMo 2, ModernBERT, DeBERTa-v2) on tiny seeded random float64 models: the decomposition identities, LogAt at
the explained position = the model's logit (sequence, masked-LM and causal-LM heads), integrated gradients'
completeness, ALTI's rows, every defined method alone = in a padded float32 batch, and `--methods all` end to end."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from conftest import MASK_ID, random_batch
from families import (NEW_FAMILIES, UNDESCRIBED, family_capture, family_heads, family_model, is_decoder,
                      write_family_dir)

from compute.adapters import adapter_for
from compute.errors import AttrscopeError
from compute.methods import REGISTRY, get_method
from compute.methods._internals.decomposition import NEEDS, attention_vectors, layer_parts, operands

LENGTHS = [7, 3, 9, 1]
ALL_NEEDS = frozenset().union(*(m.needs for m in REGISTRY.values()))


def captured(family, task=None, dtype=torch.float64, lengths=LENGTHS, needs=ALL_NEEDS):
    """A tiny model of ``family`` with the head of ``task`` (default: a sequence classifier, or a causal LM where
    transformers has none) and its capture of a padded batch, explaining as a run does (families.family_capture)."""
    task = task or family_heads(family)[0]
    model = family_model(family, task, dtype=dtype)
    ad = adapter_for(model, task)
    ad.mask_token_id = MASK_ID
    batch = random_batch("bert", list(lengths))  # [CLS] ... [SEP] = 2 ... 3, pad 0
    with torch.no_grad():
        cap = family_capture(ad, batch, needs)
    return model, ad, batch, cap


def defined(ad) -> list[str]:
    out = []
    for name, cls in REGISTRY.items():
        m = get_method(name)
        try:
            m.check_task(ad.task)
            m.check_architecture(ad)
        except AttrscopeError:
            continue
        out.append(name)
    return out


@pytest.fixture(scope="module", params=NEW_FAMILIES)
def fam(request):
    return (request.param, *captured(request.param))


@torch.no_grad()
def test_explained_position_and_logat_equal_the_logit(fam):
    family, model, ad, batch, cap = fam
    last = [k - 1 for k in LENGTHS]
    assert cap.explain_pos.tolist() == (last if is_decoder(family) else [0] * len(LENGTHS))
    assert ad.pooling == ("last" if is_decoder(family) else "first")
    res = get_method("logat").compute(cap, ad, cap.pred)
    b = torch.arange(len(LENGTHS))
    torch.testing.assert_close(res.scores[b, cap.explain_pos], cap.logits[b, cap.pred], rtol=0, atol=1e-10)


@torch.no_grad()
def test_decomposition_identity_layer_by_layer(fam):
    """The parts of every token's vector sum to the vector: pre-LN blocks sum_j T_i(x_j) + bias = the residual stream
    after attention (through an attention-output norm at its real scale where the block has one); post-LN blocks
    the LN1 output (T through LN1, b~ the bias)."""
    family, model, ad, batch, cap = fam
    kind = "res" if ad.pre_ln else "resln"
    for l in range(ad.n_layers):
        p = layer_parts(cap, ad, l)
        U, diag, scale = operands(p, kind)
        n = p.A.shape[-1]
        parts = attention_vectors(p, slice(0, n), U, diag, scale).sum(2)
        if ad.pre_ln:
            bias = p.b_O if p.rho is None else p.weights.gamma_o[l] * p.b_O / p.rho[..., None]
            want = p.t
        else:
            bias, want = p.b_tilde, p.y
        bias = bias.expand_as(want)
        # HF computes RMSNorm in float32 inside a float64 model: an attention-output norm's real output is rounded so
        tol = 1e-8 if p.rho is None else 1e-6
        for b, k in enumerate(LENGTHS):
            torch.testing.assert_close(parts[b, :k] + bias[b, :k], want[b, :k], rtol=0, atol=tol)


@torch.no_grad()
def test_alti_and_globenc_rows_sum_to_one(fam):
    family, model, ad, batch, cap = fam
    names = ["alti", "alti_l2", "globenc"]  # GlobEnc's pre-LN form on pre-LN blocks (docs/methods.md 6.1)
    for name in names:
        res = get_method(name).compute(cap, ad, cap.pred)
        for b, k in enumerate(LENGTHS):
            if name != "globenc":
                M = res.matrices[b, :, :k, :k]
                assert (M >= 0).all(), name
                torch.testing.assert_close(M.sum(-1), torch.ones(ad.n_layers, k, dtype=M.dtype), atol=1e-10, rtol=0)
            views = res.layer_scores[b, :, :k]
            assert (views >= -1e-12).all(), name
            torch.testing.assert_close(views.sum(-1), torch.ones(ad.n_layers, dtype=views.dtype), atol=1e-8, rtol=0)


def test_integrated_gradients_complete(fam):
    family, model, ad, batch, cap = fam
    if ad.block.mlp_kind == "moe":  # docs/methods.md section 5: F jumps where the routing switches along the path
        pytest.skip("a mixture of experts' routing switches along the path: no quadrature converges")
    # the [MASK] baseline: a zero one passes RMSNorm's singular point at 0, where no quadrature converges
    res = get_method("ig_l2", steps=64, baseline="mask").compute(cap, ad, cap.pred)
    delta = res.example_values["ig_delta"]
    if family == "opt":  # ReLU: F has kinks along the path, which a quadrature passes at first order only
        fine = get_method("ig_l2", steps=256, baseline="mask").compute(cap, ad, cap.pred).example_values["ig_delta"]
        assert float(fine.abs().max()) < min(2e-3, float(delta.abs().max()) / 3), (delta, fine)
        return
    assert float(delta.abs().max()) < 1e-5, delta  # HF computes RMSNorm in float32 inside float64 models


def test_refusals_are_one_line_naming_why(fam):
    family, model, ad, batch, cap = fam
    ok = defined(ad)
    must = {"grads", "grad_l2", "gxi_l2", "ig_l2", "ig_mean", "raw_attention", "rollout", "attcat", "cat", "gae",
            "logat", "normxlogit", "norm", "alti", "alti_l2", "norm_n", "norm_res", "norm_fixedres"}
    assert must <= set(ok), must - set(ok)
    for name in set(REGISTRY) - set(ok):
        with pytest.raises(AttrscopeError) as err:
            m = get_method(name)
            m.check_task(ad.task)
            m.check_architecture(ad)
        # the model's type, or the task the method is not defined for (a causal LM's: Cohere, Granite, OLMoE)
        said = str(err.value)
        assert "\n" not in said and (ad.config.model_type in said or f"--task {ad.task}" in said), said


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_every_defined_method_alone_equals_padded_batch_float32(family):
    lengths = [5, 9, 2]
    model, ad, batch, cap = captured(family, dtype=torch.float32, lengths=lengths)
    with torch.no_grad():  # each example alone, captured once for every method
        alone_caps = [family_capture(ad, {k: v[b:b + 1, :n] for k, v in batch.items()}, ALL_NEEDS)
                      for b, n in enumerate(lengths)]
    for name in defined(ad):
        if name in ("lrp", "partial_lrp", "transatt", "mask_lrp"):
            continue
        m = get_method(name)
        together = m.compute(cap, ad, cap.pred)
        for b, n in enumerate(lengths):
            alone = m.compute(alone_caps[b], ad, cap.pred[b:b + 1])
            for field in ("scores", "layer_scores", "matrices"):
                x, y = getattr(together, field), getattr(alone, field)
                if x is None:
                    continue
                x = x[b][..., :n, :n] if field == "matrices" else x[b][..., :n]
                scale = max(float(y.detach().abs().max()), 1.0)
                torch.testing.assert_close(x, y[0], rtol=1e-5, atol=1e-5 * scale, msg=f"{family} {name} {field}")


@pytest.mark.parametrize("family", (*NEW_FAMILIES, "gpt2", "llama"))
@torch.no_grad()
def test_language_model_head_logat_equals_the_word_logit(family):
    """A causal LM (decoders) or masked LM (encoders) head: LogAt of the last layer at a position = that position's
    logit of the word."""
    task = "next-token" if family in ("gpt2", "llama") or is_decoder(family) else "masked-token"
    if family in ("gpt2", "llama"):  # head_logit on every layer at once: its bias had the layers' count (L != B)
        from conftest import tiny_task_model

        model = tiny_task_model(family, task, layers=2)
        ad = adapter_for(model, task)
        batch = random_batch(family, LENGTHS)
        with torch.no_grad():
            cap = ad.capture(batch, ALL_NEEDS)
    else:
        model, ad, batch, cap = captured(family, task)
    hs = cap.stack("hidden_states")[1:]
    target = torch.tensor([5, 6, 7, 8])
    got = ad.head_logit(hs, target).transpose(0, 1)[:, -1]  # [B, n]
    want = cap.output.logits[..., :][torch.arange(4)[:, None], torch.arange(hs.shape[2])[None], target[:, None]]
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(got[mask], want[mask], rtol=0, atol=1e-9)


@pytest.mark.parametrize("family", [f for f in NEW_FAMILIES if "classification" in family_heads(f)])
def test_methods_all_end_to_end(family, tmp_path):
    """`attr-compute DATA --model DIR --methods all` on a saved tiny classifier: exit 0, the methods of the acceptance
    stored, probabilities = the model's own softmax, LogAt's last layer at the explained position = the target
    logit, ALTI non-negative summing to 1."""
    import json

    from cli_results import invoke
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from store import open_store

    model_dir = write_family_dir(tmp_path / family, family)
    data = tmp_path / "d.jsonl"
    texts = ["the movie was great", "boring and long film", "not very good acting but fun"]
    data.write_text("".join(json.dumps({"text": t, "label": i % 2}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "out.h5"
    res = invoke("run", data, "--model", model_dir, "--methods", "all", "-o", out, "--device", "cpu", "-q")
    assert res.exit_code == 0, res.stderr
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    with open_store(out) as s:
        assert {"grads", "grad_l2", "ig_l2", "raw_attention", "rollout", "attcat", "logat", "alti"} <= set(s.methods)
        for i, t in enumerate(texts):
            ex = s[i]
            with torch.no_grad():
                enc = tok(t, return_tensors="pt")
                if not getattr(model.config, "type_vocab_size", 0):  # as attrscope feeds it (GPT-J adds wte(types))
                    enc.pop("token_type_ids", None)
                logits = model(**enc).logits[0]
            np.testing.assert_allclose(ex.probs, torch.softmax(logits, -1).numpy(), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(ex.layer_scores("logat")[-1, ex.explain_pos], logits[ex.pred].item(),
                                       rtol=1e-5, atol=1e-5)
            alti = ex.scores("alti")
            assert (alti >= 0).all() and abs(alti.sum() - 1) < 1e-5


@torch.no_grad()
def test_a_family_without_description_runs_what_needs_none():
    """OPT-350m's arrangement (post-LN, projections in and out of narrower embeddings) is not OPT's block
    description (OPTAdapter.describes): its layers and attention come from the model class's own record; the
    gradient and attention methods run (LogAt = the logit at the last real token), those needing the block are
    refused in one line naming the missing description."""
    from compute.adapters.generic import GenericAdapter
    from compute.applicability import applicability

    model = family_model("opt_postln")
    ad = adapter_for(model)
    ad.mask_token_id = MASK_ID
    assert isinstance(ad, GenericAdapter) and ad.pooling == "last"
    found = applicability(ad)
    runs = {n for n, r in found.items() if r is None}
    assert {"grad_l2", "ig_l2", "raw_attention", "rollout", "gae", "attcat", "logat"} <= runs
    assert found["alti"] is not None and "no block description" in found["alti"] and "\n" not in found["alti"]
    batch = random_batch("bert", LENGTHS)
    cap = ad.capture(batch, frozenset({"attentions", "hidden_states"}))
    assert cap.explain_pos.tolist() == [k - 1 for k in LENGTHS]
    b = torch.arange(len(LENGTHS))
    lg = get_method("logat").compute(cap, ad, cap.pred).scores
    torch.testing.assert_close(lg[b, cap.explain_pos], cap.logits[b, cap.pred], rtol=0, atol=1e-10)
    with torch.enable_grad():
        res = get_method("ig_l2", steps=64).compute(cap, ad, cap.pred)
    assert float(res.example_values["ig_delta"].abs().max()) < 1e-5


def test_methods_command_lists_what_runs_for_a_checkpoint(tmp_path):
    """`attr-compute methods --model PATH`: every method, "runs" or "refused: " and its one-line reason, as the
    methods' own checks say (compute.applicability)."""
    from cli_results import invoke

    from compute.applicability import applicability
    from compute.models import load_model

    model_dir = write_family_dir(tmp_path / "gemma2", "gemma2")
    res = invoke("methods", "--model", model_dir)
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    found = applicability(load_model(str(model_dir), device=torch.device("cpu")).adapter)
    assert lines[0].startswith(f"gemma2 (gemma2, --task classification, explained token: last): "
                               f"{sum(r is None for r in found.values())} of {len(REGISTRY)} methods run")
    assert [line.split()[0] for line in lines[1:]] == list(REGISTRY)
    for line, (name, reason) in zip(lines[1:], found.items()):
        assert line.split(None, 1)[1] == ("runs" if reason is None else f"refused: {reason}")
    assert found["alti"] is None and "sublayers' outputs" in found["alti_logit"]


@pytest.mark.parametrize("family", [f for f in NEW_FAMILIES if f in ("qwen2", "qwen3", "mistral", "gemma", "phi3", "olmo",
                                                                    "starcoder2", "mixtral", "qwen2_moe", "qwen3_moe",
                                                                    "opt", "granite", "olmoe", "bloom", "mpt")])
@torch.no_grad()
def test_alti_logit_directions_give_the_logit_on_llama_like_blocks(family):
    """ALTI-Logit where its definition carries over (a sequential pre-LN block, the final norm frozen at its real
    scale; Gemma's gain 1 + weight; OLMo's LayerNorm without parameters centres): logit_c = <g, r_final> (+ <u, beta_f>
    under a LayerNorm with bias), and each layer's contributions sum to its attention
    update of the logit. A causal LM (Granite, OLMoE) explains a word's logit as the model scales it (Granite's
    1 / logits_scaling)."""
    from compute.methods.alti_logit import at

    model, ad, batch, cap = captured(family)
    m = get_method("alti_logit")
    e = cap.explain_pos
    for c in range(2):
        target = torch.full_like(cap.pred, c)
        g = m.directions(cap, ad, target)
        r = at(m._final_state(cap, ad), e)
        beta = getattr(ad.final_norm(), "bias", None)  # StarCoder2's LayerNorm: + <u, beta_f>
        head, scale = (model.score, 1.0) if ad.task == "classification" else \
            (model.get_output_embeddings(), ad.logit_scaling()[0])
        const = 0 if beta is None else scale * head.weight[c] @ beta
        torch.testing.assert_close((g[:, 0] * r).sum(-1) + const, cap.logits[:, c], rtol=1e-6, atol=1e-7)
        delta = m.layer_contributions(cap, ad, target)
        for l in range(ad.n_layers):
            p = layer_parts(cap, ad, l)
            update = at(cap.ln2_in[l], e) - at(cap.hidden_states[l], e) - p.b_O
            torch.testing.assert_close(delta[:, l].sum(-1), (g[:, l] * update).sum(-1), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("family", UNDESCRIBED)
@torch.no_grad()
def test_a_family_without_description_captures_the_models_own_record(family):
    """The generic capture of a family without a block description is what the model itself records: its layers'
    calls counted (ALBERT's one layer applied at every depth), hidden_states[0] the first layer's input (wider than the
    input embeddings in ALBERT and MobileBERT, with the positions in OPT), every attention."""
    task = family_heads(family)[0]  # float32: the MoE experts' grouped matmul has no float64 kernel
    model = family_model(family, task, layers=3, dtype=torch.float32)
    ad = adapter_for(model, task)
    batch = random_batch("bert", LENGTHS)
    cap = ad.capture(batch, frozenset({"hidden_states", "attentions"}))
    ref = model(**batch, output_hidden_states=True, output_attentions=True)
    assert ad.n_layers == 3 and len(cap.hidden_states) == 4 and len(cap.attentions) == 3
    for got, want in zip(cap.hidden_states + cap.attentions, ref.hidden_states + ref.attentions, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)  # Gemma 3's windowless pad rows


@pytest.mark.parametrize("family", ("mixtral", "qwen2"))
def test_integrated_gradients_on_a_mixture_of_experts_notes_the_routing(family):
    """A routed model's IG: the run's note (Method.run_notes) gives the median |ig_delta| / |F(x) - F(x')| once it
    exceeds 5% and names the routing; a dense model's run has none; the notes are taken once."""
    from compute.methods._internals import gradients as G

    model, ad, batch, cap = captured(family, lengths=[7, 3, 9, 5])
    m = get_method("ig_l2", steps=64)
    delta = m.compute(cap, ad, cap.pred).example_values["ig_delta"]
    gap = G.integrated_gradients(cap, ad, m.spec, cap.pred, steps=64, rule="gausslegendre", baseline="mask",
                                 memory_bytes=1 << 30)[2]
    median = float((delta.abs() / gap.abs()).quantile(0.5))
    notes = m.run_notes()
    assert ad.routed == (family == "mixtral")
    if family == "mixtral":
        assert median > 0.05 and len(notes) == 1, (median, notes)
        assert f"is {median:.1%} (over 5%)" in notes[0] and "routing switches along the path" in notes[0]
    else:
        assert notes == []
    assert m.run_notes() == []


def test_a_variant_outside_its_familys_description_runs_generically_or_is_refused_in_one_line():
    """Adapter.describes: OPT with post-LN layers (OPT-350m's) runs as an undescribed family; BLOOM whose residual is
    the norm's output (apply_residual_connection_post_layernorm) has no record of its modules to run generically and
    is refused in one line."""
    from transformers import BloomConfig, BloomForSequenceClassification, OPTConfig, OPTForSequenceClassification

    from compute.adapters.generic import GenericAdapter
    from compute.adapters.opt import OPTAdapter

    small = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, pad_token_id=0)
    opt = dict(small, ffn_dim=64, word_embed_proj_dim=32, max_position_embeddings=64)
    assert isinstance(adapter_for(OPTForSequenceClassification(OPTConfig(**opt))), OPTAdapter)
    post = OPTForSequenceClassification(OPTConfig(**opt, do_layer_norm_before=False))
    assert isinstance(adapter_for(post), GenericAdapter)
    bloom = BloomForSequenceClassification(BloomConfig(**small, apply_residual_connection_post_layernorm=True))
    with pytest.raises(AttrscopeError) as err:
        adapter_for(bloom)
    said = str(err.value)
    assert "\n" not in said and said.startswith("unsupported architecture 'bloom'"), said

