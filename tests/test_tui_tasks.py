"""attr-tui on stores of tasks other than classification (format 1.4): the task in the header, what each example
explains in place of label and prediction (target and foil words, the model's preference, the regression value and
gold, the qa spans), the marked explained position or span, the list's task columns; at 80x24, with snapshots."""

from __future__ import annotations

import numpy as np
import pytest
from rich.text import Text
from task_stores import write_task_store
from test_tui import async_test, screen_text, set_color_env, settle
from test_tui_snapshots import _run

from tui.render.task import list_cells, span_text, task_lines
from tui.render.tokens import EXPLAINED_MARK, SPAN_END_MARK


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    out = {}
    for task, name in (("masked-token", "masked.h5"), ("next-token", "next.h5"), ("qa", "qa.h5"),
                       ("regression", "regression.h5"), ("classification", "classes.h5")):
        write_task_store(root / name, task)
        out[task] = root / name
    return out


def _lines(app) -> list[str]:
    return [line.rstrip() for line in screen_text(app).splitlines()]


def _right(lines: list[str]) -> list[str]:
    """The detail pane's text of each line (right of the list's border)."""
    return [line.split("▕", 1)[1].strip() if "▕" in line else "" for line in lines]


async def _open(app, pilot, *keys):
    await settle(pilot)
    for key in keys:
        await pilot.press(key)
        await settle(pilot)
    return _lines(app)


# ---------------------------------------------------------------- Pilot
@async_test
async def test_masked_token_store_shows_words_preference_and_the_mask(stores, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch)
    app = create_app(stores["masked-token"])
    async with app.run_test(size=(80, 24)) as pilot:
        lines = await _open(app, pilot)
        right = _right(lines)
        assert app.sub_title == "3 examples · masked-token · tiny-masked-token"
        assert right[2:4] == ["target are 0.60  foil is 0.10", "✓ prefers target  logit difference +1.79"]
        assert "label" not in screen_text(app)  # no class labels for a language model task
        cells = app.query_one("#tokens").layout_data.cells
        assert [c.text for c in cells if c.text.startswith(EXPLAINED_MARK)] == [EXPLAINED_MARK + "[MASK]"]
        assert not any(SPAN_END_MARK in c.text for c in cells)
        # the list: explained output, p(target), and whether the model prefers the target
        assert lines[1].split("▕")[0].split() == ["id", "output", "p(tgt)", "len"]
        assert [line.split("▕")[0].split() for line in lines[2:5]] == [
            ["✓", "ex0", "+1.79", "0.60", "12"], ["·", "ex1", "7.50", "0.40", "8"], ["✗", "ex2", "-0.25", "0.20", "6"]]
        right = _right(await _open(app, pilot, "j"))
        assert right[2:4] == ["target wrote 0.40  foil none", "logit 7.50"]  # no foil: the target logit
        right = _right(await _open(app, pilot, "j"))
        assert right[2:4] == ["target bark 0.20  foil barks 0.40", "✗ prefers foil  logit difference -0.25"]
        assert all(len(line) <= 80 for line in lines) and len(lines) == 24


@async_test
async def test_next_token_store_marks_the_last_token(stores, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch)
    app = create_app(stores["next-token"])
    async with app.run_test(size=(80, 24)) as pilot:
        right = _right(await _open(app, pilot))
        assert "next-token" in app.sub_title
        assert right[2] == "target mat 0.60  foil moon 0.10"  # the stored " mat" without its leading space
        cells = app.query_one("#tokens").layout_data.cells
        assert cells[-1].text == EXPLAINED_MARK + "Ġthe" and sum(EXPLAINED_MARK in c.text for c in cells) == 1


@async_test
async def test_qa_store_shows_the_explained_predicted_and_gold_spans(stores, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch)
    app = create_app(stores["qa"])
    async with app.run_test(size=(80, 24)) as pilot:
        lines = await _open(app, pilot)
        right = _right(lines)
        assert app.sub_title == "2 examples · qa · tiny-qa"
        assert right[2:4] == ["span 6-7 p 0.80 0.55 denver broncos", "pred 6-7 ✓  gold 6-7 Denver Broncos"]
        assert right[4:6] == ["text who won ?", "pair the denver broncos won the game ."]
        cells = [c.text for c in app.query_one("#tokens").layout_data.cells]
        assert cells[6:8] == [EXPLAINED_MARK + "denver", "broncos" + SPAN_END_MARK]
        assert sum(EXPLAINED_MARK in c or SPAN_END_MARK in c for c in cells) == 2
        assert [line.split("▕")[0].split() for line in lines[1:4]] == [
            ["id", "span", "pred", "len"], ["·", "ex0", "6-7", "6-7", "13"], ["·", "ex1", "9-10", "10-10", "13"]]
        right = _right(await _open(app, pilot, "j"))
        assert right[2:4] == ["span 9-10 p 0.80 0.55 northern france", "pred 10-10 ✗  gold 9-10 northern France"]
        cells = [c.text for c in app.query_one("#tokens").layout_data.cells]
        assert cells[9:11] == [EXPLAINED_MARK + "northern", "france" + SPAN_END_MARK]


