"""Stage 5, methods: make the methods of the plan for the loaded model, and run one batch through the model's
forward pass and every method."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import AttrscopeError
from ..methods import Method, get_method
from ..models import LoadedModel
from .plan import RunPlan
from .progress import Progress


def make_methods(plan: RunPlan, lm: LoadedModel, progress: Progress) -> dict[str, Method]:
    """The plan's methods with their parameters; under --methods all, those undefined for the architecture are
    skipped with a message, a method named explicitly but undefined is one error line."""
    methods = {name: get_method(name, **plan.method_params[name]) for name in plan.method_names}
    if plan.every_method:
        skipped = [name for name, m in methods.items() if not _defined(m, lm.adapter)]
        methods = {name: m for name, m in methods.items() if name not in skipped}
        if skipped:
            progress.message(f"--methods all: skipping {', '.join(skipped)}, not defined for the "
                             f"{lm.info['model_type']} architecture (METHODS.md section 9)")
    for m in methods.values():
        m.check_architecture(lm.adapter)
    return methods


def _defined(method: Method, adapter) -> bool:
    try:
        method.check_architecture(adapter)
        return True
    except AttrscopeError:
        return False


@dataclass
class Timings:
    forward: float = 0.0
    methods: dict[str, float] = field(default_factory=dict)  # seconds per method


@dataclass
class BatchOutput:
    """One batch's results as numpy arrays, padded: per method its arrays (scores [B, n], layer_scores [B, V, n],
    matrices [B, L, n, n], class_scores [B, C, n]) and per-example values [B]."""

    results: dict[str, dict[str, np.ndarray]]
    values: dict[str, dict[str, np.ndarray]]
    probs: np.ndarray  # [B, C]
    pred: np.ndarray  # [B]
    target: np.ndarray  # [B]: the class explained
    explain_pos: np.ndarray  # [B]


@torch.no_grad()
def run_batch(lm: LoadedModel, methods: dict[str, Method], enc: dict[str, torch.Tensor], labels: list[int],
              target_mode: str, num_labels: int, keep_matrices: bool, timings: Timings) -> BatchOutput:
    device = enc["input_ids"].device
    needs = frozenset().union(*(m.needs for m in methods.values())) if methods else frozenset()
    _sync(device)
    t0 = time.perf_counter()
    cap = lm.adapter.capture(enc, needs)
    cap.passes = frozenset().union(*(m.passes for m in methods.values()))  # LRP tensors only for LRP methods
    _sync(device)
    timings.forward += time.perf_counter() - t0

    pred = cap.pred
    if target_mode == "label":
        target = torch.as_tensor(labels, dtype=torch.long, device=device)
    else:
        target = pred  # "predicted"; with "all" the final scores explain the predicted class
    results: dict[str, dict[str, np.ndarray]] = {}
    values: dict[str, dict[str, np.ndarray]] = {}  # per-example scalars [B] (Method.example_values)
    for name, m in methods.items():
        t0 = time.perf_counter()
        out = {}
        if m.class_specific and target_mode == "all":
            # every class first: methods that cache per target (integrated gradients) then read the predicted
            # class's result off them instead of computing it again
            out["class_scores"] = m.compute_classes(cap, lm.adapter, num_labels)
        res = m.compute(cap, lm.adapter, target)
        out["scores"] = res.scores
        if res.layer_scores is not None:
            out["layer_scores"] = res.layer_scores
        if res.matrices is not None and keep_matrices:
            out["matrices"] = res.matrices
        results[name] = {k: v.detach().float().cpu().numpy() for k, v in out.items()}
        values[name] = {k: v.detach().float().cpu().numpy() for k, v in (res.example_values or {}).items()}
        _sync(device)
        timings.methods[name] = timings.methods.get(name, 0.0) + time.perf_counter() - t0
    return BatchOutput(results=results, values=values, probs=cap.probs.cpu().numpy(), pred=pred.cpu().numpy(),
                       target=target.cpu().numpy(), explain_pos=cap.explain_pos.cpu().numpy())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
