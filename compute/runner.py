"""The batch loop of ``attr-compute``: dataset -> tokens -> batched forward + methods -> store.

Examples are processed in windows of consecutive rows. Inside a window they are sorted by length into batches (less
padding), and the window is committed in the original order, so the store is always a prefix of the dataset, which
is what makes ``--resume`` simple: skip the committed rows, go on.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import torch

from store import ExampleData, MethodLayout, StoreWriter, open_store
from store import resume as resume_store
from store.errors import StoreError

from . import __version__, interrupts
from .data import Dataset, Record, load_dataset
from .errors import AttrscopeError, UsageError
from .methods import get_method, parse_methods
from .models import LoadedModel, load_model, resolve_device
from .papers import PRESETS  # the run presets, one per paper

LOCAL_EXTENSIONS = (".jsonl", ".csv", ".tsv", ".parquet")


@dataclass
class RunConfig:
    dataset: str | None = None  # None: the bundled example dataset
    output: str | None = None
    model: str | None = None  # None: the bundled demo classifier
    methods: str = "all"
    limit: int | None = None
    batch_size: int = 32
    device: str = "auto"
    dtype: str = "float32"
    max_length: int | None = None
    text_column: str | None = None
    pair_column: str | None = None
    label_column: str | None = None
    id_column: str | None = None
    evidence_column: str | None = None  # character spans of evidence / answer tokens (precision_at_k, AP, ...)
    split: str | None = None
    target: str | None = None  # predicted | label | all (None: the preset's, else predicted)
    matrices: str = "cls"
    store_dtype: str = "float16"
    resume: bool = False
    overwrite: bool = False
    preset: str | None = None
    alti_ln2: bool = False  # ALTI+LN2 variant for alti and alti_l2
    memory_mb: int = 8  # budget of ALTI's source-token blocks (cache-sized blocks were fastest on CPU)
    ig_steps: int | None = None  # None: the preset's, else 50
    ig_rule: str | None = None  # gausslegendre | riemann (None: gausslegendre)
    ig_baseline: str | None = None  # mask | zero (None: the preset's, else mask)
    ig_memory_mb: int = 1024  # rows of (example, step) per forward/backward of integrated gradients
    attcat_layers: str | None = None  # inputs | outputs (cat, attcat)
    attgrads_variant: str | None = None  # ref | gradsam
    lrp_dtype: str = "float64"  # float64 | model: precision of the LRP rules (lrp, partial_lrp, transatt, mask_lrp)
    head_stats_data: str | None = None  # dataset of the head-statistics pass (None: the run's dataset)
    head_stats_limit: int | None = None  # its first N examples
    parses: str | None = None  # CoNLL-U parses for the syntactic statistics (None: spaCy)
    head_mask: str | None = None  # reuse the head masks of this store instead of computing them
    pos_self: str | None = None  # exclude | count: positional offset 0 (None: the preset's, else exclude)
    mask_combine: str = "union"  # union | sum of the positional and syntactic masks
    mask_rollout: str = "unmasked"  # unmasked | masked attention relevance in mask_lrp's rollout
    mask_renormalise: bool = False  # the paper's rescaling of the kept heads' relevance
    mask_rollout_unhalved: bool | None = None  # mask_lrp rolls out R^A before the 1/2 (the reference; None: preset's)
    metrics: str | None = None  # faithfulness metrics computed over the finished store (compute.evaluate)
    eval: object = None  # its EvalConfig (the CLI builds it from the metric options)
    window: int = 8  # batches per window (sort-by-length scope and commit unit)
    allow_random_head: bool = False  # run a checkpoint whose task head transformers initialised at random (testing)
    argv: list[str] = field(default_factory=list)


class Progress:
    """What the runner reports while it works. The CLI renders it with rich; tests use this silent default."""

    def start(self, total: int, completed: int) -> None: ...

    def advance(self, n: int) -> None: ...

    def message(self, text: str) -> None: ...

    def stop(self) -> None: ...


def bundled_dataset() -> str:
    from importlib.resources import files

    return str(files("attrscope_examples") / "reviews.jsonl")


def default_output(dataset: str) -> str:
    base = os.path.basename(dataset.rstrip("/")).split(":")[0]
    stem = os.path.splitext(base)[0] or "attributions"
    return f"{stem.replace('/', '_')}.h5"


# ----------------------------------------------------------------------------------------------------------------
def run(cfg: RunConfig, progress: Progress | None = None) -> dict:
    """Compute attributions for ``cfg`` and write the store. Returns the summary dict."""
    progress = progress or Progress()
    t_start = time.perf_counter()
    method_names = parse_methods(cfg.methods)
    _check_options(cfg)
    target_mode = cfg.target or PRESETS.get(cfg.preset, {}).get("target", "predicted")
    dataset_spec = cfg.dataset or bundled_dataset()
    output = cfg.output or default_output(dataset_spec)
    _check_output(output, cfg)
    if dataset_spec.lower().endswith(LOCAL_EXTENSIONS) and not os.path.exists(dataset_spec):
        raise AttrscopeError(f"dataset file '{dataset_spec}' not found: check the path")

    device = resolve_device(cfg.device)
    lm = load_model(cfg.model, device=device, dtype=cfg.dtype, allow_random_head=cfg.allow_random_head)
    info = lm.info
    if info.get("random_head"):
        progress.message(f"--allow-random-head: {len(info['random_head'])} weights of the task head are random "
                         "(recorded in the store): the results explain no trained classifier")
    id2label = info["id2label"]
    data = load_dataset(
        dataset_spec, text_column=cfg.text_column, pair_column=cfg.pair_column, label_column=cfg.label_column,
        id_column=cfg.id_column, evidence_column=cfg.evidence_column, split=cfg.split, limit=cfg.limit,
        label2id={v: k for k, v in id2label.items()}, num_labels=len(id2label))
    if target_mode == "label" and any(r.label < 0 for r in data.records):
        first = next(r for r in data.records if r.label < 0)
        raise AttrscopeError(f"--target label needs gold labels, but example '{first.id}' has none: use --target predicted")

    # From here on a stop asked for (Ctrl-C, SIGTERM) is acted on at the next safe point (compute.interrupts).
    state: dict = {}  # what the run got to: the open writer, the metrics written
    with interrupts.on_signals(), interrupts.layer_checks(lm.adapter.layers()):
        try:
            return _compute(cfg, lm, data, method_names, target_mode, output, progress, t_start, state)
        except KeyboardInterrupt as err:
            raise interrupts.Interrupted(_stopped_message(cfg, output, len(data.records), state, err)) from None


def _compute(cfg, lm, data, method_names, target_mode, output, progress, t_start, state) -> dict:
    device = lm.info["device"]  # as resolved from --device
    dataset_spec = data.source
    max_length = _max_length(cfg, lm)
    methods = {name: get_method(name, **method_params(name, cfg)) for name in method_names}
    if cfg.methods.strip() == "all":  # 'all' means every method defined for this architecture
        skipped = [name for name, m in methods.items() if not _defined(m, lm.adapter)]
        methods = {name: m for name, m in methods.items() if name not in skipped}
        method_names = list(methods)
        if skipped:
            progress.message(f"--methods all: skipping {', '.join(skipped)}, not defined for the "
                             f"{lm.info['model_type']} architecture (METHODS.md section 9)")
    for m in methods.values():
        m.check_architecture(lm.adapter)  # a method named explicitly but undefined: one line, nothing written
    head_masks = []
    if "mask_lrp" in methods:
        try:
            head_masks = _head_masks(cfg, lm, data, dataset_spec, max_length, output, progress)
        except AttrscopeError as err:
            if cfg.methods.strip() != "all" or cfg.parses or cfg.head_mask or cfg.head_stats_data:
                raise
            del methods["mask_lrp"]  # bare --methods all on a machine without a parser
            method_names = list(methods)
            progress.message(f"--methods all: skipping mask_lrp ({err})")
        else:
            methods["mask_lrp"].params["head_mask"] = next(h for h in head_masks if h.name == "mask_lrp").mask.tolist()
            methods["mask_lrp"].check_architecture(lm.adapter)
    layouts = _layouts(methods, lm, cfg, target_mode)
    provenance = _provenance(cfg, lm, data, method_names, target_mode, max_length, output)

    with interrupts.critical():
        writer, done = _open_writer(output, cfg, lm, layouts, provenance, head_masks)
    state["writer"] = writer
    records = data.records[done:]
    try:
        tok = _tokenize(lm, records, max_length)
        if cfg.matrices == "all" and records:
            _estimate_size(progress, tok, layouts, cfg)
        progress.start(total=len(data.records), completed=done)
        stats = _loop(lm, methods, records, tok, writer, cfg, target_mode, progress)
    except BaseException:
        progress.stop()
        with interrupts.critical():
            writer.close()
        raise
    progress.stop()
    total_tokens = writer.n_tokens
    n_examples = writer.n_committed
    summary = {
        "examples": n_examples,
        "examples_this_run": len(records),
        "tokens": total_tokens,
        "wall_seconds": round(time.perf_counter() - t_start, 3),
        "forward_seconds": round(stats["forward"], 3),
        "method_seconds": {k: round(v, 3) for k, v in stats["methods"].items()},
        "device": str(device),
        "resumed_from": done if cfg.resume else None,
    }
    with interrupts.critical():
        writer.close(complete=True, summary=summary)
    interrupts.check()
    if cfg.metrics:
        from .evaluate import EvalConfig, evaluate_store

        ecfg = cfg.eval or EvalConfig(metrics=cfg.metrics, preset=cfg.preset)
        if ecfg.preset is None:
            ecfg.preset = cfg.preset
        t0 = time.perf_counter()
        state["metrics"] = True
        summary["metrics"] = evaluate_store(output, ecfg, lm=lm, message=progress.message)
        summary["metric_seconds"] = round(time.perf_counter() - t0, 3)
    summary["store"] = os.path.abspath(output)
    summary["store_bytes"] = os.path.getsize(output)
    return summary


def resume_command(argv: list[str]) -> str:
    """The command line that finishes an interrupted run: the same one with --resume instead of --overwrite."""
    import shlex

    args = [a for a in argv if a != "--overwrite"]
    if "--resume" not in args:
        args.append("--resume")
    return shlex.join(args)


def _stopped_message(cfg: RunConfig, output: str, total: int, state: dict, err: BaseException) -> str:
    """The one line printed when a run stops on a signal: what the store keeps and how to finish it."""
    again = resume_command(cfg.argv) if cfg.argv else "the same options and --resume"
    writer = state.get("writer")
    if writer is None:  # stopped while loading, in the head statistics, before the store was opened
        kept = f"store '{output}' is as it was" if os.path.exists(output) else "nothing was written"
        return f"interrupted before the first example: {kept}; run the same command again"
    if state.get("metrics"):
        return (f"interrupted during the metrics: store '{output}' is complete{'; ' + str(err) if str(err) else ''}; "
                f"compute the rest with: {again}")
    return (f"interrupted: store '{output}' keeps its {writer.n_committed} of {total} examples committed so far; "
            f"finish it with: {again}")


def _head_masks(cfg: RunConfig, lm: LoadedModel, data: Dataset, dataset_spec: str, max_length: int, output: str,
                progress: Progress) -> list:
    """mask_lrp's head masks: the resumed store's own, another store's (--head-mask), or a statistics pass."""
    from .head_pass import HeadPassOptions, compute_head_masks, masks_from_store

    L, H = lm.adapter.n_layers, lm.adapter.n_heads
    if cfg.resume:
        return masks_from_store(output, L, H)
    if cfg.head_mask:
        if not os.path.exists(cfg.head_mask):
            raise AttrscopeError(f"--head-mask: store '{cfg.head_mask}' not found: check the path")
        return masks_from_store(cfg.head_mask, L, H)
    records, source = data.records, data.source
    if cfg.head_stats_data:
        id2label = lm.info["id2label"]
        other = load_dataset(cfg.head_stats_data, text_column=cfg.text_column, pair_column=cfg.pair_column,
                             label_column=cfg.label_column, id_column=cfg.id_column, split=cfg.split,
                             limit=cfg.head_stats_limit, label2id={v: k for k, v in id2label.items()},
                             num_labels=len(id2label))
        records, source = other.records, other.source
    if cfg.head_stats_limit is not None:
        records = records[:cfg.head_stats_limit]
    pos_self = cfg.pos_self or PRESETS.get(cfg.preset, {}).get("pos_self", "exclude")
    opt = HeadPassOptions(source=source, batch_size=cfg.batch_size, max_length=max_length, parses=cfg.parses,
                          exclude_self=pos_self == "exclude", combine=cfg.mask_combine,
                          mask_sep=bool(method_params("mask_lrp", cfg).get("mask_sep")))
    return compute_head_masks(lm, records, opt, progress.message)


