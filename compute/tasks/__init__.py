"""Tasks, looked up by name (``--task``), and the detection of a model's task from its head."""

from __future__ import annotations

from ..errors import AttrscopeError
from .base import Outcome, Part, Task, TaskRows
from .classification import Classification
from .generate import Generate
from .masked_token import MaskedToken
from .next_token import NextToken
from .qa import QuestionAnswering
from .regression import Regression

TASKS: dict[str, type[Task]] = {t.name: t for t in (Classification, Regression, MaskedToken, NextToken,
                                                       QuestionAnswering, Generate)}


def detect_task(config) -> str:
    """The task of a checkpoint's head, read off its config's ``architectures`` (what save_pretrained records) and,
    for sequence heads, the number of outputs: one output (or problem_type regression) is regression."""
    archs = list(getattr(config, "architectures", None) or [])
    found = {name for arch in archs for name, task in TASKS.items()
             if name not in ("regression", "generate") and arch.endswith(task.class_suffixes)}
    if len(found) != 1:
        what = ", ".join(archs) if archs else "no architectures in its config"
        raise AttrscopeError(f"cannot tell the model's task from its head ({what}): pass --task "
                             + "|".join(TASKS))
    (name,) = found
    if name == "classification" and (int(getattr(config, "num_labels", 2)) == 1
                                     or getattr(config, "problem_type", None) == "regression"):
        return "regression"
    return name


def get_task(name: str, **options) -> Task:
    return TASKS[name](**options)


__all__ = ["TASKS", "Task", "TaskRows", "Part", "Outcome", "detect_task", "get_task"]
