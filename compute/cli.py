"""``attr-compute``: batch a dataset through a classifier and attribution methods into an attrscope store.

``attr-compute [DATASET] [options]`` runs the job (the ``run`` command is implied); ``attr-compute methods`` lists
the methods. Errors are one line on stderr, exit code 1 (2 for usage errors); ``--debug`` shows tracebacks.
"""

from __future__ import annotations

import shlex
import sys

import click

from .errors import AttrscopeError
from .export import CHUNK_ROWS as EXPORT_CHUNK_ROWS
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
        except click.exceptions.Abort:
            _fail("aborted", 1)
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
        click.option("--levels", type=click.Choice(["ninths", "tenths"]), default=None,
                     help="aopc/lodds/accuracy: k = round(i/9 n) (AttCAT, Mask-LRP) or int(i/10 n) (NormXLogit)."),
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


@main.command("run", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("dataset", required=False)
@click.option("-o", "--output", metavar="STORE.h5", help="Store to write [default: <dataset name>.h5 here].")
@click.option("--model", metavar="ID_OR_PATH", help="Hugging Face id or local directory [default: bundled demo classifier].")
@click.option("--methods", default="all", show_default=True, metavar="LIST|all", help="Comma-separated method names.")
@click.option("--limit", type=int, metavar="N", help="Only the first N examples.")
@click.option("--batch-size", type=int, default=32, show_default=True, metavar="N")
@click.option("--device", default="auto", show_default=True, metavar="auto|cpu|cuda[:k]")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True,
              help="Model compute dtype (methods always compute in at least float32).")
@click.option("--max-length", type=int, metavar="N", help="Truncate inputs to N tokens [default: the model's limit].")
@click.option("--text-column", metavar="C")
@click.option("--pair-column", metavar="C")
@click.option("--label-column", metavar="C")
@click.option("--id-column", metavar="C")
@click.option("--split", metavar="NAME", help="Split of a Hugging Face dataset id.")
@click.option("--target", type=click.Choice(["predicted", "label", "all"]), default=None,
              help="Class explained by class-specific methods [default: predicted, or the preset's].")
@click.option("--matrices", type=click.Choice(["none", "cls", "all"]), default="cls", show_default=True,
              help="Per-layer matrices to keep: none, the explained row only, or all n x n.")
@click.option("--store-dtype", type=click.Choice(["float16", "float32"]), default="float16", show_default=True,
              help="dtype of stored matrices (scores are always float32).")
@click.option("--resume", is_flag=True, help="Finish an interrupted store.")
@click.option("--overwrite", is_flag=True, help="Replace an existing store.")
@click.option("--preset", type=click.Choice(PRESET_NAMES),
              help="Reference conventions of a paper (recorded in the store).")
@click.option("--alti-ln2", is_flag=True, help="ALTI+LN2: alti and alti_l2 measure through LN2 (METHODS.md 2.2).")
@click.option("--memory-mb", type=int, default=8, show_default=True, metavar="MB",
              help="Memory budget of ALTI's source-token blocks.")
@click.option("--ig-steps", type=int, metavar="M", help="Integrated gradients: quadrature steps [default: 50, or the preset's].")
@click.option("--ig-rule", type=click.Choice(["gausslegendre", "riemann"]), default=None,
              help="Integrated gradients: quadrature rule [default: gausslegendre].")
@click.option("--ig-baseline", type=click.Choice(["mask", "zero"]), default=None,
              help="Integrated gradients: [MASK]-sequence or zero baseline [default: mask, or the preset's].")
@click.option("--ig-memory-mb", type=int, default=1024, show_default=True, metavar="MB",
              help="Integrated gradients: memory for the (example, step) rows of one forward/backward.")
@click.option("--attcat-layers", type=click.Choice(["inputs", "outputs"]), default=None,
              help="cat/attcat: layer inputs h^0..h^L-1 (reference code) or outputs h^1..h^L (paper) [default: inputs].")
