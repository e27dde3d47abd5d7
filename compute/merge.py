"""``attr-compute merge OUT.h5 SHARD.h5...``: the shard stores of one ``--shard K/N`` run -> one store in dataset order.

The shards are first checked to come from one plan (compute.shards): the same model, every option that changes the
results (the resume identity) but --shard, the same dataset records (fingerprint) and N, each K once, and ranges
that tile the dataset with no gap. The examples are then copied in one pass (store.copying.merge), and the metrics
the shards have in common are joined: per-example values, curves and levels (and a generation store's values per
step) concatenated in shard order, the summaries recomputed from the concatenation by the metric itself (every
summary is a function of the per-example values, which is what lets attr-compute eval evaluate in chunks). The
store is built under a temporary name and renamed into place at the end, so a failure leaves nothing at OUT.
"""

from __future__ import annotations

import os
import platform
import time

from store import MetricData, add_metrics, open_store
from store.copying import merge as merge_stores
from store.lock import writer_lock
from store.replace import copy_beside, discard, replace_with

from . import __version__
from .errors import AttrscopeError, UsageError
from .options import show_value
from .outdir import check_output_dir
from .run.config import declared_options
from .run.progress import Progress, bar


def merge_shards(out: str, paths: list[str], *, argv: list[str] | None = None, message=None,
                 replace: bool = False, extra_provenance: dict | None = None, progress: Progress | None = None) -> dict:
    """Merge the shard stores ``paths`` (any order) into the new store ``out`` (``replace``: an existing ``out`` is
    replaced once the merge is done). ``extra_provenance`` is added to the merged store's. ``progress``: the bar of
    the examples copied; ``message`` (default: the progress's) says what is left out. Returns what was merged."""
    progress = progress or Progress()
    message = message or progress.message
    t0 = time.perf_counter()
    if not paths:
        raise UsageError("merge needs the shard stores: attr-compute merge OUT.h5 SHARD.h5...")
    if os.path.exists(out) and not replace:
        raise AttrscopeError(f"store '{out}' already exists: remove it or choose another OUT")
    if any(os.path.realpath(p) == os.path.realpath(out) for p in paths):
        raise UsageError(f"OUT '{out}' is one of the shards: choose another OUT")
    check_output_dir(out, "OUT")  # before the shards are read (seconds on large ones)
    with writer_lock(out):  # one writer per store
        return _merge_locked(out, paths, t0, argv=argv, message=message, extra_provenance=extra_provenance,
                             progress=progress)


def _merge_locked(out: str, paths: list[str], t0: float, *, argv, message, extra_provenance, progress) -> dict:
    shards = [_read_shard(p) for p in paths]
    _check_one_plan(shards)
    shards.sort(key=lambda s: s["plan"]["k"])
    metrics, dropped = _merged_metrics(shards)

    first = shards[0]
    n_examples = sum(s["examples"] for s in shards)
    provenance = {
        **first["provenance"],
        "attrscope_version": __version__,
        "command": list(argv or []),
        "config": {**first["provenance"]["config"], "shard": None, "output": os.path.abspath(out)},
        "dataset": {**first["provenance"]["dataset"], "n_records": n_examples},
        "shard": None,
        "merged_from": [{"path": os.path.abspath(s["path"]), "k": s["plan"]["k"], "n": s["plan"]["n"],
                         "host": s["provenance"].get("host"), "device": s["provenance"]["model"].get("device"),
                         "rows": [s["plan"]["first_row"], s["plan"]["last_row"]],
                         "examples": s["examples"], "tokens": s["plan"]["tokens"], "command": s["provenance"]["command"]}
                        for s in shards],
        "merged_on": {"platform": platform.platform(), "node": platform.node()},
        **(extra_provenance or {}),
    }
    summary = {"examples": n_examples, "tokens": sum(s["plan"]["tokens"] for s in shards), "shards": len(shards),
               "shard_wall_seconds": [(s["summary"] or {}).get("wall_seconds") for s in shards]}
    real, tmp = copy_beside(out, ".merging")  # through a symlink: beside the file it names, which it replaces
    discard(tmp + ".merge-tmp")
    try:
        with bar(progress, n_examples, "merging"):
            merge_stores(tmp, [s["path"] for s in shards], provenance, summary=summary, copied=progress.advance)
            add_metrics(tmp, metrics)
            replace_with(tmp, real)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    for line in dropped:
        message(line)
    return {"store": os.path.abspath(out), "examples": n_examples, "shards": len(shards),
            "metrics": [f"{m.method}/{m.name}" for m in metrics], "seconds": round(time.perf_counter() - t0, 3)}


