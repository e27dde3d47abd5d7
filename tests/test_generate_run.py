"""attr-compute run --task generate end to end on a saved tiny Llama: a generation store's step t equals a
--task next-token run on the prefix (prompt + the first t tokens) with the step's token as target (and foil), every
method; EOS at the first step stores T = 0; bad input is one line and writes nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from cli_results import invoke, ok, one_line
from conftest import write_tiny_model_dir, write_tiny_task_model_dir
from store import open_store

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["the movie was", "i loved it", "a dull plot and", "this acting is", "it", "not very good but the"]
CONTINUATIONS = [" great fun", " a film", " slow story", " bad", " is fun and long", " film"]
FOILS = [" good film", " the plot", " fun film", " great", " was bad but dull", " story"]
RUN = ("--device", "cpu", "-q", "--ig-baseline", "zero", "--ig-steps", "4", "--matrices", "all")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return write_tiny_task_model_dir(tmp_path_factory.mktemp("gen") / "llama", "llama", "next-token")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_forced_and_contrasted_generation_equals_next_token_runs_on_its_prefixes(llama_dir, tmp_path):
    data = write_jsonl(tmp_path / "g.jsonl", [{"prompt": p, "cont": c, "foil": f}
                                              for p, c, f in zip(PROMPTS, CONTINUATIONS, FOILS)])
    gen = tmp_path / "gen.h5"
    ok(invoke("run", data, "--model", llama_dir, "-o", gen, "--task", "generate", "--methods", "all",
              "--continuation-column", "cont", "--contrast-column", "foil", *RUN))
    prefixes = [{"text": p + "".join(" " + w for w in c.split()[:t]),
                 "target": c.split()[t], "foil": f.split()[t]}
                for p, c, f in zip(PROMPTS, CONTINUATIONS, FOILS) for t in range(len(c.split()))]
    nt = tmp_path / "nt.h5"
    ok(invoke("run", write_jsonl(tmp_path / "nt.jsonl", prefixes), "--model", llama_dir, "-o", nt,
              "--task", "next-token", "--methods", "all", *RUN))
    with open_store(str(gen)) as g, open_store(str(nt)) as ref:
        assert g.generation and g.task_name == "generate" and len(g) == len(PROMPTS)
        methods = g.methods
        assert set(methods) == set(ref.methods) and len(methods) >= 20
        r = 0
        for i, cont in enumerate(CONTINUATIONS):
            ex = g[i]
            assert ex.n_steps == len(cont.split()) and ex.generated_tokens == cont.split()
            assert ex.step_foil_words == FOILS[i].split()
            for t in range(ex.n_steps):
                want = ref[r]
                n = ex.prompt_len + t
                assert list(ex.tokens[:n]) == list(want.tokens) and want.explain_pos == n - 1
                assert ex.step_foil_tokens[t] == want.foil_token
                np.testing.assert_allclose(ex.step_probs[t], want.probs[0], rtol=1e-5)
                np.testing.assert_allclose(ex.step_foil_probs[t], want.probs[1], rtol=1e-5)
                np.testing.assert_allclose(ex.step_outputs[t], want.output, rtol=1e-5, atol=1e-6)
                for m in methods:
                    w = want.scores(m)
                    scale = max(float(np.abs(w).max()), 1e-30)
                    np.testing.assert_allclose(ex.scores(m, step=t)[:n], w, rtol=0, atol=1e-5 * scale,
                                               err_msg=f"{m} example {i} step {t}")
                    assert np.isnan(ex.scores(m, step=t)[n:]).all()
                    lw = want.layer_scores(m)
                    if lw is not None:
                        np.testing.assert_allclose(ex.layer_scores(m, step=t)[:, :n], lw, rtol=0,
                                                   atol=1e-5 * max(float(np.abs(lw).max()), 1e-30), err_msg=m)
                r += 1
        assert r == len(ref)


def greedy_chain(model_dir: Path, prompt: str, n: int) -> list[int]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    ids, out = tok(prompt)["input_ids"], []
    with torch.no_grad():
        for _ in range(n):
            out.append(int(model(input_ids=torch.as_tensor([ids + out])).logits[0, -1].argmax()))
    return out


def eos_first_model(llama_dir: Path, tmp_path: Path) -> tuple[Path, list[int]]:
    """A copy of the tiny Llama whose EOS is the first prompt's first greedy token (its generation ends at once)."""
    chain = greedy_chain(llama_dir, PROMPTS[0], 1)
    model = tmp_path / "model"
    model.mkdir()
    for f in os.listdir(llama_dir):
        (model / f).write_bytes((llama_dir / f).read_bytes())
    config = json.loads((model / "config.json").read_text())
    config["eos_token_id"] = chain[0]
    (model / "config.json").write_text(json.dumps(config))
    (model / "generation_config.json").unlink(missing_ok=True)
    return model, chain


