"""Stage 1, plan: the options of a run -> a validated, frozen :class:`RunPlan`.

Every check that needs no model is here, in one place: the options' own checks (``Option.check``, in declaration
order), the checks across options, the output path and, for --resume, that the store opens. The checks that need
the model or the data (--max-length against the model's limit, --target label against the labels, a method's
architecture) are made where those are loaded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import MappingProxyType

from store import open_store

from ..errors import AttrscopeError, UsageError
from ..methods import parse_methods
from ..options import GENERATE_OPTIONS
from ..outdir import check_output_dir
from ..papers import PRESETS
from ..shards import parse_shard, shard_output
from .config import RunConfig, declared_options, method_options

LOCAL_EXTENSIONS = (".jsonl", ".csv", ".tsv", ".parquet")


@dataclass(frozen=True)
class RunPlan:
    cfg: RunConfig  # the options as given (read only from here on)
    method_names: tuple[str, ...]  # as asked, before the architecture's filter
    every_method: bool  # --methods all or default: the methods the model and machine run (others skipped, not refused)
    announce_skips: bool  # --methods all says what it skips; default (nothing named) skips silently
    target_mode: str  # predicted | label | all
    dataset: str  # the dataset spec (the bundled one when none was given)
    output: str  # the store's path
    pos_self: str  # exclude | count (head statistics)
    method_params: MappingProxyType  # method name -> its parameters (method_params)
    heads: str = "none"  # per-head attention kept per example: none, cls (explained row) or all (--heads, --matrices)


def make_plan(cfg: RunConfig) -> RunPlan:
    method_names = parse_methods(cfg.methods)
    check_options(cfg)
    preset = PRESETS.get(cfg.preset, {})
    dataset = cfg.dataset or bundled_dataset()
    output = cfg.output or default_output(dataset)
    if cfg.shard is not None:  # each shard its own store beside the output named (compute.shards)
        output = shard_output(output, *parse_shard(cfg.shard))
    check_output(output, cfg)
    if dataset.lower().endswith(LOCAL_EXTENSIONS) and not os.path.exists(dataset):
        raise AttrscopeError(f"dataset file '{dataset}' not found: check the path")
    return RunPlan(
        cfg=cfg, method_names=tuple(method_names), every_method=cfg.methods.strip() in ("all", "default"),
        announce_skips=cfg.methods.strip() == "all",
        target_mode=cfg.target or preset.get("target", "predicted"), dataset=dataset, output=output,
        pos_self=cfg.pos_self or preset.get("pos_self", "exclude"),
        method_params=MappingProxyType({name: method_params(name, cfg) for name in method_names}),
        heads=cfg.matrices if cfg.heads else "none")


def method_params(name: str, cfg: RunConfig) -> dict:
    """Parameters of method ``name``: the preset's reference conventions, then the options it declares."""
    params = dict(PRESETS.get(cfg.preset, {}).get("methods", {}).get(name, {}))
    for opt in method_options(name):
        if opt.param is None:
            continue
        passed, value = opt.param_of(getattr(cfg, opt.name))
        if passed:
            params[opt.param] = value
        elif opt.param_default is not None:
            params.setdefault(opt.param, opt.param_default)  # recorded either way
    return params


def check_options(cfg: RunConfig) -> None:
    if cfg.resume and cfg.overwrite:
        raise UsageError("--resume and --overwrite exclude each other: pick one")
    if cfg.heads and cfg.matrices == "none":
        raise UsageError("--heads stores the attention as --matrices says, and --matrices none keeps nothing: use "
                         "--matrices cls (the explained row) or all")
    check_generate(cfg)
    for opt in declared_options():
        if opt.check is not None and (err := opt.check(opt.flag, getattr(cfg, opt.name))) is not None:
            raise err
    if cfg.metrics:
        # before the model loads (a model that does not exist is not reached)
        check_evidence(cfg, known_task(cfg), cfg.dataset or "")
    if cfg.preset is not None and cfg.preset not in PRESETS:
        raise UsageError(f"unknown preset '{cfg.preset}': choose from {', '.join(PRESETS)}")


