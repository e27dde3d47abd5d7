"""The pre-LN path (GPT-2; METHODS.md 1.1 pre-LN variant and section 9) on tiny random float64 models: the identity
sum_j T_i(x_j) + b_O = r_i, the explained position, ALTI / ALTI-l2 / N / N_RES / N_FIXEDRES against the naive
reference, one-line errors for the methods that are not defined there, and batch invariance."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import PRE_LN_ARCHS, alone_vs_batch_tol, assert_batch_invariant, random_batch, tiny_model

import reference as R
from compute.adapters import adapter_for
from compute.errors import AttrscopeError
from compute.methods import REGISTRY, get_method
from compute.methods._internals.decomposition import NEEDS, attention_vectors, layer_parts, operands

LENGTHS = [8, 3, 6, 1]
DEFINED = ["alti", "alti_l2", "norm_n", "norm_res", "norm_fixedres"]


@pytest.fixture(scope="module", params=PRE_LN_ARCHS)
def gpt2(request):
    """A tiny pre-LN decoder (GPT-2, or Llama with RMSNorm and grouped-query attention) and a padded batch."""
    model = tiny_model(request.param)
    ad = adapter_for(model)
    batch = random_batch(request.param, LENGTHS)
    with torch.no_grad():
        cap = ad.capture(batch, NEEDS)
    return model, ad, batch, cap


@torch.no_grad()
def test_pre_ln_identity_and_explained_position(gpt2):
    model, ad, batch, cap = gpt2
    assert ad.pre_ln
    assert cap.explain_pos.tolist() == [k - 1 for k in LENGTHS]  # the last real token, as HF's classifier pools
    # METHODS.md 11.9 for decoders: the head at the explained position of the last layer is the model's own logit.
    head = ad.head_per_token(cap.hidden_states[-1])
    torch.testing.assert_close(head[torch.arange(len(LENGTHS)), cap.explain_pos], cap.logits, rtol=0, atol=1e-12)
    for l in range(ad.n_layers):
        p = layer_parts(cap, ad, l)
        U, diag, _ = operands(p, "res")
        n = p.A.shape[-1]
        r = attention_vectors(p, slice(0, n), U, diag, None).sum(2) + p.b_O  # sum_j T_i(x_j) + b_O
        for b, k in enumerate(LENGTHS):
            torch.testing.assert_close(r[b, :k], p.t[b, :k], rtol=0, atol=1e-8)  # = the residual stream r_i


@torch.no_grad()
def test_pre_ln_methods_equal_the_reference(gpt2):
    model, ad, batch, cap = gpt2
    got = {name: get_method(name).compute(cap, ad, cap.pred) for name in DEFINED}
    tol = alone_vs_batch_tol(model.config.model_type, 1e-8, 1e-10)
    for b, k in enumerate(LENGTHS):
        _, att, hs = R.forward64(model, batch["input_ids"][b, :k].tolist())
        ref = R.gpt2_methods(model, hs, att, DEFINED, pos=k - 1)
        for name in DEFINED:
            final, views, mats = ref[name]
            res = got[name]
            np.testing.assert_allclose(res.matrices[b, :, :k, :k].numpy(), mats, **tol, err_msg=name)
            np.testing.assert_allclose(res.layer_scores[b, :, :k].numpy(), views, **tol, err_msg=name)
            np.testing.assert_allclose(res.scores[b, :k].numpy(), final, **tol, err_msg=name)
        C = got["alti"].matrices[b, :, :k, :k]
        assert torch.all(C.triu(1) == 0)  # causal attention: a token takes nothing from later tokens


@pytest.mark.parametrize("name,params", [("alti", {"ln2": True})])
def test_methods_undefined_on_pre_ln_fail_with_one_line(gpt2, name, params):
    model, ad, batch, cap = gpt2
    with pytest.raises(AttrscopeError) as err:
        get_method(name, **params).compute(cap, ad, cap.pred)
    msg = str(err.value)
    assert "\n" not in msg and ad.config.model_type in msg and "pre-LN" in msg


@pytest.mark.parametrize("arch", PRE_LN_ARCHS)
@pytest.mark.parametrize("name", [n for n, m in REGISTRY.items() if m.pre_ln_ok])
def test_pre_ln_example_alone_equals_example_in_padded_batch_float32(name, arch):
    assert_batch_invariant(arch, name, params={"baseline": "zero"} if name.startswith("ig_") else None)


def _gpt2_dir(path):
    """A saved tiny GPT-2 classifier with a byte-level BPE tokenizer trained offline on a few sentences."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2ForSequenceClassification, GPT2TokenizerFast

    from conftest import WORDS, tiny_config

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([" ".join(WORDS)] * 3, trainer)
    tok = GPT2TokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                            unk_token="<|endoftext|>")
    cfg = tiny_config("gpt2")
    cfg.vocab_size, cfg.pad_token_id = len(tok), None  # like released GPT-2: no pad token
    cfg.id2label, cfg.label2id = {0: "negative", 1: "positive"}, {"negative": 0, "positive": 1}
    torch.manual_seed(0)
    GPT2ForSequenceClassification(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_attr_compute_on_gpt2(tmp_path):
    """End to end: 'all' skips the undefined methods with a note; the last real token is explained; predictions are
    the model's own; naming an undefined method is a one-line error that writes nothing."""
    import json

    from click.testing import CliRunner
    from transformers import AutoModelForSequenceClassification

    from compute.cli import main
    from store import open_store

    model_dir = _gpt2_dir(tmp_path / "gpt2")
    data = tmp_path / "d.jsonl"
    texts = ["the movie was great", "boring and long", "i loved it not", "bad", "good acting but dull plot story"]
    data.write_text("".join(json.dumps({"text": t, "label": i % 2}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "g.h5"
    res = CliRunner().invoke(main, [str(data), "--model", str(model_dir), "-o", str(out), "--batch-size", "3",
                                    "--device", "cpu", "--matrices", "all", "--methods", "all"])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())  # the message may wrap
    skipped = said[said.index("--methods all: skipping"):said.index("not defined for the")]
    # the pre-LN forms (docs/methods.md 6) run
    assert not any(m in skipped for m in ("globenc", "norm_resln", "w_res", "value_zeroing", "decompx",
                                          "decompx_nohead"))
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with open_store(out) as s:
        assert len(s) == len(texts)
        assert {"alti", "globenc", "norm_resln", "w_res", "value_zeroing", "decompx",
                "decompx_nohead"} <= set(s.methods)
        for ex in s:
            assert ex.explain_pos == ex.n_tokens - 1
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ex.token_ids.tolist()])).logits[0]
            assert ex.pred == int(logits.argmax())
            assert ex.matrices("alti").shape == (3, ex.n_tokens, ex.n_tokens)
    bad = tmp_path / "bad.h5"
    res = CliRunner().invoke(main, [str(data), "--model", str(model_dir), "-o", str(bad), "--methods", "alti",
                                    "--alti-ln2"])
    assert res.exit_code == 1 and not bad.exists()
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "alti" in lines[0] and "pre-LN" in lines[0]