def test_greedy_generation_and_eos_at_the_first_step(llama_dir, tmp_path):
    """The stored continuation is the model's greedy chain; a prompt whose first token is EOS stores T = 0."""
    model, chain = eos_first_model(llama_dir, tmp_path)
    data = write_jsonl(tmp_path / "g.jsonl", [{"prompt": p} for p in PROMPTS[:3]])
    out = tmp_path / "gen.h5"
    ok(invoke("run", data, "--model", model, "-o", out, "--task", "generate", "--max-new-tokens", "3",
              "--methods", "rollout,grad_l2", "--contrast", "top2", "--heads", *RUN))
    with open_store(str(out)) as g:
        assert g[0].n_steps == 0 and g[0].step_scores("rollout").shape == (0, g[0].prompt_len)
        n = len(g[1].tokens)  # the pass's attention per head over prompt + continuation, as the matrices
        assert g[1].heads().shape == (3, 4, n, n) and g[1].matrices("rollout").shape == (3, n, n)
        for i in (1, 2):
            ex = g[i]
            want = [t for t in greedy_chain(llama_dir, PROMPTS[i], 3)]
            cut = want.index(chain[0]) if chain[0] in want else 3
            assert list(ex.generated_ids) == want[:cut]
            assert (ex.step_foil_tokens != np.asarray(ex.generated_ids)).all()  # the runner-up, never the token


def test_a_batch_whose_last_generation_stops_at_once_is_stored(llama_dir, tmp_path):
    """EOS at the first step of the last example of a batch (no step values at the end of the batch's joined
    arrays) stores T = 0; it ended the run in an internal error in the store's scale statistics."""
    model, _ = eos_first_model(llama_dir, tmp_path)
    data = write_jsonl(tmp_path / "g.jsonl", [{"prompt": p} for p in (PROMPTS[1], PROMPTS[0])])
    out = tmp_path / "gen.h5"
    ok(invoke("run", data, "--model", model, "-o", out, "--task", "generate", "--max-new-tokens", "2",
              "--methods", "rollout,grad_l2", "--batch-size", "2", *RUN))
    with open_store(str(out)) as g:
        assert g.complete and g[1].n_steps == 0 and g[1].step_scores("grad_l2").shape == (0, g[1].prompt_len)
        assert g[0].n_steps > 0 and np.isfinite(g[0].step_scores("grad_l2")).any()
        stats = g.scale_stats("grad_l2", compute=True)
        assert stats is not None


# --- bad input: one line, nothing written -------------------------------------------------------------------------
def refused(tmp_path: Path, *args, code: int = 1) -> str:
    before = set(os.listdir(tmp_path))
    line = one_line(invoke("run", *args, "-o", tmp_path / "out.h5", "--methods", "rollout", "--device", "cpu", "-q"),
                    code)
    assert set(os.listdir(tmp_path)) == before, line  # no store, no lock
    return line


def test_an_empty_prompt_is_refused(llama_dir, tmp_path):
    data = write_jsonl(tmp_path / "g.jsonl", [{"prompt": "the movie"}, {"prompt": "  "}])
    line = refused(tmp_path, data, "--model", llama_dir, "--task", "generate")
    assert "row 1 of" in line and "has an empty prompt in column 'prompt'" in line, line


