"""Faithfulness metrics over a finished store (``attr-compute eval STORE --metrics ...``, and ``attr-compute
--metrics ...`` after its main loop): read each method's attributions back, perturb, run the model, write
``/metrics/<method>/<metric>`` into the store.

Metric specs are ``name`` or ``name@preset`` (``aopc@attcat``): the preset picks a paper's exact variant
(METHODS.md 8.2) and the stored name keeps the suffix, so several variants live side by side.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from store import MetricData, add_metrics, open_store
from store.lock import writer_lock

from . import interrupts
from .errors import AttrscopeError, UsageError
from .metrics import REGISTRY, get_metric
from .metrics.base import EvalExample, MetricContext, MetricResult
from .run.progress import Progress, bar


@dataclass
class EvalConfig:
    metrics: str  # comma-separated specs: name or name@preset
    methods: str | None = None  # None: every method of the store
    preset: str | None = None  # default preset for metrics named without one (the run's --preset)
    saliency: str = "gxi_l2"  # spearman's second method
    k: int = 20  # precision_at_k
    other: str | None = None  # another store (jaccard_25, seed_spearman)
    batch_size: int = 64  # perturbed sequences per forward
    chunk: int = 256  # examples evaluated per predictor call
    overrides: dict = field(default_factory=dict)  # explicit metric settings (perturbation, levels, cls, side)


class ModelPredictor:
    """Probabilities of many token sequences: length-sorted, padded, ``batch_size`` per forward, no token types.
    Identical (sequence, attend) pairs are run once per call and remembered across calls (the variants of AOPC
    and LOdds of several presets share most of their perturbed inputs)."""

    def __init__(self, model, pad_id: int, batch_size: int, cache_limit: int = 2_000_000,
                 task: str = "classification"):
        self.model, self.pad_id, self.batch_size = model, pad_id, batch_size
        self.task = task  # what a row's numbers are: softmax (classification), the value (regression), or
        #                   [p(target), p(foil)] at the explained position (word prediction, with ``where``)
        self.device = next(model.parameters()).device
        self.cache: dict[bytes, np.ndarray] = {}
        self.cache_limit = cache_limit
        self.forwarded = 0  # sequences actually run (for the benchmark and the summary)
        self.seconds = 0.0

    @staticmethod
    def _key(seq: np.ndarray, att: np.ndarray | None) -> bytes:
        s = np.asarray(seq, dtype=np.int64).tobytes()
        return s + b"|" + (b"" if att is None else np.packbits(np.asarray(att, dtype=bool)).tobytes()
                           + len(att).to_bytes(4, "little"))

    def __call__(self, sequences, attend=None, where=None):
        keys = [self._key(s, None if attend is None else attend[i])
                + (b"" if where is None else np.asarray(where[i], dtype=np.int64).tobytes())
                for i, s in enumerate(sequences)]
        todo = list(dict.fromkeys(k for k in keys if k not in self.cache))
        index = {k: i for i, k in enumerate(keys)}
        t0 = time.perf_counter()
        order = sorted(todo, key=lambda k: -len(sequences[index[k]]))
        for b0 in range(0, len(order), self.batch_size):
            chunk = order[b0:b0 + self.batch_size]
            n = max(len(sequences[index[k]]) for k in chunk)
            ids = torch.full((len(chunk), n), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), n), dtype=torch.long)
            for r, k in enumerate(chunk):
                i = index[k]
                s = np.asarray(sequences[i], dtype=np.int64)
                ids[r, :len(s)] = torch.from_numpy(s)
                mask[r, :len(s)] = 1 if attend is None else torch.from_numpy(np.asarray(attend[i], dtype=np.int64))
            interrupts.check()
            with torch.no_grad():
                logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
            probs = self._rows(logits, None if where is None else np.stack([where[index[k]] for k in chunk]))
            for r, k in enumerate(chunk):
                self.cache[k] = probs[r]
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds += time.perf_counter() - t0
        self.forwarded += len(todo)
        out = np.stack([self.cache[k] for k in keys]) if keys else np.zeros((0, 0))
        if len(self.cache) > self.cache_limit:
            self.cache.clear()
        return out


    def _rows(self, logits: torch.Tensor, where: np.ndarray | None) -> np.ndarray:
        if where is not None:  # word prediction: the target's and the foil's probability at the explained position
            w = torch.as_tensor(where, device=logits.device)
            at = torch.softmax(logits[torch.arange(len(w), device=logits.device), w[:, 0]].double(), dim=-1)
            b = torch.arange(len(w), device=logits.device)
            p_foil = torch.where(w[:, 2] >= 0, at[b, w[:, 2].clamp_min(0)], torch.full_like(at[:, 0], float("nan")))
            return torch.stack([at[b, w[:, 1]], p_foil], 1).cpu().numpy()
        if self.task == "regression":  # the output value itself: the metrics measure its change
            return logits.double().cpu().numpy()
        return torch.softmax(logits.double(), dim=-1).cpu().numpy()


def parse_metric_specs(spec: str) -> list[tuple[str, str, str | None]]:
    """'aopc,lodds@masklrp' -> [(stored name, metric name, preset)]."""
    out = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        name, _, preset = item.partition("@")
        if name not in REGISTRY:
            raise UsageError(f"unknown metric '{name}': choose from {', '.join(REGISTRY)}")
        if preset and preset not in REGISTRY[name].presets:
            choices = ", ".join(REGISTRY[name].presets)
            raise UsageError(f"metric '{name}' has no preset '{preset}': "
                             + (f"choose from {choices}" if choices else f"name it without @{preset}"))
        out.append((item, name, preset or None))
    if not out:
        raise UsageError("--metrics is empty: pass names such as comprehensiveness,sufficiency,aopc")
    return list(dict.fromkeys(out))


def evidence_metrics(specs: list[tuple[str, str, str | None]]) -> list[str]:
    """The stored names of the metrics in ``specs`` that read evidence flags."""
    return [stored for stored, name, _ in specs if REGISTRY[name].needs_evidence]


def _examples(s, idx: list[int], method: str, cfg: EvalConfig, other, other_ids) -> list[EvalExample]:
    out = []
    class_specific = bool(s.method_info(method)["params"].get("class_specific"))
    classes = s.task["name"] == "classification"  # elsewhere the metrics read the explained output's column
    for i in idx:
        ex = s[i]
        seg = ex.segment
        words = ex.task_info if s.task["name"] in ("masked-token", "next-token") else {}
        cs = ex.class_scores(method)
        if cs is None and not class_specific:  # a class-independent method explains every class the same way
            cs = np.tile(ex.scores(method), (s.num_labels, 1))
        others = {}
        if cfg.saliency in s.methods:
            others[cfg.saliency] = ex.scores(cfg.saliency).astype(np.float64)
        paired_scores = paired_pred = None
        if other is not None:
            j = other_ids.get(ex.id)
            if j is not None:
                oex = other[j]
                if np.array_equal(oex.token_ids, ex.token_ids) and method in other.methods:
                    paired_scores, paired_pred = oex.scores(method).astype(np.float64), oex.pred
        out.append(EvalExample(index=i, id=ex.id, token_ids=ex.token_ids.astype(np.int64), special=seg < 0,
                               scores=ex.scores(method).astype(np.float64), label=ex.label if ex.label is not None
                               else -1, pred=ex.pred if classes else ex.target, explain_pos=ex.explain_pos,
                               target_token=words.get("target_token", -1), foil_token=words.get("foil_token", -1),
                               class_scores=None if cs is None else cs.astype(np.float64), other_scores=others,
                               evidence=ex.evidence, paired_scores=paired_scores, paired_pred=paired_pred))
    return out


def _step_examples(s, idx: list[int], method: str, cfg: EvalConfig) -> tuple[list[EvalExample], np.ndarray]:
    """A generation store's examples ``idx`` as one EvalExample per step: the tokens before the step's token, the
    step's scores over them, its token as the target (and its foil) read at the last of them, so the metric
    perturbs that prefix and reads the step's target probability. Returns them and each one's place in ``idx``."""
    out, owner = [], []
    for k, i in enumerate(idx):
        ex = s[i]
        steps = ex.step_scores(method)
        others = ex.step_scores(cfg.saliency) if cfg.saliency in s.methods else None
        for t in range(ex.n_steps):
            n = ex.prompt_len + t
            scores = steps[t, :n].astype(np.float64)
            out.append(EvalExample(
                index=i, id=ex.id, token_ids=ex.token_ids[:n].astype(np.int64), special=ex.segment[:n] < 0,
                scores=scores, label=-1, pred=0, explain_pos=n - 1, target_token=int(ex.generated_ids[t]),
                foil_token=int(ex.step_foil_tokens[t]),
                other_scores={} if others is None else {cfg.saliency: others[t, :n].astype(np.float64)}))
            owner.append(k)
    return out, np.asarray(owner, dtype=np.int64)


def per_example_mean(res: MetricResult, owner: np.ndarray, n: int) -> MetricResult:
    """Step values [S] -> each example's mean over its steps [n] (NaN for an example without a finite one: no step,
    or none the metric defines), the step values kept as ``steps`` (in step order: owner is sorted); the per-level
    curves differ in length between steps and are not kept."""
    v = np.asarray(res.values, dtype=np.float64)
    ok = np.isfinite(v)
    total = np.bincount(owner[ok], weights=v[ok], minlength=n)
    count = np.bincount(owner[ok], minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return MetricResult(values=np.where(count > 0, total / np.maximum(count, 1), np.nan), steps=v)


def _settings(name: str, preset: str | None, cfg: EvalConfig, tokenizer, signed: bool,
              task: str = "classification") -> dict:
    """A preset's settings, then the command line's overrides the metric accepts, then what it takes from the run."""
    metric = REGISTRY[name]
    settings = dict(metric.presets.get(preset, {})) if preset else {}
    settings.update({k: v for k, v in cfg.overrides.items() if v is not None and k in metric.overridable})
    ctx = MetricContext(pad_id=int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0),
                        mask_id=None if getattr(tokenizer, "mask_token_id", None) is None
                        else int(tokenizer.mask_token_id),
                        saliency=cfg.saliency, k=cfg.k, signed=bool(signed), task=task)
    for k, v in metric.context_settings(ctx).items():
        settings.setdefault(k, v)
    return settings


def evaluate_store(path: str, cfg: EvalConfig, lm=None, model_spec: str | None = None, device="cpu",
                   message=None, allow_random_head: bool = False, world=None, progress: Progress | None = None) -> dict:
    """Compute ``cfg.metrics`` for the store's methods and write them into the store. ``lm``: a loaded model (the
    run's own), else it is loaded from the store's provenance or ``model_spec`` (``allow_random_head``: as in
    attr-compute). ``world`` (compute.distributed.World, under torchrun, with the process group up): this rank
    evaluates its contiguous share of the examples (balanced by tokens), the shares are gathered and rank 0 writes
    them. ``progress``: the bar of the examples evaluated per method and metric; ``message`` (default: the
    progress's) says each result finished. Returns a summary dict."""
    progress = progress or Progress()
    message = message or progress.message
    if world is not None and world.rank != 0:  # rank 0 writes, and holds the store's lock for them all
        return _evaluate_store(path, cfg, lm, model_spec, device, message, allow_random_head, world, progress)
    with writer_lock(path):
        return _evaluate_store(path, cfg, lm, model_spec, device, message, allow_random_head, world, progress)


def _evaluate_store(path, cfg, lm, model_spec, device, message, allow_random_head, world, progress) -> dict:
    from .models import load_model

    specs = parse_metric_specs(cfg.metrics)
    s = open_store(path)
    # A stop asked for (Ctrl-C, SIGTERM) ends the work at the next safe point; the results finished are written.
    with interrupts.on_signals():
        with s:
            if not s.complete:
                raise AttrscopeError(f"store '{path}' is not complete (a run is writing it, or it was interrupted): "
                                     "finish it with attr-compute --resume first")
            if not s.methods:
                raise AttrscopeError(f"store '{path}' holds no attribution methods: nothing to evaluate; compute "
                                     "some with attr-compute DATASET --methods LIST")
            methods = (s.methods if not cfg.methods or cfg.methods == "all"
                       else [m.strip() for m in cfg.methods.split(",")])
            for m in methods:
                if m not in s.methods:
                    raise UsageError(f"method '{m}' is not in store '{path}': it holds {', '.join(s.methods)}")
            needs_model = any(REGISTRY[name].needs_model for _, name, _ in specs)
            task = s.task["name"]
            if needs_model and task == "qa":
                perturbing = next(stored for stored, name, _ in specs if REGISTRY[name].needs_model)
                raise UsageError(f"metric '{perturbing}' perturbs the input and reads one output, which qa stores "
                                 "do not define (a start and an end that move): use precision_at_k, dot_product "
                                 "or average_precision")
            _check_needs(s, specs, cfg, methods, path)  # before the model loads: a refusal takes no time
            if lm is None:
                spec = model_spec or s.config.get("model", {}).get("model_id")
                dtype = s.config.get("config", {}).get("dtype", "float32")
                lm = load_model(spec, device=torch.device(device), dtype=dtype, allow_random_head=allow_random_head,
                                task=task)
            other = other_ids = None
            if cfg.other:
                other = open_store(cfg.other)
                other_ids = {x: i for i, x in enumerate(other.ids())}
            pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
            predictor = ModelPredictor(lm.model, pad_id, cfg.batch_size, task=task) if needs_model else None
            out, timings, stopped = [], {}, False
            lo, hi = (0, len(s)) if world is None else rank_rows(s.index_column("n_tokens"), world)
            try:
                with bar(progress, len(methods) * len(specs) * (hi - lo), "evaluating"), \
                        interrupts.layer_checks(lm.adapter.layers()):
                    _evaluate(s, methods, specs, cfg, lm, predictor, other, other_ids, out, timings, progress,
                              message, lo, hi)
            except KeyboardInterrupt:
                if world is not None:
                    raise  # the other ranks' shares are lost with this one: nothing is written
                stopped = True
            finally:
                if other is not None:
                    other.close()
        if world is not None:  # every rank has closed the store: rank 0 joins the shares and writes them
            out = _gathered(out, world)
            if world.rank != 0:
                return {"metrics": [x[0] for x in specs], "methods": methods, "rows": [lo, hi]}
        with interrupts.critical():  # never cut in half
            if out or not stopped:
                add_metrics(path, out)
    if stopped:
        done = ", ".join(f"{m.method}/{m.name}" for m in out) or "none"
        raise interrupts.Interrupted(f"{len(out)} of {len(methods) * len(specs)} metric results were finished and "
                                     f"written ({done})")
    summary = {"metrics": [x[0] for x in specs], "methods": methods, "seconds": timings,
               "sequences_forwarded": predictor.forwarded if predictor else 0,
               "model_seconds": round(predictor.seconds, 3) if predictor else 0.0}
    message(f"metrics: {len(specs)} x {len(methods)} methods, {summary['sequences_forwarded']} perturbed "
            f"sequences through the model ({summary['model_seconds']:.1f} s)")
    return summary


def rank_rows(n_tokens, world) -> tuple[int, int]:
    """The examples [lo, hi) that rank ``world.rank`` evaluates: contiguous shares balanced by token count
    (compute.shards.split_by_tokens); with fewer examples than ranks, one each and none for the rest."""
    from .shards import split_by_tokens

    n = len(n_tokens)
    if n < world.world_size:
        return (world.rank, world.rank + 1) if world.rank < n else (n, n)
    return split_by_tokens([int(x) for x in n_tokens], world.world_size)[world.rank]


def _gathered(out: list, world) -> list:
    """Every rank's results of each (method, metric), joined in rank order (= dataset order), the summaries
    recomputed over the whole store by the metric itself (each is a function of the per-example values)."""
    import torch.distributed as dist

    shares = [None] * world.world_size
    dist.all_gather_object(shares, [(m.method, m.name, m.values, m.curves, m.levels, m.steps) for m in out])
    joined = []
    for i, mine in enumerate(out):
        if any(share[i][:2] != (mine.method, mine.name) for share in shares):
            raise AttrscopeError("the ranks evaluated different metrics: launch every rank with the same command")
        res, summary = joined_parts(mine.settings, [MetricResult(values=share[i][2], curves=share[i][3],
                                                                 levels=share[i][4], steps=share[i][5])
                                                    for share in shares])
        joined.append(replace(mine, values=res.values, curves=res.curves, levels=res.levels, steps=res.steps,
                              summary=summary))
    return joined


def joined_parts(settings: dict, parts: list[MetricResult]) -> tuple[MetricResult, dict]:
    """The results of consecutive parts of a store's examples (ranks, shards) joined in order, and the summary
    the metric of ``settings`` (a stored record's) computes over all of them: every summary is a function of the
    per-example values."""
    parts = [p for p in parts if len(p.values)]
    res = _concat(parts, sum(len(p.values) for p in parts))
    metric = get_metric(settings["metric"], **{k: v for k, v in settings.items() if k not in ("preset", "metric")})
    return res, metric.summary(res)


def _evaluate(s, methods, specs, cfg, lm, predictor, other, other_ids, out: list, timings: dict,
              progress: Progress, message, lo: int = 0, hi: int | None = None) -> None:
    """Every (method, metric) of the examples [lo, hi) of the store, appended to ``out`` as each one is finished
    (and said); the progress advances per chunk of examples."""
    hi = len(s) if hi is None else hi
    for method in methods:
        signed = s.is_signed(method)
        for stored, name, preset in specs:
            # a name without @preset takes the run's preset where the metric has one (aopc under --preset attcat)
            preset = preset or (cfg.preset if cfg.preset in REGISTRY[name].presets else None)
            metric = get_metric(name, **_settings(name, preset, cfg, lm.tokenizer, signed, s.task["name"]))
            t0 = time.perf_counter()
            parts = []
            progress.stage(f"{method}/{stored}")
            for a in range(lo, hi, cfg.chunk):
                interrupts.check()
                rows = list(range(a, min(a + cfg.chunk, hi)))
                if s.generation:  # each step explained apart: the metric per step, its mean per example
                    examples, owner = _step_examples(s, rows, method, cfg)
                    parts.append(per_example_mean(metric.evaluate(examples, predictor), owner, len(rows)))
                else:
                    examples = _examples(s, rows, method, cfg, other, other_ids)
                    parts.append(metric.evaluate(examples, predictor))
                progress.advance(len(rows))
            res = _concat(parts, hi - lo)
            timings[f"{method}/{stored}"] = round(time.perf_counter() - t0, 3)
            message(f"metric {method}/{stored}: done in {timings[f'{method}/{stored}']:.1f} s")
            out.append(MetricData(method=method, name=stored, values=res.values, settings={
                **metric.settings, "preset": preset, "metric": name}, summary=metric.summary(res),
                higher_is_better=metric.higher_is_better, description=metric.description,
                curves=res.curves, levels=res.levels, steps=res.steps))


def _check_needs(s, specs, cfg, methods, path) -> None:
    """What the metrics declare they need (``Metric.needs_*``), checked against the store before the model loads."""
    metrics = [REGISTRY[n] for n in dict.fromkeys(name for _, name, _ in specs)]
    if s.generation:  # one explanation per step, none per class, evidence or paired store
        undefined = [m.name for m in metrics if m.needs_class_scores or m.needs_other_store or m.needs_evidence]
        if undefined:
            raise UsageError(f"metric '{undefined[0]}' is not defined per generation step (store '{path}' explains "
                             "each generated token): use the perturbation metrics (comprehensiveness, sufficiency, "
                             "aopc, lodds) or spearman")
    for m in (m for m in metrics if m.needs_class_scores):
        lacking = [x for x in methods if s.method_info(x)["params"].get("class_specific")
                   and not s.method_info(x).get("class_scores")]
        if lacking:
            raise AttrscopeError(f"metric '{m.name}' needs per-class attributions of {', '.join(lacking)}, which "
                                 f"store '{path}' lacks: compute it with --target all")
    for m in (m for m in metrics if m.needs_saliency):
        if cfg.saliency not in s.methods:
            raise AttrscopeError(f"metric '{m.name}' compares with the saliency method '{cfg.saliency}', which store "
                                 f"'{path}' lacks: compute it too, or pass --saliency METHOD")
    needing = [m.name for m in metrics if m.needs_other_store]
    if needing and not cfg.other:
        raise UsageError(f"{' and '.join(needing)} compare{'s' if len(needing) == 1 else ''} two stores: pass "
                         "--other STORE.h5")
    needing = evidence_metrics(specs)
    if needing and len(s) and s[0].evidence is None:
        raise AttrscopeError(f"metric '{needing[0]}' needs evidence tokens, which store '{path}' lacks: compute the "
                             "store with --evidence-column C (the evidence character spans of each example)")


def _concat(parts, N):
    from .metrics.base import MetricResult

    values = np.concatenate([np.asarray(p.values, dtype=np.float64) for p in parts]) if parts else np.zeros(0)
    steps = None  # a generation store's, in step order as the parts are in example order; all parts or none
    if parts and all(p.steps is not None for p in parts):
        steps = np.concatenate([np.asarray(p.steps, dtype=np.float64) for p in parts])
    curves = levels = None
    if parts and all(p.curves is not None for p in parts):
        K = max(p.curves.shape[1] for p in parts)
        curves = np.full((N, K), np.nan)
        levels = np.full((N, K), -1, dtype=np.int64)
        r = 0
        for p in parts:
            e, k = p.curves.shape
            curves[r:r + e, :k] = p.curves
            if p.levels is not None:
                levels[r:r + e, :k] = p.levels
            r += e
    return MetricResult(values=values, curves=curves, levels=levels, steps=steps)