def test_attr_compute_on_llama(tmp_path):
    """End to end on a saved tiny Llama (grouped-query attention) with a BPE tokenizer and no pad token: every method
    defined on pre-LN runs, the last real token is explained, predictions are the model's own."""
    import json

    from click.testing import CliRunner
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, LlamaForSequenceClassification

    from compute.cli import main
    from conftest import tiny_config
    from store import open_store

    tok = AutoTokenizer.from_pretrained(_gpt2_dir(tmp_path / "gpt2"))
    cfg = tiny_config("llama")
    cfg.vocab_size, cfg.pad_token_id = len(tok), None
    cfg.id2label, cfg.label2id = {0: "negative", 1: "positive"}, {"negative": 0, "positive": 1}
    torch.manual_seed(0)
    model_dir = tmp_path / "llama"
    LlamaForSequenceClassification(cfg).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    data = tmp_path / "d.jsonl"
    texts = ["the movie was great", "boring and long", "bad", "good acting but dull plot story"]
    data.write_text("".join(json.dumps({"text": t, "label": i % 2}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "l.h5"
    res = CliRunner().invoke(main, [str(data), "--model", str(model_dir), "-o", str(out), "--batch-size", "3",
                                    "--device", "cpu", "--ig-steps", "4", "--ig-baseline", "zero", "--methods", "all"])
    assert res.exit_code == 0, res.output
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with open_store(out) as s:
        # every method with a pre-LN form, and the LRP family on its sequential decoder rules (docs/methods.md 8)
        lrp_family = {"lrp", "partial_lrp", "transatt", "mask_lrp"}
        assert set(s.methods) == {n for n, m in REGISTRY.items() if m.pre_ln_ok} | lrp_family
        for ex in s:
            assert ex.explain_pos == ex.n_tokens - 1
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ex.token_ids.tolist()])).logits[0]
            assert ex.pred == int(logits.argmax())
            np.testing.assert_allclose(ex.scores("alti").sum(), 1, rtol=1e-5)
