"""The example's two header lines (id, position, length, truncation; label, prediction, correct) and its text; for a
task other than classification the lines of render/task.py in place of label and prediction.

Like every widget here they only format what the screen hands them; they never read the store.
"""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, RenderResult
from rich.style import Style
from rich.text import Text

from ..data import LoadedExample
from ..render.task import task_lines
from ..render.tokens import printable, printable_text
from .rendered_lines import RenderedLines

_DIM = Style(dim=True)
_BOLD = Style(bold=True)


def _label_name(labels: dict[int, str], k: int | None) -> str:
    if k is None or k < 0:
        return "—"
    return printable(labels.get(int(k), str(int(k))))


class InfoPanel(RenderedLines):
    """Two lines: id, position, length, truncation; gold label, prediction with its probability, correct mark (other
    tasks: up to two lines of what the example explains, render/task.py)."""

    DEFAULT_CSS = "InfoPanel { height: 2; }"
    FITTED = False

    def show_example(self, ex: LoadedExample, labels: dict[int, str], total: int, *, monochrome: bool = False) -> None:
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(printable(ex.id), _BOLD)
        t.append(f"  {ex.index + 1}/{total}  {len(ex.tokens)} tokens", _DIM)
        if ex.truncated:
            t.append("  truncated", _BOLD if monochrome else Style(bold=True, color="yellow"))
            t.append(f" (of {ex.n_orig_tokens})", _DIM)
        t.append("\n")
        if ex.task is not None:  # another task than classification: what the example explains, in place of labels
            lines = task_lines(ex.task, ex.probs, ex.tokens, ex.gold_span, monochrome)
            t.append(Text("\n").join(lines))
            self.styles.height = 1 + len(lines)
            self.show_content(lambda width: t)
            return
        self.styles.height = 2
        t.append("label ", _DIM)
        t.append(_label_name(labels, ex.label))
        t.append("  pred ", _DIM)
        t.append(_label_name(labels, ex.pred))
        if 0 <= ex.pred < len(ex.probs):
            t.append(f" {float(ex.probs[ex.pred]):.2f}")
        good, bad = (Style(), _BOLD) if monochrome else (Style(color="green"), Style(color="red", bold=True))
        mark = {True: ("  ✓ correct", good), False: ("  ✗ wrong", bad), None: ("  · unlabelled", _DIM)}[ex.correct]
        t.append(*mark)
        self.show_content(lambda width: t)

    def show_message(self, message: str) -> None:
        text = Text(message, style=_DIM)
        self.show_content(lambda width: text)


class Clipped:
    """Text wrapped to the width and cut to ``lines`` lines, the last one ending with "…" when anything is cut."""

    def __init__(self, text: Text, lines: int):
        self.text, self.lines = text, lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(options.max_width, 2)
        wrapped = self.text.wrap(console, width)
        if len(wrapped) > self.lines:
            last = wrapped[self.lines - 1].copy()
            last.rstrip()
            last.truncate(width - 1)
            last.append("…")
            wrapped = [*wrapped[: self.lines - 1], last]
        yield Text("\n").join(wrapped)


class TextPanel(RenderedLines):
    """The example's text (and pair text), literally, cut to TEXT_LINES lines (marked "…")."""

    TEXT_LINES = 3
    FITTED = False
    DEFAULT_CSS = "TextPanel { height: auto; max-height: 3; color: $text-muted; }"

    def show_example(self, ex: LoadedExample | None) -> None:
        t = Text()
        if ex is not None:
            t.append("text ", _BOLD)
            t.append(printable_text(ex.text))
            if ex.pair is not None:
                t.append("\npair ", _BOLD)
                t.append(printable_text(ex.pair))
        clipped = Clipped(t, self.TEXT_LINES)
        self.show_content(lambda width: clipped)