def _defined(method, adapter) -> bool:
    try:
        method.check_architecture(adapter)
        return True
    except AttrscopeError:
        return False


def method_params(name: str, cfg: RunConfig) -> dict:
    """Parameters of method ``name``: the preset's reference conventions, then the explicit options."""
    params = dict(PRESETS.get(cfg.preset, {}).get("methods", {}).get(name, {}))
    if name in ("alti", "alti_l2"):
        params["memory_mb"] = cfg.memory_mb
        if cfg.alti_ln2:
            params["ln2"] = True
    if name in ("ig_l2", "ig_mean"):
        params["memory_mb"] = cfg.ig_memory_mb
        for key, value in (("steps", cfg.ig_steps), ("rule", cfg.ig_rule), ("baseline", cfg.ig_baseline)):
            if value is not None:
                params[key] = value
    if name in ("cat", "attcat") and cfg.attcat_layers:
        params["layers"] = cfg.attcat_layers
    if name == "attgrads" and cfg.attgrads_variant:
        params["variant"] = cfg.attgrads_variant
    if name in ("lrp", "partial_lrp", "transatt", "mask_lrp"):
        params["dtype"] = cfg.lrp_dtype
    if name == "mask_lrp":
        params.update(combine=cfg.mask_combine, rollout_uses_masked=cfg.mask_rollout == "masked",
                      renormalise=bool(cfg.mask_renormalise))
        if cfg.mask_rollout_unhalved is not None:
            params["rollout_unhalved"] = cfg.mask_rollout_unhalved
        params["rollout_unhalved"] = bool(params.get("rollout_unhalved", False))  # recorded either way
    return params


