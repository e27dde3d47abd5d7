"""Each method declares the passes it reads (Method.passes); the shared gradient pass records the LRP tensors (every
Linear's input and output) only when a method of the batch declares "lrp" (issue 15). Tiny models from conftest."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from compute.methods import REGISTRY, get_method
from compute.methods._internals.base import PASSES
from compute.methods._internals.gradients import GradientMethod, IntegratedGradientsMethod, spec_from
from compute.methods._internals.relevance import RelevanceMethod

from conftest import captured_tiny

GRADIENT_ONLY = ("grad_l2", "gxi_l2", "attcat")


def union(names) -> frozenset[str]:
    return frozenset().union(*(REGISTRY[n].passes for n in names))


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_method_declares_its_passes(name):
    cls = REGISTRY[name]
    assert "forward" in cls.passes and cls.passes <= PASSES, cls.passes
    assert ("lrp" in cls.passes) == issubclass(cls, RelevanceMethod)
    gradient = issubclass(cls, (GradientMethod, IntegratedGradientsMethod)) or name in ("transatt", "mask_lrp")
    assert ("backward" in cls.passes) == gradient


def run_methods(cap, ad, names, passes):
    cap = replace(cap, memo={}, passes=passes)
    target = torch.tensor([0, 2, 1, 0])
    with torch.no_grad():
        return cap, {n: get_method(n).compute(cap, ad, target) for n in names}


def passes_of(cap) -> list:
    return [v for k, v in cap.memo.items() if isinstance(k, tuple) and k[0] == "gradient_pass"]


def test_a_gradient_only_batch_records_no_lrp_tensors_and_scores_are_unchanged():
    _, ad, _, cap = captured_tiny("bert")
    lean, lean_res = run_methods(cap, ad, GRADIENT_ONLY, union(GRADIENT_ONLY))
    full, full_res = run_methods(cap, ad, GRADIENT_ONLY, None)  # undeclared: records as before
    (gp_lean,), (gp_full,) = passes_of(lean), passes_of(full)
    assert gp_lean.lrp is None and not gp_lean.records_lrp
    assert gp_full.lrp is not None and len(gp_full.lrp.layers) == ad.n_layers
    for n in GRADIENT_ONLY:
        assert torch.equal(lean_res[n].scores, full_res[n].scores), n
    assert torch.equal(lean_res["attcat"].layer_scores, full_res["attcat"].layer_scores)


def test_a_batch_with_an_lrp_method_records_them_once():
    _, ad, _, cap = captured_tiny("bert")
    names = ("grad_l2", "lrp", "transatt")
    declared, res = run_methods(cap, ad, names, union(names))
    lrp_spec = spec_from(get_method("lrp").params)
    gp = declared.memo[("gradient_pass", lrp_spec)]
    assert gp.lrp is not None and gp.records_lrp
    undeclared, ref = run_methods(cap, ad, names, None)
    for n in names:
        assert torch.equal(res[n].scores, ref[n].scores), n


def test_an_lrp_method_in_a_batch_that_declared_none_still_gets_its_tensors():
    """A caller that declared a gradient-only batch and runs lrp anyway: the pass is run again with the record."""
    _, ad, _, cap = captured_tiny("bert")
    names = ("transatt",)
    cap_lean, res = run_methods(cap, ad, names, frozenset({"forward", "backward"}))
    _, ref = run_methods(cap, ad, names, None)
    assert all(gp.lrp is not None for gp in passes_of(cap_lean))
    assert torch.equal(res["transatt"].scores, ref["transatt"].scores)


def test_the_runner_declares_the_batch_passes(tiny_model_dirs, tmp_path, monkeypatch):
    """End to end: a gradient-only run never records LRP tensors, a run with lrp does (the runner sets cap.passes)."""
    import compute.methods._internals.gradients as G
    from compute.runner import RunConfig, run

    recorded = []
    init = G.GradientPass.__init__

    def spy(self, cap, adapter, spec, record_lrp=True):
        recorded.append(record_lrp)
        init(self, cap, adapter, spec, record_lrp)

    monkeypatch.setattr(G.GradientPass, "__init__", spy)
    data = tmp_path / "rows.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"the movie was {w} film\t{i % 2}\n"
                                                 for i, w in enumerate(("great", "dull", "fun", "slow", "good"))))
    common = dict(dataset=str(data), model=str(tiny_model_dirs["bert"]), device="cpu", batch_size=2)
    run(RunConfig(methods=",".join(GRADIENT_ONLY), output=str(tmp_path / "grad.h5"), **common))
    assert recorded and not any(recorded), recorded
    recorded.clear()
    run(RunConfig(methods="grad_l2,lrp", output=str(tmp_path / "lrp.h5"), **common))
    assert recorded and all(recorded), recorded
