"""Stage 5, methods: make the methods of the plan for the loaded model, queue one batch's forward pass and every
method on the device (the methods whose cost grows faster than n on length-homogeneous parts of it), and halve a
batch that runs out of memory."""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ..errors import AttrscopeError
from ..methods import Method, get_method
from ..methods._internals.base import MethodResult
from ..adapters import Captured
from ..models import LoadedModel
from ..tasks import Outcome, Part, TaskRows
from ..tasks.base import long_tensor
from .batches import parts as parts_of
from .parts import TOKEN_AXES, cut_capture, put_back
from .steps import Steps, explaining_steps, rows_capture, step_foils, step_logits, step_outcome
from .transfer import HostCopy, Stopwatch
from .plan import RunPlan
from .progress import Progress

T = TypeVar("T")

def make_methods(plan: RunPlan, lm: LoadedModel, progress: Progress) -> dict[str, Method]:
    """The plan's methods with their parameters; under --methods all (with a message) or default, those undefined for
    the architecture are skipped, a method named explicitly but undefined is one error line."""
    methods = {name: get_method(name, **plan.method_params[name]) for name in plan.method_names}
    if plan.every_method:
        skipped = [name for name, m in methods.items() if not _defined(m, lm.adapter)]
        methods = {name: m for name, m in methods.items() if name not in skipped}
        if skipped and plan.announce_skips:
            progress.message(f"--methods all: skipping {', '.join(skipped)}, not defined for the "
                             f"{lm.info['model_type']} architecture (METHODS.md section 9) or --task {lm.task.name}")
    for m in methods.values():
        m.check_task(lm.task.explained_task)
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
    host: dict[str, float] = field(default_factory=dict)  # seconds of the host's own stages (the runner's)

    def add(self, stages: dict[str, float]) -> None:
        """A batch's stage seconds (Stopwatch.seconds): "forward", else a method's name."""
        for stage, sec in stages.items():
            if stage == "forward":
                self.forward += sec
            else:
                self.methods[stage] = self.methods.get(stage, 0.0) + sec

    def add_host(self, stage: str, seconds: float) -> None:
        self.host[stage] = self.host.get(stage, 0.0) + seconds


@dataclass
class BatchOutput:
    """One batch's results as numpy arrays, padded: per method its arrays (scores [B, n], layer_scores [B, V, n],
    matrices [B, L, n, n], class_scores [B, C, n]) and per-example values [B], the task's outcome (the
    prediction, its probabilities, the explained position and output, target and foil tokens, spans), and under
    --heads the per-head attention ([B, L, H, n, n], or the explained row [B, L, H, n])."""

    results: dict[str, dict[str, np.ndarray]]
    values: dict[str, dict[str, np.ndarray]]
    outcome: Outcome
    heads: np.ndarray | None = None


class PendingBatch:
    """A batch whose kernels are queued and whose results are on their way to the host (compute.run.transfer):
    ``result()`` waits for them, once, and adds the batch's stage seconds to the timings."""

    def __init__(self, results: dict, values: dict, outcome: Outcome, stopwatch: Stopwatch, timings: Timings,
                 device: torch.device, heads: torch.Tensor | None = None):
        tensors = {("results", m, k): t for m, res in results.items() for k, t in res.items()}
        if heads is not None:
            tensors[("heads",)] = heads
        tensors.update({("values", m, k): t for m, vals in values.items() for k, t in vals.items()})
        fields = {f.name: getattr(outcome, f.name) for f in dataclasses.fields(outcome)}
        tensors.update({("outcome", k): v for k, v in fields.items() if isinstance(v, torch.Tensor)})
        self._copy = HostCopy(tensors, device)
        self._names = ({m: list(res) for m, res in results.items()}, {m: list(v) for m, v in values.items()})
        self._outcome = {k: v for k, v in fields.items() if not isinstance(v, torch.Tensor)}
        self._stopwatch, self._timings, self._out = stopwatch, timings, None

    def result(self) -> BatchOutput:
        if self._out is None:
            host = self._copy.arrays()
            results, values = ({m: {k: host[(part, m, k)] for k in keys} for m, keys in names.items()}
                               for part, names in zip(("results", "values"), self._names))
            outcome = Outcome(**{**self._outcome, **{k[1]: v for k, v in host.items() if k[0] == "outcome"}})
            self._timings.add(self._stopwatch.seconds())
            self._out = BatchOutput(results=results, values=values, outcome=outcome, heads=host.get(("heads",)))
        return self._out


