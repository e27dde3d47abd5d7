"""Integrated gradients of a generation's steps runs its forward in segments of columns (gradients.StepForward):
the prompt up to the earliest step's position, then the later step positions in a few segments through the model's
key-value cache, so that step t's backward walks only the segments up to its position. The results are the whole
forward's, to 1e-10 of scale in float64, on tiny Llama and GPT-2, right-padded as the runner pads the attribution
pass, with examples of different step counts and one that stopped at EOS before its first step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compute.methods._internals import gradients
from test_generate_steps import STEPS, generations, loaded, steps_run

METHODS = ["grad_l2", "gxi_l2", "gxi_mean", "ig_l2", "ig_mean"]


def whole(monkeypatch):
    """The forward over every column at once (no segments), as before the segments."""
    monkeypatch.setattr(gradients, "segment_bounds", lambda outputs: None)


def float64_run(lm, prompts, made, contrast, monkeypatch) -> tuple[list, object]:
    """The float64 tensors the input gradients and the integration return (before the store's float32), and the
    run's results."""
    kept = []
    for name in ("input_gradients", "integrated_gradients"):
        real = getattr(gradients, name)

        def spy(*a, _real=real, **k):
            out = _real(*a, **k)
            kept.extend([out.X, out.grads["X"]] if isinstance(out, gradients.InputGradients) else out)
            return out

        monkeypatch.setattr(gradients, name, spy)
    _, got = steps_run(lm, METHODS, prompts, made, None, contrast)
    return kept, got


def float64_softmax(monkeypatch):
    """Llama's eager attention takes its softmax in float32 whatever the model's dtype, and float32's exp rounds a
    row differently by its length (a segment's rows see fewer keys than the whole forward's: 1e-7 apart in a float64
    model, as a plain forward through the cache is from one forward): in float64 here, for both runs below."""
    real = torch.nn.functional.softmax

    def softmax(x, dim=None, _stacklevel=3, dtype=None):
        return real(x, dim=dim, dtype=None if x.dtype == torch.float64 else dtype)

    monkeypatch.setattr(torch.nn.functional, "softmax", softmax)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("contrast", [None, "top2"])
def test_the_segmented_forward_gives_the_whole_forwards_attributions(arch, contrast, monkeypatch):
    lm = loaded(arch)
    float64_softmax(monkeypatch)
    assert next(lm.model.parameters()).dtype == torch.float64
    prompts, made, _ = generations()
    assert 0 in STEPS and len(set(STEPS)) > 2  # an example stopped at EOS first, others after 1..4 steps
    with monkeypatch.context() as m:
        cut_tensors, cut = float64_run(lm, prompts, made, contrast, m)
    with monkeypatch.context() as m:
        whole(m)
        ref_tensors, ref = float64_run(lm, prompts, made, contrast, m)
    # X, dF/dX of every step row [R, n, d]; IG's attribution [R, n, d], delta and F(X) - F(X') [R]
    assert [t.shape for t in cut_tensors] == [t.shape for t in ref_tensors] and len(cut_tensors) == 5
    for i, (h, w) in enumerate(zip(cut_tensors, ref_tensors)):
        assert h.dtype == torch.float64 and h.shape[0] == sum(STEPS)
        torch.testing.assert_close(h, w, rtol=0, atol=1e-10 * float(w.abs().max()), msg=f"{arch} tensor {i}")
    for name in METHODS:  # and what the store keeps of them
        for key, want in ref.results[name].items():
            have = cut.results[name][key]
            assert len(have) == len(want) == sum(STEPS)
            for r, (w, h) in enumerate(zip(want, have)):
                np.testing.assert_allclose(h, w, rtol=1e-6, atol=1e-7 * max(float(np.abs(w).max()), 1e-30),
                                           err_msg=f"{arch} {name} {key} step row {r}")
        for key, want in ref.values[name].items():
            np.testing.assert_allclose(cut.values[name][key], want, rtol=1e-6, atol=1e-9, err_msg=f"{name} {key}")


def test_each_steps_backward_walks_only_the_segments_up_to_its_position():
    """ig_l2 (4 steps, one pass of the 72 path rows) on the 12 generations (prompts of 1..10 tokens, up to 4
    steps): the forward's column ranges are the bounds (the prompt to the earliest step's last position, then the
    later needs), and the backward of step index k reaches the head through the segments up to its furthest
    position only."""
    lm = loaded("llama")
    prompts, made, _ = generations()
    # step index k's furthest explained position + 1 over the examples that have step k
    need = [max(len(p) + k for p, g in zip(prompts, made) if len(g) > k) for k in range(max(STEPS))]
    n = max(len(p) + len(g) for p, g in zip(prompts, made))
    widths, seen = [], []
    head = lm.model.get_output_embeddings()
    h1 = lm.model.register_forward_pre_hook(
        lambda _m, args, kwargs: widths.append(int(kwargs["input_ids"].shape[1])), with_kwargs=True)
    h2 = head.register_full_backward_hook(lambda _m, _gi, go: seen.append(int(go[0].shape[1])))
    try:
        steps_run(lm, ["ig_l2"], prompts, made, None, None)
    finally:
        h1.remove(), h2.remove()
    cuts = sorted(set(need))
    bounds = gradients.cut_columns(cuts)
    assert bounds[0] == min(need) and bounds[-1] == max(need) < n  # the last token and the right pads: not run
    # the capture's pass and the embedding outputs' (the data's, the [MASK] baseline's) over every column, then the
    # path's segments
    assert widths == [n, n, n] + np.diff([0] + bounds).tolist()
    # per backward, the columns of the segments it walks: those up to the segment holding its furthest position
    assert sorted(seen) == sorted(w for k in need for w in np.diff([0] + bounds)[:np.searchsorted(bounds, k) + 1])
    assert sum(seen) < len(need) * n
