"""One declaration per concept: the papers (compute/papers.py) against the CLI's --preset choices, the run presets,
the metric presets and the report tables; the metric registry (declared on the metric classes) against the metric
table of docs/cli.md (moved there from the README, issue 38), the TUI's order and the checks evaluate.py makes."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from compute import papers
from compute.cli import main
from compute.metrics import REGISTRY, Metric, preset_names

CLI_DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"  # attr-compute's synopsis and the metric table


def _choices(command: str, option: str) -> list[str]:
    cmd = main.commands[command]
    (param,) = [p for p in cmd.get_params(click.Context(cmd)) if p.name == option]  # run's come from declarations
    assert isinstance(param.type, click.Choice)
    return list(param.type.choices)


def test_the_cli_presets_are_the_papers():
    assert _choices("run", "preset") == _choices("eval", "preset") == list(papers.PRESET_NAMES)
    synopsis = re.search(r"\[--preset ([a-z|]+)\]", CLI_DOC.read_text(encoding="utf-8")).group(1)
    assert synopsis.split("|") == list(papers.PRESET_NAMES)


def test_run_presets_come_from_the_papers_module():
    from compute.methods import REGISTRY as METHODS
    from compute.run import plan

    assert plan.PRESETS is papers.PRESETS and list(papers.PRESETS) == list(papers.PRESET_NAMES)
    for name, run in papers.PRESETS.items():
        assert run["target"] in ("predicted", "label"), name
        assert set(run["methods"]) <= set(METHODS), name


def test_metric_presets_are_papers_and_the_report_tables_match_them():
    from compute.methods import REGISTRY as METHODS

    assert set(preset_names()) <= set(papers.PRESET_NAMES)
    tables = 0
    for name, paper in papers.PAPERS.items():
        for t in paper.tables:
            tables += 1
            assert t["metric"] in REGISTRY, t["paper"]
            # a table's metric variant is its own paper's preset of that metric, or the metric's default
            assert t["preset"] in (None, name) and (t["preset"] is None or t["preset"] in REGISTRY[t["metric"]].presets)
            assert t["claim"] in t["values"] and set(t["values"]) <= set(METHODS), t["paper"]
            # the claim is the table's best value in the metric's direction (the report says "the paper ranks it
            # first")
            pick = max if REGISTRY[t["metric"]].higher_is_better else min
            assert pick(t["values"], key=t["values"].get) == t["claim"], t["paper"]
    assert papers.REPORT_TABLES == [t for p in papers.PAPERS.values() for t in p.tables] and tables == 11


def test_the_cli_perturbation_choices_are_the_metrics():
    from compute.metrics.perturbation import LEVEL_CHOICES

    for option, setting in (("levels", "levels"), ("perturbation", "perturbation"), ("side", "side"),
                            ("metric_class", "cls")):
        assert _choices("eval", option) == list(LEVEL_CHOICES[setting]), option
        assert _choices("run", option) == list(LEVEL_CHOICES[setting]), option


def test_report_finds_a_papers_variant_by_its_settings():
    from compute.report import _find

    alti_comp = papers.PAPERS["alti"].tables[0]
    eraser = {"comprehensiveness": {"settings": {"variant": "eraser", "preset": None}}}
    alti = {"comprehensiveness": {"settings": {"variant": "alti", "preset": None}}}
    assert _find(eraser, alti_comp) is None and _find(alti, alti_comp) == "comprehensiveness"
    aopc = papers.PAPERS["attcat"].tables[0]
    assert _find({"aopc@attcat": {"settings": {"preset": "attcat", "metric": "aopc"}}}, aopc) == "aopc@attcat"
    assert _find({"aopc@masklrp": {"settings": {"preset": "masklrp", "metric": "aopc"}}}, aopc) is None


# --- the metric registry ------------------------------------------------------------------------------------------


def _readme_metric_rows() -> list[tuple[list[str], str, str]]:
    """(metric names, better arrow, presets cell) of docs/cli.md's metric table."""
    text = CLI_DOC.read_text(encoding="utf-8")
    table = text[text.index("| metric | what | better | presets |"):]
    rows = []
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        rows.append((re.findall(r"`([a-z_0-9]+)`", cells[0]), cells[2], cells[3]))
    return rows


def test_the_docs_metric_table_is_the_registry():
    rows = _readme_metric_rows()
    assert [n for names, _, _ in rows for n in names] == list(REGISTRY)  # every metric, once, in order
    for names, better, presets in rows:
        for n in names:
            m = REGISTRY[n]
            assert better == ("↑" if m.higher_is_better else "↓"), n
            if presets == "—":
                assert not m.presets, n
            else:  # "as `aopc`" names another metric's presets
                same_as = re.match(r"as `([a-z_]+)`", presets)
                listed = (set(REGISTRY[same_as.group(1)].presets) if same_as
                          else set(re.findall(r"`([a-z]+)`", presets)) & set(papers.PRESET_NAMES))
                assert listed == set(m.presets), n


def test_every_metric_declares_itself_and_the_registry_follows_the_order():
    orders = [m.order for m in REGISTRY.values()]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)
    for name, m in REGISTRY.items():
        assert m.name == name and isinstance(m.higher_is_better, bool) and m.description and m.reference
        assert set(m.overridable) <= {"perturbation", "levels", "cls", "side"}


def test_the_tui_lists_metrics_in_the_registrys_order():
    from tui.data import METRIC_ORDER  # the TUI reads through store/ only, so it keeps its own copy

    assert list(METRIC_ORDER) == list(REGISTRY)


class _Fake(Metric):
    name = "fake_metric"
    description = "a made-up metric"
    reference = "tests"
    higher_is_better = True
    order = 999
    presets = {"attcat": {"side": "bottom"}}
    overridable = ("side",)
    needs_other_store = True

    @classmethod
    def context_settings(cls, ctx):
        return {"k": ctx.k, "side": "top"}


def test_evaluate_reads_what_a_metric_needs_from_its_class(monkeypatch):
    from types import SimpleNamespace

    from compute import evaluate
    from compute.errors import UsageError

    monkeypatch.setitem(REGISTRY, "fake_metric", _Fake)
    specs = evaluate.parse_metric_specs("fake_metric@attcat")
    cfg = evaluate.EvalConfig(metrics="fake_metric@attcat", k=7, overrides={"levels": "tenths", "side": None})
    with pytest.raises(UsageError, match="fake_metric compares two stores"):
        evaluate._check_needs(SimpleNamespace(methods=["m"], generation=False), specs, cfg, ["m"], "s.h5")
    tok = SimpleNamespace(pad_token_id=0, mask_token_id=None)
    # the preset wins over the run's value; levels is not the metric's to override
    assert evaluate._settings("fake_metric", "attcat", cfg, tok, True) == {"side": "bottom", "k": 7}
    cfg.overrides["side"] = "top"
    assert evaluate._settings("fake_metric", "attcat", cfg, tok, True)["side"] == "top"
    with pytest.raises(UsageError, match="no preset 'masklrp': choose from attcat"):
        evaluate.parse_metric_specs("fake_metric@masklrp")
    with pytest.raises(UsageError, match="no preset 'attcat'"):
        evaluate.parse_metric_specs("kendall@attcat")