class Probe:
    """What runs around each stage of a batch (the forward pass, each method); nothing by default."""

    def begin(self, stage: str) -> None:
        pass

    def end(self, stage: str) -> None:
        pass


class StageProbe(Probe):
    """Says on the progress bar which stage of which batch runs (on a GPU: is being queued)."""

    def __init__(self, progress: Progress, batch: str):
        self.progress, self.batch = progress, batch

    def begin(self, stage: str) -> None:
        self.progress.stage(f"{self.batch} · {stage}")


def _capture_for(lm: LoadedModel, methods: dict[str, Method], enc: dict[str, torch.Tensor], heads: str,
                 probe: Probe, clock: Stopwatch) -> tuple[Captured, float]:
    """The batch's forward pass with the internals its methods need (and the attention under --heads), its passes
    set; the forward stage begun on ``probe`` and ``clock`` (the caller ends it): (the capture, the stage's start)."""
    needs = frozenset().union(*(m.needs for m in methods.values())) if methods else frozenset()
    if heads != "none":
        needs |= {"attentions"}
    probe.begin("forward")
    t0 = clock.now()
    cap = lm.adapter.capture(enc, needs)
    cap.passes = frozenset().union(*(m.passes for m in methods.values()))  # LRP tensors only for LRP methods
    cap.attention_terms = frozenset().union(*(m.attention_terms for m in methods.values()))
    return cap, t0


@torch.no_grad()
def run_batch(lm: LoadedModel, methods: dict[str, Method], enc: dict[str, torch.Tensor], rows: TaskRows,
              target_mode: str, num_labels: int, matrices: str, timings: Timings,
              lengths: Sequence[int] | None = None, part_tokens: Mapping[str, int] | None = None,
              heads: str = "none") -> BatchOutput:
    """The forward pass and every method on one batch, its results on the host (``launch_batch``, waited for)."""
    return launch_batch(lm, methods, enc, rows, target_mode, num_labels, matrices, timings, lengths,
                        part_tokens, heads=heads).result()


