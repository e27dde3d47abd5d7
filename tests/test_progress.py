"""Issue 38.9, progress that tells the truth: the rate and time left come from the work done (examples / elapsed),
the bar says which batch and method run, and eval, merge and export show the same bar."""

from __future__ import annotations

import json
import re
import time

import pytest

from cli_results import invoke, ok
from compute.run.progress import Pace

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = "the movie was great but long and boring film good bad not very".split()
N = 6


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # the bar's every column on one line of an 80-column terminal


def _data(path, n=N):
    path.write_text("".join(json.dumps({"text": " ".join(WORDS[i % 5:i % 5 + 3 + i]), "label": i % 2}) + "\n"
                            for i in range(n)))
    return path


def test_pace_is_the_work_done_over_the_time_it_took():
    now = [100.0]
    pace = Pace(total=60, completed=0, clock=lambda: now[0])
    now[0] += 110.0  # the first batch: nothing done yet, nothing made up
    assert pace.rate() is None and pace.eta() is None
    pace.advance(32)
    pace.advance(28)  # read together with the one before (a CPU run's burst): the rate is still done / elapsed
    assert pace.rate() == pytest.approx(60 / 110) and pace.eta() == 0
    resumed = Pace(total=60, completed=40, clock=lambda: now[0])
    now[0] += 10.0
    resumed.advance(5)
    assert resumed.rate() == pytest.approx(0.5) and resumed.eta() == pytest.approx(15 / 0.5)  # this run's work only


def _rate(stderr: str, label: str) -> tuple[float, str]:
    """The final bar of ``label``: its rate (ex/s) and the line."""
    line = [ln for ln in stderr.splitlines() if ln.lstrip().startswith(label) and "ETA" in ln][-1]
    assert len(line.rstrip()) <= 80, line
    return float(re.search(r"([0-9.]+) ex/s", line).group(1)), line


def test_a_runs_reported_rate_is_examples_over_elapsed(tiny_model_dirs, tmp_path, monkeypatch):
    """Three batches of a method that takes 0.4 s each: the bar's last rate is within 20% of the examples over the
    seconds between the bar's start and its end, and while a batch runs the bar names it and its method."""
    from compute import ui
    from compute.methods.norm import Norm

    real = Norm.compute

    def slow(self, cap, adapter, target):
        time.sleep(0.4)
        return real(self, cap, adapter, target)

    monkeypatch.setattr(Norm, "compute", slow)
    times, stages = {}, []
    start, stop, stage = ui.RichProgress.start, ui.RichProgress.stop, ui.RichProgress.stage
    monkeypatch.setattr(ui.RichProgress, "start",
                        lambda self, *a, **k: times.setdefault("start", time.monotonic()) and start(self, *a, **k))
    monkeypatch.setattr(ui.RichProgress, "stop", lambda self: times.__setitem__("stop", time.monotonic()) or stop(self))
    monkeypatch.setattr(ui.RichProgress, "stage", lambda self, text: stages.append(text) or stage(self, text))
    res = ok(invoke("run", _data(tmp_path / "d.jsonl"), "--model", tiny_model_dirs["bert"], "-o", tmp_path / "o.h5",
                    "--device", "cpu", "--methods", "rollout,norm", "--batch-size", 2))
    rate, line = _rate(res.stderr, "computing")
    truth = N / (times["stop"] - times["start"])
    assert abs(rate - truth) <= 0.2 * truth, (rate, truth, line)
    assert f"{N}/{N}" in line and "ETA 0:00:00" in line
    assert [s for s in stages if s.endswith("norm")] == [f"batch {k} (2 ex) · norm" for k in (1, 2, 3)]


@pytest.fixture(scope="module")
def small_store(tiny_model_dirs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("progress")
    data = _data(tmp / "d.jsonl")
    common = ("--model", tiny_model_dirs["bert"], "--device", "cpu", "--methods", "rollout,norm", "-q")
    ok(invoke("run", data, "-o", tmp / "s.h5", *common))
    for k in (0, 1):
        ok(invoke("run", data, "-o", tmp / "m.h5", "--shard", f"{k}/2", *common))
    return tmp


def test_eval_shows_the_bar(small_store):
    res = ok(invoke("eval", small_store / "s.h5", "--metrics", "comprehensiveness", "--device", "cpu"))
    rate, line = _rate(res.stderr, "evaluating")
    assert f"{2 * N}/{2 * N}" in line and rate > 0  # two methods x N examples
    assert "metric norm/comprehensiveness: done" in res.stderr


def test_merge_shows_the_bar(small_store):
    shards = sorted(small_store.glob("m.shard-*-of-2.h5"))
    res = ok(invoke("merge", small_store / "merged.h5", *shards))
    _, line = _rate(res.stderr, "merging")
    assert f"{N}/{N}" in line


def test_export_shows_the_bar(small_store):
    res = ok(invoke("export", small_store / "s.h5", "-o", small_store / "t.csv", "--chunk-size", 4))
    _, line = _rate(res.stderr, "exporting")
    assert f"{N}/{N}" in line


def test_the_head_statistics_pass_shows_the_bar(tiny_model_dirs, tmp_path):
    """mask_lrp's head-statistics pass (minutes over a large --head-stats-data) counts its examples on a bar of its
    own before the run's."""
    from test_head_pass import write_data

    data, parses, rows = write_data(tmp_path, n=6)
    res = ok(invoke("run", data, "--model", tiny_model_dirs["bert"], "-o", tmp_path / "o.h5", "--device", "cpu",
                    "--methods", "mask_lrp", "--parses", parses, "--batch-size", 4))
    _, line = _rate(res.stderr, "head statistics")
    assert f"{len(rows)}/{len(rows)}" in line
    assert res.stderr.index("head statistics") < res.stderr.index("computing")
