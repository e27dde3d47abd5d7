"""Stage 6, write: what the store records of a run (the methods' layouts, the provenance), opening it (new, or
resumed after checking that the run is the same), and each batch's results cut to the examples' real lengths."""

from __future__ import annotations

import os
import platform
import queue
import threading
import time

import numpy as np
import torch

from store import ExampleData, MethodLayout, StoreWriter, open_store
from store import resume as resume_store
from store.errors import StoreWriteError, committed_kept

from .. import __version__
from ..errors import AttrscopeError
from ..methods import Method
from ..options import show_value
from .batches import Tokenized
from .config import declared_options
from .dispatch import BatchOutput
from .generate import token_strings
from .load import Loaded
from .plan import RunPlan
from ..tasks import TaskRows


class WindowWriter:
    """Commits windows on a writer thread, so the model never waits for the file unless the queue is full.

    The main thread ``submit``s each finished window (its examples in dataset order); one thread appends them in the
    order submitted, each a whole commit, so the store stays a prefix of the dataset. The queue holds at most
    ``depth`` windows (their arrays are in memory until written). ``finish()`` writes what is queued and waits for
    it; an error of the writer thread is raised in the main thread by the next ``submit`` or by ``finish``. Only the
    writer thread touches the store between the first ``submit`` and ``finish``.
    """

    def __init__(self, writer: StoreWriter, depth: int = 2):
        self.writer = writer
        self.wait_seconds = 0.0  # the main thread blocked on writing: a full queue, and the drain at the end
        self.write_seconds = 0.0  # the writer thread inside StoreWriter.append
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None  # the writer thread's error, until the main thread raised it
        self._failed = False  # once set, nothing more is written
        self._thread = threading.Thread(target=self._work, name="attrscope-writer", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            examples = self._queue.get()
            if examples is None:
                return
            if self._failed:
                continue  # after an error nothing more is written; taking the rest keeps submit from blocking
            try:
                t0 = time.perf_counter()
                self.writer.append(examples)
                self.write_seconds += time.perf_counter() - t0
            except OSError as err:  # not HDF5's (the writer turns those into StoreWriteError): said the same way
                self._failed = True
                self._error = StoreWriteError(self.writer.path, _os_reason(err), committed_kept(self.writer.n_committed))
            except BaseException as err:  # a failed write (StoreWriteError), a bug: raised by the main thread's next call
                self._error, self._failed = err, True

    def check(self) -> None:
        """Raise the writer thread's error, if it had one (the store is then abandoned: stop computing)."""
        self._raise_error()

    def submit(self, examples: list[ExampleData]) -> None:
        self._raise_error()
        t0 = time.perf_counter()
        self._queue.put(examples)
        self.wait_seconds += time.perf_counter() - t0

    def finish(self) -> None:
        """Write every window submitted, stop the thread, and raise its error if it had one. Idempotent."""
        if self._thread.is_alive():
            t0 = time.perf_counter()
            self._queue.put(None)
            self._thread.join()
            self.wait_seconds += time.perf_counter() - t0
        self._raise_error()

    def _raise_error(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err


def layouts(plan: RunPlan, methods: dict[str, Method], adapter) -> list[MethodLayout]:
    cfg, target_mode = plan.cfg, plan.target_mode
    out = []
    for name, m in methods.items():
        # a generation keeps the matrices of its one pass; a class-specific method's differ per step (not kept)
        mat = cfg.matrices if m.has_matrices and not (cfg.task == "generate" and m.class_specific) else "none"
        out.append(MethodLayout(
            name=name, signed=m.signed, n_layer_views=m.n_layer_views(adapter), matrices=mat,
            n_matrix_layers=adapter.n_layers if mat != "none" else 0,
            class_scores=bool(m.class_specific and target_mode == "all"), example_values=tuple(m.example_values),
            description=m.description,
            params={**m.params, "store_dtype": cfg.store_dtype, "reference": m.reference,
                    "class_specific": m.class_specific,
                    "target": target_mode if m.class_specific else None}))
    return out


def provenance(plan: RunPlan, loaded: Loaded, method_names: list[str]) -> dict:
    import h5py
    import transformers

    data = loaded.data
    return {
        "attrscope_version": __version__,
        "command": plan.cfg.argv,
        "config": {**plan.cfg.as_dict(), "methods": method_names, "target": plan.target_mode,
                   "max_length": loaded.max_length, "output": os.path.abspath(plan.output)},
        "model": loaded.lm.info,
        "dataset": {"source": data.source, "kind": data.kind, "columns": data.columns, "n_rows": data.n_rows,
                    "n_records": len(data.records), "sha256": data.sha256, "label_names": data.label_names},
        "shard": loaded.shard.as_dict() if loaded.shard else None,  # --shard: the plan (compute.shards)
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "h5py": h5py.__version__, "numpy": np.__version__},
        "host": {"platform": platform.platform(), "node": platform.node(), "cuda": torch.version.cuda,
                 "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
    }


def open_writer(plan: RunPlan, loaded: Loaded, layouts: list[MethodLayout], provenance: dict,
                head_masks=()) -> tuple[StoreWriter, int]:
    """The store's writer and the number of examples it already holds (0 unless --resume)."""
    output = plan.output
    if plan.cfg.resume:
        with open_store(output) as old:
            before, complete = old.config, old.complete
        check_resume(before, provenance, output)
        try:
            writer = resume_store(output, keep_metrics=complete)  # the same identity: a complete store gains no row
        except OSError as err:
            raise AttrscopeError(f"cannot write store '{output}': {_os_reason(err)}: check the path and its "
                                 "permissions") from None
        return writer, writer.n_committed
    try:
        real = os.path.realpath(output)  # through a symlink the file it points to is replaced, the link kept
        if plan.cfg.overwrite and os.path.exists(real):
            os.remove(real)
        return _create_writer(real, plan, loaded, layouts, provenance, head_masks), 0
    except OSError as err:
        raise AttrscopeError(f"cannot create store '{output}': {_os_reason(err)}: choose another -o") from None


def _os_reason(err: OSError) -> str:
    """The system's reason (HDF5 wraps it into a long message; the errno's text is what the user needs)."""
    import errno as errno_names

    if err.errno in errno_names.errorcode:
        return os.strerror(err.errno)
    return " ".join(str(err).split())[:200]


def _create_writer(path: str, plan: RunPlan, loaded: Loaded, layouts, provenance, head_masks) -> StoreWriter:
    lm = loaded.lm
    attrs = {"model_id": lm.info["model_id"], "model_revision": str(lm.info.get("revision")),
             "tokenizer": lm.info.get("tokenizer", ""), "attn_implementation": "eager",
             "torch_version": torch.__version__, "transformers_version": provenance["versions"]["transformers"],
             "attrscope_version": __version__, "dataset": provenance["dataset"]["source"]}
    return StoreWriter.create(path, n_layers=lm.adapter.n_layers, n_heads=lm.adapter.n_heads,
                              labels=lm.task.labels(lm.info["id2label"]), methods=layouts, provenance=provenance,
                              attrs=attrs, head_masks=list(head_masks), evidence=has_evidence(plan, loaded),
                              task={"name": lm.task.name, "options": dict(lm.task.options)}, heads=plan.heads,
                              heads_dtype=plan.cfg.store_dtype)


def has_evidence(plan: RunPlan, loaded: Loaded) -> bool:
    """Evidence flags are stored for --evidence-column, for qa always (the gold answer's tokens), and where the
    data's layout gives them (Linzen's agreement file: the subject), judged over the whole run (every shard alike)."""
    records = loaded.run_records if loaded.run_records is not None else loaded.data.records
    return (plan.cfg.evidence_column is not None or loaded.lm.task.name == "qa"
            or any(r.evidence is not None for r in records))


def check_resume(before: dict, now: dict, output: str) -> None:
    """--resume continues a store only with the same resume identity (``Option.resume``), device type, model and
    data."""
    b, n = before.get("config", {}), now["config"]
    for opt in declared_options():
        if not opt.resume:
            continue
        was, given = b.get(opt.name, opt.default), n.get(opt.name)  # a store older than the option: its default
        if was != given:
            made = f"without {opt.flag}" if was is None else f"with {opt.flag} {show_value(was)}"
            other = ("without it" if given is None else f"with {opt.flag} {show_value(given)}") if was is None or \
                given is None else show_value(given)
            raise AttrscopeError(f"--resume: store '{output}' was made {made}, not {other}: rerun {made} (the same "
                                 "options), or --overwrite")
    was_device = before.get("model", {}).get("device")
    now_device = now["model"].get("device")
    if was_device and torch.device(was_device).type != torch.device(now_device).type:
        raise AttrscopeError(f"--resume: store '{output}' was computed on {was_device}, not {now_device}: "
                             f"rerun with --device {torch.device(was_device).type}, or --overwrite")
    if before.get("model", {}).get("model_id") != now["model"]["model_id"]:
        raise AttrscopeError(f"--resume: store '{output}' was made with another model: use the same --model, or --overwrite")
    if before.get("dataset", {}).get("sha256") != now["dataset"]["sha256"]:
        raise AttrscopeError(f"--resume: the dataset differs from the one store '{output}' was made from: use the same file, or --overwrite")
    if before.get("shard") != now.get("shard"):  # same K/N, yet other rows: another tokenizer cut the shards
        raise AttrscopeError(f"--resume: shard store '{output}' holds other rows than this run's shard: use the same "
                             "dataset, model and --max-length, or --overwrite")


def examples(out: BatchOutput, batch: list[int], records, tok: Tokenized, matrices: str,
             convert_ids_to_tokens, task_rows: TaskRows | None = None) -> list[ExampleData]:
    """The batch's examples as the store keeps them: every array a view of the batch's, cut to the example's tokens
    (under --matrices cls the batch's matrices and heads hold the explained row only), the tokens' ids, strings, spans
    and segments views of the window's flat arrays, evidence spans turned into a per-token flag, the task's outcome
    with the words of its target and foil tokens. ``batch``: rows of ``records`` and ``tok``."""
    o = out.outcome
    rows = np.asarray(batch, dtype=np.int64)
    n, starts = tok.lengths[rows].tolist(), tok.starts[rows].tolist()
    outcome = {f: np.asarray(getattr(o, f)).tolist() for f in ("pred", "target", "explain_pos", "target_token",
                                                                  "foil_token", "span_end", "pred_end", "output")}
    probs = np.asarray(o.probs)
    gold = [float("nan")] * len(batch) if task_rows is None else [float(task_rows.gold_value[i]) for i in batch]
    values = {name: {k: v.tolist() for k, v in vals.items()} for name, vals in out.values.items()}
    tokens = tok.tokens
    examples = []
    for b, i in enumerate(batch):
        r, k, s, pos = records[i], n[b], starts[b], outcome["explain_pos"][b]
        per = {}
        for name, res in out.results.items():
            d = {"scores": res["scores"][b, :k]}
            if "layer_scores" in res:
                d["layer_scores"] = res["layer_scores"][b, :, :k]
            if "matrices" in res:  # under --matrices cls the explained row only, cut on the device
                d["matrices"] = res["matrices"][b, :, :k, :k] if matrices == "all" else res["matrices"][b, :, :, :k]
            if "class_scores" in res:
                d["class_scores"] = res["class_scores"][b, :, :k]
            d["example_values"] = {key: v[b] for key, v in values[name].items()}
            per[name] = d
        heads = None
        if out.heads is not None:  # [B, L, H, n, n], or [B, L, H, n]: the explained row
            heads = out.heads[b, :, :, :k, :k] if out.heads.ndim == 5 else out.heads[b, :, :, :k]
        spans, segment = tok.flat_spans[s:s + k], tok.flat_segments[s:s + k]
        evidence = None
        if r.evidence is not None:  # tokens overlapping an evidence span of their own segment
            evidence = np.zeros(k, dtype=bool)
            for seg, start, end in r.evidence:
                evidence |= (segment == seg) & (spans[:, 0] < end) & (start < spans[:, 1])
        target_token, foil_token = outcome["target_token"][b], outcome["foil_token"][b]
        examples.append(ExampleData(
            row=r.row, id=r.id, text=r.text, pair=r.pair, token_ids=tok.flat_ids[s:s + k],
            tokens=tokens[s:s + k] if tokens is not None else convert_ids_to_tokens(tok.input_ids[i]), spans=spans,
            segment=segment, label=r.label, pred=outcome["pred"][b], probs=probs[b], target=outcome["target"][b],
            explain_pos=pos, n_orig_tokens=tok.n_orig[i], truncated=tok.n_orig[i] > k, results=per,
            evidence=evidence, heads=heads, target_token=target_token, foil_token=foil_token,
            span_end=outcome["span_end"][b], pred_end=outcome["pred_end"][b], output=outcome["output"][b], gold_value=gold[b],
            task_info=_task_info(target_token, foil_token, outcome["pred"][b],
                                 None if task_rows is None else task_rows.info[i], convert_ids_to_tokens)))
    return examples


def generation_examples(out: BatchOutput, batch: list[int], records, tok: Tokenized, matrices: str,
                        convert_ids_to_tokens, task_rows: TaskRows) -> list[ExampleData]:
    """A batch of generations as the store keeps them (docs/store.md "Generation stores"): per example its prompt's
    and continuation's tokens, and per step (the batch's results have one row per step, an example's consecutive)
    the step's scores [T, n] and layer views [T, V, n], its probabilities, output and foil; the pass's matrices and
    heads per example."""
    o = out.outcome
    counts = [len(task_rows.info[i]["continuation"]) for i in batch]
    first = np.cumsum([0] + counts)
    probs, output, foils = np.asarray(o.probs), np.asarray(o.output), np.asarray(o.foil_token)
    made = []
    for b, i in enumerate(batch):
        r, k, s, steps = records[i], int(tok.lengths[i]), int(tok.starts[i]), slice(first[b], first[b + 1])
        per = {}
        for name, res in out.results.items():
            d = {"step_scores": res["scores"][steps, :k],
                 "example_values": {key: v[steps] for key, v in out.values[name].items()}}
            if "layer_scores" in res:
                d["step_layer_scores"] = res["layer_scores"][steps, :, :k]
            if "matrices" in res:  # the pass's (under --matrices cls its prompt's last row)
                d["matrices"] = res["matrices"][b, :, :k, :k] if matrices == "all" else res["matrices"][b, :, :, :k]
            per[name] = d
        heads = None
        if out.heads is not None:
            heads = out.heads[b, :, :, :k, :k] if out.heads.ndim == 5 else out.heads[b, :, :, :k]
        step_foils = foils[steps]
        words = [token_strings(convert_ids_to_tokens, [int(f)])[0] if f >= 0 else None for f in step_foils]
        P = task_rows.position[i] + 1
        made.append(ExampleData(
            row=r.row, id=r.id, text=r.text, pair=None, token_ids=tok.flat_ids[s:s + k],
            tokens=tok.tokens[s:s + k] if tok.tokens is not None else convert_ids_to_tokens(tok.input_ids[i]),
            spans=tok.flat_spans[s:s + k], segment=tok.flat_segments[s:s + k], label=-1, pred=0,
            probs=np.array([np.nan, np.nan]), target=0, explain_pos=P - 1, n_orig_tokens=tok.n_orig[i],
            truncated=False, results=per, heads=heads, prompt_len=P, step_probs=probs[steps, 0],
            step_outputs=output[steps], step_foil_tokens=step_foils, step_foil_probs=probs[steps, 1],
            task_info={"foils": words} if any(w is not None for w in words) else None))
    return made


def _task_info(target_token: int, foil_token: int, pred: int, data_info: dict | None, convert_ids_to_tokens) -> dict:
    """The example's words (JSON in the store): the target and foil tokens as the tokenizer writes them, the model's
    own top word, and what the data gave (a qa answer's text)."""
    info = dict(data_info or {})
    for key, token in (("target", target_token), ("foil", foil_token)):
        if token >= 0:
            info[key] = convert_ids_to_tokens([token])[0]
    if target_token >= 0:  # a word-prediction task: the model's own top word too
        info["predicted"] = convert_ids_to_tokens([pred])[0]
    return info
