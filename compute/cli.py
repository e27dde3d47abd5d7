"""``attr-compute``: batch a dataset through a classifier and attribution methods into an attrscope store.

``attr-compute [DATASET] [options]`` runs the job (the ``run`` command is implied); ``attr-compute methods`` lists
the methods. Errors are one line on stderr, exit code 1 (2 for usage errors); ``--debug`` shows tracebacks.
"""

from __future__ import annotations

import shlex
import sys
from contextlib import contextmanager

import click

from .errors import AttrscopeError
from .export import CHUNK_ROWS as EXPORT_CHUNK_ROWS
from . import interrupts
from .interrupts import Interrupted
from .papers import PRESET_NAMES

PROG = "attr-compute"


class DefaultGroup(click.Group):
    """A group whose first argument, when it is not a subcommand, goes to the default command ``run``."""

    default_cmd = "run"

    def main(self, args=None, prog_name=None, **extra):
        # Usage errors as one line too (click's default prints usage and a hint over several lines).
        extra.pop("standalone_mode", None)
        try:
            rv = super().main(args, prog_name or PROG, standalone_mode=False, **extra)
        except click.UsageError as err:
            hint = f" (see {PROG} --help)"
            _fail(" ".join(err.format_message().split()) + hint, 2)
        except click.ClickException as err:
            _fail(" ".join(err.format_message().split()), err.exit_code)
        except click.exceptions.Abort:  # Ctrl-C before a command began its work (click turns it into Abort)
            _fail("interrupted before anything was written: run the same command again", 130)
        sys.exit(rv if isinstance(rv, int) else 0)

    def parse_args(self, ctx, args):
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h", "--version")):
            args = [self.default_cmd, *args]
        return super().parse_args(ctx, args)


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="attrscope", prog_name=PROG)
def main():
    """Token attributions of a Transformer classifier, layer by layer, into one HDF5 store.

    \b
    attr-compute [DATASET] [OPTIONS]     compute (see: attr-compute run --help)
    attr-compute merge OUT.h5 SHARD...   join the shard stores of a --shard K/N run
    attr-compute methods                 list the attribution methods
    attr-tui STORE.h5                    browse the result in the terminal
    """


