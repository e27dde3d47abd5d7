"""``attr-compute run``: dataset -> tokens -> batched forward + methods -> store, as the stages of compute.run.

Examples are processed in windows of consecutive rows. Inside a window they are sorted by length into batches (less
padding), and the window is committed in the original order, so the store is always a prefix of the dataset, which
is what makes ``--resume`` simple: skip the committed rows, go on.
"""

from __future__ import annotations

import os
import time

from store import open_store

from . import interrupts
from .run.batches import encode, matrix_bytes, tokenize, windows
from .run.config import RunConfig
from .run.dispatch import Timings, auto_batch_size, make_methods, run_batch, run_halving
from .run.head_masks import attach_head_masks
from .run.load import Loaded, load
from .run.metrics import compute_metrics
from .run.plan import RunPlan, make_plan, method_params
from .run.progress import Progress
from .run.write import WindowWriter, examples, layouts, open_writer, provenance

__all__ = ["RunConfig", "Progress", "run", "method_params", "resume_command"]


def run(cfg: RunConfig, progress: Progress | None = None) -> dict:
    """Compute attributions for ``cfg`` and write the store. Returns the summary dict."""
    progress = progress or Progress()
    t_start = time.perf_counter()
    plan = make_plan(cfg)  # every check that needs no model; nothing is loaded or written before it
    loaded = load(plan, progress)

    # From here on a stop asked for (Ctrl-C, SIGTERM) is acted on at the next safe point (compute.interrupts).
    state: dict = {}  # what the run got to: the open writer, the metrics written
    with interrupts.on_signals(), interrupts.layer_checks(loaded.lm.adapter.layers()):
        try:
            return _stages(plan, loaded, progress, t_start, state)
        except KeyboardInterrupt as err:
            raise interrupts.Interrupted(_stopped_message(plan, len(loaded.data.records), state, err)) from None


def _stages(plan: RunPlan, loaded: Loaded, progress: Progress, t_start: float, state: dict) -> dict:
    cfg, lm = plan.cfg, loaded.lm
    if lm.task.name != "classification":  # the task's data errors (a missing mask, a word of two tokens) come now,
        run_records = loaded.data.records  # before anything runs
        lm.task.check_rows(lm.task.prepare(lm, run_records, tokenize(lm, run_records, loaded.max_length)),
                           run_records, plan.target_mode)
    methods = make_methods(plan, lm, progress)
    methods, head_masks = attach_head_masks(plan, loaded, methods, progress)
    batch_size, how = _batch_size(plan, loaded, methods, progress)
    method_layouts = layouts(plan, methods, lm.adapter)
    prov = {**provenance(plan, loaded, list(methods)),
            "batch_size": {"asked": cfg.batch_size, "used": batch_size, "how": how}}
    with interrupts.critical():
        writer, done = open_writer(plan, loaded, method_layouts, prov, head_masks)
    state["writer"] = writer

    records = loaded.data.records[done:]
    timings = Timings(methods={name: 0.0 for name in methods})
    window_writer = None
    try:
        tok = tokenize(lm, records, loaded.max_length)
        task_rows = lm.task.prepare(lm, records, tok)  # target and foil tokens, spans, positions (compute.tasks)
        if cfg.matrices == "all" and records:
            total = matrix_bytes(tok, [lay.n_matrix_layers for lay in method_layouts if lay.matrices == "all"],
                                 cfg.store_dtype)
            progress.message(f"--matrices all: about {total / 1e6:.1f} MB of matrices before compression "
                             "(use --matrices cls or none for less)")
        progress.start(total=len(loaded.data.records), completed=done)
        device = next(lm.model.parameters()).device
        pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
        window_writer = WindowWriter(writer)  # commits on its own thread while the next window computes

        def run_rows(rows: list[int]):
            return run_batch(lm, methods, encode(tok, rows, pad_id, device), task_rows.take(rows),
                             plan.target_mode, writer.num_labels, cfg.matrices != "none", timings)

        for window in windows(tok, batch_size, cfg.window):
            done_rows = {}
            for batch in window.batches:
                # a batch that runs out of memory is computed in halves (the same results: padding is masked)
                for rows, out in run_halving(batch, run_rows, lambda i: len(tok.input_ids[i]), progress.message):
                    done_rows.update(zip(rows, examples(out, rows, records, tok, cfg.matrices,
                                                        lm.tokenizer.convert_ids_to_tokens, task_rows)))
                progress.advance(len(batch))
                interrupts.check()
            window_writer.submit([done_rows[i] for i in sorted(done_rows)])  # a whole window, in dataset order
            interrupts.check()
        with interrupts.critical():
            window_writer.finish()
    except BaseException:
        progress.stop()
        with interrupts.critical():  # what was submitted is written (the store keeps every finished window)
            try:
                if window_writer is not None:
                    window_writer.finish()
            finally:
                writer.close()
        raise
    progress.stop()

    summary = {
        "examples": writer.n_committed,
        "examples_this_run": len(records),
        "tokens": writer.n_tokens,
        "wall_seconds": round(time.perf_counter() - t_start, 3),
        "forward_seconds": round(timings.forward, 3),
        "method_seconds": {k: round(v, 3) for k, v in timings.methods.items()},
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


def _batch_size(plan: RunPlan, loaded: Loaded, methods: dict, progress: Progress) -> tuple[int, str]:
    """The batch size and how it was chosen: as given, or --batch-size auto's (compute.run.dispatch.auto_batch_size:
    a probe on CUDA, a measurement on the CPU under --batch-memory-mb, else a fixed size)."""
    cfg, lm = plan.cfg, loaded.lm
    if cfg.batch_size != "auto":
        return cfg.batch_size, "given"
    if cfg.resume:  # the size the store was begun with: the same batches, so the same numbers, bit for bit
        with open_store(plan.output) as old:
            used = old.config.get("batch_size", {}).get("used")
        if used:
            progress.message(f"--batch-size auto: {used} (as the resumed store recorded)")
            return used, "recorded in the resumed store"
    probed = next(lm.model.parameters()).device.type == "cuda" or cfg.batch_memory_mb is not None
    records = loaded.data.records if probed else []
    tok = tokenize(lm, records, loaded.max_length)  # the probe's longest example (CUDA, or --batch-memory-mb)
    size, how = auto_batch_size(lm, methods, tok, lm.task.prepare(lm, records, tok), plan.target_mode,
                                len(lm.task.labels(lm.info["id2label"])), cfg.matrices != "none", cfg.batch_memory_mb)
    progress.message(f"--batch-size auto: {size} ({how})")
    return size, how


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
