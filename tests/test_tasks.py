"""The tasks beyond classification (compute.tasks) on tiny random models in float64: the explained output and its
identities (LogAt at the explained position is the model's own logit, METHODS.md 11.9; a contrast is the difference
of two single-target runs for the methods linear in F; qa maps are start map + end map), padding independence,
the methods' task restrictions, detection of the task from a head."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compute.adapters import adapter_for
from compute.errors import AttrscopeError
from compute.methods import REGISTRY, get_method
from compute.models import LoadedModel
from compute.run.dispatch import Timings, explaining, run_batch
from compute.tasks import TASKS, TaskRows, detect_task, get_task
from compute.tasks.qa import MAX_ANSWER_TOKENS, best_spans
from compute.tasks.word_targets import word_token
from conftest import MASK_ID, random_batch, tiny_task_model

LENGTHS = [7, 4, 9]
LM_CASES = [("bert", "masked-token"), ("roberta", "masked-token"), ("distilbert", "masked-token"),
            ("electra", "masked-token"), ("gpt2", "next-token"), ("llama", "next-token")]


def loaded(arch: str, task: str, seed: int = 0) -> LoadedModel:
    model = tiny_task_model(arch, task, seed=seed)
    ad = adapter_for(model, task)
    ad.mask_token_id = MASK_ID
    return LoadedModel(model=model, tokenizer=None, adapter=ad, task=get_task(task), info={"model_type": arch})


def lm_rows(task: str, foils: bool = True) -> TaskRows:
    rows = TaskRows.plain([-1] * len(LENGTHS))
    rows.position = [2, 1, 5] if task == "masked-token" else [k - 1 for k in LENGTHS]
    rows.target_token = [10, -1, 11]  # the second example explains the model's own top word
    rows.foil_token = [12, -1, 13] if foils else [-1, -1, -1]
    return rows


def defined(task: str, adapter) -> list[str]:
    out = []
    for name in REGISTRY:
        m = get_method(name)
        try:
            m.check_task(task)
            m.check_architecture(adapter)
        except AttrscopeError:
            continue
        if name != "mask_lrp":  # needs head statistics of a dataset (tested in test_head_stats)
            out.append(name)
    return out


def run(lm, names, batch, rows, **params):
    methods = {n: get_method(n, **params.get(n, {})) for n in names}
    return run_batch(lm, methods, batch, rows, "predicted", 2, "all", Timings())


def model_logits(lm, batch) -> torch.Tensor:
    with torch.no_grad():
        return lm.model(**batch).logits


# ------------------------------------------------------------------------------------------------ language models
@pytest.mark.parametrize("arch,task", LM_CASES)
def test_logat_at_the_explained_position_is_the_models_logit(arch, task):
    """METHODS.md 11.9 for word targets: LogAt (last layer) at the explained position = the model's own logit of the
    target less the foil's; the stored output is the same number; the probabilities are the model's softmax."""
    lm = loaded(arch, task)
    batch = random_batch(arch, LENGTHS)
    rows = lm_rows(task)
    if task == "masked-token":
        for b, p in enumerate(rows.position):
            batch["input_ids"][b, p] = MASK_ID
    out = run(lm, ["logat", "normxlogit"], batch, rows)
    logits = model_logits(lm, batch)
    b = torch.arange(len(LENGTHS))
    pos = torch.as_tensor(rows.position)
    at = logits[b, pos]  # [B, V]
    top = at.argmax(-1)
    target = torch.where(torch.as_tensor(rows.target_token) >= 0, torch.as_tensor(rows.target_token), top)
    foil = torch.as_tensor(rows.foil_token)
    want = at[b, target] - torch.where(foil >= 0, at[b, foil.clamp_min(0)], torch.zeros(3, dtype=at.dtype))
    got = torch.as_tensor(out.results["logat"]["scores"])[b, pos]
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)  # stored as float32
    o = out.outcome
    assert o.target_token.tolist() == target.tolist() and o.foil_token.tolist() == foil.tolist()
    assert o.pred.tolist() == top.tolist() and o.explain_pos.tolist() == rows.position
    torch.testing.assert_close(torch.as_tensor(o.output).double(), want, rtol=1e-6, atol=1e-6)
    probs = torch.softmax(at, -1)
    torch.testing.assert_close(torch.as_tensor(o.probs[:, 0]).double(), probs[b, target], rtol=1e-5, atol=1e-7)
    assert torch.isnan(torch.as_tensor(o.probs[1, 1]))  # no foil
    torch.testing.assert_close(float(o.probs[0, 1]), float(probs[0, 12]), rtol=1e-5, atol=1e-7)
    assert o.span_end.tolist() == [-1] * 3 and o.pred_end.tolist() == [-1] * 3
    assert o.target.tolist() == [0, 0, 0]  # the probs column the explained output reads
    # normxlogit = embedding norm x logat
    norm = run(lm, ["norm"], batch, rows).results["norm"]["scores"]
    torch.testing.assert_close(torch.as_tensor(out.results["normxlogit"]["scores"]),
                               torch.as_tensor(norm * out.results["logat"]["scores"]), rtol=1e-5, atol=1e-6)


LINEAR_IN_F = ["logat", "cat", "attcat"]  # signed sums of gradient x state terms, or a logit


@pytest.mark.parametrize("arch,task", [("bert", "masked-token"), ("gpt2", "next-token"), ("llama", "next-token")])
def test_contrast_is_the_difference_of_two_single_target_runs(arch, task):
    """For the methods linear in the explained output F, explaining logit(t) - logit(f) equals explaining t minus
    explaining f (issue 17's identity)."""
    lm = loaded(arch, task)
    batch = random_batch(arch, LENGTHS)
    both = lm_rows(task)
    both.target_token = [10, 20, 11]
    only_t = lm_rows(task, foils=False)
    only_t.target_token = both.target_token
    only_f = lm_rows(task, foils=False)
    only_f.target_token = both.foil_token[:1] + [21] + both.foil_token[2:]
    both.foil_token = only_f.target_token
    r_both, r_t, r_f = (run(lm, LINEAR_IN_F, batch, r).results for r in (both, only_t, only_f))
    for name in LINEAR_IN_F:
        for key in r_both[name]:
            if key == "matrices" and name != "grads":
                continue
            torch.testing.assert_close(torch.as_tensor(r_both[name][key]),
                                       torch.as_tensor(r_t[name][key] - r_f[name][key]), rtol=1e-4, atol=1e-5,
                                       msg=f"{name} {key}")


@pytest.mark.parametrize("arch,task", LM_CASES + [("bert", "qa"), ("gpt2", "qa"), ("bert", "regression"),
                                                 ("llama", "regression")])
def test_every_defined_method_runs_and_does_not_depend_on_the_batch(arch, task):
    """Every method defined for the task runs, its arrays stay aligned with the tokens (zero on padding), and each
    example alone gives what it gives inside the padded batch."""
    lm = loaded(arch, task)
    batch = random_batch(arch, LENGTHS)
    rows = lm_rows(task) if task in ("masked-token", "next-token") else TaskRows.plain([-1] * 3)
    if task == "qa":
        rows.context = [(3, 5), (2, 2), (4, 7)]
    names = defined(task, lm.adapter)
    assert len(names) >= 15, names
    if task in ("masked-token", "qa") and arch != "gpt2":
        assert {"lrp", "partial_lrp", "transatt"} <= set(names)  # the LRP rules start at these heads too
    params = {n: {"steps": 4} for n in ("ig_l2", "ig_mean")}
    full = run(lm, names, batch, rows, **params)
    for b, k in enumerate(LENGTHS):
        one = {key: v[b:b + 1, :k] for key, v in batch.items()}
        alone = run(lm, names, one, rows.take([b]), **params)
        for name in names:
            s = full.results[name]["scores"][b]
            assert (s[k:] == 0).all(), name
            tol = dict(rtol=2e-4, atol=2e-5) if arch == "llama" else dict(rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(torch.as_tensor(alone.results[name]["scores"][0]),
                                       torch.as_tensor(s[:k]), msg=f"{name} example {b}", **tol)
        for field in ("pred", "target_token", "foil_token", "explain_pos", "span_end", "pred_end"):
            assert getattr(alone.outcome, field)[0] == getattr(full.outcome, field)[b], field
        torch.testing.assert_close(torch.as_tensor(alone.outcome.output[0]), torch.as_tensor(full.outcome.output[b]),
                                   rtol=1e-5, atol=1e-6)


# every method is defined for next-token (the LRP family included: tests/test_method_lrp_decoder.py)
@pytest.mark.parametrize("task,undefined", [("masked-token", ("decompx", "decompx_nohead")),
                                            ("qa", ("decompx", "alti_logit", "logat"))])
def test_methods_not_defined_for_a_task_fail_in_one_line_naming_the_defined_ones(task, undefined):
    for name in undefined:
        with pytest.raises(AttrscopeError) as err:
            get_method(name).check_task(task)
        msg = str(err.value)
        assert "\n" not in msg and f"--task {task}" in msg and "alti" in msg.split("are ")[1]
        assert name not in msg.split("are ")[1].split(", ")


# --------------------------------------------------------------------------------------------------------------- qa
def test_qa_maps_are_start_map_plus_end_map():
    """Each method runs once per explained output: the stored map is the start part's plus the end part's, computed
    here one part at a time; class-independent rows are the start row plus the end row; the span is the best valid
    one; probabilities are softmaxes over the real tokens."""
    lm = loaded("bert", "qa")
    batch = random_batch("bert", LENGTHS)
    rows = TaskRows.plain([-1] * 3)
    rows.context = [(3, 5), (2, 2), (4, 7)]
    names = ["gxi_mean", "attcat", "alti", "rollout"]
    out = run(lm, names, batch, rows)
    with torch.no_grad():
        cap = lm.adapter.capture(batch, frozenset().union(*(get_method(n).needs for n in names)))
        res = lm.model(**batch)
    parts = lm.task.parts(cap, rows, "predicted")
    s, e = parts[0].target, parts[1].target
    start, end = res.start_logits, res.end_logits
    for b, (c0, c1) in enumerate(rows.context):
        best = max(((i, j) for i in range(c0, c1 + 1) for j in range(i, min(c1, i + MAX_ANSWER_TOKENS - 1) + 1)),
                   key=lambda ij: float(start[b, ij[0]] + end[b, ij[1]]))
        assert (int(s[b]), int(e[b])) == best
    assert out.outcome.explain_pos.tolist() == s.tolist() and out.outcome.span_end.tolist() == e.tolist()
    assert out.outcome.pred.tolist() == s.tolist() and out.outcome.pred_end.tolist() == e.tolist()
    b = torch.arange(3)
    torch.testing.assert_close(torch.as_tensor(out.outcome.output).double(), start[b, s] + end[b, e], rtol=1e-6,
                               atol=1e-6)
    real = batch["attention_mask"].bool()
    p_start = torch.softmax(start.masked_fill(~real, float("-inf")), -1)[b, s]
    torch.testing.assert_close(torch.as_tensor(out.outcome.probs[:, 0]).double(), p_start, rtol=1e-5, atol=1e-7)
    for name in names:
        m = get_method(name)
        maps = []
        for part in parts:
            pcap = explaining(lm.adapter.capture(batch, m.needs) if m.needs else cap_copy(lm, batch), part, True)
            with torch.no_grad():
                maps.append(m.compute(pcap, lm.adapter, part.target).scores)
        torch.testing.assert_close(torch.as_tensor(out.results[name]["scores"]), (maps[0] + maps[1]).float(),
                                   rtol=1e-5, atol=1e-6, msg=name)


def cap_copy(lm, batch):
    with torch.no_grad():
        return lm.adapter.capture(batch, frozenset())


def test_best_spans_respects_the_context_and_the_length_limit():
    n = 40
    start = torch.zeros(1, n, dtype=torch.float64)
    end = torch.zeros(1, n, dtype=torch.float64)
    start[0, 2], end[0, 1] = 9.0, 9.0  # outside the context / end before start
    start[0, 5], end[0, 5 + MAX_ANSWER_TOKENS] = 5.0, 5.0  # too long
    start[0, 6], end[0, 8] = 1.0, 1.0
    # (2, 1): outside and reversed; (5, 5 + MAX): 10 but too long; (5, 8) = 6 beats (6, 8) = 2
    assert best_spans(start, end, [(4, 39)]).tolist() == [[5, 8]]
    assert best_spans(start, end, [(6, 39)]).tolist() == [[6, 5 + MAX_ANSWER_TOKENS]]  # 6 + 5: the longest allowed


# ------------------------------------------------------------------------------------------------------- regression
def test_regression_logat_is_the_distance_to_the_prediction_ranked_by_the_option():
    lm = loaded("bert", "regression")
    batch = random_batch("bert", LENGTHS)
    rows = TaskRows.plain([-1] * 3)
    asc = run(lm, ["logat", "normxlogit"], batch, rows)
    desc = run(lm, ["logat", "normxlogit"], batch, rows,
               logat={"regression_rank": "descending"}, normxlogit={"regression_rank": "descending"})
    with torch.no_grad():
        value = lm.model(**batch).logits[:, 0]
        hs = lm.model(**batch, output_hidden_states=True).hidden_states[-1]
        g = lm.adapter.head_per_token(hs)[..., 0]  # [B, n]
    want = -(g - g[:, :1]).abs() * batch["attention_mask"]
    torch.testing.assert_close(torch.as_tensor(asc.results["logat"]["scores"]).double(), want, rtol=1e-5, atol=1e-6)
    assert (asc.results["logat"]["scores"][:, 0] == 0).all()  # the explained token is at distance 0
    for name in ("logat", "normxlogit"):
        torch.testing.assert_close(torch.as_tensor(desc.results[name]["scores"]),
                                   -torch.as_tensor(asc.results[name]["scores"]))
    o = asc.outcome
    torch.testing.assert_close(torch.as_tensor(o.output).double(), value, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(torch.as_tensor(o.probs[:, 0]).double(), value, rtol=1e-6, atol=1e-6)
    assert o.pred.tolist() == [0, 0, 0] and o.target.tolist() == [0, 0, 0]


def test_regression_gradients_explain_the_value_even_with_the_prob_output():
    """A one-output head has no softmax: gradient methods with output=prob (the ALTI preset) explain the value."""
    lm = loaded("bert", "regression")
    batch = random_batch("bert", LENGTHS)
    rows = TaskRows.plain([-1] * 3)
    a = run(lm, ["gxi_mean"], batch, rows).results["gxi_mean"]["scores"]
    b = run(lm, ["gxi_mean"], batch, rows, gxi_mean={"output": "prob"}).results["gxi_mean"]["scores"]
    assert abs(a).max() > 1e-6
    torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b))


# -------------------------------------------------------------------------------------------------------- detection
@pytest.mark.parametrize("archs,num_labels,want", [
    (["BertForSequenceClassification"], 2, "classification"), (["BertForSequenceClassification"], 1, "regression"),
    (["RobertaForMaskedLM"], 2, "masked-token"), (["GPT2LMHeadModel"], 2, "next-token"),
    (["LlamaForCausalLM"], 2, "next-token"), (["DistilBertForQuestionAnswering"], 2, "qa")])
def test_the_task_is_detected_from_the_head(archs, num_labels, want):
    from transformers import BertConfig

    cfg = BertConfig(num_labels=num_labels)
    cfg.architectures = archs
    assert detect_task(cfg) == want


@pytest.mark.parametrize("archs", [None, ["BertForPreTraining"], ["BertForMaskedLM", "BertForQuestionAnswering"]])
def test_an_unknown_head_asks_for_task(archs):
    from transformers import BertConfig

    cfg = BertConfig()
    cfg.architectures = archs
    with pytest.raises(AttrscopeError, match="pass --task") as err:
        detect_task(cfg)
    assert "\n" not in str(err.value)


def test_a_model_of_another_head_is_refused_in_one_line():
    model = tiny_task_model("bert", "masked-token")
    with pytest.raises(AttrscopeError, match="--task qa needs a \\*ForQuestionAnswering model, not BertForMaskedLM"):
        adapter_for(model, "qa")
    with pytest.raises(AttrscopeError, match="one output"):
        TASKS["regression"]().check_model(tiny_task_model("bert", "classification"))


def test_word_targets_must_be_one_token():
    from transformers import BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "is", "are", "walk", "##ing"]
    tok = BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)})
    assert word_token(tok, "is", "x") == 5 and word_token(tok, " are ", "x") == 6
    with pytest.raises(AttrscopeError, match="example 'e1': the word 'walking' is 2 tokens .*walk ##ing"):
        word_token(tok, "walking", "example 'e1'")


