"""attr-compute --task generate against inseq 0.7.1 (issue 37), step by step, on the tiny random Llama and GPT-2 whose
checkpoints benchmarks/inseq_reference.py saved under tests/fixtures/inseq/ and whose inseq attributions (float64,
the target's logit, greedy, up to 6 new tokens, 12 prompts) it committed as tests/fixtures/inseq/inseq_generate.json.

Like for like: inseq's saliency is |dF/dt| (Captum's abs), its L2 norm over the hidden dimension divided by the sum
over the step's positions is grad_l2; input_x_gradient's L2 norm is gxi_l2 and its mean |.| gxi_mean; integrated
gradients (50 Gauss-Legendre steps from the [UNK] embedding, zeroed in the checkpoint: --ig-baseline zero) the same
for ig_l2 and ig_mean. inseq differentiates at the token embeddings (inputs_embeds): --gradient-input
token-embedding on GPT-2, where the default (the embedding module's output, token + position) differs; on Llama the
two are the same. Each step's scores must equal inseq's within 1e-5 of the step's scale (max |ours - theirs| / max
|theirs|); attrscope runs in float32 and stores float32."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cli_results import invoke, ok
from store import open_store

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURES = Path(__file__).parent / "fixtures" / "inseq"
REFERENCE = json.loads((FIXTURES / "inseq_generate.json").read_text())
METHODS = ("grad_l2", "gxi_l2", "gxi_mean", "ig_l2", "ig_mean")
TOL = 1e-5
# (family, --gradient-input): the runs of the module, each made once
RUNS = (("llama", "token-embedding"), ("llama", "embedding-output"), ("gpt2", "token-embedding"),
        ("gpt2", "embedding-output"))


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("inseq")
    out = {}
    for family, mode in RUNS:
        data = tmp / f"{family}.jsonl"
        data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in REFERENCE["models"][family]["prompts"]))
        store = tmp / f"{family}-{mode}.h5"
        ok(invoke("run", data, "--model", FIXTURES / family, "-o", store, "--task", "generate", "--max-new-tokens",
                  str(REFERENCE["max_new_tokens"]), "--methods", ",".join(METHODS), "--store-dtype", "float32",
                  "--ig-baseline", "zero", "--ig-steps", str(REFERENCE["ig"]["n_steps"]), "--gradient-input", mode,
                  "--matrices", "none", "--device", "cpu", "-q"))
        out[family, mode] = store
    return out


def theirs(family: str, method: str, i: int, t: int) -> np.ndarray:
    """inseq's scores aggregated as attrscope's ``method`` aggregates, for prompt i, step t."""
    ref = REFERENCE["models"][family]["methods"]
    d = _hidden(family)
    inseq = {"grad_l2": "saliency", "gxi_l2": "input_x_gradient", "gxi_mean": "input_x_gradient",
             "ig_l2": "integrated_gradients", "ig_mean": "integrated_gradients"}[method]
    step = ref[inseq][i][t]
    if method.endswith("_l2"):
        a = np.asarray(step["l2"])
        return a / a.sum() if method == "grad_l2" else a
    return np.asarray(step["abs_sum"]) / d


def _hidden(family: str) -> int:
    cfg = json.loads((FIXTURES / family / "config.json").read_text())
    return int(cfg.get("hidden_size", cfg.get("n_embd")))


def errors(store: Path, family: str) -> dict[str, float]:
    """The largest per-step relative error of each method against inseq, after checking the continuations."""
    ref = REFERENCE["models"][family]
    worst = dict.fromkeys(METHODS, 0.0)
    with open_store(str(store)) as s:
        assert len(s) == len(ref["prompts"])
        for i, (prompt_ids, cont) in enumerate(zip(ref["prompt_ids"], ref["continuations"])):
            ex = s[i]
            assert ex.prompt_len == len(prompt_ids) and ex.token_ids[:ex.prompt_len].tolist() == prompt_ids
            assert ex.generated_ids.tolist() == cont, f"{family} prompt {i}: another continuation"
            for name in METHODS:
                grid = ex.step_scores(name)
                for t in range(ex.n_steps):
                    want = theirs(family, name, i, t)
                    got = grid[t, :ex.prompt_len + t].astype(np.float64)
                    assert got.shape == want.shape and np.isnan(grid[t, ex.prompt_len + t:]).all()
                    err = float(np.abs(got - want).max() / np.abs(want).max())
                    worst[name] = max(worst[name], err)
    return worst


@pytest.mark.parametrize("family,mode", [("llama", "token-embedding"), ("llama", "embedding-output"),
                                         ("gpt2", "token-embedding")])
def test_every_step_equals_inseq(stores, family, mode):
    worst = errors(stores[family, mode], family)
    assert all(e <= TOL for e in worst.values()), f"{family} --gradient-input {mode}: worst relative errors {worst}"


def test_gpt2_at_the_embedding_output_is_not_inseq(stores):
    """The default mode on GPT-2 attributes token + position embeddings: gradient x input and IG differ from inseq's
    (the saliency does not: the gradient at t + p is the gradient at t)."""
    worst = errors(stores["gpt2", "embedding-output"], "gpt2")
    assert worst["grad_l2"] <= TOL, worst
    for name in ("gxi_l2", "gxi_mean", "ig_l2", "ig_mean"):
        assert worst[name] > 100 * TOL, worst