@torch.no_grad()
def launch_batch(lm: LoadedModel, methods: dict[str, Method], enc: dict[str, torch.Tensor], rows: TaskRows,
                 target_mode: str, num_labels: int, matrices: str, timings: Timings,
                 lengths: Sequence[int] | None = None, part_tokens: Mapping[str, int] | None = None,
                 probe: Probe | None = None, first_part_only: bool = False, heads: str = "none") -> PendingBatch:
    """Queue the forward pass and every method on one batch, and the copies of its results to the host; nothing here
    waits for the device. ``rows``: what the task read of these examples. A task with several explained outputs (qa:
    start and end) runs every method once per output and adds the maps. ``matrices`` (--matrices): none, cls (only
    the row of the explained position, cut on the device: [B, L, 1, n]) or all. With ``lengths`` (the examples' tokens,
    longest first, as the batches stage orders them), a method whose cost grows faster than n
    (``Method.cost_exponent``) runs on length-homogeneous parts of the batch (compute.run.parts), each within
    ``part_tokens[name]`` padded tokens where given; the methods of one cut run part by part, each part's capture
    freed before the next is cut. ``probe``: called around every stage (the auto batch size measures memory so);
    ``first_part_only``: such methods run their first part only (auto's confirming batch: each further part needs
    the same memory again, and time the confirmation would waste). ``heads`` (plan.heads): the per-head attention
    kept beside the methods' results, none, cls (the explained row, cut on the device) or all."""
    device = enc["input_ids"].device
    probe = probe or Probe()
    clock = Stopwatch(device)
    cap, t0 = _capture_for(lm, methods, enc, heads, probe, clock)
    parts = lm.task.parts(cap, rows, target_mode)
    outcome = lm.task.outcome(cap, parts, rows)
    clock.span("forward", t0)
    probe.end("forward")

    caps = [explaining(cap, part, fresh=len(parts) > 1) for part in parts]
    # the row the store keeps of each matrix: the outcome's explained position (qa: the start), for every part
    kept_row = outcome.explain_pos if isinstance(outcome.explain_pos, torch.Tensor) else long_tensor(
        outcome.explain_pos, device)
    cap.output = None  # a language model's [B, n, V] logits are not kept while the methods run
    for c in caps:  # what a method that streams the layers keeps of its matrices
        c.kept_matrices, c.kept_row = matrices, kept_row
    kept_heads = None if heads == "none" else _kept_heads(cap, heads, kept_row)
    B, n = enc["input_ids"].shape
    whole = [(slice(0, B), n)]
    cuts: dict[tuple, list[tuple[slice, int]]] = {}  # (exponent, part tokens) -> the batch's parts (rows, tokens)
    for name, m in methods.items():
        key = (m.cost_exponent, (part_tokens or {}).get(name))
        if lengths is not None and m.cost_exponent > 1 and key not in cuts:
            cuts[key] = [(s, max(int(x) for x in lengths[s])) for s in parts_of(lengths, *key)]
    group_of = {name: (m.cost_exponent, (part_tokens or {}).get(name)) for name, m in methods.items()}
    results: dict[str, dict[str, torch.Tensor]] = {}
    values: dict[str, dict[str, torch.Tensor]] = {}  # per-example scalars [B] (Method.example_values)
    # one target tensor per (output, rows) for every method: the passes they share are memoised by its identity
    # (base.Same), so a new slice per method would run integrated gradients' path and the backward once per method
    targets: dict[tuple[int, int, int], torch.Tensor] = {}
    for name, m in methods.items():
        if name in results:
            continue  # run with its group, part by part
        cut = cuts.get(group_of[name], whole)
        group = [name] if cut == whole else [g for g in methods if group_of[g] == group_of[name]]
        if first_part_only:
            cut = cut[:1]
        # the group's methods part by part (they share a part's capture and memo; it is freed after the part)
        pieces: dict[str, list[list]] = {g: [[] for _ in parts] for g in group}
        for t, (pcap, part) in enumerate(zip(caps, parts)):
            for rows_, n_part in cut:
                sub = pcap if (rows_, n_part) == whole[0] else cut_capture(pcap, rows_, n_part)
                for g in group:
                    probe.begin(g)
                    t0 = clock.now()
                    keep = matrices if methods[g].class_specific or t == 0 else "none"  # class-independent: once
                    target = targets.setdefault((t, rows_.start, rows_.stop), part.target[rows_])
                    pieces[g][t].append((rows_, _compute(methods[g], sub, lm.adapter, target,
                                                         target_mode, num_labels, keep, kept_row[rows_])))
                    clock.span(g, t0)
                    probe.end(g)
                del sub
        for g in group:
            outs, vals = zip(*(_joined(p, B, n, matrices) for p in pieces[g]))
            results[g] = {k: _added([o[k] for o in outs if k in o]) for k in outs[0]}
            values[g] = {k: _added([v[k] for v in vals]) for k in vals[0]}
    return PendingBatch(results, values, outcome, clock, timings, device, kept_heads)


