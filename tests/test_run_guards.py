"""attr-compute's guards around a run (issue 13): evidence flags never disturb the stored predictions, checkpoints
without a trained task head are refused, --resume refuses result-changing options, bad outputs and missing model
directories get one clear line, evidence metrics need evidence. Tiny models from conftest, in process (CliRunner)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from compute.cli import main
from store import open_store

WORDS = "the movie was great but long and boring film good bad not very a plot story loved hated fun dull".split()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=True)


def ok(res):
    assert res.exit_code == 0, (res.exit_code, res.stderr, res.exception)
    return res


def one_line(res, code=1) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == code and len(lines) == 1 and "Traceback" not in res.stderr, (res.exit_code, res.stderr)
    assert lines[0].startswith("attr-compute: error:") and "internal error" not in lines[0], lines[0]
    return lines[0]


# --- 1. --evidence-column never changes what is stored about the prediction -----------------------------------------


def evidence_rows(n: int, short_spans: bool) -> list[dict]:
    """Sentence pairs of varied lengths with evidence spans anywhere: in the text or the pair, at the start (ends 1
    and 2, below the batch size), in the middle and at the very end (ends far past the batch size), several or none."""
    rows = []
    for i in range(n):
        text = " ".join(WORDS[(i * 5 + 3 * k) % len(WORDS)] for k in range(2 + i % 9))
        pair = " ".join(WORDS[(i * 3 + 2 * k) % len(WORDS)] for k in range(1 + i % 5))
        if short_spans:
            spans = [[0, 1 + i % 2]] if i % 3 else [[1, 0, 1 + i % 2]]
        else:
            kind = i % 5
            spans = {0: [[0, 1 + i % 2]],  # ends at 1 or 2
                     1: [[len(text) - 3, len(text)]],  # ends at the text's end
                     2: [[1, 0, len(pair)]],  # the whole pair segment
                     3: [[2, 5], [1, len(pair) - 1, len(pair)]],  # both segments
                     4: []}[kind]
        rows.append({"id": f"p{i}", "sentence1": text, "sentence2": pair, "label": i % 2, "evidence": spans})
    return rows


def expected_flags(ex, spans) -> np.ndarray:
    want = np.zeros(ex.n_tokens, dtype=bool)
    for span in spans:
        seg, a, b = (0, *span) if len(span) == 2 else span
        for t, ((s, e), g) in enumerate(zip(ex.spans, ex.segment)):
            want[t] |= bool(g == seg and s < b and a < e)
    return want


@pytest.mark.parametrize("short_spans", [True, False], ids=["spans-ending-below-batch-size", "spans-anywhere"])
@pytest.mark.parametrize("target", ["predicted", "label"])
def test_evidence_column_changes_nothing_else(tiny_model_dirs, tmp_path, short_spans, target):
    rows = evidence_rows(23, short_spans)
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["--model", tiny_model_dirs["bert"], "--device", "cpu", "--batch-size", 3, "--methods",
              "rollout,normxlogit", "--target", target, "-q"]
    ok(invoke("run", data, "-o", tmp_path / "plain.h5", *common))
    ok(invoke("run", data, "-o", tmp_path / "ev.h5", "--evidence-column", "evidence", *common))
    with open_store(tmp_path / "plain.h5") as plain, open_store(tmp_path / "ev.h5") as ev:
        assert len(plain) == len(ev) == len(rows)
        assert plain[0].evidence is None
        for i, row in enumerate(rows):
            a, b = plain[i], ev[i]
            assert (b.id, b.row, b.text, b.pair, b.label) == (a.id, a.row, a.text, a.pair, a.label) == (
                row["id"], i, row["sentence1"], row["sentence2"], row["label"])
            assert b.tokens == a.tokens and np.array_equal(b.token_ids, a.token_ids)
            assert np.array_equal(b.spans, a.spans) and np.array_equal(b.segment, a.segment)
            assert b.pred == a.pred and b.target == a.target and b.explain_pos == a.explain_pos, i
            np.testing.assert_array_equal(b.probs, a.probs, err_msg=f"example {i}")
            for m in ("rollout", "normxlogit"):
                np.testing.assert_array_equal(b.scores(m), a.scores(m), err_msg=f"{m} example {i}")
                np.testing.assert_array_equal(b.layer_scores(m), a.layer_scores(m))
            np.testing.assert_array_equal(b.matrices("rollout"), a.matrices("rollout"))
            np.testing.assert_array_equal(b.evidence, expected_flags(b, row["evidence"]), err_msg=f"example {i}")
            assert b.evidence.any() == bool(row["evidence"])
        # every example has its own probabilities, so a row of another example would be seen
        assert len({tuple(ex.probs) for ex in ev}) == len(rows)