def _read_shard(path: str) -> dict:
    """What the checks need of one shard store (its provenance, plan, size), read once; the store is closed again."""
    if not os.path.isfile(path):
        raise AttrscopeError(f"shard '{path}' not found: check the path")
    with open_store(path) as s:
        prov = s.config
        plan = prov.get("shard")
        if not plan:
            raise AttrscopeError(f"'{path}' is not a shard store (it was made without --shard): merge joins the "
                                 "stores of one --shard K/N run")
        if not s.complete:
            raise AttrscopeError(f"shard '{path}' is not complete ({len(s)} of {plan['stop'] - plan['start']} "
                                 "examples): finish it with its command and --resume first")
        return {"path": path, "provenance": prov, "plan": plan, "examples": len(s), "summary": s.summary}


def _check_one_plan(shards: list[dict]) -> None:
    """One line naming the first difference between the shards, if any."""
    a = shards[0]
    pa, ca = a["provenance"], a["provenance"]["config"]
    for b in shards[1:]:
        pb, cb = b["provenance"], b["provenance"]["config"]
        pair = f"shards '{a['path']}' and '{b['path']}'"
        for key in ("model_id", "revision"):
            if pa["model"].get(key) != pb["model"].get(key):
                raise AttrscopeError(f"{pair} were made with different models ({pa['model'].get(key)} and "
                                     f"{pb['model'].get(key)}): merge the shards of one run")
        if a["plan"]["fingerprint"] != b["plan"]["fingerprint"] or pa["dataset"].get("sha256") != pb["dataset"].get("sha256"):
            raise AttrscopeError(f"{pair} come from different datasets (or --limit): merge the shards of one run")
        for opt in declared_options():
            if opt.resume and opt.name != "shard" and ca.get(opt.name, opt.default) != cb.get(opt.name, opt.default):
                raise AttrscopeError(f"{pair} were made with different {opt.flag} ({show_value(ca.get(opt.name))} and "
                                     f"{show_value(cb.get(opt.name))}): the shards of one run share every option but --shard")
        if a["plan"]["n"] != b["plan"]["n"]:
            raise AttrscopeError(f"{pair} are shards of different splits (--shard {a['plan']['k']}/{a['plan']['n']} "
                                 f"and {b['plan']['k']}/{b['plan']['n']}): merge the N shards of one K/N run")
    n = a["plan"]["n"]
    by_k: dict[int, dict] = {}
    for s in shards:
        k = s["plan"]["k"]
        if k in by_k:
            raise AttrscopeError(f"shards '{by_k[k]['path']}' and '{s['path']}' are both shard {k}/{n} (they overlap): "
                                 "give each shard once")
        by_k[k] = s
    missing = [k for k in range(n) if k not in by_k]
    if missing:
        raise AttrscopeError(f"shard{'s' if len(missing) > 1 else ''} {', '.join(f'{k}/{n}' for k in missing)} "
                             f"missing: merge needs all {n} shards of the run")
    expected_start = 0
    for k in range(n):
        s = by_k[k]
        plan = s["plan"]
        if plan["start"] != expected_start:
            raise AttrscopeError(f"shard '{s['path']}' starts at example {plan['start']}, not {expected_start}: the "
                                 "shards' ranges leave a gap or overlap (another tokenizer or --max-length?)")
        if s["examples"] != plan["stop"] - plan["start"]:
            raise AttrscopeError(f"shard '{s['path']}' holds {s['examples']} examples, not the "
                                 f"{plan['stop'] - plan['start']} of its range")
        expected_start = plan["stop"]
    if expected_start != a["plan"]["n_examples_total"]:
        raise AttrscopeError(f"the shards cover {expected_start} of the run's {a['plan']['n_examples_total']} "
                             "examples: merge needs all of them")


def _merged_metrics(shards: list[dict]) -> tuple[list[MetricData], list[str]]:
    """The metrics every shard has with the same settings, joined; and a line for each one left out."""
    from .evaluate import joined_parts
    from .metrics.base import MetricResult

    per_shard = []
    for s in shards:
        with open_store(s["path"]) as st:
            per_shard.append({(m, name): st.metric_info(m, name) | {"values": st.metric_values(m, name)}
                              for m in st.metric_methods for name in st.metric_names(m)})
    keys = [key for key in per_shard[0] if all(key in p for p in per_shard)]
    out, dropped = [], []
    for key in list(dict.fromkeys(k for p in per_shard for k in p)):
        if key not in keys or any(p[key]["settings"] != per_shard[0][key]["settings"] for p in per_shard):
            dropped.append(f"metric {key[0]}/{key[1]} is not in every shard with the same settings: not merged "
                           "(compute it on the merged store with attr-compute eval)")
            continue
        infos = [p[key] for p in per_shard]
        settings = infos[0]["settings"]
        res, summary = joined_parts(settings, [MetricResult(values=i["values"], curves=i["curves"],
                                                            levels=i["levels"], steps=i["steps"]) for i in infos])
        out.append(MetricData(method=key[0], name=key[1], values=res.values, settings=settings,
                              summary=summary, higher_is_better=infos[0]["higher_is_better"],
                              description=infos[0]["description"], curves=res.curves, levels=res.levels,
                              steps=res.steps))
    return out, dropped
