"""``attr-compute run``: dataset -> tokens -> batched forward + methods -> store, as the stages of compute.run.

Examples are processed in windows of consecutive rows. Inside a window they are sorted by length into batches (less
padding), and the window is committed in the original order, so the store is always a prefix of the dataset, which
is what makes ``--resume`` simple: skip the committed rows, go on.
"""

from __future__ import annotations

import os
import time
from collections import deque
from contextlib import closing
from dataclasses import dataclass, field

from store import open_store
from store.errors import StoreWriteError
from store.lock import writer_lock

from . import interrupts
from .errors import AttrscopeError
from .options import DEFAULT_BATCH_TOKENS
from .run.auto_batch import Batching, auto_batching
from .run.batches import Tokenized, batches, encode, matrix_bytes, tokenize, tokenized_windows
from .run.config import RunConfig
from .run.dispatch import (PendingBatch, StageProbe, Timings, launch_batch, launch_steps_batch, make_methods,
                           run_halving)
from .run.generate import batch_steps, continued
from .run.head_masks import attach_head_masks
from .run.load import Loaded, load
from .run.metrics import compute_metrics
from .run.plan import RunPlan, make_plan, method_params
from .run.progress import Progress
from .run.write import WindowWriter, examples, generation_examples, layouts, open_writer, provenance
from .tasks import TaskRows

__all__ = ["RunConfig", "Progress", "run", "method_params", "resume_command"]


def run(cfg: RunConfig, progress: Progress | None = None) -> dict:
    """Compute attributions for ``cfg`` and write the store. Returns the summary dict."""
    progress = progress or Progress()
    t_start = time.perf_counter()
    plan = make_plan(cfg)  # every check that needs no model; nothing is loaded or written before it
    with writer_lock(plan.output):  # one writer per store, from before the model loads to the last metric
        return _locked(plan, progress, t_start)


def _locked(plan: RunPlan, progress: Progress, t_start: float) -> dict:
    cfg = plan.cfg
    loaded = load(plan, progress)

    # From here on a stop asked for (Ctrl-C, SIGTERM) is acted on at the next safe point (compute.interrupts).
    state: dict = {}  # what the run got to: the open writer, the metrics written
    with interrupts.on_signals(), interrupts.layer_checks(loaded.lm.adapter.layers()):
        try:
            return _stages(plan, loaded, progress, t_start, state)
        except KeyboardInterrupt as err:
            raise interrupts.Interrupted(_stopped_message(plan, len(loaded.data.records), state, err)) from None
        except StoreWriteError as err:  # a full disk: the committed prefix is kept, and resumable
            again = resume_command(cfg.argv) if cfg.argv else "the same options and --resume"
            raise AttrscopeError(f"{err}; free space and finish it with: {again}") from None


def _stages(plan: RunPlan, loaded: Loaded, progress: Progress, t_start: float, state: dict) -> dict:
    cfg, lm = plan.cfg, loaded.lm
    if lm.task.name != "classification":  # the task's data errors (a missing mask, a word of two tokens) come now,
        run_records = loaded.data.records  # before anything runs
        lm.task.check_rows(lm.task.prepare(lm, run_records, tokenize(lm, run_records, loaded.max_length)),
                           run_records, plan.target_mode)
    methods = make_methods(plan, lm, progress)
    methods, head_masks = attach_head_masks(plan, loaded, methods, progress)
    batching = _batching(plan, loaded, methods, progress)
    method_layouts = layouts(plan, methods, lm.adapter)
    prov = {**provenance(plan, loaded, list(methods)), "batch_size": batching.record(cfg.batch_size)}
    with interrupts.critical():
        writer, done = open_writer(plan, loaded, method_layouts, prov, head_masks)
    state["writer"] = writer

    records = loaded.data.records[done:]
    timings = Timings(methods={name: 0.0 for name in methods})
    window_writer = None
    try:
        if cfg.matrices == "all" and records:
            layers = [lay.n_matrix_layers for lay in method_layouts if lay.matrices == "all"]
            if plan.heads == "all":  # L x H matrices per example
                layers.append(lm.adapter.n_layers * lm.adapter.n_heads)
            total = matrix_bytes(tokenize(lm, records, loaded.max_length), layers, cfg.store_dtype)
            progress.message(f"--matrices all: about {total / 1e6:.1f} MB of matrices before compression "
                             "(use --matrices cls or none for less)")
        progress.start(total=len(loaded.data.records), completed=done)
        window_writer = WindowWriter(writer)  # commits on its own thread while the next window computes
        _compute_windows(plan, loaded, methods, done, batching, writer.num_labels, timings, window_writer,
                         progress)
        with interrupts.critical():
            window_writer.finish()
    except BaseException:
        progress.stop(keep=False)
        with interrupts.critical():  # what was submitted is written (the store keeps every finished window)
            try:
                if window_writer is not None:
                    window_writer.finish()
            finally:
                writer.close()
        raise
    progress.stop()
    for note in dict.fromkeys(note for m in methods.values() for note in m.run_notes()):  # ig_l2 and ig_mean: once
        progress.message(note)

    summary = {
        "examples": writer.n_committed,
        "examples_this_run": len(records),
        "tokens": writer.n_tokens,
        "wall_seconds": round(time.perf_counter() - t_start, 3),
        "forward_seconds": round(timings.forward, 3),
        "method_seconds": {k: round(v, 3) for k, v in timings.methods.items()},
        "host_seconds": {k: round(v, 3) for k, v in timings.host.items()},  # the host's own stages (docs/cli.md)
        "write_seconds": round(window_writer.write_seconds, 3),  # on the writer thread
        "write_wait_seconds": round(window_writer.wait_seconds, 3),  # the compute loop waiting on the writer
        "device": str(lm.info["device"]),
        "resumed_from": done if cfg.resume else None,
    }
    with interrupts.critical():
        writer.close(complete=True, summary=summary)
    interrupts.check()
    if cfg.metrics:
        t0 = time.perf_counter()
        state["metrics"] = True
        summary["metrics"] = compute_metrics(plan, lm, progress)
        summary["metric_seconds"] = round(time.perf_counter() - t0, 3)
    summary["store"] = os.path.abspath(plan.output)
    summary["store_bytes"] = os.path.getsize(plan.output)
    return summary