def test_a_prompt_at_the_models_length_is_refused(llama_dir, tmp_path):
    data = write_jsonl(tmp_path / "g.jsonl", [{"prompt": "the movie"}, {"prompt": " ".join(["fun"] * 64)}])
    line = refused(tmp_path, data, "--model", llama_dir, "--task", "generate")
    assert "example '1': its prompt is 64 tokens, at or over the model's length (64)" in line, line
    line = refused(tmp_path, data, "--model", llama_dir, "--task", "generate", "--max-length", "2")
    assert "example '0': its prompt is 2 tokens, at or over the model's length (2)" in line, line


def test_a_model_without_a_causal_lm_head_is_refused(tiny_model_dirs, tmp_path):
    data = write_jsonl(tmp_path / "g.jsonl", [{"prompt": "the movie"}])
    line = refused(tmp_path, data, "--model", tiny_model_dirs["bert"], "--task", "generate")
    assert "no trained generate head" in line and "ForCausalLM" in line, line
    line = refused(tmp_path, data, "--model", tiny_model_dirs["bert"], "--task", "generate", "--allow-random-head")
    assert "--task generate needs a causal language model" in line and "without causal attention" in line, line


def test_a_continuation_that_does_not_retokenise_to_itself_is_refused(llama_dir, tmp_path):
    data = write_jsonl(tmp_path / "g.jsonl", [{"prompt": "the movie", "cont": " was fun"},
                                              {"prompt": "the movie", "cont": " was Fun"}])
    line = refused(tmp_path, data, "--model", llama_dir, "--task", "generate", "--continuation-column", "cont")
    assert ("example '1': the continuation ' was Fun' does not re-tokenise to itself: its tokens read back as "
            "'was fun', differing at character 4") in line, line


@pytest.mark.parametrize("args,message", [
    (("--task", "next-token", "--max-new-tokens", "4"), "--max-new-tokens applies to --task generate, not next-token"),
    (("--task", "generate", "--contrast", "top2", "--contrast-column", "f", "--continuation-column", "c"),
     "--contrast top2 contrasts with the runner-up"),
    (("--task", "generate", "--continuation-column", "c", "--do-sample"), "--continuation-column gives the continuation"),
    (("--task", "generate", "--seed", "3"), "--seed seeds --do-sample's draws"),
    (("--task", "generate", "--contrast-column", "f"), "--contrast-column gives one foil per continuation token"),
    (("--task", "generate", "--batch-size", "auto"), "--batch-size auto measures one-target batches"),
    (("--task", "generate", "--target", "label"), "--target label has no meaning for --task generate"),
])
def test_generate_options_out_of_place_are_usage_errors(llama_dir, tmp_path, args, message):
    data = write_jsonl(tmp_path / "g.jsonl", [{"prompt": "the movie", "c": " fun", "f": " bad"}])
    assert message in refused(tmp_path, data, "--model", llama_dir, *args, code=2)


METRIC_NAMES = ("comprehensiveness", "sufficiency", "aopc", "lodds")
STEP_PROMPTS = (0, 1, 4)  # 4: a one-token prompt, whose first two steps comprehensiveness does not define


@pytest.fixture(scope="module")
def metric_runs(llama_dir, tmp_path_factory) -> dict:
    """A forced generation with --metrics, and the --task next-token run with --metrics of each of its steps'
    prefixes (prompt + the first t tokens, the step's token as target)."""
    tmp = tmp_path_factory.mktemp("stepmetrics")
    picked = [(PROMPTS[i], CONTINUATIONS[i]) for i in STEP_PROMPTS]
    data = write_jsonl(tmp / "g.jsonl", [{"prompt": p, "cont": c} for p, c in picked])
    args = ("--model", llama_dir, "--task", "generate", "--methods", "rollout,grad_l2", "--continuation-column",
            "cont", "--metrics", ",".join(METRIC_NAMES), *RUN)
    gen = tmp / "gen.h5"
    ok(invoke("run", data, "-o", gen, *args))
    prefixes = [{"text": p + "".join(" " + w for w in c.split()[:t]), "target": c.split()[t]}
                for p, c in picked for t in range(len(c.split()))]
    nt = tmp / "nt.h5"
    ok(invoke("run", write_jsonl(tmp / "nt.jsonl", prefixes), "--model", llama_dir, "-o", nt, "--task",
              "next-token", "--methods", "rollout,grad_l2", "--metrics", ",".join(METRIC_NAMES), *RUN))
    return {"data": data, "args": args, "gen": gen, "nt": nt, "steps": [len(c.split()) for _, c in picked]}


