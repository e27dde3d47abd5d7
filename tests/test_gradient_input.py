"""--gradient-input (docs/methods.md, gradient section): the gradient methods differentiate at the embedding module's
output (the default) or at the token embeddings fed as inputs_embeds (inseq's and Captum's input), on tiny random
float64 models: the definition against autograd, where the two coincide (Llama: no position embedding; GPT-2's
plain gradient: position embeddings are added) and where they differ, IG's completeness and its [MASK] baseline."""

from __future__ import annotations

import pytest
import torch
from conftest import MASK_ID, TINY_LENGTHS
from conftest import captured_tiny as setup

from compute.errors import AttrscopeError
from compute.methods import get_method
from compute.methods._internals.gradients import Explained, integrated_gradients
from compute.run.plan import method_params
from compute.runner import RunConfig

TOKEN = {"gradient_input": "token-embedding"}
METHODS = ("grad_l2", "gxi_l2", "gxi_mean", "ig_l2", "ig_mean")


def scores(name, cap, ad, **params):
    if name.startswith("ig_"):
        params = {"baseline": "zero", "steps": 8, **params}
    return get_method(name, **params).compute(cap, ad, cap.pred).scores


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_token_embedding_mode_is_the_gradient_at_inputs_embeds(arch):
    """gxi_l2 = ||t * dF/dt|| with t = get_input_embeddings()(ids), F = model(inputs_embeds=t)'s target logit."""
    model, ad, batch, cap = setup(arch)
    got = scores("gxi_l2", cap, ad, **TOKEN)
    for b, n in enumerate(TINY_LENGTHS):
        ids = batch["input_ids"][b:b + 1, :n]
        t = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        y = model(inputs_embeds=t).logits[0, cap.pred[b]]
        (g,) = torch.autograd.grad(y, t)
        torch.testing.assert_close(got[b, :n], (t * g).norm(dim=-1)[0].detach(), rtol=1e-9, atol=1e-12)
        assert (got[b, n:] == 0).all()


def test_llama_modes_are_identical():
    """Llama's embedding module is its token embedding: both modes give the same scores for every method."""
    _, ad, _, cap = setup("llama")
    for name in METHODS:
        torch.testing.assert_close(scores(name, cap, ad, **TOKEN), scores(name, cap, ad), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_modes_differ_where_positions_are_added(arch):
    """GPT-2 adds position embeddings, BERT positions, types and a LayerNorm: gradient x input and IG differ; GPT-2's
    plain gradient is the same (d(t + p)/dt = 1), BERT's is not (the LayerNorm)."""
    _, ad, _, cap = setup(arch)
    for name in ("gxi_l2", "gxi_mean", "ig_l2", "ig_mean"):
        token, output = scores(name, cap, ad, **TOKEN), scores(name, cap, ad)
        assert (token - output).abs().max() > 1e-3 * output.abs().max(), name
    token, output = scores("grad_l2", cap, ad, **TOKEN), scores("grad_l2", cap, ad)
    if arch == "gpt2":
        torch.testing.assert_close(token, output, rtol=1e-12, atol=1e-14)
    else:
        assert (token - output).abs().max() > 1e-3 * output.abs().max()


@pytest.mark.parametrize("arch,baseline", [("bert", "mask"), ("bert", "zero"), ("gpt2", "zero")])
def test_ig_completeness_in_token_embedding_mode(arch, baseline):
    """sum IG = F(x) - F(x') within the quadrature error, shrinking with the steps, as in the default mode."""
    _, ad, _, cap = setup(arch)

    def delta(steps):
        r = get_method("ig_l2", steps=steps, baseline=baseline, **TOKEN).compute(cap, ad, cap.pred)
        return r.example_values["ig_delta"].abs().max().item()

    gl = [delta(s) for s in (2, 8, 32, 128)]
    assert all(b <= a or b < 1e-12 for a, b in zip(gl, gl[1:])) and gl[-1] < 1e-6, gl


def test_token_embedding_baselines():
    """zero: zero token embeddings (positions and types still added: F(x') is the model at inputs_embeds = 0);
    mask: [MASK]'s token embedding at every non-special token, i.e. the model on the [MASK]ed ids."""
    model, ad, batch, cap = setup("bert")
    spec = Explained(gradient_input="token-embedding")
    for baseline in ("zero", "mask"):
        _, _, gap = integrated_gradients(cap, ad, spec, cap.pred, steps=2, rule="gausslegendre", baseline=baseline,
                                         memory_bytes=1 << 30)
        for b, n in enumerate(TINY_LENGTHS):
            ids = batch["input_ids"][b:b + 1, :n]
            with torch.no_grad():
                f_x = model(input_ids=ids).logits[0, cap.pred[b]]
                if baseline == "zero":
                    d = model.get_input_embeddings().weight.shape[1]
                    f_0 = model(inputs_embeds=torch.zeros(1, n, d, dtype=torch.float64)).logits[0, cap.pred[b]]
                else:
                    masked = ids.clone()
                    masked[0, 1:n - 1] = MASK_ID  # [CLS] and [SEP] kept
                    f_0 = model(input_ids=masked).logits[0, cap.pred[b]]
            torch.testing.assert_close(gap[b], f_x - f_0, rtol=1e-9, atol=1e-12)


def test_the_option_is_a_method_parameter():
    """--gradient-input is recorded on the methods that read X (default embedding-output), not on the others; with
    a preset's double-embedding quirk it is refused in one line."""
    for name in METHODS:
        assert method_params(name, RunConfig())["gradient_input"] == "embedding-output"
        assert method_params(name, RunConfig(gradient_input="token-embedding"))["gradient_input"] == "token-embedding"
    assert "gradient_input" not in method_params("attcat", RunConfig(gradient_input="token-embedding"))
    with pytest.raises(AttrscopeError, match="drop one"):
        get_method("gxi_l2", double_embedding=True, **TOKEN)