def metric_options(fn):
    """Options shared by ``run --metrics`` and ``eval`` (METHODS.md section 8)."""
    opts = [
        click.option("--saliency", default="gxi_l2", show_default=True, metavar="METHOD",
                     help="spearman: the saliency method of the same store to correlate with (GlobEnc's evaluation)."),
        click.option("--precision-k", "precision_k", type=int, default=20, show_default=True, metavar="K",
                     help="precision_at_k: top-K positions."),
        click.option("--other", "other_store", type=click.Path(dir_okay=False), metavar="STORE.h5", default=None,
                     help="jaccard_25, seed_spearman: the store to compare with (e.g. another seed)."),
        click.option("--perturbation", type=click.Choice(["delete", "pad", "mask"]), default=None,
                     help="aopc/lodds/accuracy: delete tokens or replace them by [PAD] / [MASK] [default: the preset's]."),
        click.option("--levels", type=click.Choice(["ninths", "tenths", "ranked_tenths"]), default=None,
                     help="aopc/lodds/accuracy: k = round(i/9 n) (AttCAT, Mask-LRP), int(i/10 n) (NormXLogit) or "
                          "floor(i/10 m), m the tokens other than [CLS]/[SEP] (DecompX)."),
        click.option("--metric-class", type=click.Choice(["label", "predicted"]), default=None,
                     help="aopc/lodds/accuracy: the class whose probability is tracked."),
        click.option("--side", type=click.Choice(["top", "bottom"]), default=None,
                     help="aopc/lodds/accuracy: perturb the most (top) or least (bottom) important tokens first."),
        click.option("--metric-batch-size", type=int, default=64, show_default=True, metavar="N",
                     help="Perturbed sequences per forward pass."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _eval_config(metrics, methods, preset, saliency, precision_k, other_store, perturbation, levels, metric_class,
                 side, metric_batch_size):
    from .evaluate import EvalConfig

    if metric_batch_size < 1:
        from .errors import UsageError

        raise UsageError("--metric-batch-size must be at least 1")
    return EvalConfig(metrics=metrics, methods=methods, preset=preset, saliency=saliency, k=precision_k,
                      other=other_store, batch_size=metric_batch_size,
                      overrides={"perturbation": perturbation, "levels": levels, "cls": metric_class, "side": side})


class ParsedValue(click.ParamType):
    """A declared option's ``parse`` as a click type: its ValueError is the usage error."""

    def __init__(self, parse, name):
        self.parse, self.name = parse, name or "value"

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value  # the default
        try:
            return self.parse(value)
        except ValueError as err:
            self.fail(str(err), param, ctx)


def click_option(opt) -> click.Option:
    """The command-line option of a declared option (compute.options.Option)."""
    decls = list(opt.flags) or ["--" + opt.name.replace("_", "-")]
    kw = {"help": opt.help, "metavar": opt.metavar, "show_default": opt.show_default or None}
    if opt.choices:
        kw["type"] = click.Choice(list(opt.choices))
    elif opt.path:
        kw["type"] = click.Path(dir_okay=False)
    elif opt.parse:
        kw["type"] = ParsedValue(opt.parse, opt.metavar)
    elif opt.type is int:
        kw["type"] = int
    if opt.type is bool and not any("/" in d for d in decls):
        kw["is_flag"] = True
    kw["default"] = opt.default
    return click.Option(decls + [opt.name], **{k: v for k, v in kw.items() if v is not None or k == "default"})


class RunCommand(click.Command):
    """``run`` takes every declared option (compute.run.config.declared_options) after its DATASET argument: the
    run-level ones and each registered method's, as the registry holds them when the command runs."""

    _made: dict = {}  # declarations -> their click options (click asks for the parameters more than once)

    def get_params(self, ctx):
        from .run.config import declared_options

        declared = tuple(o for o in declared_options() if o.cli)
        if declared not in self._made:
            self._made[declared] = [click_option(o) for o in declared]
        params = super().get_params(ctx)
        return [params[0], *self._made[declared], *params[1:]]  # DATASET first, as in the usage line

    def parse_args(self, ctx, args):
        # The methods' options come with the methods (torch, 1-2 s): a damaged store to resume is named before.
        output = _resumed_output(args)
        if output:
            _guarded(lambda: _check_readable(output), "--debug" in args)
        return super().parse_args(ctx, args)


def _resumed_output(args: list[str]) -> str | None:
    """The -o of a command line with --resume, read off the raw arguments (None without either)."""
    args = args[:args.index("--")] if "--" in args else args
    if "--resume" not in args:
        return None
    output = shard = None
    for i, arg in enumerate(args):
        if arg in ("-o", "--output") and i + 1 < len(args):
            output = args[i + 1]
        elif arg.startswith("--output="):
            output = arg.split("=", 1)[1]
        elif arg.startswith("-o") and not arg.startswith("--") and len(arg) > 2:
            output = arg[2:]
        elif arg == "--shard" and i + 1 < len(args):
            shard = args[i + 1]
        elif arg.startswith("--shard="):
            shard = arg.split("=", 1)[1]
    if output and shard:  # the shard's own store (compute.shards); a bad K/N is the plan's usage error
        from .errors import UsageError
        from .shards import parse_shard, shard_output

        try:
            output = shard_output(output, *parse_shard(shard))
        except UsageError:
            return None
    return output


@main.command("run", cls=RunCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("dataset", required=False)
@metric_options
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary.")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def run_cmd(dataset, saliency, precision_k, other_store, perturbation, levels, metric_class, side, metric_batch_size,
            quiet, debug, **options):
    """Compute attributions for DATASET (.jsonl/.csv/.tsv/.parquet or a Hugging Face id name[/config]:split).

    Without DATASET, the bundled example reviews are used; without --model, the bundled demo classifier."""
    metrics = options["metrics"]
    from .run.config import RunConfig

    cfg = RunConfig(dataset, argv=[PROG, *sys.argv[1:]], **options)

    def go():
        if metrics:
            cfg.eval = _eval_config(metrics, None, options["preset"], saliency, precision_k, other_store,
                                    perturbation, levels, metric_class, side, metric_batch_size)
            from .evaluate import parse_metric_specs

            parse_metric_specs(metrics)  # a usage error before anything runs
        _run(cfg, quiet)

    _guarded(go, debug)


@main.command("eval", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("store", type=click.Path(dir_okay=False))
@click.option("--metrics", required=True, metavar="LIST",
              help="Comma-separated metrics, each name or name@preset (attr-compute metrics lists them and their "
                   "presets).")
@click.option("--methods", default="all", show_default=True, metavar="LIST|all", help="Methods of the store to evaluate.")
@click.option("--model", metavar="ID_OR_PATH", default=None, help="The model [default: the one recorded in the store].")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:K.")
@click.option("--preset", type=click.Choice(PRESET_NAMES), default=None,
              help="Default preset of the metrics named without one [default: the store's run preset].")
@click.option("--allow-random-head", is_flag=True,
              help="Run a checkpoint whose classification head is not trained (transformers initialises it at "
                   "random; refused otherwise). For testing only; recorded in the store.")
@metric_options
@click.option("-q", "--quiet", is_flag=True, help="No summary.")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def eval_cmd(store, metrics, methods, model, device, preset, allow_random_head, saliency, precision_k, other_store,
             perturbation, levels, metric_class, side, metric_batch_size, quiet, debug):
    """Add faithfulness metrics to an existing STORE (the model is reloaded from its provenance or --model)."""

    def go():
        import os

        if not os.path.exists(store):
            raise AttrscopeError(f"store '{store}' not found: check the path")
        _check_readable(store, whole=True)  # before torch and the model load (seconds to minutes)

        from .distributed import process_group, world_from_env
        from .evaluate import evaluate_store
        from .models import resolve_device
        from .ui import RichProgress

        cfg = _eval_config(metrics, methods, preset or _store_preset(store), saliency, precision_k, other_store,
                           perturbation, levels, metric_class, side, metric_batch_size)
        world = world_from_env()  # torchrun: each rank its share of the examples (compute.distributed)
        with interrupts.on_signals(defer=False):  # eval defers a stop to its safe points; here one raises at once
            try:
                with process_group(world, device) as dev:
                    summary = evaluate_store(store, cfg, model_spec=model, device=resolve_device(dev),
                                             progress=RichProgress(quiet=quiet or bool(world and world.rank)),
                                             allow_random_head=allow_random_head, world=world)
            except Interrupted as err:
                raise Interrupted(f"interrupted: {err or 'no metric result was finished'}; store '{store}' stays "
                                  f"valid; compute the rest with: {shlex.join([PROG, *sys.argv[1:]])}") from None
            if world is not None and world.rank != 0:
                return
            with _after_finishing("eval", store, "holds every metric asked for"):
                if not quiet:
                    _say(_metrics_table(store, summary["methods"]))

    _guarded(go, debug)


@main.command("report", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("store", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["markdown", "csv"]), default="markdown", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write to a file [default: stdout].")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def report_cmd(store, fmt, output, debug):
    """One table of every method x metric in STORE, the papers' numbers beside ours, and the papers' rankings
    checked against ours."""

    def go():
        from .report import make_report

        text = make_report(store, fmt)
        if output:
            with open(output, "w", encoding="utf-8") as fh:
                fh.write(text)
        else:
            click.echo(text, nl=False)

    _guarded(go, debug)


@main.command("export", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("store", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(), metavar="FILE.parquet|FILE.csv",
              help="Token table: one row per example x method x token (example -> method -> position).")
@click.option("--methods", default="all", show_default=True, metavar="LIST|all", help="Methods of the store to export.")
@click.option("--layers", is_flag=True, help="Add the per-layer views as columns layer_1..layer_V.")
@click.option("--metrics", is_flag=True,
              help="Also write the per-example metrics (one row per example x method) to FILE.metrics.parquet|csv.")
@click.option("--chunk-size", type=int, default=None, metavar="N",
              help=f"Examples read and written at a time; memory follows the chunk, not the store [default: as many "
                   f"as make about {EXPORT_CHUNK_ROWS:,} token rows].")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def export_cmd(store, output, methods, layers, metrics, chunk_size, debug):
    """Export STORE's token table (and with --metrics its per-example metrics) as Parquet or CSV, in chunks."""

    def go():
        from .export import export_store
        from .ui import RichProgress

        chosen = None if methods.strip() == "all" else [m.strip() for m in methods.split(",") if m.strip()]
        done = export_store(store, output, chosen, layers=layers, metrics=metrics, chunk=chunk_size,
                            progress=RichProgress())
        note = "" if done["complete"] else " (the store is not complete: its committed examples only)"
        for path, rows in done["files"].items():
            _say(f"{path}: {rows} rows from {done['examples']} examples{note}")

    _guarded(go, debug)


@main.command("merge", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("output", type=click.Path(dir_okay=False), metavar="OUT.h5")
@click.argument("shards", nargs=-1, required=True, type=click.Path(dir_okay=False), metavar="SHARD.h5...")
@click.option("-q", "--quiet", is_flag=True, help="No summary.")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def merge_cmd(output, shards, quiet, debug):
    """Merge the shard stores of one --shard K/N run (any order) into OUT.h5, in dataset order."""

    def go():
        from .merge import merge_shards
        from .ui import RichProgress

        done = merge_shards(output, list(shards), argv=[PROG, *sys.argv[1:]], message=_say,
                            progress=RichProgress(quiet=quiet))
        if not quiet:
            _say(f"{output}: {done['examples']} examples from {done['shards']} shards"
                 f"{', metrics ' + ', '.join(done['metrics']) if done['metrics'] else ''}")

    _guarded(go, debug)


@main.command("metrics")
def metrics_cmd():
    """List the faithfulness metrics."""
    from .metrics import REGISTRY, presets_of

    for name, m in REGISTRY.items():
        better = "higher" if m.higher_is_better else "lower"
        presets = ", ".join(presets_of(name)) or "-"
        click.echo(f"{name:18s} {m.description} [{better} is better; presets: {presets}]")


def _check_readable(path: str, whole: bool = False) -> None:
    """Open an existing store once, so that a damaged or truncated one is named (StoreError) before torch loads.
    ``whole``: read all of it (store.verify), for a command that writes into it (eval): HDF5 writing beside a
    damaged chunk failed with an internal error, or hung."""
    import os

    from store import open_store, verify

    if os.path.isfile(path):  # a missing path or a directory is the runner's one line
        with open_store(path) as s:
            if whole:
                verify(s)


def _store_preset(store: str) -> str | None:
    from store import open_store

    try:
        with open_store(store) as s:
            return s.config.get("config", {}).get("preset")
    except Exception:  # noqa: BLE001 - evaluate_store reports an unreadable store in one line
        return None


def _metrics_table(store: str, methods: list[str]) -> str:
    from store import open_store

    lines = []
    with open_store(store) as s:
        for m in methods:
            if m not in s.metric_methods:
                continue
            cells = [f"{k}={v['summary'].get('mean', float('nan')):.4f}" for k, v in s.metric_summaries(m).items()]
            lines.append(f"{m:15s} " + "  ".join(cells))
    return "\n".join(lines)


@main.command("methods")
@click.option("--model", "model_spec", default=None, metavar="ID_OR_PATH",
              help="List what runs for this checkpoint (its family and head): each method, or the reason it is refused.")
@click.option("--task", default="auto", show_default=True, help="The head to load (as for a run).")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def methods_cmd(model_spec, task, debug):
    """List the attribution methods (with --model: which run for that checkpoint)."""
    from .methods import REGISTRY

    if model_spec is None:
        for name, m in REGISTRY.items():
            kind = "signed" if m.signed else "non-negative"
            layers = ", layer views" if m.has_layer_views else ""
            click.echo(f"{name:15s} {m.description} [{kind}{layers}]")
        return

    def go():
        import torch

        from .applicability import applicability
        from .models import load_model

        lm = load_model(model_spec, device=torch.device("cpu"), task=task)
        found = applicability(lm.adapter)
        click.echo(f"{lm.info['model_type']} ({lm.adapter.family}, --task {lm.task.name}, explained token: "
                   f"{lm.adapter.pooling}): {sum(r is None for r in found.values())} of {len(found)} methods run")
        for name, reason in found.items():
            click.echo(f"{name:15s} {'runs' if reason is None else 'refused: ' + reason}")

    _guarded(go, debug)


def _run(cfg, quiet: bool) -> None:
    from .distributed import run_distributed, world_from_env
    from .runner import run
    from .ui import RichProgress, print_summary

    world = world_from_env()
    with interrupts.on_signals(defer=False):  # the run defers a stop to its safe points; here one raises at once
        if world is None:
            summary = run(cfg, RichProgress(quiet=quiet))
        else:  # torchrun: rank 0 shows its progress and the merged store; the others work quietly
            summary = run_distributed(cfg, RichProgress(quiet=quiet or world.rank != 0), world)
            if world.rank != 0:
                return
        with _after_finishing("the run", summary["store"], "is already complete"):
            if not quiet:
                print_summary(summary)
            else:
                _say(summary["store"], err=False)


@contextmanager
def _after_finishing(what: str, store: str, kept: str):
    """Output once the work is stored: a stop there (or one still pending from the work's last moments) says so."""
    try:
        yield
        interrupts.check()
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted after {what} finished: store '{store}' {kept}") from None


def _guarded(fn, debug: bool) -> None:
    from store.errors import StoreError

    try:
        fn()
    except (AttrscopeError, StoreError) as err:
        if debug:
            raise
        _fail(str(err), getattr(err, "exit_code", 1))
    except KeyboardInterrupt as err:  # compute.interrupts.Interrupted says what was kept and how to go on
        if debug:
            raise
        _fail(str(err) or "interrupted before anything was written: run the same command again", 130)
    except Exception as err:  # noqa: BLE001 - the last line of defence: one line, no traceback
        if debug:
            raise
        msg = " ".join(str(err).split())[:300]
        _fail(f"internal error: {type(err).__name__}: {msg} (rerun with --debug for the traceback)", 1)


def _say(line: str, err: bool = True) -> None:
    """A line that may hold user input (paths, names), its control characters escaped."""
    from store.text import printable_text

    click.echo(printable_text(line), err=err)


def _fail(message: str, code: int) -> None:
    import os

    from store.text import printable_text

    # under a launch, which rank says it (RANK may be what is missing: the line then says so itself)
    rank = f"[rank {os.environ.get('RANK', '?')}] " if os.environ.get("WORLD_SIZE", "1") not in ("", "1") else ""
    click.echo(f"{PROG}: error: {rank}{printable_text(message)}", err=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
