"""A method added from outside the package: its class (with one option) and one registry line are all it takes.
The option then is an ``attr-compute run`` option, reaches the method as its parameter, is checked by the plan, is
recorded in the store's provenance and is part of the resume identity (compute.run.config)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from compute.cli import main
from compute.methods import REGISTRY, Method, MethodResult
from compute.options import Option, at_least
from store import open_store


class MadeUp(Method):
    """Each token's position times --made-up-scale: a result that shows the option's value reached the method."""

    name = "made_up"
    description = "position x scale (a test method)"
    reference = "tests/test_made_up_method.py"
    run_options = (
        Option("made_up_scale", 1, type=int, show_default=True, metavar="K", param="scale", resume=True,
               check=at_least(1), help="made_up: the factor of every position."),
    )

    def compute(self, cap, adapter, target):
        positions = torch.arange(cap.input_ids.shape[1], dtype=torch.float32, device=cap.mask.device)
        return MethodResult(scores=self.params["scale"] * positions[None] * cap.mask)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(REGISTRY, MadeUp.name, MadeUp)  # the registry line


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data.jsonl"
    rows = [{"id": f"m{i}", "text": "the movie was great but long and boring"[: 8 + 3 * i], "label": i % 2}
            for i in range(5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_a_made_up_method_runs_end_to_end_with_its_option(registered, data, tiny_model_dirs, tmp_path):
    out = tmp_path / "out.h5"
    base = ("run", data, "--model", tiny_model_dirs["bert"], "-o", out, "--device", "cpu", "--batch-size", 2,
            "--methods", "made_up,rollout")
    res = invoke(*base, "--made-up-scale", 3)
    assert res.exit_code == 0, (res.stderr, res.exception)
    with open_store(out) as s:
        assert s.methods == ["made_up", "rollout"] and len(s) == 5
        for ex in s:
            assert np.array_equal(ex.scores("made_up"), 3 * np.arange(ex.n_tokens, dtype=np.float32))
        assert s.config["config"]["made_up_scale"] == 3  # provenance
        assert s.method_info("made_up")["params"]["scale"] == 3
    # the resume identity: a store made with another value is not continued
    res = invoke(*base, "--made-up-scale", 4, "--resume")
    assert res.exit_code == 1
    assert "was made with --made-up-scale 3, not 4" in res.stderr
    # the declared check, before anything loads
    res = invoke(*base, "--made-up-scale", 0, "--overwrite")
    assert res.exit_code == 2 and "--made-up-scale must be at least 1" in res.stderr


def test_the_option_is_in_the_help_only_with_its_method(registered, monkeypatch):
    assert "--made-up-scale K" in invoke("run", "--help").output
    monkeypatch.delitem(REGISTRY, MadeUp.name)
    assert "--made-up-scale" not in invoke("run", "--help").output