@pytest.mark.parametrize("arch,task", [("bert", "masked-token"), ("roberta", "masked-token"),
                                       ("distilbert", "masked-token"), ("electra", "masked-token"),
                                       ("bert", "qa"), ("distilbert", "qa")])
def test_lrp_relevance_starts_at_the_task_head_and_is_conserved(arch, task):
    """METHODS.md 11.7 for the masked-LM and QA heads: one unit of relevance at the explained output (the target
    word's logit; the start channel at the answer's start) reaches the input, about conserved; a foil starts -1 more,
    so a contrast starts with a total of 0 (the add rule rescales by absolute sums: not linear in the start)."""
    from compute.methods._internals.gradients import Explained, gradient_pass
    from compute.methods._internals.relevance import propagate

    lm = loaded(arch, task)
    batch = random_batch(arch, [9, 9])
    batch["attention_mask"][:] = 1  # no padding: conservation is stated without it
    rows = TaskRows.plain([-1, -1])
    if task == "qa":
        rows.context = [(3, 7), (2, 6)]
    else:
        rows.position, rows.target_token, rows.foil_token = [3, 5], [10, 11], [12, 13]
    with torch.no_grad():
        cap = lm.adapter.capture(batch, frozenset())
    parts = lm.task.parts(cap, rows, "predicted")
    pcap = explaining(cap, parts[0], True)
    gp = gradient_pass(pcap, lm.adapter, Explained(dtype="float64"), lrp=True)
    channel = 0 if task == "qa" else None
    with torch.no_grad():
        rel = propagate(gp, parts[0].target, pcap.explain_pos, channel=channel)
        total = rel.input.sum((1, 2))
        assert torch.allclose(total, torch.ones_like(total), atol=0.1), total
        if task == "masked-token":
            contrast = propagate(gp, parts[0].target, pcap.explain_pos, foil=parts[0].foil).input
            assert torch.allclose(contrast.sum((1, 2)), torch.zeros(2, dtype=contrast.dtype), atol=0.2)