@click.option("--attgrads-variant", type=click.Choice(["ref", "gradsam"]), default=None,
              help="attgrads: last-layer Grad-CAM style (reference) or Grad-SAM over all layers [default: ref].")
@click.option("--lrp-dtype", type=click.Choice(["float64", "model"]), default="float64", show_default=True,
              help="Precision of the LRP rules (lrp, partial_lrp, transatt, mask_lrp): float64 on a copy of the model, "
                   "or the model's own dtype (the reference; unstable, see README).")
@click.option("--head-stats-data", metavar="DATASET", default=None,
              help="mask_lrp: dataset of the head-statistics pass [default: the run's dataset].")
@click.option("--head-stats-limit", type=int, metavar="N", default=None,
              help="mask_lrp: use the first N examples for the head statistics.")
@click.option("--parses", type=click.Path(dir_okay=False), default=None,
              help="mask_lrp: dependency parses as CoNLL-U (default: spaCy, pip install 'attrscope[parse]').")
@click.option("--head-mask", "head_mask", type=click.Path(dir_okay=False), metavar="STORE.h5", default=None,
              help="mask_lrp: reuse the head masks of another store instead of computing them.")
@click.option("--pos-self", type=click.Choice(["exclude", "count"]), default=None,
              help="Positional statistics: offset 0 excluded (the paper) or counted (the reference) "
                   "[default: exclude; count under --preset masklrp].")
@click.option("--mask-combine", type=click.Choice(["union", "sum"]), default="union", show_default=True,
              help="mask_lrp: union (the reference) or sum (the paper) of the positional and syntactic masks.")
@click.option("--mask-rollout", type=click.Choice(["unmasked", "masked"]), default="unmasked", show_default=True,
              help="mask_lrp: roll out each layer's unmasked attention relevance (the reference) or the masked one.")
@click.option("--mask-renormalise", is_flag=True,
              help="mask_lrp: rescale the kept heads' relevance to the layer's total (the paper's variant).")
@click.option("--mask-rollout-unhalved/--mask-rollout-halved", "mask_rollout_unhalved", default=None,
              help="mask_lrp: roll out the attention relevance before the 1/2 of the A.V rule, as the reference code "
                   "does (maps 2x TransAtt's), or after it, so that an all-ones mask gives TransAtt "
                   "[default: halved; unhalved under --preset masklrp].")
@click.option("--evidence-column", metavar="C", default=None,
              help="Column of evidence / answer character spans [[start, end], ...] (precision_at_k, dot_product, "
                   "average_precision).")
@click.option("--metrics", default=None, metavar="LIST",
              help="Faithfulness metrics computed after the run (name or name@preset, e.g. "
                   "comprehensiveness,sufficiency,aopc@attcat); see attr-compute metrics.")
@click.option("--allow-random-head", is_flag=True,
              help="Run a checkpoint whose classification head is not trained (transformers initialises it at "
                   "random; refused otherwise). For testing only; recorded in the store.")