@dataclass
class _Window:
    """A window being computed: its rows (``records``, ``tok``, ``task_rows``: the window's own), how many of its
    first rows the store holds (``committed``: a resumed run's first window may begin mid-window) and the examples of
    its finished batches not yet committed (by row)."""

    records: list
    tok: Tokenized
    task_rows: TaskRows
    committed: int = 0
    done: dict = field(default_factory=dict)


def _compute_windows(plan: RunPlan, loaded: Loaded, methods: dict, done: int, batching: Batching,
                     num_labels: int, timings: Timings, window_writer: WindowWriter, progress: Progress) -> None:
    """Every window of the records after the ``done`` the store holds, tokenised ahead on a worker, its batches
    queued on the device one ahead of the batch whose results the host waits for. A window's finished prefix of rows
    is submitted to the writer when the window is done, and whenever ``--commit-seconds`` have passed since the last
    commit. Windows are laid from the dataset's first row, so a run resumed mid-window cuts that window into the same
    batches as the run it finishes (the same numbers) and computes only the batches holding rows not yet stored."""
    cfg, lm = plan.cfg, loaded.lm
    device = next(lm.model.parameters()).device
    pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    in_flight: deque = deque()  # (window, rows, PendingBatch), launched and not yet read
    # Length buckets for the run's most length-sensitive method: no method pays more than 15% for padding, and the
    # n**2 methods run on whole batches, sharing the batch's intermediates with the others (parts of a batch each
    # need their own: splitting for them alone cost ALTI more than the padding it saved)
    exponent = max((m.cost_exponent for m in methods.values()), default=1)
    clock = time.perf_counter
    last_commit = [clock()]
    launched = [0]  # batches launched: the progress bar names the one running
    # On a GPU a batch's kernels are queued and the host waits for the one before; on the CPU launching a batch
    # computes it, so its examples are counted at once (the progress bar's rate is then the work done).
    ahead = 1 if device.type == "cuda" else 0
    generating = lm.task.name == "generate"  # each example's steps (compute/run/generate.py, steps.py)

    def commit(window: _Window) -> None:
        """Submit the window's finished rows after those committed, up to the first unfinished one."""
        end = window.committed
        while end in window.done:
            end += 1
        if end > window.committed:
            window_writer.submit([window.done.pop(i) for i in range(window.committed, end)])  # in dataset order
            window.committed = end
            last_commit[0] = clock()

    def finish() -> None:
        window, rows, pending = in_flight.popleft()
        t0 = clock()
        out = pending.result()
        t1 = clock()
        made = (generation_examples if generating else examples)(
            out, rows, window.records, window.tok, cfg.matrices, lm.tokenizer.convert_ids_to_tokens, window.task_rows)
        new = [(i, ex) for i, ex in zip(rows, made)
               if i >= window.committed]  # a resumed window's batch recomputes the rows the store holds: not kept
        window.done.update(new)
        timings.add_host("results", t1 - t0)
        timings.add_host("examples", clock() - t1)
        progress.advance(len(new))
        if window.committed + len(window.done) == len(window.records) or \
                clock() - last_commit[0] >= cfg.commit_seconds:
            commit(window)

    records = loaded.data.records
    rows_per_window = batching.size * cfg.window
    w0 = done - done % rows_per_window  # the window that holds the first row to compute
    tokenized = tokenized_windows(lm, records[w0:], loaded.max_length, rows_per_window,
                                  lambda sec: timings.add_host("tokenize", sec))
    t0 = clock()
    with closing(tokenized):  # an error or a stop ends the tokenizer's worker too
        for tok in tokenized:
            timings.add_host("tokenize_wait", clock() - t0)
            t0 = clock()
            rows_of_window = records[w0:w0 + len(tok)]
            # the task's target and foil tokens, spans (compute.tasks)
            window = _Window(rows_of_window, tok, lm.task.prepare(lm, rows_of_window, tok), committed=max(0, done - w0))
            if generating:  # the prompts continued: the window's tokens become prompt + continuation
                t_gen = clock()
                window.tok = continued(lm, rows_of_window, tok, window.task_rows, batching.size, loaded.max_length)
                timings.add_host("generate", clock() - t_gen)
                t0 += clock() - t_gen  # not counted twice (in "batches")
            w0 += len(tok)
            cut = [batch for batch in batches(window.tok.lengths, batching.size, batching.tokens, exponent)
                   if max(batch) >= window.committed]  # only batches with rows the store does not hold
            timings.add_host("batches", clock() - t0)

            def launch(rows: list[int], window=window) -> PendingBatch:
                t0 = clock()
                enc = encode(window.tok, rows, pad_id, device)
                t1 = clock()
                launched[0] += 1
                probe = StageProbe(progress, f"batch {launched[0]} ({len(rows)} ex)")
                if generating:
                    pending = launch_steps_batch(lm, methods, enc, batch_steps(window.task_rows, rows, device),
                                                 lm.task.options["contrast"], cfg.matrices, timings, probe=probe,
                                                 heads=plan.heads)
                else:
                    pending = launch_batch(lm, methods, enc, window.task_rows.take(rows), plan.target_mode,
                                           num_labels, cfg.matrices, timings, window.tok.lengths[rows],
                                           batching.part_tokens, probe=probe, heads=plan.heads)
                timings.add_host("encode", t1 - t0)
                timings.add_host("launch", clock() - t1)
                return pending

            for batch in cut:
                # a batch that runs out of memory is computed in halves (the same results: padding is masked)
                for rows, pending in run_halving(batch, launch, lambda i: int(window.tok.lengths[i]), progress.message):
                    in_flight.append((window, rows, pending))
                    while len(in_flight) > ahead:  # on a GPU the next batch is queued before the host waits
                        finish()
                interrupts.check()
                window_writer.check()  # a failed write stops the run now, not a window later
            t0 = clock()
    while in_flight:
        finish()
    interrupts.check()