def step_means(steps: np.ndarray, counts: list[int]) -> np.ndarray:
    """Each example's mean over its finite step values (NaN without one)."""
    out, a = [], 0
    for T in counts:
        part = steps[a:a + T]
        out.append(part[np.isfinite(part)].mean() if np.isfinite(part).any() else np.nan)
        a += T
    return np.asarray(out)


def test_the_perturbation_metrics_of_a_generation_are_its_steps_next_token_metrics(metric_runs):
    """Point 5: each step's metric is the next-token metric of its prefix and token (its target probability
    perturbed), kept per step (Store.metric_steps, Example.step_metric); an example stores the mean over its
    steps."""
    counts = metric_runs["steps"]
    with open_store(str(metric_runs["gen"])) as g, open_store(str(metric_runs["nt"])) as ref:
        for m in ("rollout", "grad_l2"):
            for name in METRIC_NAMES:
                per_step = ref.metric_values(m, name)
                assert len(per_step) == sum(counts)
                np.testing.assert_allclose(g.metric_steps(m, name), per_step, rtol=1e-5, atol=1e-7,
                                           err_msg=f"{m} {name}")
                a = 0
                for i, T in enumerate(counts):
                    np.testing.assert_allclose(g[i].step_metric(m, name), per_step[a:a + T], rtol=1e-5, atol=1e-7)
                    a += T
                np.testing.assert_allclose(g.metric_values(m, name), step_means(per_step, counts), rtol=1e-5,
                                           atol=1e-7, err_msg=f"{m} {name}")
        comp = g[2].step_metric("grad_l2", "comprehensiveness")  # prefixes of 1 and 2 tokens: both ends kept
        assert np.isnan(comp[:2]).all() and np.isfinite(comp[2:]).all()
        assert np.isfinite(g.metric_values("grad_l2", "comprehensiveness")[2])


def test_sharded_generation_metrics_merge_to_the_single_runs_steps(metric_runs, tmp_path):
    """--shard K/N with --metrics, then merge: the merged store's per-step values (and means) are the one-process
    run's."""
    out = tmp_path / "out.h5"
    for k in (0, 1):
        ok(invoke("run", metric_runs["data"], "-o", out, "--shard", f"{k}/2", *metric_runs["args"]))
    merged = tmp_path / "merged.h5"
    ok(invoke("merge", merged, tmp_path / "out.shard-0-of-2.h5", tmp_path / "out.shard-1-of-2.h5"))
    with open_store(str(merged)) as mg, open_store(str(metric_runs["gen"])) as one:
        for m in ("rollout", "grad_l2"):
            for name in METRIC_NAMES:
                np.testing.assert_allclose(mg.metric_steps(m, name), one.metric_steps(m, name), rtol=1e-5,
                                           atol=1e-7, err_msg=f"{m} {name}")
                np.testing.assert_allclose(mg.metric_values(m, name), one.metric_values(m, name), rtol=1e-5,
                                           atol=1e-7)


