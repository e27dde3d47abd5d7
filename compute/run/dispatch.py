"""Stage 5, methods: make the methods of the plan for the loaded model, and run one batch through the model's
forward pass and every method."""

from __future__ import annotations

import functools
import operator
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ..errors import AttrscopeError
from ..methods import Method, get_method
from ..adapters import Captured
from ..models import LoadedModel
from ..tasks import Outcome, Part, TaskRows
from ..options import DEFAULT_BATCH_SIZE
from .batches import Tokenized, encode
from .plan import RunPlan
from .progress import Progress

CPU_AUTO_BATCH_SIZE = DEFAULT_BATCH_SIZE  # --batch-size auto on CPU: memory is not probed there
AUTO_BATCH_LIMIT = 1024  # the largest batch --batch-size auto tries


def make_methods(plan: RunPlan, lm: LoadedModel, progress: Progress) -> dict[str, Method]:
    """The plan's methods with their parameters; under --methods all, those undefined for the architecture are
    skipped with a message, a method named explicitly but undefined is one error line."""
    methods = {name: get_method(name, **plan.method_params[name]) for name in plan.method_names}
    if plan.every_method:
        skipped = [name for name, m in methods.items() if not _defined(m, lm.adapter)]
        methods = {name: m for name, m in methods.items() if name not in skipped}
        if skipped:
            progress.message(f"--methods all: skipping {', '.join(skipped)}, not defined for the "
                             f"{lm.info['model_type']} architecture (METHODS.md section 9) or --task {lm.task.name}")
    for m in methods.values():
        m.check_task(lm.task.name)
        m.check_architecture(lm.adapter)
    return methods


def _defined(method: Method, adapter) -> bool:
    try:
        method.check_task(adapter.task)
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
    matrices [B, L, n, n], class_scores [B, C, n]) and per-example values [B], and the task's outcome (the
    prediction, its probabilities, the explained position and output, target and foil tokens, spans)."""

    results: dict[str, dict[str, np.ndarray]]
    values: dict[str, dict[str, np.ndarray]]
    outcome: Outcome


@torch.no_grad()
def run_batch(lm: LoadedModel, methods: dict[str, Method], enc: dict[str, torch.Tensor], rows: TaskRows,
              target_mode: str, num_labels: int, keep_matrices: bool, timings: Timings) -> BatchOutput:
    """The forward pass and every method on one batch; ``rows``: what the task read of these examples. A task with
    several explained outputs (qa: start and end) runs every method once per output and adds the maps."""
    device = enc["input_ids"].device
    needs = frozenset().union(*(m.needs for m in methods.values())) if methods else frozenset()
    _sync(device)
    t0 = time.perf_counter()
    cap = lm.adapter.capture(enc, needs)
    cap.passes = frozenset().union(*(m.passes for m in methods.values()))  # LRP tensors only for LRP methods
    parts = lm.task.parts(cap, rows, target_mode)
    outcome = lm.task.outcome(cap, parts, rows)
    _sync(device)
    timings.forward += time.perf_counter() - t0

    caps = [explaining(cap, part, fresh=len(parts) > 1) for part in parts]
    cap.output = None  # a language model's [B, n, V] logits are not kept while the methods run
    results: dict[str, dict[str, np.ndarray]] = {}
    values: dict[str, dict[str, np.ndarray]] = {}  # per-example scalars [B] (Method.example_values)
    for name, m in methods.items():
        t0 = time.perf_counter()
        outs, vals = [], []
        for pcap, part in zip(caps, parts):
            out = {}
            if m.class_specific and target_mode == "all":
                # every class first: methods that cache per target (integrated gradients) then read the predicted
                # class's result off them instead of computing it again
                out["class_scores"] = m.compute_classes(pcap, lm.adapter, num_labels)
            res = m.compute(pcap, lm.adapter, part.target)
            out["scores"] = res.scores
            if res.layer_scores is not None:
                out["layer_scores"] = res.layer_scores
            if res.matrices is not None and keep_matrices and (m.class_specific or not outs):
                out["matrices"] = res.matrices  # a class-independent method's matrices are the same for every part
            outs.append(out)
            vals.append(res.example_values or {})
        results[name] = {k: _added([o[k] for o in outs if k in o]) for k in outs[0]}
        values[name] = {k: _added([v[k] for v in vals]) for k in vals[0]}
        _sync(device)
        timings.methods[name] = timings.methods.get(name, 0.0) + time.perf_counter() - t0
    return BatchOutput(results=results, values=values, outcome=outcome)


def _added(parts: list[torch.Tensor]) -> np.ndarray:
    """The parts' maps added (one part: itself, bit for bit) as float32 numpy."""
    total = functools.reduce(operator.add, parts)
    return total.detach().float().cpu().numpy()


def explaining(cap: Captured, part: Part, fresh: bool) -> Captured:
    """``cap`` set to explain ``part``: its position, output vector, target's foil. With ``fresh`` a copy with its own
    memo (the intermediates methods share are keyed by target, not by position)."""
    if fresh:
        cap = replace(cap, memo={})
    cap.explain_pos, cap.readout, cap.foil = part.explain_pos, part.readout, part.foil
    logits = part.readout(cap.output, part.explain_pos)
    cap.logits = logits.float() if logits.element_size() < 4 else logits
    return cap


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- out of memory: a batch that does not fit is halved, and --batch-size auto ------------------------------------
def is_out_of_memory(err: BaseException) -> bool:
    """A CUDA out-of-memory error (torch.cuda.OutOfMemoryError, or the RuntimeError older kernels raise)."""
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(err, oom)) or (isinstance(err, RuntimeError) and "out of memory" in str(err))