def _check_options(cfg: RunConfig) -> None:
    if cfg.resume and cfg.overwrite:
        raise UsageError("--resume and --overwrite exclude each other: pick one")
    if cfg.batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    if cfg.max_length is not None and cfg.max_length < 2:
        raise UsageError("--max-length must be at least 2 (room for the special tokens)")
    if cfg.memory_mb < 1:
        raise UsageError("--memory-mb must be at least 1")
    if cfg.ig_steps is not None and cfg.ig_steps < 1:
        raise UsageError("--ig-steps must be at least 1")
    if cfg.ig_memory_mb < 1:
        raise UsageError("--ig-memory-mb must be at least 1")
    if cfg.head_stats_limit is not None and cfg.head_stats_limit < 1:
        raise UsageError("--head-stats-limit must be at least 1")
    if cfg.parses and not os.path.exists(cfg.parses):
        raise AttrscopeError(f"--parses: file '{cfg.parses}' not found: check the path")
    if cfg.metrics:
        from .evaluate import evidence_metrics, parse_metric_specs

        needing = evidence_metrics(parse_metric_specs(cfg.metrics))
        if needing and cfg.evidence_column is None:
            raise UsageError(f"metric '{needing[0]}' needs evidence tokens: pass --evidence-column C with the "
                             "evidence character spans, or drop the metric")
    if cfg.preset is not None and cfg.preset not in PRESETS:
        raise UsageError(f"unknown preset '{cfg.preset}': choose from {', '.join(PRESETS)}")


