"""User-supplied names (paths, dataset names, commands recorded in a store) reach the terminal as data: their control
characters escaped (no escape sequence from a file name reaches the terminal) and never parsed as Rich markup."""

from __future__ import annotations

import io

import numpy as np
from click.testing import CliRunner
from cli_results import invoke, ok, one_line
from rich.console import Console

from store import ExampleData, MethodLayout, MetricData, StoreWriter, add_metrics

TITLE = "\x1b]0;owned\x07"  # sets the terminal's title (OSC 0), ends with BEL
ESCAPED = "\\u001b]0;owned\\u0007"


def _store(path, dataset: str):
    w = StoreWriter.create(str(path), n_layers=2, n_heads=2, labels={0: "neg", 1: "pos"},
                           methods=[MethodLayout("rollout", signed=False, description="r")],
                           provenance={"command": ["attr-compute", dataset]},
                           attrs={"model_id": "m[/b]", "dataset": dataset})
    w.append([ExampleData(row=i, id=f"e{i}", text="a", pair=None, token_ids=np.arange(3),
                          tokens=["[CLS]", "a", "[SEP]"], spans=np.full((3, 2), -1), segment=np.zeros(3), label=1,
                          pred=1, probs=np.array([0.2, 0.8]), target=1, explain_pos=0, n_orig_tokens=3,
                          truncated=False, results={"rollout": {"scores": np.ones(3)}}) for i in range(3)])
    w.close(complete=True)
    add_metrics(str(path), [MetricData("rollout", "comprehensiveness", np.ones(3), {}, {"mean": 1.0, "n": 3}, True,
                                       "c")])
    return path


def test_report_escapes_a_dataset_name_with_an_escape_sequence(tmp_path):
    path = _store(tmp_path / "s.h5", f"data{TITLE}.tsv")
    md = ok(invoke("report", path)).stdout
    assert "\x1b" not in md and "\x07" not in md
    assert f"dataset `data{ESCAPED}.tsv`" in md and f"`attr-compute data{ESCAPED}.tsv`" in md
    csv_out = tmp_path / "r.csv"
    ok(invoke("report", path, "--format", "csv", "-o", csv_out))
    assert csv_out.read_text().splitlines()[1].startswith("rollout,comprehensiveness,1.0,")


def test_error_lines_escape_control_characters_in_paths(tmp_path):
    line = one_line(invoke("export", tmp_path / f"s{TITLE}.h5", "-o", tmp_path / "o.csv"))
    assert "\x1b" not in line and "\x07" not in line and f"s{ESCAPED}.h5' not found" in line


def test_attr_tui_error_lines_escape_control_characters(tmp_path):
    from tui.cli import main

    res = CliRunner().invoke(main, [str(tmp_path / f"s{TITLE}.h5")])
    assert res.exit_code == 1 and "\x1b" not in res.stderr and "\x07" not in res.stderr
    assert f"s{ESCAPED}.h5' not found" in res.stderr


def _summary(store: str) -> dict:
    return {"examples": 3, "examples_this_run": 3, "tokens": 9, "device": "cpu", "wall_seconds": 1.0,
            "forward_seconds": 0.5, "method_seconds": {"rollout": 0.1}, "store": store, "store_bytes": 2000}


def test_the_run_summary_shows_a_store_path_that_looks_like_markup(monkeypatch):
    """-o 'a[/b].h5' ended in 'internal error: MarkupError' after the store was complete."""
    import compute.ui as ui

    out = io.StringIO()
    monkeypatch.setattr(ui, "Console", lambda **k: Console(file=out, width=200, color_system=None))
    ui.print_summary(_summary("/tmp/a[/b].h5"))
    ui.print_summary(_summary(f"/tmp/x{TITLE}.h5"))
    text = out.getvalue()
    assert "/tmp/a[/b].h5 (2.0 KB)" in text and f"/tmp/x{ESCAPED}.h5 (2.0 KB)" in text
    assert "\x1b" not in text and "\x07" not in text