@torch.no_grad()
def launch_steps_batch(lm: LoadedModel, methods: dict[str, Method], enc: dict[str, torch.Tensor], steps: Steps,
                       contrast: str | None, matrices: str, timings: Timings, probe: Probe | None = None,
                       heads: str = "none") -> PendingBatch:
    """Queue one batch of generations (--task generate; ``enc``: prompt + continuation, right-padded): one forward
    pass, then every method on every step (compute/run/steps.py), each step explaining its generated token (less
    its foil: ``contrast`` top2, column or None). The results have one row per step: scores [R, n] and layer_scores
    [R, V, n], zero after the step's position; a class-independent method's matrices of the pass, per example
    ([B, L, n, n] under ``matrices`` all, the prompt's last row [B, L, 1, n] under cls; a class-specific method's
    differ per step and are not kept). ``heads``: the per-head attention of the pass, as launch_batch keeps it (cls:
    the prompt's last row)."""
    device = enc["input_ids"].device
    probe = probe or Probe()
    clock = Stopwatch(device)
    cap, t0 = _capture_for(lm, methods, enc, heads, probe, clock)
    logits = step_logits(cap, steps)
    foil = step_foils(logits, steps, contrast)
    outcome = step_outcome(logits, steps, foil)
    clock.span("forward", t0)
    probe.end("forward")
    cap.output = None  # the [B, n, V] logits are not kept while the methods run
    cap.kept_matrices, cap.kept_row = matrices, steps.prompt_last
    kept_heads = None if heads == "none" else _kept_heads(cap, heads, steps.prompt_last)
    made: list[Captured] = []

    def rows() -> Captured:  # the step rows, made for the first method that reads them, shared by the others
        if not made:
            made.append(explaining_steps(rows_capture(cap, steps), logits, foil))
        return made[0]

    step_mask = steps.mask(cap.mask)
    results: dict[str, dict[str, torch.Tensor]] = {}
    values: dict[str, dict[str, torch.Tensor]] = {}
    for name, m in methods.items():
        probe.begin(name)
        t0 = clock.now()
        if m.class_specific and not len(steps.example):  # every example ended at once (EOS first): no step
            V = m.n_layer_views(lm.adapter)
            res = MethodResult(scores=cap.mask.new_zeros((0, cap.mask.shape[1]), dtype=torch.float32),
                               layer_scores=cap.mask.new_zeros((0, V, cap.mask.shape[1]), dtype=torch.float32)
                               if V else None,
                               example_values={k: cap.mask.new_zeros(0, dtype=torch.float32) for k in m.example_values})
        else:
            res = m.compute_rows(cap, lm.adapter, steps, rows)
        out = {"scores": res.scores * step_mask}
        if res.layer_scores is not None:
            out["layer_scores"] = res.layer_scores * step_mask[:, None]
        if res.matrices is not None and matrices != "none" and not m.class_specific:  # the pass's, per example
            out["matrices"] = _kept_matrices(res, matrices, steps.prompt_last)
        results[name] = {k: v.detach().float() for k, v in out.items()}
        values[name] = {k: v.detach().float() for k, v in (res.example_values or {}).items()}
        clock.span(name, t0)
        probe.end(name)
    return PendingBatch(results, values, outcome, clock, timings, device, kept_heads)


def _kept_heads(cap: Captured, heads: str, kept_row: torch.Tensor) -> torch.Tensor:
    """The model's attention probabilities per head as the store keeps them: [B, L, H, n, n] (all, a view of the
    capture, which the methods only read) or the explained row [B, L, H, n] (cls)."""
    att = cap.stack("attentions").transpose(0, 1)  # [B, L, H, n, n]
    if heads == "all":
        return att
    B, L, H, _, n = att.shape
    return att.gather(3, kept_row.view(B, 1, 1, 1, 1).expand(B, L, H, 1, n)).squeeze(3)


def _compute(m: Method, cap: Captured, adapter, target: torch.Tensor, target_mode: str, num_labels: int,
             matrices: str, kept_row: torch.Tensor) -> dict[str, torch.Tensor]:
    out = {}
    if m.class_specific and target_mode == "all":
        # every class first: methods that cache per target (integrated gradients) then read the predicted
        # class's result off them instead of computing it again
        out["class_scores"] = m.compute_classes(cap, adapter, num_labels)
    res = m.compute(cap, adapter, target)
    out["scores"] = res.scores
    if res.layer_scores is not None:
        out["layer_scores"] = res.layer_scores
    if res.matrices is not None and matrices != "none":
        out["matrices"] = _kept_matrices(res, matrices, kept_row)
    for key, value in (res.example_values or {}).items():
        out[("value", key)] = value
    return out