def _check_output(output: str, cfg: RunConfig) -> None:
    if os.path.isdir(output):
        raise AttrscopeError(f"-o '{output}' is a directory: pass a file name, e.g. -o {os.path.join(output, 'run.h5')}")
    exists = os.path.exists(output)
    if cfg.resume and not exists:
        raise AttrscopeError(f"--resume: store '{output}' does not exist: run without --resume to create it")
    if exists and not (cfg.resume or cfg.overwrite):
        raise AttrscopeError(f"store '{output}' already exists: pass --overwrite to replace it or --resume to finish it")
    if cfg.resume:
        try:  # a damaged or truncated store is named before the model loads (minutes on a large model)
            open_store(output).close()
        except StoreError as err:
            raise AttrscopeError(str(err)) from None
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise AttrscopeError(f"output directory '{parent}' does not exist: create it or choose another -o")
    if not os.access(parent, os.W_OK):
        raise AttrscopeError(f"output directory '{parent}' is not writable: choose another -o")


def _max_length(cfg: RunConfig, lm: LoadedModel) -> int:
    limit = int(getattr(lm.model.config, "max_position_embeddings", 512))
    if lm.info["model_type"] in ("roberta", "xlm-roberta", "camembert"):
        limit -= 2  # positions start after padding_idx
    tok_max = getattr(lm.tokenizer, "model_max_length", limit) or limit
    limit = min(limit, tok_max if tok_max < 1_000_000 else limit)
    if cfg.max_length is None:
        return limit
    if cfg.max_length > limit:
        raise UsageError(f"--max-length {cfg.max_length} exceeds what the model accepts ({limit})")
    return cfg.max_length