def check_generate(cfg: RunConfig) -> None:
    """--task generate's options: only under it, and those that exclude each other."""
    given = [o for o in declared_options() if o.name in GENERATE_OPTIONS and getattr(cfg, o.name) not in (None, False)]
    if given and cfg.task != "generate":
        raise UsageError(f"{given[0].flag} applies to --task generate, not {cfg.task}: drop it, or pass --task generate")
    pairs = (("contrast", "contrast_column", "--contrast top2 contrasts with the runner-up, --contrast-column with the "
                                             "given foils: pick one"),
             ("continuation_column", "do_sample", "--continuation-column gives the continuation, --do-sample decodes "
                                                  "one: pick one"),
             ("continuation_column", "max_new_tokens", "--continuation-column gives the continuation, so its tokens "
                                                       "are the steps: drop --max-new-tokens"))
    for a, b, why in pairs:
        if getattr(cfg, a) not in (None, False) and getattr(cfg, b) not in (None, False):
            raise UsageError(why)
    if cfg.seed is not None and not cfg.do_sample:
        raise UsageError("--seed seeds --do-sample's draws, and greedy decoding draws none: add --do-sample, or drop "
                         "--seed")
    if cfg.contrast_column is not None and cfg.continuation_column is None:
        raise UsageError("--contrast-column gives one foil per continuation token, so it needs --continuation-column "
                         "(or use --contrast top2 with generated continuations)")
    if cfg.task == "generate" and cfg.batch_size == "auto":
        raise UsageError("--batch-size auto measures one-target batches, not a generation's steps: pass --batch-size N "
                         "with --task generate")
    if cfg.task == "generate" and cfg.target not in (None, "predicted"):
        raise UsageError(f"--target {cfg.target} has no meaning for --task generate (each step explains its own "
                         "token): drop it")


def known_task(cfg: RunConfig) -> str:
    """The run's task as far as it is known without loading the model: --task, the demo's, or what a local
    checkpoint's config.json names (read as JSON); "auto" when only the loaded model can tell."""
    import json
    from types import SimpleNamespace

    from ..tasks import detect_task

    if cfg.task != "auto":
        return cfg.task
    if cfg.model is None:
        return "classification"  # the bundled demo classifier
    config = os.path.join(os.path.expanduser(cfg.model), "config.json")
    try:
        with open(config) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return "auto"
    labels = raw.get("id2label") or {0: 0, 1: 1}  # transformers' default: two labels
    head = SimpleNamespace(architectures=raw.get("architectures"), num_labels=len(labels),
                           problem_type=raw.get("problem_type"))
    try:
        return detect_task(head)
    except AttrscopeError:
        return "auto"


def check_evidence(cfg: RunConfig, task: str, dataset: str) -> None:
    """A metric that reads evidence tokens needs --evidence-column, except under qa (the gold answers are) and for a
    file whose layout carries them (Linzen's agreement file: the subject)."""
    from ..data import gives_evidence
    from ..evaluate import evidence_metrics, parse_metric_specs

    needing = evidence_metrics(parse_metric_specs(cfg.metrics)) if cfg.metrics else []
    if needing and cfg.evidence_column is None and task != "qa" and not gives_evidence(dataset, task):
        raise UsageError(f"metric '{needing[0]}' needs evidence tokens: pass --evidence-column C with the "
                         "evidence character spans, or drop the metric (a qa run reads its gold answers: --task qa)")


def check_output(output: str, cfg: RunConfig) -> None:
    if os.path.isdir(output):
        raise AttrscopeError(f"-o '{output}' is a directory: pass a file name, e.g. -o {os.path.join(output, 'run.h5')}")
    exists = os.path.exists(output)
    if cfg.resume and not exists:
        raise AttrscopeError(f"--resume: store '{output}' does not exist: run without --resume to create it")
    if exists and not (cfg.resume or cfg.overwrite):
        raise AttrscopeError(f"store '{output}' already exists: pass --overwrite to replace it or --resume to finish it")
    if cfg.resume:
        # a damaged or truncated store is named (StoreError) before the model loads (minutes on a large model)
        open_store(output).close()
    check_output_dir(output, "-o")


def bundled_dataset() -> str:
    from importlib.resources import files

    return str(files("attrscope_examples") / "reviews.jsonl")


def default_output(dataset: str) -> str:
    base = os.path.basename(dataset.rstrip("/")).split(":")[0]
    stem = os.path.splitext(base)[0] or "attributions"
    return f"{stem.replace('/', '_')}.h5"
