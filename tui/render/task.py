"""The lines that say what an example of a task other than classification explains (pure: no Textual, no HDF5).

Language model tasks (masked-token, next-token): the target and foil words with their probabilities, and whether
the model prefers the target (the explained output is the target logit minus the foil logit). Regression: the
model's value and the gold value. qa: the explained answer span with its start and end probabilities, the predicted
span and the gold span (the evidence tokens), with a mark for whether the prediction is the gold span.
"""

from __future__ import annotations

import math

from rich.style import Style
from rich.text import Text

from .tokens import printable

DIM = Style(dim=True)
BOLD = Style(bold=True)


def marks(monochrome: bool) -> tuple[Style, Style]:
    """Styles of a right and a wrong mark: without colour the glyph shapes (✓ ✗) alone tell them apart."""
    return (Style(), BOLD) if monochrome else (Style(color="green"), Style(color="red", bold=True))


def _number(v: float | None, digits: int = 2) -> str:
    if v is None or not math.isfinite(v):
        return "—"
    return f"{v:.{digits}f}" if abs(v) < 1e4 else f"{v:.3g}"


def _signed(v: float) -> str:
    return ("+" if v > 0 else "") + _number(v)


def _word(word: str | None, token_id: int) -> str:
    """A target or foil word as stored, else its token id."""
    if word is not None:
        return printable(word.strip()) or printable(word)
    return f"#{token_id}" if token_id >= 0 else "—"


def span_text(tokens: list[str], start: int, end: int) -> str:
    """Tokens start..end (inclusive) as one string: a WordPiece "##" continuation joined to the piece before it."""
    out = ""
    for tok in tokens[max(start, 0):end + 1]:
        if tok.startswith("##") and len(tok) > 2 and out:
            out += printable(tok[2:])
        else:
            out += (" " if out else "") + printable(tok)
    return out


def _span(span: tuple[int, int] | None) -> str:
    return "—" if span is None or span[0] < 0 else f"{span[0]}-{span[1]}"


def task_lines(task: dict, probs, tokens: list[str], gold_span: tuple[int, int] | None,
               monochrome: bool = False) -> list[Text]:
    """The lines under the example's first header line (in place of label and prediction) for ``task`` (a store
    Example's task_info)."""
    name = task["task"]
    good, bad = marks(monochrome)
    p = [float(x) for x in probs]
    if name in ("masked-token", "next-token"):
        words = Text()
        words.append("target ", DIM)
        words.append(_word(task["target_word"], task["target_token"]), BOLD)
        words.append(f" {_number(p[0])}" if p else "")
        words.append("  foil ", DIM)
        if task["foil_token"] >= 0:
            words.append(_word(task["foil_word"], task["foil_token"]), BOLD)
            words.append(f" {_number(p[1])}" if len(p) > 1 else "")
        else:
            words.append("none")
        verdict = Text()
        prefers = task["prefers_target"]
        if prefers is None:  # no foil: the explained output is the target logit
            verdict.append("logit ", DIM)
            verdict.append(_number(task["output"]))
        else:
            verdict.append("✓ prefers target" if prefers else "✗ prefers foil", good if prefers else bad)
            verdict.append("  logit difference ", DIM)
            verdict.append(_signed(task["output"]))
        return [words, verdict]
    if name == "regression":
        line = Text()
        line.append("value ", DIM)
        line.append(_number(task["output"], 3), BOLD)
        line.append("  gold ", DIM)
        gold = task["gold_value"]
        line.append(_number(gold, 3))
        if gold is not None and math.isfinite(task["output"]):
            line.append("  error ", DIM)
            line.append(("+" if task["output"] > gold else "") + _number(task["output"] - gold, 3))
        return [line]
    if name == "qa":
        span, pred = task["span"], task["pred_span"]
        explained = Text()
        explained.append("span ", DIM)
        explained.append(_span(span), BOLD)
        if len(p) > 1:
            explained.append(f" p {_number(p[0])} {_number(p[1])}", DIM)
        explained.append(" " + span_text(tokens, *span))
        answer = Text()
        answer.append("pred ", DIM)
        answer.append(_span(pred), BOLD)
        if gold_span is not None:
            right = tuple(pred) == tuple(gold_span)
            answer.append(" ✓" if right else " ✗", good if right else bad)
        answer.append("  gold ", DIM)
        answer.append(_span(gold_span))
        if task.get("answer"):
            answer.append(" " + printable(task["answer"]))
        return [explained, answer]
    if name == "generate":  # the step the views show (LoadedExample.at_step)
        return generation_lines(task, len(tokens))
    # a task of a newer format: its name and output
    line = Text()
    line.append(f"{printable(name)} output ", DIM)
    line.append(_number(task.get("output")))
    return [line]


