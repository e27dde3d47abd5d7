"""`attr-compute methods --model` and the run never disagree: for every family of tests/families.py (described or
not) and every head transformers has for it (a sequence classifier; a causal LM for decoders, a masked LM for
encoders), each method listed as running runs under `--methods all` and is stored, and each listed as refused is
skipped."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_results import invoke
from families import ALL_FAMILIES, family_heads, write_family_task_dir

from store import open_store

ROWS = {"classification": [{"text": "the movie was great", "label": 1}, {"text": "boring and long film", "label": 0}],
        # one-letter words: one token for every tokenizer transformers builds from the vocabulary (Qwen2's rebuilds it)
        "next-token": [{"text": "the movie was", "target": "a", "foil": "i"}, {"text": "i loved the"}],
        "masked-token": [{"text": "the movie [MASK] great", "target": "was", "foil": "is"},
                         {"text": "it [MASK] a fun film"}]}
CASES = [(family, task) for family in ALL_FAMILIES for task in family_heads(family)]


def listed(res) -> dict[str, str]:
    """method -> "runs" or "refused: ..." from `attr-compute methods --model`'s lines."""
    return dict(line.split(None, 1) for line in res.stdout.splitlines()[1:])


@pytest.mark.slow
@pytest.mark.parametrize("family,task", CASES, ids=[f"{f}-{t}" for f, t in CASES])
def test_what_methods_lists_as_running_runs(family, task, tmp_path):
    model_dir = write_family_task_dir(tmp_path / family, family, task)
    res = invoke("methods", "--model", model_dir, "--task", task)
    assert res.exit_code == 0, res.stderr
    found = listed(res)
    runs = {name for name, said in found.items() if said == "runs"}
    if task == "next-token":  # every decoder's causal-LM head is known (generic: its output embeddings, scaled)
        assert {"logat", "normxlogit"} <= runs, (found["logat"], found["normxlogit"])
    assert all(said == "runs" or (said.startswith("refused: ") and "\n" not in said) for said in found.values())
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS[task]))
    out = tmp_path / "out.h5"
    res = invoke("run", data, "--model", model_dir, "--task", task, "--methods", "all", "-o", out, "--device", "cpu",
                 "--ig-steps", "4", "-q")
    assert res.exit_code == 0, res.stderr
    with open_store(out) as s:
        assert s.complete and len(s) == len(ROWS[task])
        assert set(s.methods) == runs
        for i in range(len(s)):
            ex = s[i]
            for m in s.methods:
                assert np.isfinite(ex.scores(m)).all(), (m, i)
            if task != "classification" and "logat" in runs:  # the head as the model applies it (scaled, capped)
                np.testing.assert_allclose(ex.layer_scores("logat")[-1, ex.explain_pos], ex.task_info["output"],
                                           rtol=1e-4, atol=1e-5)


def test_a_mixture_of_experts_run_notes_the_routing_once(tmp_path):
    """`--methods ig_l2,ig_mean` on a tiny Mixtral (its median relative IG delta above 5%): one line
    after the run names the routing switching along the path; the store is complete."""
    model_dir = write_family_task_dir(tmp_path / "mixtral", "mixtral", "next-token")
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in ("the movie was", "i loved the", "a dull plot")))
    out = tmp_path / "out.h5"
    res = invoke("run", data, "--model", model_dir, "--task", "next-token", "--methods", "ig_l2,ig_mean", "-o", out,
                 "--device", "cpu", "--ig-steps", "8", "--ig-baseline", "zero")
    assert res.exit_code == 0, res.stderr
    said = " ".join((res.stderr + res.stdout).split())  # the console wraps its lines at its width
    assert said.count("integrated gradients: the median |ig_delta| / |F(x) - F(x')| is") == 1, said
    assert said.count("the routing switches along the path from the baseline") == 1, said
    with open_store(out) as s:
        assert s.complete and set(s.methods) == {"ig_l2", "ig_mean"}
