"""--batch-size auto: how the run batches when asked to choose.

First, before anything runs, the memory model of compute/memory_model.py (each method's peak from the model's shapes)
for the run's methods at the longest example's length: a run whose one example does not fit the memory (on CUDA what
is free, on the CPU --batch-memory-mb) is refused in one line naming the method and the longest input that fits,
and no batch larger than the model lets fit is tried (``modelled_size``).

On CUDA, a memory model of every stage of a batch (the forward pass, each method), from two trial batches of one
and two copies of the run's longest example: the memory each stage starts from (the captured forward, what earlier
methods keep) and what it adds while it runs, each a line in the batch size, the slope at least what the method
declares (``Method.memory_per_example``, for buffers its chunk budget bounds only down to one block). It gives the
largest batch of the longest example whose every stage fits the free memory, hence the token budget, and for each
method whose cost grows faster than n (they run on parts of a batch, compute.run.parts) the largest part; one
confirming batch of that size runs, lowered by a quarter while it runs out of memory. No method ever runs a
batch larger than the model says fits, and those methods never one larger than their part.

On the CPU, with ``--batch-memory-mb``, the largest batch whose measured peak resident memory stays within it
(``cpu_batch_within``); without, a fixed size (a CPU swaps rather than fails, so there is no error to probe for).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from .. import memory_model as mm
from ..errors import AttrscopeError
from ..methods import Method
from ..methods._internals.base import Shape
from ..models import LoadedModel
from ..options import DEFAULT_BATCH_SIZE, DEFAULT_BATCH_TOKENS
from ..tasks import TaskRows
from .batches import Tokenized, encode
from .dispatch import Probe, Timings, is_out_of_memory, launch_batch, release_cached_memory

CPU_AUTO_BATCH_SIZE = DEFAULT_BATCH_SIZE  # --batch-size auto on CPU without --batch-memory-mb
AUTO_BATCH_LIMIT = 1024  # the most examples in a batch under --batch-size auto
TRIAL_SIZES = (1, 2)  # the trial batches of the memory model (copies of the longest example)
MEMORY_FRACTION = 0.85  # of the memory free to this process, what the model may plan to use (fragmentation, slack)
# The most padded tokens a method whose cost grows faster than n gets in one part under auto: the GPU is busy at
# far fewer (its work per token grows with n), and the confirming batch stays short.
AUTO_PART_TOKENS = DEFAULT_BATCH_TOKENS


@dataclass(frozen=True)
class Batching:
    """How a run batches: at most ``size`` examples and ``tokens`` padded tokens a batch; ``part_tokens``: per method
    whose cost grows faster than n, the most padded tokens of one of its parts (none: the batch's)."""

    size: int
    tokens: int
    how: str
    part_tokens: dict[str, int] = field(default_factory=dict)

    def record(self, asked) -> dict:
        """What the store's provenance keeps (``s.config["batch_size"]``; --resume of an auto store reads it)."""
        return {"asked": asked, "used": self.size, "tokens": self.tokens, "part_tokens": dict(self.part_tokens),
                "how": self.how}


class DeviceMemory:
    """The device memory as the model reads it: torch.cuda's allocator counts (no wait for the device: allocations
    happen when kernels are queued). A test gives a fake."""

    def __init__(self, device: torch.device):
        self.device = device

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def total(self) -> int:
        """The card's memory (the methods' GPU block budgets are a share of it)."""
        return torch.cuda.get_device_properties(self.device).total_memory

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    def limit(self) -> int:
        """The allocated bytes a batch may reach: what is allocated now and a fraction of the rest the device has free
        (this process's cache included)."""
        free, _ = torch.cuda.mem_get_info(self.device)
        spare = free + torch.cuda.memory_reserved(self.device) - self.allocated()
        return self.allocated() + int(MEMORY_FRACTION * spare)


class _Recorder(Probe):
    """Each stage's allocated bytes when it begins and its peak while it runs."""

    def __init__(self, memory: DeviceMemory):
        self.memory, self.start, self.peak = memory, {}, {}

    def begin(self, stage: str) -> None:
        self.memory.reset_peak()
        self.start.setdefault(stage, self.memory.allocated())  # a stage run part by part: from its first part

    def end(self, stage: str) -> None:
        self.peak[stage] = max(self.peak.get(stage, 0), self.memory.peak())


@dataclass(frozen=True)
class Line:
    at0: float  # bytes at batch size 0
    slope: float  # bytes per example

    def __call__(self, b: float) -> float:
        return self.at0 + self.slope * b


@dataclass(frozen=True)
class StageModel:
    start: Line  # allocated when the stage begins
    added: Line  # what it adds while it runs


def fit_stages(trials: dict[int, _Recorder], declared: dict[str, int]) -> dict[str, StageModel]:
    """The lines through the trials (two sizes; one: flat), the added slope at least ``declared[stage]``."""
    (b1, r1), *rest = sorted(trials.items())
    b2, r2 = rest[0] if rest else (b1, r1)
    out = {}
    for stage in r1.start:
        lines = []
        for y1, y2, floor in ((r1.start[stage], r2.start[stage], 0),
                              (r1.peak[stage] - r1.start[stage], r2.peak[stage] - r2.start[stage],
                               declared.get(stage, 0))):
            slope = max((y2 - y1) / (b2 - b1) if b2 != b1 else 0.0, float(floor), 0.0)
            lines.append(Line(max(y2 - slope * b2, 0.0), slope))  # through the larger trial
        out[stage] = StageModel(*lines)
    return out


def plan_sizes(stages: dict[str, StageModel], limit_bytes: int, limit: int, heavy: dict[str, int]) -> tuple[int, dict]:
    """(the largest batch B <= ``limit`` at which every stage fits, {heavy method: its largest part P <= its cap}).
    A method in ``heavy`` (name -> most examples of a part) runs its parts while the batch's memory is held, each on
    a copy of the part's capture: start(B) + added(P) + capture(P); every other stage start(B) + added(B). The
    capture per example is what the forward pass leaves behind (the next stage's start). B is 0 when one example
    does not fit."""
    def largest(fixed: float, slope: float, cap: int) -> int:
        room = limit_bytes - fixed
        if room < 0:
            return 0
        return cap if slope <= 0 else min(cap, int(room // slope))

    names = list(stages)
    capture = max(stages[names[1]].start.slope - stages[names[0]].start.slope, 0.0) if len(names) > 1 else 0.0
    part = {name: Line(stages[name].added.at0, stages[name].added.slope + capture) for name in heavy}
    size = limit
    for stage, m in stages.items():
        if stage in heavy:  # a part of one example must fit beside the batch
            size = min(size, largest(m.start.at0 + part[stage](1), m.start.slope, limit))
        else:
            size = min(size, largest(m.start.at0 + m.added.at0, m.start.slope + m.added.slope, limit))
    parts = {name: max(1, largest(stages[name].start(size) + part[name].at0, part[name].slope, min(cap, size)))
             for name, cap in heavy.items()}
    return size, parts


def auto_batching(lm: LoadedModel, methods: dict[str, Method], tok: Tokenized, rows: TaskRows, target_mode: str,
                  num_labels: int, matrices: str, default_tokens: int, tokens_asked: int | None,
                  cpu_budget_mb: int | None = None, memory: DeviceMemory | None = None,
                  heads: str = "none") -> Batching:
    """--batch-size auto's batching (the module's docstring). ``tokens_asked``: --batch-tokens, a cap on the token
    budget found on CUDA. ``memory``: the device's memory readings (a test injects a fake). ``heads``: the per-head
    attention kept (plan.heads), measured with the rest."""
    device = next(lm.model.parameters()).device
    if not len(tok) or (device.type != "cuda" and cpu_budget_mb is None):
        return Batching(CPU_AUTO_BATCH_SIZE, default_tokens, f"fixed on {device.type}")
    longest = int(tok.lengths.argmax())
    n = int(tok.lengths[longest])
    pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    limit = min(AUTO_BATCH_LIMIT, len(tok))

    itemsize = next(lm.model.parameters()).dtype.itemsize
    if device.type != "cuda":
        room, budgets, where = cpu_budget_mb << 20, mm.Budgets.cpu(), f"--batch-memory-mb {cpu_budget_mb}"
    else:
        memory = memory or DeviceMemory(device)
        room, budgets = memory.limit() - memory.allocated(), mm.Budgets.gpu(memory.total())
        where = f"the {room / 2**30:.1f} GiB free on {device}"
    most = modelled_size(list(methods), model_shape(lm, num_labels), n, itemsize, room, budgets, limit, where,
                         matrices)

    def run(size: int, part_tokens: dict | None = None, probe: Probe | None = None) -> None:
        # the confirming batch (with part budgets) runs each part-wise method on one part: the others repeat it
        launch_batch(lm, methods, encode(tok, [longest] * size, pad_id, device), rows.take([longest] * size),
                     target_mode, num_labels, matrices, Timings(), [n] * size, part_tokens, probe,
                     first_part_only=part_tokens is not None, heads=heads).result()

    if device.type != "cuda":
        batching = _cpu_batching(run, cpu_budget_mb, most, n, tokens_asked, device)
    else:
        batching = cuda_batching(run, memory, methods, _shape(lm, n), most, tokens_asked, device)
    if most < limit:
        batching = replace(batching, how=f"{batching.how}; at most {most} by the memory model")
    return batching


def modelled_size(methods: list[str], shape: mm.ModelShape, n: int, itemsize: int, room: int, budgets: mm.Budgets,
                  limit: int, where: str = "", matrices: str = "cls") -> int:
    """The most examples of ``n`` tokens (at most ``limit``) whose peak above the model's weights the memory model
    (compute/memory_model.py: ``per_batch``) keeps within ``room`` bytes (``where``: what they are, for the message)
    for each of ``methods`` (one without a formula, a test's own, is left to the trials), keeping ``matrices`` (the
    run's --matrices: under all a streamed method holds every layer's [n, n]). One example that does not fit is
    refused in one line, naming the method whose longest fitting input is the shortest and that length."""
    def peak(name: str, length: int) -> int:
        return sum(mm.per_batch(name, shape, mm.Run(length, itemsize, budgets, matrices)))

    parts = {name: mm.per_batch(name, shape, mm.Run(n, itemsize, budgets, matrices))
             for name in methods if name in mm.FORMULAS}
    too_big = [name for name, (fixed, each) in parts.items() if fixed + each > room]
    if too_big:
        fit = {name: mm.longest(lambda k, name=name: peak(name, k) <= room) for name in too_big}
        worst = min(too_big, key=fit.get)
        hint = f"lower --max-length to {fit[worst]}" if fit[worst] else "run on a device with more memory"
        raise AttrscopeError(
            f"--batch-size auto: {worst} needs about {sum(parts[worst]) / 2**30:.1f} GiB for one example of {n} "
            f"tokens, beyond {where or f'the {room / 2**30:.1f} GiB free'} (the memory model, docs/scaling.md): the "
            f"longest input that fits is about {fit[worst]} tokens; {hint}, or leave out {' and '.join(too_big)}")
    return min([limit] + [max(1, (room - fixed) // max(each, 1)) for fixed, each in parts.values()])


def model_shape(lm: LoadedModel, num_labels: int) -> mm.ModelShape:
    """The memory model's shape of the loaded model (its config and adapter)."""
    config, adapter = lm.model.config, lm.adapter
    shape = _shape(lm, 0)
    block = getattr(adapter, "block", None)
    return mm.ModelShape(getattr(config, "model_type", "model"), layers=shape.layers, d=shape.d, heads=shape.heads,
                         kv_heads=adapter.n_kv_heads, d_ff=shape.d_ff, vocab=int(getattr(config, "vocab_size", 0)),
                         gated=block is not None and block.mlp_kind != "plain", kv_cache=adapter.decoder,
                         labels=num_labels, head_dim=int(getattr(config, "head_dim", None) or 0))


def cuda_batching(run: Callable, memory: DeviceMemory, methods: dict[str, Method], shape: Shape, limit: int,
                  tokens_asked: int | None, device) -> Batching:
    """The memory model on CUDA: ``run(size, part_tokens, probe)`` runs a batch of ``size`` copies of the longest
    example (``shape.n`` tokens); ``limit``: the most examples a batch may hold."""
    n = shape.n
    heavy = {name: max(1, AUTO_PART_TOKENS // n) for name, m in methods.items() if m.cost_exponent > 1}
    declared = {name: m.memory_per_example(shape, m.params) for name, m in methods.items()}
    trials = {}
    for size in TRIAL_SIZES[:2 if limit > 1 else 1]:
        recorder = _Recorder(memory)
        if not _fits(lambda: run(size, None, recorder)):
            if size == TRIAL_SIZES[0]:
                raise AttrscopeError(f"out of memory on a single example of {n} tokens: lower --max-length, or run "
                                     "on a device with more memory")
            break
        trials[size] = recorder
    if len(trials) == 1:  # only one example fits, or there is only one
        return Batching(1, n, f"modelled on {device}: one example of the longest ({n} tokens) fits", {})
    stages = fit_stages(trials, declared)
    limit_bytes = memory.limit()
    most = limit if tokens_asked is None else max(1, min(limit, tokens_asked // n))
    size, parts = plan_sizes(stages, limit_bytes, most, heavy)
    while size >= 1:  # the confirming batch, lowered by a quarter while it does not fit
        part_tokens = {name: p * n for name, p in parts.items()}
        if _fits(lambda: run(size, part_tokens)):
            return Batching(limit, size * n, (
                f"modelled on {device}: {size} of the longest example ({n} tokens) within "
                f"{limit_bytes / 2**30:.1f} GiB, from trial batches of {' and '.join(map(str, trials))}, confirmed"
                + (f"; {', '.join(parts)} in parts of at most {min(parts.values())}-{max(parts.values())}"
                   if parts else "")), part_tokens)
        size = size * 3 // 4
        parts = {name: min(p, max(size, 1)) for name, p in parts.items()}
    raise AttrscopeError(f"out of memory on a single example of {n} tokens: lower --max-length, or run on a device "
                         "with more memory")


def _fits(work: Callable[[], None]) -> bool:
    try:
        work()
        return True
    except Exception as err:  # noqa: BLE001 - only out-of-memory errors mean "does not fit"
        if not is_out_of_memory(err):
            raise
    release_cached_memory()  # outside the except block: its traceback holds the failed attempt's tensors
    return False


def _shape(lm: LoadedModel, n: int) -> Shape:
    config, adapter = lm.model.config, lm.adapter
    d = next(int(v) for v in (getattr(config, k, None) for k in ("hidden_size", "dim", "n_embd")) if v)
    d_ff = next((int(v) for v in (getattr(config, k, None) for k in ("intermediate_size", "hidden_dim", "n_inner"))
                 if v), 4 * d)
    return Shape(n=n, layers=adapter.n_layers, heads=adapter.n_heads, d=d, d_ff=d_ff)


def _cpu_batching(run: Callable, budget_mb: int, limit: int, n: int, tokens_asked: int | None, device) -> Batching:
    from .. import memory

    if not memory.can_measure():
        return Batching(CPU_AUTO_BATCH_SIZE, tokens_asked or DEFAULT_BATCH_TOKENS,
                        f"fixed on {device.type} (the peak memory cannot be measured here)")
    size, per_example = cpu_batch_within(lambda size: memory.peak_bytes(lambda: run(size)), budget_mb << 20, limit)
    if size == 0:
        raise AttrscopeError(f"--batch-memory-mb {budget_mb}: one example of {n} tokens needs about "
                             f"{per_example / 2**20:.0f} MB: raise the budget or lower --max-length")
    # the tokens of the batch measured (of the longest example): no batch of shorter ones holds more
    return Batching(size, min(size * n, tokens_asked or size * n), (
        f"measured on {device.type}: the largest batch of the longest example ({n} tokens, about "
        f"{per_example / 2**20:.1f} MB each) within {budget_mb} MB, up to {limit}"))


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
