"""The metric interface. One subclass per file; the registry in ``compute.metrics`` finds them by name.

Each metric declares on its class everything the rest of the package asks about it: its direction, its place in
lists and tables, its papers' presets, what it needs (a model, evidence, per-class scores, a saliency method,
another store), which settings the command-line overrides may set, and the settings it takes from the run.

A metric evaluates one method's stored attributions over a list of examples read back from a store. Metrics that
perturb inputs call a :class:`Predictor`, which runs the model on many token sequences at once (all levels of all
examples of a call go through the model together, length-sorted and chunked), so a metric builds every perturbed
sequence of its examples first and makes one call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import numpy as np


@dataclass
class EvalExample:
    """One stored example, as the metrics see it. Per-token arrays are aligned with ``token_ids``."""

    index: int  # row of the example in the store
    id: str
    token_ids: np.ndarray  # [n] int64, special tokens included
    special: np.ndarray  # [n] bool: [CLS], [SEP], <s>, </s> ... (the tokenizer's special tokens)
    scores: np.ndarray  # [n] float64: the method's final attribution
    label: int  # gold class, -1 when the dataset has none
    pred: int  # the model's predicted class on the unperturbed input
    explain_pos: int  # the explained position ([CLS])
    class_scores: np.ndarray | None = None  # [C, n] per-class attributions (stores made with --target all)
    other_scores: dict = field(default_factory=dict)  # name -> [n]: other methods of the store (spearman)
    evidence: np.ndarray | None = None  # [n] bool: evidence / answer tokens, when the dataset gives them
    # The same example and method in another store (robustness across seeds: jaccard_25, seed_spearman); the
    # caller pairs examples by id and only where both stores hold the same tokens.
    paired_scores: np.ndarray | None = None  # [n]
    paired_pred: int | None = None
    # Word-prediction tasks (masked-token, next-token): the explained target and foil tokens (-1: none); the
    # Predictor reads their probabilities at the explained position of each perturbed sequence.
    target_token: int = -1
    foil_token: int = -1


class Predictor(Protocol):
    """Runs the model. ``sequences``: token id arrays (any lengths); ``attend``: per sequence a bool array of the
    positions the model attends to (None: all of them). Token type ids are not passed (the reference code of all
    the papers leaves them out). Returns softmax probabilities [R, C] as float64."""

    def __call__(self, sequences: list[np.ndarray], attend: list[np.ndarray] | None = None,
                 where: np.ndarray | None = None) -> np.ndarray: ...
    # ``where`` [R, 3] (word-prediction tasks only): per sequence the explained position, target and foil token;
    # the probabilities are then [p(target), p(foil) or NaN] at that position.


@dataclass
class MetricResult:
    """values: [E] one number per example (NaN where the metric is undefined for it, e.g. too short);
    curves: [E, K] the per-level quantity (probabilities, or log-odds) the value was computed from, NaN-padded;
    levels: [E, K] the level of each curve point (number of perturbed tokens), -1 padded;
    steps: [S] a generation store's value per step (values: each example's mean over its steps), None elsewhere."""

    values: np.ndarray
    curves: np.ndarray | None = None
    levels: np.ndarray | None = None
    steps: np.ndarray | None = None


@dataclass(frozen=True)
class MetricContext:
    """What a run offers a metric's settings (see :meth:`Metric.context_settings`)."""

    pad_id: int  # the tokenizer's pad token (0 without one)
    mask_id: int | None  # its mask token, None without one
    saliency: str  # --saliency
    k: int  # --precision-k
    signed: bool  # whether the evaluated method's scores are signed
    task: str = "classification"  # the store's task (compute.tasks)


class Metric:
    name: ClassVar[str]
    description: ClassVar[str]
    reference: ClassVar[str]
    higher_is_better: ClassVar[bool]
    order: ClassVar[int]  # place in lists, tables and reports (the registry is sorted by it)
    # {paper preset name (compute/papers.py): settings of that paper's variant}; name@preset picks one
    presets: ClassVar[dict[str, dict]] = {}
    # settings that --perturbation, --levels, --metric-class (cls) and --side may set
    overridable: ClassVar[tuple[str, ...]] = ()
    needs_model: ClassVar[bool] = False  # perturbs inputs and calls the Predictor
    needs_evidence: ClassVar[bool] = False  # reads EvalExample.evidence (a store made with --evidence-column)
    needs_class_scores: ClassVar[bool] = False  # per-class scores of class-specific methods (--target all)
    needs_saliency: ClassVar[bool] = False  # the --saliency method's scores in the same store
    needs_other_store: ClassVar[bool] = False  # the same methods in a second store (--other)

    @classmethod
    def context_settings(cls, ctx: MetricContext) -> dict:
        """Settings taken from the run (token ids, --saliency, --precision-k, the method's sign); a preset's or an
        override's value wins over them."""
        return {}

    def __init__(self, **settings):
        self.settings = settings

    def evaluate(self, examples: list[EvalExample], predictor: Predictor | None) -> MetricResult:
        raise NotImplementedError

    def summary(self, result: MetricResult) -> dict:
        """Dataset-level numbers: by default mean, std and count of the finite per-example values."""
        v = np.asarray(result.values, dtype=np.float64)
        v = v[np.isfinite(v)]
        return {"mean": float(v.mean()) if v.size else float("nan"),
                "std": float(v.std()) if v.size else float("nan"), "n": int(v.size)}