@pytest.mark.parametrize("arch,task", [("bert", "masked-token"), ("gpt2", "next-token"), ("bert", "qa")])
def test_alti_explains_the_explained_row_and_ig_is_complete_for_the_contrast(arch, task):
    """ALTI's final map is a distribution over the tokens at each explained position (qa: two of them, summing to
    2); integrated gradients of the contrast (or the qa sum) is complete: sum IG = F(x) - F(baseline) up to the
    quadrature error (the stored ig_delta)."""
    lm = loaded(arch, task)
    batch = random_batch(arch, LENGTHS)
    rows = lm_rows(task) if task != "qa" else TaskRows.plain([-1] * 3)
    if task == "qa":
        rows.context = [(3, 5), (2, 2), (4, 7)]
    out = run(lm, ["alti", "ig_mean"], batch, rows, ig_mean={"steps": 64, "baseline": "zero"})
    parts = 2 if task == "qa" else 1
    sums = out.results["alti"]["scores"].sum(-1)
    np.testing.assert_allclose(sums, parts, rtol=1e-5)
    delta = out.values["ig_mean"]["ig_delta"]
    assert np.abs(delta).max() < 1e-3 * max(1.0, float(np.abs(out.outcome.output).max())), delta


@pytest.mark.parametrize("arch,task", LM_CASES)
@torch.no_grad()
def test_alti_logit_of_a_word_contrast(arch, task):
    """ALTI-Logit for word targets (issue 18): each layer's contributions sum to that layer's attention update of
    the explained logit difference; on decoders the direction reproduces the model's own logit(target) -
    logit(foil) from the final residual stream (the paper's setting); on masked LMs it is the explicit product of
    the head's frozen Jacobians (decoder rows, LayerNorm, activation slope, dense) with the layers' below."""
    from compute.methods._internals.decomposition import layer_parts
    from compute.methods.alti_logit import at

    lm = loaded(arch, task)
    batch = random_batch(arch, LENGTHS)
    rows = lm_rows(task)
    m = get_method("alti_logit")
    cap = lm.adapter.capture(batch, m.needs)
    (part,) = lm.task.parts(cap, rows, "predicted")
    cap = explaining(cap, part, False)
    ad, t, e = lm.adapter, part.target, cap.explain_pos
    delta, G = m.layer_contributions(cap, ad, t), m.directions(cap, ad, t)
    for l in range(ad.n_layers):
        p = layer_parts(cap, ad, l)
        after_attention = cap.ln2_in[l] if ad.pre_ln else cap.ln1_in[l]
        update = at(after_attention, e) - at(cap.hidden_states[l], e) - p.b_O
        torch.testing.assert_close(delta[:, l].sum(-1), (G[:, l] * update).sum(-1), rtol=1e-10, atol=1e-12)
    foil = part.foil
    _, _, _, decoder = ad.lm_head_parts()
    W = decoder.weight
    w = W[t] - torch.where((foil >= 0)[:, None], W[foil.clamp_min(0)], torch.zeros_like(W[t]))
    if ad.pre_ln:
        logits = model_logits(lm, batch)[torch.arange(3), e]
        want = logits.gather(1, t[:, None])[:, 0] - torch.where(
            foil >= 0, logits.gather(1, foil.clamp_min(0)[:, None])[:, 0], torch.zeros(3, dtype=logits.dtype))
        r = at(m._final_state(cap, ad), e)
        beta = getattr(ad.final_norm(), "bias", None)
        const = 0 if beta is None else w @ beta
        tol = dict(rtol=1e-6, atol=1e-7) if arch == "llama" else dict(rtol=1e-10, atol=1e-12)
        torch.testing.assert_close((G[:, 0] * r).sum(-1) + const, want, **tol)
    else:
        dense, act, norm, _ = ad.lm_head_parts()
        for b in range(3):
            h = cap.hidden_states[-1][b, int(e[b])]
            pre = dense(h)
            a = act(pre)
            sigma = (a.var(unbiased=False) + norm.eps).sqrt()
            d = a.shape[0]
            P = torch.eye(d, dtype=a.dtype) - 1.0 / d
            u = w[b] @ torch.diag(norm.weight) @ P / sigma @ torch.diag(a / pre) @ dense.weight
            torch.testing.assert_close(m.output_direction(cap, ad, t)[b], u, rtol=1e-9, atol=1e-12)