def _layouts(methods, lm: LoadedModel, cfg: RunConfig, target_mode: str) -> list[MethodLayout]:
    out = []
    for name, m in methods.items():
        mat = cfg.matrices if m.has_matrices else "none"
        out.append(MethodLayout(
            name=name, signed=m.signed, n_layer_views=m.n_layer_views(lm.adapter), matrices=mat,
            n_matrix_layers=lm.adapter.n_layers if mat != "none" else 0,
            class_scores=bool(m.class_specific and target_mode == "all"), example_values=tuple(m.example_values),
            description=m.description,
            params={**m.params, "store_dtype": cfg.store_dtype, "reference": m.reference,
                    "class_specific": m.class_specific,
                    "target": target_mode if m.class_specific else None}))
    return out


def _provenance(cfg, lm, data: Dataset, method_names, target_mode, max_length, output) -> dict:
    import h5py
    import transformers

    return {
        "attrscope_version": __version__,
        "command": cfg.argv,
        "config": {**asdict(cfg), "methods": method_names, "target": target_mode, "max_length": max_length,
                   "output": os.path.abspath(output)},
        "model": lm.info,
        "dataset": {"source": data.source, "kind": data.kind, "columns": data.columns, "n_rows": data.n_rows,
                    "n_records": len(data.records), "sha256": data.sha256, "label_names": data.label_names},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "h5py": h5py.__version__, "numpy": np.__version__},
        "host": {"platform": platform.platform(), "cuda": torch.version.cuda,
                 "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
    }


# Settings that must match for --resume to continue a store: everything that changes the numbers (batch size,
# window, dtype and the memory budgets change how examples are batched and summed, hence float rounding), the data
# read, or what is stored. The head-statistics options are absent: a resumed run reads its masks from the store.
_RESUME_KEYS = ("methods", "target", "matrices", "store_dtype", "max_length", "limit", "split", "preset", "text_column",
                "pair_column", "label_column", "id_column", "evidence_column", "batch_size", "window", "dtype",
                "memory_mb", "ig_memory_mb", "alti_ln2", "ig_steps", "ig_rule", "ig_baseline", "attcat_layers",
                "attgrads_variant", "lrp_dtype", "mask_combine", "mask_rollout", "mask_renormalise",
                "mask_rollout_unhalved")


def _open_writer(output, cfg, lm, layouts, provenance, head_masks=()) -> tuple[StoreWriter, int]:
    if cfg.resume:
        try:
            with open_store(output) as old:
                before = old.config
        except StoreError as err:
            raise AttrscopeError(str(err)) from None
        _check_resume(before, provenance, output)
        try:
            writer = resume_store(output)
        except OSError as err:
            raise AttrscopeError(f"cannot write store '{output}': {_os_reason(err)}: check the path and its "
                                 "permissions") from None
        return writer, writer.n_committed
    try:
        if cfg.overwrite and os.path.exists(output):
            os.remove(output)
        return _create_writer(output, cfg, lm, layouts, provenance, head_masks), 0
    except OSError as err:
        raise AttrscopeError(f"cannot create store '{output}': {_os_reason(err)}: choose another -o") from None


def _os_reason(err: OSError) -> str:
    """The system's reason (HDF5 wraps it into a long message; the errno's text is what the user needs)."""
    import errno as errno_names

    if err.errno in errno_names.errorcode:
        return os.strerror(err.errno)
    return " ".join(str(err).split())[:200]


def _create_writer(output, cfg, lm, layouts, provenance, head_masks) -> StoreWriter:
    attrs = {"model_id": lm.info["model_id"], "model_revision": str(lm.info.get("revision")),
             "tokenizer": lm.info.get("tokenizer", ""), "attn_implementation": "eager",
             "torch_version": torch.__version__, "transformers_version": provenance["versions"]["transformers"],
             "attrscope_version": __version__, "dataset": provenance["dataset"]["source"]}
    return StoreWriter.create(output, n_layers=lm.adapter.n_layers, n_heads=lm.adapter.n_heads,
                              labels=lm.info["id2label"], methods=layouts, provenance=provenance, attrs=attrs,
                              head_masks=list(head_masks), evidence=cfg.evidence_column is not None)