def _kept_matrices(res: MethodResult, matrices: str, kept_row: torch.Tensor) -> torch.Tensor:
    """What the store keeps of a result's matrices: all, or (cls) the row ``kept_row`` of each, [B, L, 1, n] (cut
    here, or already by a method that streamed the layers)."""
    M = res.matrices
    if matrices == "all" or res.matrix_rows:
        return M
    return M.gather(2, kept_row.view(-1, 1, 1, 1).expand(-1, M.shape[1], 1, M.shape[3]))


def _joined(pieces: list[tuple[slice, dict]], B: int, n: int, matrices: str) -> tuple[dict, dict]:
    """The parts' results as the batch's (one part covering the batch: itself): (arrays, per-example values)."""
    if len(pieces) == 1 and pieces[0][0] == slice(0, B):
        joined = pieces[0][1]
    else:
        axes = {**TOKEN_AXES, "matrices": 2 if matrices == "all" else 1}  # cls: [b, L, 1, n]
        joined = {k: put_back([(rows, out[k]) for rows, out in pieces], B, n,
                              axes["value" if isinstance(k, tuple) else k]) for k in pieces[0][1]}
    out = {k: v for k, v in joined.items() if not isinstance(k, tuple)}
    return out, {k[1]: v for k, v in joined.items() if isinstance(k, tuple)}


def _added(parts: list[torch.Tensor]) -> torch.Tensor:
    """The parts' maps added (one part: itself, bit for bit) as float32, on the device."""
    total = functools.reduce(operator.add, parts)
    return total.detach().float()


def explaining(cap: Captured, part: Part, fresh: bool) -> Captured:
    """``cap`` set to explain ``part``: its position, output vector, target's foil. With ``fresh`` a copy with its own
    memo (the intermediates methods share are keyed by target, not by position)."""
    if fresh:
        cap = replace(cap, memo={})
    cap.explain_pos, cap.readout, cap.foil = part.explain_pos, part.readout, part.foil
    logits = part.readout(cap.output, part.explain_pos)
    cap.logits = logits.float() if logits.element_size() < 4 else logits
    return cap


# --- out of memory: a batch that does not fit is halved, and --batch-size auto ------------------------------------
def is_out_of_memory(err: BaseException) -> bool:
    """A CUDA out-of-memory error (torch.cuda.OutOfMemoryError, or the RuntimeError older kernels raise)."""
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(err, oom)) or (isinstance(err, RuntimeError) and "out of memory" in str(err))


def release_cached_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_halving(rows: list[int], run_rows: Callable[[list[int]], T], n_tokens: Callable[[int], int],
                message: Callable[[str], None] = lambda _: None) -> list[tuple[list[int], T]]:
    """``run_rows(rows)``, or, when it runs out of memory, each half of ``rows`` the same way (down to one example):
    the (rows, output) parts in the order of ``rows``. The results do not depend on how rows are batched (padding
    is masked), so a split batch gives what the whole one would, to float rounding."""
    try:
        return [(rows, run_rows(rows))]
    except Exception as err:  # noqa: BLE001 - anything but an out-of-memory error is raised again at once
        if not is_out_of_memory(err):
            raise
    # outside the except block: its traceback holds the failed attempt's tensors until it ends
    release_cached_memory()
    if len(rows) == 1:
        raise AttrscopeError(f"out of memory on a single example of {n_tokens(rows[0])} tokens: lower --max-length, "
                             "or run on a device with more memory (--batch-size is already 1 here)")
    half = (len(rows) + 1) // 2
    message(f"out of memory on a batch of {len(rows)}: retrying it as {half} + {len(rows) - half}")
    return (run_halving(rows[:half], run_rows, n_tokens, message)
            + run_halving(rows[half:], run_rows, n_tokens, message))