def test_eval_keeps_each_steps_value_and_an_eos_first_example_has_none(llama_dir, tmp_path):
    """attr-compute eval on a greedy generation: each step's value is the metric computed directly on that step's
    prefix (the step's scores, its token's probability); the example whose model ended at once (T = 0) has no
    step value and a NaN mean."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from compute.evaluate import EvalConfig, ModelPredictor, _settings
    from compute.metrics import get_metric
    from compute.metrics.base import EvalExample

    model_dir, _ = eos_first_model(llama_dir, tmp_path)
    data = write_jsonl(tmp_path / "g.jsonl", [{"prompt": p} for p in PROMPTS[:3]])
    out = tmp_path / "gen.h5"
    ok(invoke("run", data, "--model", model_dir, "-o", out, "--task", "generate", "--max-new-tokens", "3",
              "--methods", "grad_l2", *RUN))
    names = ("comprehensiveness", "sufficiency", "aopc")
    ok(invoke("eval", out, "--metrics", ",".join(names), "--device", "cpu", "-q"))
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    with open_store(str(out)) as g:
        assert g[0].n_steps == 0 and sum(g[i].n_steps for i in range(len(g))) >= 4
        for name in names:
            assert g[0].step_metric("grad_l2", name).shape == (0,)
            assert np.isnan(g.metric_values("grad_l2", name)[0])
            metric = get_metric(name, **_settings(name, None, EvalConfig(metrics=name), tok, True, "generate"))
            predictor = ModelPredictor(model, tok.pad_token_id, 64, task="generate")
            for i in range(1, len(g)):
                ex = g[i]
                want = []
                for t in range(ex.n_steps):
                    n = ex.step_position(t)
                    one = EvalExample(index=i, id=ex.id, token_ids=ex.token_ids[:n].astype(np.int64),
                                      special=np.zeros(n, bool), scores=ex.scores("grad_l2", step=t)[:n].astype(
                                          np.float64), label=-1, pred=0, explain_pos=n - 1,
                                      target_token=int(ex.generated_ids[t]))
                    want.append(metric.evaluate([one], predictor).values[0])
                got = ex.step_metric("grad_l2", name)
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=f"{name} example {i}")
                np.testing.assert_allclose(g.metric_values("grad_l2", name)[i], step_means(got, [len(got)])[0],
                                           rtol=1e-6)


def test_a_stopped_sampled_generation_resumes_with_the_same_generations(llama_dir, tmp_path, monkeypatch):
    """--do-sample --seed: a run stopped after its first window and resumed stores what one uninterrupted run does
    (each example decodes from its own generator, whatever the window it is decoded in)."""
    import compute.runner as runner
    from compute import interrupts
    from compute.runner import RunConfig, run

    data = write_jsonl(tmp_path / "g.jsonl", [{"prompt": p} for p in PROMPTS])
    common = dict(dataset=str(data), model=str(llama_dir), task="generate", methods="rollout,grad_l2",
                  do_sample=True, seed=3, max_new_tokens=4, batch_size=2, window=1, device="cpu")
    full = tmp_path / "full.h5"
    run(RunConfig(output=str(full), **common))
    submitted = []
    submit = runner.WindowWriter.submit

    def stop_at_the_second(self, examples):
        submitted.append(len(examples))
        if len(submitted) == 2:
            raise KeyboardInterrupt
        return submit(self, examples)

    monkeypatch.setattr(runner.WindowWriter, "submit", stop_at_the_second)
    part = tmp_path / "part.h5"
    with pytest.raises(interrupts.Interrupted, match="--resume"):
        run(RunConfig(output=str(part), **common))
    monkeypatch.undo()
    with open_store(str(part)) as s:
        assert len(s) == 2 and not s.complete
    run(RunConfig(output=str(part), resume=True, **common))
    with open_store(str(full)) as a, open_store(str(part)) as b:
        assert len(a) == len(b) == len(PROMPTS) and b.complete
        assert sum(a[i].n_steps for i in range(len(a))) > len(PROMPTS)  # sampled, several tokens each
        for i in range(len(a)):
            assert list(a[i].generated_ids) == list(b[i].generated_ids)
            np.testing.assert_allclose(a[i].step_probs, b[i].step_probs, rtol=1e-6)
            for m in ("rollout", "grad_l2"):
                np.testing.assert_allclose(a[i].step_scores(m), b[i].step_scores(m), rtol=1e-6, atol=1e-7)