def _check_resume(before: dict, now: dict, output: str) -> None:
    b, n = before.get("config", {}), now["config"]
    defaults = {f.name: f.default for f in fields(RunConfig)}
    for key in _RESUME_KEYS:
        was = b.get(key, defaults.get(key))  # a store older than the option was made with its default
        if was != n.get(key):
            option = _OPTION_OF.get(key, f"--{key.replace('_', '-')}")
            raise AttrscopeError(
                f"--resume: store '{output}' was made with {option} {_show(was)}, not {_show(n.get(key))}: "
                f"rerun with {option} {_show(was)} (the same options), or --overwrite")
    was_device = before.get("model", {}).get("device")
    now_device = now["model"].get("device")
    if was_device and torch.device(was_device).type != torch.device(now_device).type:
        raise AttrscopeError(f"--resume: store '{output}' was computed on {was_device}, not {now_device}: "
                             f"rerun with --device {torch.device(was_device).type}, or --overwrite")
    if before.get("model", {}).get("model_id") != now["model"]["model_id"]:
        raise AttrscopeError(f"--resume: store '{output}' was made with another model: use the same --model, or --overwrite")
    if before.get("dataset", {}).get("sha256") != now["dataset"]["sha256"]:
        raise AttrscopeError(f"--resume: the dataset differs from the one store '{output}' was made from: use the same file, or --overwrite")


_OPTION_OF = {"window": "the window (RunConfig.window)", "target": "--target"}


def _show(value) -> str:
    """An option's value as the user types it (None: the option was not given)."""
    if value is None:
        return "(not given)"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


# ----------------------------------------------------------------------------------------------------------------
@dataclass
class Tokenized:
    input_ids: list[list[int]]
    token_type_ids: list[list[int]] | None
    offsets: list[list[tuple[int, int]]] | None
    segments: list[list[int]]
    n_orig: list[int]


def _tokenize(lm: LoadedModel, records: list[Record], max_length: int) -> Tokenized:
    tok = lm.tokenizer
    texts = [r.text for r in records]
    pairs = [r.pair for r in records]
    has_pair = any(p is not None for p in pairs)
    if has_pair and any(p is None for p in pairs):
        raise AttrscopeError("some examples have a pair text and some do not: fill the pair column for every row")
    second = pairs if has_pair else None
    if not records:
        return Tokenized([], None, None, [], [])
    fast = getattr(tok, "is_fast", False)
    enc = tok(texts, second, truncation=True, max_length=max_length, return_offsets_mapping=fast,
              return_token_type_ids=True, verbose=False)
    full = tok(texts, second, truncation=False, verbose=False)["input_ids"]
    empty = next((r for r, ids in zip(records, enc["input_ids"]) if not ids), None)
    if empty is not None:
        raise AttrscopeError(f"example '{empty.id}' has no tokens (empty text and no special tokens): remove or fill it")
    segments = []
    for i in range(len(records)):
        seq = enc.sequence_ids(i) if fast else [0] * len(enc["input_ids"][i])
        segments.append([-1 if s is None else int(s) for s in seq])
    return Tokenized(
        input_ids=enc["input_ids"], token_type_ids=enc.get("token_type_ids"),
        offsets=enc["offset_mapping"] if fast else None, segments=segments, n_orig=[len(x) for x in full])


def _estimate_size(progress: Progress, tok: Tokenized, layouts, cfg) -> None:
    n_sq = sum(len(x) ** 2 for x in tok.input_ids)
    per = 2 if cfg.store_dtype == "float16" else 4
    total = sum(n_sq * lay.n_matrix_layers * per for lay in layouts if lay.matrices == "all")
    progress.message(f"--matrices all: about {total / 1e6:.1f} MB of matrices before compression "
                     "(use --matrices cls or none for less)")