@metric_options
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary.")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def run_cmd(dataset, output, model, methods, limit, batch_size, device, dtype, max_length, text_column,
            pair_column, label_column, id_column, split, target, matrices, store_dtype, resume, overwrite, preset,
            alti_ln2, memory_mb, ig_steps, ig_rule, ig_baseline, ig_memory_mb, attcat_layers, attgrads_variant,
            lrp_dtype, head_stats_data, head_stats_limit, parses, head_mask, pos_self, mask_combine, mask_rollout,
            mask_renormalise, mask_rollout_unhalved, evidence_column, metrics, allow_random_head, saliency,
            precision_k, other_store, perturbation, levels, metric_class, side, metric_batch_size, quiet, debug):
    """Compute attributions for DATASET (.jsonl/.csv/.tsv/.parquet or a Hugging Face id name[/config]:split).

    Without DATASET, the bundled example reviews are used; without --model, the bundled demo classifier."""
    if resume and output:
        _guarded(lambda: _check_readable(output), debug)  # before torch loads: a damaged store is named in a second
    from .runner import RunConfig

    cfg = RunConfig(
        dataset=dataset, output=output, model=model, methods=methods, limit=limit, batch_size=batch_size,
        device=device, dtype=dtype, max_length=max_length, text_column=text_column, pair_column=pair_column,
        label_column=label_column, id_column=id_column, split=split, target=target, matrices=matrices,
        store_dtype=store_dtype, resume=resume, overwrite=overwrite, preset=preset, alti_ln2=alti_ln2,
        memory_mb=memory_mb, ig_steps=ig_steps, ig_rule=ig_rule, ig_baseline=ig_baseline, ig_memory_mb=ig_memory_mb,
        attcat_layers=attcat_layers, attgrads_variant=attgrads_variant, lrp_dtype=lrp_dtype,
        head_stats_data=head_stats_data, head_stats_limit=head_stats_limit, parses=parses, head_mask=head_mask,
        pos_self=pos_self, mask_combine=mask_combine, mask_rollout=mask_rollout, mask_renormalise=mask_renormalise,
        mask_rollout_unhalved=mask_rollout_unhalved,
        evidence_column=evidence_column, metrics=metrics, allow_random_head=allow_random_head,
        argv=[PROG, *sys.argv[1:]])

    def go():
        if metrics:
            cfg.eval = _eval_config(metrics, None, preset, saliency, precision_k, other_store, perturbation, levels,
                                    metric_class, side, metric_batch_size)
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
        _check_readable(store)  # before torch and the model load (seconds to minutes)

        from .evaluate import evaluate_store
        from .models import resolve_device

        cfg = _eval_config(metrics, methods, preset or _store_preset(store), saliency, precision_k, other_store,
                           perturbation, levels, metric_class, side, metric_batch_size)
        try:
            summary = evaluate_store(store, cfg, model_spec=model, device=resolve_device(device),
                                     message=(lambda m: None) if quiet else (lambda m: click.echo(m, err=True)),
                                     allow_random_head=allow_random_head)
        except Interrupted as err:
            raise Interrupted(f"interrupted: {err or 'no metric result was finished'}; store '{store}' stays valid; "
                              f"compute the rest with: {shlex.join([PROG, *sys.argv[1:]])}") from None
        if not quiet:
            click.echo(_metrics_table(store, summary["methods"]), err=True)

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

        chosen = None if methods.strip() == "all" else [m.strip() for m in methods.split(",") if m.strip()]
        done = export_store(store, output, chosen, layers=layers, metrics=metrics, chunk=chunk_size)
        note = "" if done["complete"] else " (the store is not complete: its committed examples only)"
        for path, rows in done["files"].items():
            click.echo(f"{path}: {rows} rows from {done['examples']} examples{note}", err=True)

    _guarded(go, debug)


@main.command("metrics")
def metrics_cmd():
    """List the faithfulness metrics."""
    from .metrics import REGISTRY, presets_of

    for name, m in REGISTRY.items():
        better = "higher" if m.higher_is_better else "lower"
        presets = ", ".join(presets_of(name)) or "-"
        click.echo(f"{name:18s} {m.description} [{better} is better; presets: {presets}]")


def _check_readable(path: str) -> None:
    """Open an existing store once, so that a damaged or truncated one is named (StoreError) before torch loads."""
    import os

    from store import open_store

    if os.path.isfile(path):  # a missing path or a directory is the runner's one line
        open_store(path).close()


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
def methods_cmd():
    """List the attribution methods."""
    from .methods import REGISTRY

    for name, m in REGISTRY.items():
        kind = "signed" if m.signed else "non-negative"
        layers = ", layer views" if m.has_layer_views else ""
        click.echo(f"{name:15s} {m.description} [{kind}{layers}]")


def _run(cfg, quiet: bool) -> None:
    from .runner import run
    from .ui import RichProgress, print_summary

    summary = run(cfg, RichProgress(quiet=quiet))
    if not quiet:
        print_summary(summary)
    else:
        click.echo(summary["store"])


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


def _fail(message: str, code: int) -> None:
    click.echo(f"{PROG}: error: {message}", err=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