def _batching(plan: RunPlan, loaded: Loaded, methods: dict, progress: Progress) -> Batching:
    """How the run batches: as given, or --batch-size auto's (compute.run.auto_batch)."""
    cfg, lm = plan.cfg, loaded.lm
    tokens = cfg.batch_tokens or DEFAULT_BATCH_TOKENS
    if cfg.batch_size != "auto":
        return Batching(cfg.batch_size, tokens, "given")
    if cfg.resume:  # what the store was begun with: the same batches, so the same numbers, bit for bit
        with open_store(plan.output) as old:
            recorded = old.config.get("batch_size", {})
        if recorded.get("used"):
            progress.message(f"--batch-size auto: {recorded['used']} (as the resumed store recorded)")
            return Batching(recorded["used"], recorded.get("tokens") or tokens, "recorded in the resumed store",
                            recorded.get("part_tokens") or {})
    probed = next(lm.model.parameters()).device.type == "cuda" or cfg.batch_memory_mb is not None
    records = loaded.data.records if probed else []
    tok = tokenize(lm, records, loaded.max_length)  # the probe's longest example (CUDA, or --batch-memory-mb)
    batching = auto_batching(lm, methods, tok, lm.task.prepare(lm, records, tok), plan.target_mode,
                             len(lm.task.labels(lm.info["id2label"])), cfg.matrices, tokens,
                             cfg.batch_tokens, cfg.batch_memory_mb, heads=plan.heads)
    progress.message(f"--batch-size auto: {batching.size} ({batching.how})")
    return batching


def resume_command(argv: list[str]) -> str:
    """The command line that finishes an interrupted run: the same one with --resume instead of --overwrite."""
    import shlex

    args = [a for a in argv if a != "--overwrite"]
    if "--resume" not in args:
        args.append("--resume")
    return shlex.join(args)


def _stopped_message(plan: RunPlan, total: int, state: dict, err: BaseException) -> str:
    """The one line printed when a run stops on a signal: what the store keeps and how to finish it."""
    output, argv = plan.output, plan.cfg.argv
    again = resume_command(argv) if argv else "the same options and --resume"
    writer = state.get("writer")
    if writer is None:  # stopped while loading, in the head statistics, before the store was opened
        kept = f"store '{output}' is as it was" if os.path.exists(output) else "nothing was written"
        return f"interrupted before the first example: {kept}; run the same command again"
    if state.get("metrics"):
        return (f"interrupted during the metrics: store '{output}' is complete{'; ' + str(err) if str(err) else ''}; "
                f"compute the rest with: {again}")
    return (f"interrupted: store '{output}' keeps its {writer.n_committed} of {total} examples committed so far; "
            f"finish it with: {again}")