def _pad(seqs: list[list[int]], value: int, device) -> torch.Tensor:
    n = max(len(s) for s in seqs)
    out = torch.full((len(seqs), n), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out.to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _loop(lm, methods, records, tok: Tokenized, writer: StoreWriter, cfg, target_mode, progress) -> dict:
    device = next(lm.model.parameters()).device
    needs = frozenset().union(*(m.needs for m in methods.values())) if methods else frozenset()
    num_labels = writer.num_labels
    pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    stats = {"forward": 0.0, "methods": {name: 0.0 for name in methods}}
    win = cfg.batch_size * cfg.window
    lengths = [len(x) for x in tok.input_ids]
    for w0 in range(0, len(records), win):
        idx = list(range(w0, min(w0 + win, len(records))))
        idx.sort(key=lambda i: -lengths[i])  # longest first: an out-of-memory shows up at once
        done: dict[int, ExampleData] = {}
        for b0 in range(0, len(idx), cfg.batch_size):
            batch = idx[b0:b0 + cfg.batch_size]
            for i, ex in zip(batch, _run_batch(lm, methods, needs, records, tok, batch, pad_id, device, num_labels,
                                                target_mode, cfg, stats)):
                done[i] = ex
            progress.advance(len(batch))
            interrupts.check()
        with interrupts.critical():  # a commit is never cut in half
            writer.append([done[i] for i in range(w0, w0 + len(idx))])
        interrupts.check()
    return stats


@torch.no_grad()
def _run_batch(lm, methods, needs, records, tok, batch, pad_id, device, num_labels, target_mode, cfg, stats):
    ids = [tok.input_ids[i] for i in batch]
    enc = {"input_ids": _pad(ids, pad_id, device),
           "attention_mask": _pad([[1] * len(s) for s in ids], 0, device)}
    if tok.token_type_ids is not None:
        enc["token_type_ids"] = _pad([tok.token_type_ids[i] for i in batch], 0, device)
    _sync(device)
    t0 = time.perf_counter()
    cap = lm.adapter.capture(enc, needs)
    _sync(device)
    stats["forward"] += time.perf_counter() - t0

    pred = cap.pred
    if target_mode == "label":
        target = torch.as_tensor([records[i].label for i in batch], dtype=torch.long, device=device)
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
        if res.matrices is not None and cfg.matrices != "none":
            out["matrices"] = res.matrices
        results[name] = {k: v.detach().float().cpu().numpy() for k, v in out.items()}
        values[name] = {k: v.detach().float().cpu().numpy() for k, v in (res.example_values or {}).items()}
        _sync(device)
        stats["methods"][name] += time.perf_counter() - t0

    probs = cap.probs.cpu().numpy()
    pred_np = pred.cpu().numpy()
    target_np = target.cpu().numpy()
    pos_np = cap.explain_pos.cpu().numpy()
    convert = lm.tokenizer.convert_ids_to_tokens
    out = []
    for b, i in enumerate(batch):
        r = records[i]
        n = len(tok.input_ids[i])
        pos = int(pos_np[b])
        per = {}
        for name, res in results.items():
            d = {"scores": res["scores"][b, :n]}
            if "layer_scores" in res:
                d["layer_scores"] = res["layer_scores"][b, :, :n]
            if "matrices" in res:
                m = res["matrices"][b, :, :n, :n]
                d["matrices"] = m if cfg.matrices == "all" else m[:, pos:pos + 1, :]
            if "class_scores" in res:
                d["class_scores"] = res["class_scores"][b, :, :n]
            d["example_values"] = {k: float(v[b]) for k, v in values[name].items()}
            per[name] = d
        offsets = np.asarray(tok.offsets[i], dtype=np.int32) if tok.offsets is not None else np.full((n, 2), -1)
        segment = np.asarray(tok.segments[i], dtype=np.int8)
        offsets[segment < 0] = -1
        evidence = None
        if r.evidence is not None:  # tokens overlapping an evidence span of their own segment
            evidence = np.zeros(n, dtype=bool)
            for seg, start, end in r.evidence:
                evidence |= (segment == seg) & (offsets[:, 0] < end) & (start < offsets[:, 1])
        out.append(ExampleData(
            row=r.row, id=r.id, text=r.text, pair=r.pair, token_ids=np.asarray(tok.input_ids[i]),
            tokens=convert(tok.input_ids[i]), spans=offsets, segment=segment, label=r.label,
            pred=int(pred_np[b]), probs=probs[b], target=int(target_np[b]), explain_pos=pos,
            n_orig_tokens=tok.n_orig[i], truncated=tok.n_orig[i] > n, results=per, evidence=evidence))
    return out
