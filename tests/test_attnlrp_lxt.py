"""AttnLRP (`attnlrp`) against the peer, lxt 2.1, on the same tiny random checkpoints (issue 35): lxt's numbers were
made in lxt's own environment (transformers 4.x) by benchmarks/lxt_reference.py and committed as a fixture,
tests/fixtures/lxt/ (the checkpoints, and attnlrp_lxt.json with the versions and the command that made it).

First the checkpoints must load here (transformers 5) to the weights lxt ran: the model's logits at the explained
position equal the fixture's. Then attrscope's attnlrp, run as a run runs it (a right-padded batch of the fixture's
prompts, the explained position the last real token, the fixture's target and foil) equals lxt's relevance to 1e-5 of
its scale (max |ours - lxt| / max |lxt|, per example) in float64 and 1e-3 in float32: the scores and every layer
view (lxt's relevance at each layer's input)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "lxt"
FIXTURE = FIXTURES / "attnlrp_lxt.json"
DOC = json.loads(FIXTURE.read_text()) if FIXTURE.exists() else None
FAMILIES = list(DOC["models"]) if DOC else []
DTYPES = {"float64": torch.float64, "float32": torch.float32}
TOL = {"float64": 1e-5, "float32": 1e-3}  # of the scale
LOGIT_TOL = {"float64": 1e-12, "float32": 1e-5}  # transformers 5's kernels against 4.57's, relative
# inside a padded batch: Hugging Face computes RMSNorm, RoPE and the softmax in float32 even in a float64 model
BATCHED_TOL = {"float64": 1e-6, "float32": 1e-5}

pytestmark = [pytest.mark.skipif(DOC is None, reason=f"lxt's fixture {FIXTURE} is absent"),
              pytest.mark.usefixtures("one_thread")]


@functools.cache
def load(family: str, dtype: str):
    """The fixture's checkpoint with its task's head, a padded batch of its prompts and the task's rows."""
    import transformers

    from compute.adapters import adapter_for
    from compute.models import LoadedModel
    from compute.tasks import TaskRows, get_task

    m = DOC["models"][family]
    task = m["task"]
    cls = transformers.AutoModelForSequenceClassification if task == "classification" else \
        transformers.AutoModelForCausalLM
    model = cls.from_pretrained(FIXTURES / family, dtype=DTYPES[dtype], attn_implementation="eager").eval()
    lm = LoadedModel(model=model, tokenizer=None, adapter=adapter_for(model, task), task=get_task(task),
                     info={"model_type": model.config.model_type})
    lengths = [len(p) for p in m["prompts"]]
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)  # pad id 0
    mask = torch.zeros_like(ids)
    for b, p in enumerate(m["prompts"]):
        ids[b, :len(p)], mask[b, :len(p)] = torch.tensor(p), 1
    rows = TaskRows.plain(m["target"] if task == "classification" else [-1] * len(lengths))
    if task != "classification":
        rows.position = [k - 1 for k in lengths]  # the last real token
        rows.target_token = list(m["target"])
    return m, lm, {"input_ids": ids, "attention_mask": mask}, rows, lengths


def relative(got, want) -> float:
    want = torch.as_tensor(want, dtype=torch.float64)
    return float((torch.as_tensor(got, dtype=torch.float64) - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("family", FAMILIES)
def test_the_checkpoints_load_to_the_weights_lxt_ran(family, dtype):
    """Each prompt alone and inside the padded batch: the explained position's logits are lxt's (a checkpoint that
    loads differently here, e.g. Mixtral's experts, which transformers 5 stores fused, fails here first)."""
    m, lm, batch, rows, lengths = load(family, dtype)
    with torch.no_grad():
        batched = lm.model(**batch).logits
        for b, (p, k) in enumerate(zip(m["prompts"], lengths)):
            alone = lm.model(input_ids=torch.tensor([p])).logits
            alone, batched_ = (alone[0, -1], batched[b, k - 1]) if alone.dim() == 3 else (alone[0], batched[b])
            assert relative(alone, m[dtype]["logits"][b]) <= LOGIT_TOL[dtype], (family, dtype, b)
            assert relative(batched_, m[dtype]["logits"][b]) <= BATCHED_TOL[dtype], (family, dtype, b, "batched")
    assert [max(range(len(r)), key=r.__getitem__) for r in m["float64"]["logits"]] == m["target"]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("family", FAMILIES)
def test_attnlrp_equals_lxt(family, dtype):
    from compute.methods import REGISTRY, get_method
    from compute.run.dispatch import Timings, run_batch

    if "attnlrp" not in REGISTRY:
        pytest.skip("method 'attnlrp' is not registered")
    m, lm, batch, rows, lengths = load(family, dtype)
    target_mode = "label" if m["task"] == "classification" else "predicted"
    # lxt explains inputs_embeds, attnlrp the embedding module's output (layer 1's input): the same tensor for the
    # rotary decoders; BERT's is after its position embeddings and LayerNorm. The fixture has lxt's relevance at every
    # layer's input (activation x grad), which attnlrp's layer views are.
    cases = [("", rows)]
    if m["task"] != "classification":  # a foil: the target's logit less the foil's
        contrast = rows.take(list(range(len(lengths))))
        contrast.foil_token = list(m["foil"])
        cases.append(("_contrast", contrast))
    for suffix, rows_ in cases:
        out = run_batch(lm, {"attnlrp": get_method("attnlrp")}, batch, rows_, target_mode, 2, "none", Timings())
        scores = torch.as_tensor(out.results["attnlrp"]["scores"])
        views = torch.as_tensor(out.results["attnlrp"]["layer_scores"])  # [B, L, n]
        torch.testing.assert_close(torch.as_tensor(out.outcome.output, dtype=torch.float64),
                                   torch.tensor(m[dtype]["output" + suffix], dtype=torch.float64),
                                   rtol=1e-6, atol=1e-6)
        for b, k in enumerate(lengths):
            want = m[dtype]["relevance" + suffix + "_layers"][b]  # [L][k]
            err = relative(scores[b, :k], want[0])
            assert err <= TOL[dtype], f"{family} {dtype}{suffix} example {b}: {err:.2e} of the scale"
            err = relative(views[b, :, :k], want)
            assert err <= TOL[dtype], f"{family} {dtype}{suffix} example {b}, layer views: {err:.2e} of the scale"
            assert not scores[b, k:].any() and not views[b, :, k:].any()  # padding