def _release_cached_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_halving(rows: list[int], run_rows: Callable[[list[int]], BatchOutput], n_tokens: Callable[[int], int],
                message: Callable[[str], None] = lambda _: None) -> list[tuple[list[int], BatchOutput]]:
    """``run_rows(rows)``, or, when it runs out of memory, each half of ``rows`` the same way (down to one example):
    the (rows, output) parts in the order of ``rows``. The results do not depend on how rows are batched (padding
    is masked), so a split batch gives what the whole one would, to float rounding."""
    try:
        return [(rows, run_rows(rows))]
    except Exception as err:  # noqa: BLE001 - anything but an out-of-memory error is raised again at once
        if not is_out_of_memory(err):
            raise
    # outside the except block: its traceback holds the failed attempt's tensors until it ends
    _release_cached_memory()
    if len(rows) == 1:
        raise AttrscopeError(f"out of memory on a single example of {n_tokens(rows[0])} tokens: lower --max-length, "
                             "or run on a device with more memory (--batch-size is already 1 here)")
    half = (len(rows) + 1) // 2
    message(f"out of memory on a batch of {len(rows)}: retrying it as {half} + {len(rows) - half}")
    return (run_halving(rows[:half], run_rows, n_tokens, message)
            + run_halving(rows[half:], run_rows, n_tokens, message))


def largest_fitting(fits: Callable[[int], bool], limit: int) -> int:
    """The largest batch size b <= ``limit`` with ``fits(b)`` (which must be monotone: a batch that fits, fits
    smaller), by doubling from 1 and then bisecting: about 2 log2(limit) tries. 0 when even 1 does not fit."""
    if not fits(1):
        return 0
    lo, hi = 1, limit + 1  # fits(lo); hi: the smallest size known not to fit
    while lo * 2 < hi:
        if not fits(lo * 2):
            hi = lo * 2
            break
        lo *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def auto_batch_size(lm: LoadedModel, methods: dict[str, Method], tok: Tokenized, rows: TaskRows,
                    target_mode: str, num_labels: int, keep_matrices: bool,
                    cpu_budget_mb: int | None = None) -> tuple[int, str]:
    """--batch-size auto: (the batch size, how it was found). On CUDA, the largest batch of copies of the longest
    example that runs the forward pass and every method without running out of memory (``largest_fitting``), found
    once. On the CPU, with ``cpu_budget_mb`` (--batch-memory-mb), the largest whose measured peak memory stays
    within it (``cpu_batch_within``); without, the fixed CPU_AUTO_BATCH_SIZE (a CPU swaps rather than fails, so
    there is no error to probe for)."""
    device = next(lm.model.parameters()).device
    if not tok.input_ids or (device.type != "cuda" and cpu_budget_mb is None):
        return CPU_AUTO_BATCH_SIZE, f"fixed on {device.type}"
    longest = max(range(len(tok.input_ids)), key=lambda i: len(tok.input_ids[i]))
    pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    limit = min(AUTO_BATCH_LIMIT, len(tok.input_ids))

    def run(size: int) -> None:
        run_batch(lm, methods, encode(tok, [longest] * size, pad_id, device), rows.take([longest] * size),
                  target_mode, num_labels, keep_matrices, Timings())

    if device.type != "cuda":
        from .. import memory

        if not memory.can_measure():
            return CPU_AUTO_BATCH_SIZE, f"fixed on {device.type} (the peak memory cannot be measured here)"
        size, per_example = cpu_batch_within(lambda size: memory.peak_bytes(lambda: run(size)),
                                             cpu_budget_mb << 20, limit)
        if size == 0:
            raise AttrscopeError(f"--batch-memory-mb {cpu_budget_mb}: one example of {len(tok.input_ids[longest])} "
                                 f"tokens needs about {per_example / 2**20:.0f} MB: raise the budget or lower "
                                 "--max-length")
        return size, (f"measured on {device.type}: the largest batch of the longest example "
                      f"({len(tok.input_ids[longest])} tokens, about {per_example / 2**20:.1f} MB each) within "
                      f"{cpu_budget_mb} MB, up to {limit}")

    def fits(size: int) -> bool:
        try:
            run(size)
            return True
        except Exception as err:  # noqa: BLE001
            if not is_out_of_memory(err):
                raise
        _release_cached_memory()
        return False

    size = largest_fitting(fits, limit)
    if size == 0:
        raise AttrscopeError(f"out of memory on a single example of {len(tok.input_ids[longest])} tokens: lower "
                             "--max-length, or run on a device with more memory")
    return size, f"probed on {device}: the largest batch of the longest example ({len(tok.input_ids[longest])} tokens) that fits, up to {limit}"


def cpu_batch_within(peak: Callable[[int], int], budget: int, limit: int) -> tuple[int, int]:
    """(the largest batch size <= ``limit`` whose ``peak(size)`` (bytes) is within ``budget``, the bytes per
    example). Memory grows about linearly with the batch: the line through sizes 1 and 2 (after a warm-up run, whose
    one-time allocations are not the batch's) predicts the size, which is measured and lowered by a quarter until it
    fits. A handful of runs, the largest one batch of the size found. (0, per example) when one example does not
    fit."""
    peak(1)  # warm-up: lazily made buffers and caches
    one = peak(1)
    if one > budget:
        return 0, one
    if limit == 1:
        return 1, one
    per = max(peak(2) - one, 1)
    size = min(limit, 1 + (budget - one) // per)
    while size > 2 and peak(size) > budget:
        size = max(2, size * 3 // 4)
    return size, per