"""What the store is given to write, at the numpy level: examples with their method results, method layouts, head
masks and metrics (compute fills these from its own objects; store/ never sees a tensor)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class MethodLayout:
    """What the store keeps for one method (numpy-level description; compute fills it from its method classes)."""

    name: str
    signed: bool
    n_layer_views: int = 0  # V: rows of layer_scores per example (0: none)
    matrices: str = "none"  # "none" | "cls" | "all"
    n_matrix_layers: int = 0  # L of the per-layer matrices
    class_scores: bool = False
    example_values: tuple[str, ...] = ()  # per-example scalars (e.g. the completeness delta of integrated gradients)
    description: str = ""
    params: dict = field(default_factory=dict)
    steps: bool = False  # one row per generated token (a generation store's methods, 2.0: set by the store itself)


@dataclass
class HeadMaskData:
    """One [L, H] head mask with the statistics it came from (Mask-LRP, METHODS.md 6.1).

    ``arrays`` are stored as datasets beside the mask (counts, rates, thresholds, ...); ``attrs`` are JSON-able
    settings and provenance (thresholds, parser, dataset, number of examples)."""

    name: str
    mask: np.ndarray  # [L, H]
    arrays: dict = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)


@dataclass
class MetricData:
    """One metric of one method over every example of a store (rows aligned with /examples/index)."""

    method: str
    name: str
    values: np.ndarray  # [N] per-example values (NaN: undefined for that example)
    settings: dict  # the metric's exact settings (JSON-able)
    summary: dict  # dataset-level numbers (mean, std, n, ...)
    higher_is_better: bool
    description: str = ""
    curves: np.ndarray | None = None  # [N, K] per-level values (probabilities, log-odds ...), NaN-padded
    levels: np.ndarray | None = None  # [N, K] the level of each curve point (perturbed tokens), -1 padded
    # A generation store's value per generated token (format 2.1): [S] in the store's step order (example i's at its
    # step_off); ``values`` are then each example's mean over its steps. None: not kept.
    steps: np.ndarray | None = None


@dataclass
class ExampleData:
    """One example ready to commit. Arrays are unpadded and aligned with ``token_ids``."""

    row: int
    id: str
    text: str
    pair: str | None
    token_ids: np.ndarray  # [n] int
    tokens: list[str]
    spans: np.ndarray  # [n, 2] int
    segment: np.ndarray  # [n] int
    label: int
    pred: int
    probs: np.ndarray  # [C]
    target: int
    explain_pos: int
    n_orig_tokens: int
    truncated: bool
    evidence: np.ndarray | None = None  # [n] bool: evidence / answer tokens (stores made with --evidence-column)
    # The task (format 1.4; the defaults are a classification example's): docs/store.md
    target_token: int = -1  # language model tasks: token id of the explained target word
    foil_token: int = -1  # language model tasks: token id of the foil word (-1: no foil)
    span_end: int = -1  # qa: end position of the explained answer span (explain_pos is its start)
    pred_end: int = -1  # qa: the model's predicted end position (pred is its start)
    output: float = math.nan  # the explained output of the unperturbed model
    gold_value: float = math.nan  # regression: the gold value (NaN: unlabelled)
    task_info: dict | None = None  # the task words, JSON-able: {"target": .., "foil": ..}, {"answer": ..}
    heads: np.ndarray | None = None  # per-head attention (stores made with --heads): [L, H, n, n] or the row [L, H, n]
    results: dict = field(default_factory=dict)  # method name -> {"scores": [n], "layer_scores": [V, n], "matrices": [L, n|1, n], "class_scores": [C, n],
    #                                "example_values": {key: float}}
    # A generation store's example (task "generate", 2.0; docs/store.md): token_ids are the prompt's prompt_len tokens,
    # then the T = n - prompt_len generated ones; per step t (the token at prompt_len + t) the values below, and
    # results[m] = {"step_scores": [T, n], "step_layer_scores": [T, V, n], "matrices": as above,
    # "example_values": {key: [T]}}, where row t's cells from prompt_len + t on are not attributions (stored as NaN).
    prompt_len: int = -1
    step_probs: np.ndarray | None = None  # [T] p(generated token t) at its step
    step_outputs: np.ndarray | None = None  # [T] the explained output of each step (None: NaN)
    step_foil_tokens: np.ndarray | None = None  # [T] the foil token id of each step, -1 without one (None: none)
    step_foil_probs: np.ndarray | None = None  # [T] p(foil), NaN without one (None: none)


def layout_from_dict(d: dict) -> MethodLayout:
    return MethodLayout(**{**d, "example_values": tuple(d.get("example_values", ()))})