def generation_lines(task: dict, n: int) -> list[Text]:
    """A generation example at one step: the step, its target token with its probability and the foil (with
    --contrast); then the explained output and the prompt's and the continuation's lengths."""
    step = Text(no_wrap=True, overflow="ellipsis")
    more = Text(no_wrap=True, overflow="ellipsis")
    T, P = task.get("n_steps", 0), task.get("prompt_len", n)
    if task.get("step", -1) < 0:
        step.append("no generated tokens (EOS first)", DIM)
        more.append(f"prompt {n} tokens", DIM)
        return [step, more]
    step.append(f"<step {task['step'] + 1}/{T}> ", DIM)  # < and > move it
    step.append(f"▸{printable(task['target_word'])}", BOLD)
    step.append(f" p {_number(task['prob'])}")
    foil = task["foil_token"] >= 0
    if foil:
        step.append(" vs ", DIM)
        step.append(_word(task["foil_word"], task["foil_token"]), BOLD)
        step.append(f" {_number(task['foil_prob'])}")
    more.append("logit diff. " if foil else "logit ", DIM)
    more.append(_signed(task["output"]) if foil else _number(task["output"]))
    more.append(f"  prompt {P} + {T} generated", DIM)
    return [step, more]


# ---------------------------------------------------------------------------------------------- the example list
#: The example list's two value columns per task (classification: label and prediction, by the list itself).
LIST_HEADS = {"masked-token": ("output", "p(tgt)"), "next-token": ("output", "p(tgt)"),
              "regression": ("gold", "value"), "qa": ("span", "pred"), "generate": ("prompt", "steps")}
OTHER_TASK_HEADS = ("output", "")  # a task of a newer format


def list_cells(task: str, rows) -> tuple[list[str], list[str], list[bool | None]]:
    """The list's two columns of LIST_HEADS and its mark for index rows ``rows`` (store.schema.index_dtype) of a
    task other than classification. Language model tasks: the explained output (target minus foil logit), p(target)
    and ✓ / ✗ for whether the model prefers the target (· without a foil); regression: the gold and the model's
    value (no mark); qa: the explained and the predicted span (no mark: the gold span is in the tokens)."""
    n = len(rows)
    if task in ("masked-token", "next-token"):
        out = [float(v) for v in rows["output"]]
        first = [_signed(v) if f >= 0 else _number(v) for v, f in zip(out, rows["foil_token"].tolist())]
        second = [_number(float(p)) for p in rows["probs"].reshape(n, -1)[:, 0]]
        mark = [None if f < 0 or not math.isfinite(v) else v > 0 for v, f in zip(out, rows["foil_token"].tolist())]
        return first, second, mark
    if task == "regression":
        return ([_number(float(v), 3) for v in rows["gold_value"]], [_number(float(v), 3) for v in rows["output"]],
                [None] * n)
    if task == "generate":  # the prompt's tokens and the generated ones
        return ([str(int(v)) for v in rows["prompt_len"]], [str(int(v)) for v in rows["n_steps"]], [None] * n)
    if task == "qa":
        return ([_span((int(a), int(b))) for a, b in zip(rows["explain_pos"], rows["span_end"])],
                [_span((int(a), int(b))) for a, b in zip(rows["pred"], rows["pred_end"])], [None] * n)
    return [_number(float(v)) for v in rows["output"]], ["—"] * n, [None] * n
