"""The task interface: what a run explains, shared by the whole pipeline (DESIGN: one declaration per concept).

A task says which Hugging Face head it runs (the Auto class, the model classes it accepts), what it reads from the
data per example (``prepare``: target and foil tokens, gold spans and values), which output(s) of a batch the methods
explain (``parts``: the explained position, where the output vector is read, the target and the foil), and what the
store records of the prediction (``outcome``). A task with two explained outputs (qa: the answer's start and end)
has two parts; the methods run once per part and their maps are added, as the references do (start map + end map).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from ..errors import AttrscopeError, UsageError
from ..padding import to_device
from .readout import Readout, explained


@dataclass
class Part:
    """One explained output of a batch."""

    explain_pos: torch.Tensor  # [B] the position whose row the methods explain
    readout: Readout  # where the output vector [B, C] is read off the model's output
    target: torch.Tensor  # [B] index into that vector
    foil: torch.Tensor | None = None  # [B] a second index subtracted from the target's (-1: none), or None


@dataclass
class TaskRows:
    """What the task read from the data, one entry per tokenised example (aligned with Tokenized)."""

    label: list[int]  # class index (-1: none)
    position: list[int] = field(default_factory=list)  # explained position fixed by the data (-1: the model's rule)
    target_token: list[int] = field(default_factory=list)  # -1: the model's own prediction
    foil_token: list[int] = field(default_factory=list)  # -1: no foil
    gold_span: list[tuple[int, int]] = field(default_factory=list)  # qa: token span of the gold answer, (-1, -1)
    gold_value: list[float] = field(default_factory=list)  # regression gold, NaN
    context: list[tuple[int, int]] = field(default_factory=list)  # qa: first and last context token, (-1, -1)
    info: list[dict] = field(default_factory=list)  # per-example words for the store (JSON)

    @classmethod
    def plain(cls, labels: list[int]) -> "TaskRows":
        n = len(labels)
        return cls(label=list(labels), position=[-1] * n, target_token=[-1] * n, foil_token=[-1] * n,
                   gold_span=[(-1, -1)] * n, gold_value=[float("nan")] * n, context=[(-1, -1)] * n,
                   info=[{} for _ in range(n)])

    def take(self, rows: list[int]) -> "TaskRows":
        return TaskRows(**{k: [getattr(self, k)[i] for i in rows] for k in self.__dataclass_fields__})


@dataclass
class Outcome:
    """A batch's prediction as the store keeps it ([B] each; probs [B, K] with K = len(Task.labels)): tensors on
    the model's device (the runner copies them to the host with the batch's results, without waiting for them
    here) or numpy arrays."""

    pred: np.ndarray
    probs: np.ndarray
    target: np.ndarray  # the probs column the explained output reads (the class, or 0)
    explain_pos: np.ndarray
    output: np.ndarray  # F of the unperturbed model
    target_token: np.ndarray
    foil_token: np.ndarray
    span_end: np.ndarray
    pred_end: np.ndarray


class Task:
    name: ClassVar[str]
    description: ClassVar[str]
    auto_class: ClassVar[str]  # the transformers Auto class that loads the model
    class_suffixes: ClassVar[tuple[str, ...]]  # model class names it runs, by ending
    target_modes: ClassVar[tuple[str, ...]] = ("predicted", "label")  # --target values that mean something here
    # The task each explained output is, as the adapters and the methods' task checks see it (a generation's steps
    # are next-token outputs); None: this task itself.
    explains_as: ClassVar[str | None] = None

    @property
    def explained_task(self) -> str:
        return self.explains_as or self.name

    def __init__(self, **options):
        self.options = options  # recorded in the store (e.g. regression_rank)

    def check_model(self, model) -> None:
        cls = type(model).__name__
        if not cls.endswith(self.class_suffixes):
            raise AttrscopeError(f"--task {self.name} needs a *{self.class_suffixes[0]} model, not {cls}: pass such a "
                                 "checkpoint, or the --task its head is for")

    def check_target_mode(self, mode: str) -> None:
        if mode not in self.target_modes:
            raise UsageError(f"--target {mode} has no meaning for --task {self.name}: use "
                             + " or ".join(self.target_modes))

    def labels(self, id2label: dict[int, str]) -> dict[int, str]:
        """Names of the probability columns the store keeps per example."""
        raise NotImplementedError

    def prepare(self, lm, records, tok) -> TaskRows:
        return TaskRows.plain([r.label for r in records])

    def check_rows(self, rows: TaskRows, records, target_mode: str) -> None:
        """One-line errors for data the chosen --target cannot use (checked before anything runs)."""

    def parts(self, cap, rows: TaskRows, target_mode: str) -> list[Part]:
        raise NotImplementedError

    def outcome(self, cap, parts: list[Part], rows: TaskRows) -> Outcome:
        raise NotImplementedError


def long_tensor(values, device) -> torch.Tensor:
    """A long tensor of host ``values`` on ``device``: to a GPU from pinned memory without blocking, so the host
    does not wait there for the kernels queued before (a plain copy from a list would)."""
    return to_device(torch.as_tensor(values, dtype=torch.long), device)


def none_like(t: torch.Tensor) -> np.ndarray:
    return np.full(t.shape[0], -1, dtype=np.int64)


def output_of(cap, part: Part) -> torch.Tensor:
    """F [B] of the unperturbed model for one part."""
    return explained(part.readout(cap.output, part.explain_pos).float(), part.target, part.foil)