@async_test
async def test_regression_store_shows_value_and_gold(stores, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch)
    app = create_app(stores["regression"])
    async with app.run_test(size=(80, 24)) as pilot:
        lines = await _open(app, pilot)
        right = _right(lines)
        assert "regression" in app.sub_title
        assert right[2:4] == ["value 3.750  gold 4.000  error -0.250", "text a fine film"]
        assert [line.split("▕")[0].split() for line in lines[1:4]] == [
            ["id", "gold", "value", "len"], ["·", "ex0", "4.000", "3.750", "5"], ["·", "ex1", "—", "-0.500", "5"]]
        right = _right(await _open(app, pilot, "j"))
        assert right[2] == "value -0.500  gold —"


@async_test
async def test_a_classification_store_of_format_1_4_shows_no_task(stores, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch)
    app = create_app(stores["classification"])
    async with app.run_test(size=(80, 24)) as pilot:
        right = _right(await _open(app, pilot))
        assert app.sub_title == "2 examples · tiny-classification"
        assert right[2] == "label negative  pred positive 0.70  ✗ wrong"
        assert app.cache.get(0).task is None and app.cache.get(0).explained_end == -1


# ---------------------------------------------------------------- the renderers alone
def _plain(lines: list[Text]) -> list[str]:
    return [t.plain for t in lines]


def test_task_lines_of_each_task():
    base = {"target_token": -1, "foil_token": -1, "target_word": None, "foil_word": None, "prefers_target": None,
            "output": float("nan"), "gold_value": None, "span": None, "pred_span": None, "answer": None}
    lm = {**base, "task": "next-token", "target_token": 7, "foil_token": 9, "prefers_target": False, "output": -2.5}
    assert _plain(task_lines(lm, np.array([0.1, 0.3]), [], None)) == [
        "target #7 0.10  foil #9 0.30", "✗ prefers foil  logit difference -2.50"]  # no words stored: the token ids
    reg = {**base, "task": "regression", "output": 1.5, "gold_value": 1.0}
    assert _plain(task_lines(reg, np.array([1.5]), [], None)) == ["value 1.500  gold 1.000  error +0.500"]
    qa = {**base, "task": "qa", "span": (1, 3), "pred_span": (1, 3), "answer": "x"}
    tokens = ["[CLS]", "un", "##believ", "##able", "[SEP]"]
    assert _plain(task_lines(qa, np.array([0.5, 0.25]), tokens, None)) == [
        "span 1-3 p 0.50 0.25 unbelievable", "pred 1-3  gold — x"]  # no evidence: no gold span, no mark
    assert span_text(tokens, 0, 1) == "[CLS] un"
    newer = {**base, "task": "translation", "output": 0.5}
    assert _plain(task_lines(newer, np.array([]), [], None)) == ["translation output 0.50"]


def test_list_cells_of_each_task():
    from store.schema import index_dtype

    rows = np.zeros(3, dtype=index_dtype(2))
    rows["output"] = [1.5, -0.25, 3.0]
    rows["foil_token"] = [4, 5, -1]
    rows["probs"] = [[0.5, 0.1], [0.2, 0.3], [0.9, np.nan]]
    assert list_cells("masked-token", rows) == (["+1.50", "-0.25", "3.00"], ["0.50", "0.20", "0.90"],
                                                [True, False, None])
    rows["gold_value"] = [1.0, np.nan, -2.0]
    assert list_cells("regression", rows) == (["1.000", "—", "-2.000"], ["1.500", "-0.250", "3.000"], [None] * 3)
    rows["explain_pos"], rows["span_end"], rows["pred"], rows["pred_end"] = [1, 2, 3], [1, 4, 3], [1, 2, 0], [2, 2, 0]
    assert list_cells("qa", rows) == (["1-1", "2-4", "3-3"], ["1-2", "2-2", "0-0"], [None] * 3)


# ---------------------------------------------------------------- snapshots (pytest --snapshot-update to renew)
def test_snapshot_masked_token(snap_compare, stores, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch)
    assert snap_compare(create_app(stores["masked-token"]), terminal_size=(80, 24), run_before=_run("j", "j"))


def test_snapshot_qa_no_color(snap_compare, stores, monkeypatch):
    from tui.app import create_app

    set_color_env(monkeypatch, no_color=True)
    assert snap_compare(create_app(stores["qa"]), terminal_size=(80, 24), run_before=_run("j"))
