"""Method cost relative to the bare model pass it needs, measured in one run (ratios hold on a noisy machine).

For every batch of the dataset (length-sorted as attr-compute does), time
  * the bare forward: the model alone, no hooks, under no_grad;
  * the capture forward: the same pass with attrscope's hooks for what the methods need;
  * each method on the captured batch.
Report seconds and ratios (method / bare forward). Each timing is the median of --repeat runs of the whole sweep.

    python benchmarks/bench_methods.py                       # shared MiniLM-SST2 over SST-2 dev, CPU
    python benchmarks/bench_methods.py --device cuda --batch-size 64
    python benchmarks/bench_methods.py --random-base 512 --batch-size 1 --methods alti,globenc --peak-memory
    python benchmarks/bench_methods.py --methods lrp,partial_lrp,transatt,mask_lrp,gae --repeat 1
    python benchmarks/bench_methods.py --random-base 512 --batch-size 1 --methods alti --alti-paths auto,dense
    python benchmarks/bench_methods.py --join 30 --limit 60 --batch-size 1 --methods alti --alti-paths auto,dense
    python benchmarks/bench_methods.py --random-base 64 --family llama --methods lrp,transatt,mask_lrp --lrp-dtype model

Gradient, integrated-gradient and LRP methods run their own forward and backward; they are compared with a bare
forward + backward of the model (integrated gradients with m of them).

``--random-base N`` replaces the model and data by a seeded random BERT-base-sized classifier (12 layers, hidden
768, 12 heads; ``--family llama``: a Llama of that size, 4 key/value heads) on random token sequences of length N. ``--peak-memory`` adds each method's peak memory: on CUDA the
allocator's peak; on CPU the peak resident memory of a fresh process that builds the model, captures the first batch
and runs the method (the "capture forward" row: a process that only captures).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from compute.data import load_dataset  # noqa: E402
from compute.methods import get_method, parse_methods  # noqa: E402
from compute.methods._internals.gradients import GradientMethod, IntegratedGradientsMethod  # noqa: E402
from compute.methods._internals.relevance import RelevanceMethod  # noqa: E402
from compute.models import load_model, resolve_device  # noqa: E402


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO.parent / "shared/models/minilm-sst2"))
    ap.add_argument("--data", default=str(REPO.parent / "shared/data/sst2/dev.tsv"))
    ap.add_argument("--methods", default="all")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--random-base", type=int, metavar="N", help="random BERT-base-sized model, sequences of length N")
    ap.add_argument("--family", choices=("bert", "llama"), default="bert", help="--random-base's architecture")
    ap.add_argument("--join", type=int, default=1, metavar="K",
                    help="join every K consecutive texts of the data into one (cut at 512 tokens): long real inputs")
    ap.add_argument("--peak-memory", action="store_true", help="also measure each method's peak memory")
    ap.add_argument("--ig-steps", type=int, default=16, help="quadrature steps of ig_l2/ig_mean (default 16)")
    ap.add_argument("--alti-paths", default="auto", metavar="PATHS",
                    help="forms of ALTI's L1 proximities to time, comma-separated from auto,dense,pruned (default auto); "
                         "each but auto is its own row, alti[dense] and alti[pruned]")
    ap.add_argument("--lrp-dtype", choices=["auto", "float64", "mixed", "model"], default="auto",
                    help="precision of the LRP rules (as attr-compute's --lrp-dtype)")
    args = ap.parse_args()

    dev = resolve_device(args.device)
    model, adapter, batches, n_ex = setup(args, dev)
    names = parse_methods(args.methods)
    # mask_lrp: every other head kept (its cost does not depend on the mask; the statistics pass is timed apart)
    half = [[(l + h) % 2 for h in range(adapter.n_heads)] for l in range(adapter.n_layers)]

    def params(n):
        if n.startswith("ig_"):
            return {"steps": args.ig_steps}
        if n in ("lrp", "partial_lrp", "transatt", "mask_lrp"):
            return {"dtype": args.lrp_dtype, **({"head_mask": half} if n == "mask_lrp" else {})}
        return {}

    methods = {n: get_method(n, **params(n)) for n in names}
    if "alti" in methods:  # ALTI's forms side by side (its l1_path), in the same sweeps
        paths = [x.strip() for x in args.alti_paths.split(",") if x.strip()]
        if "auto" not in paths:
            del methods["alti"]
        methods.update({f"alti[{x}]": get_method("alti", l1_path=x) for x in paths if x != "auto"})
        names = list(methods)
    if args.methods.strip() == "all":  # methods without a rule set for this architecture are left out
        methods = {n: m for n, m in methods.items() if _defined(m, adapter)}
        names = list(methods)
    needs = frozenset().union(*(m.needs for m in methods.values()))
    grad_names = [n for n in names
                  if isinstance(methods[n], (GradientMethod, IntegratedGradientsMethod, RelevanceMethod))]

    def sweep():
        t = {"bare forward": 0.0, "capture forward": 0.0, **{n: 0.0 for n in names}}
        with torch.no_grad():
            for batch in batches:
                _sync(dev); t0 = time.perf_counter()
                model(**adapter.forward_inputs(batch))
                _sync(dev); t["bare forward"] += time.perf_counter() - t0
                if grad_names:
                    t0 = time.perf_counter()
                    bare_forward_backward(model, batch)
                    _sync(dev); t["bare fwd + bwd"] = t.get("bare fwd + bwd", 0.0) + time.perf_counter() - t0
                t0 = time.perf_counter()
                cap = adapter.capture(batch, needs)
                _sync(dev); t["capture forward"] += time.perf_counter() - t0
                for n, m in methods.items():
                    cap.memo.clear()  # each method pays for its own intermediates (attr-compute shares them)
                    t0 = time.perf_counter()
                    m.compute(cap, adapter, cap.pred)
                    _sync(dev); t[n] += time.perf_counter() - t0
        return t

    sweep()  # warm-up
    runs = [sweep() for _ in range(args.repeat)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    base = med["bare forward"]
    what = f"random {args.family}-base, n = {args.random_base}" if args.random_base else args.model
    print(f"model {what} on {dev} ({torch.get_num_threads()} threads), {n_ex} examples, "
          f"batch {args.batch_size}, median of {args.repeat}")
    peaks = peak_memory(args, names) if args.peak_memory else {}
    print(f"{'':18s} {'seconds':>9s} {'x bare fwd':>11s} {'(fwd+method)/fwd':>17s} {'peak MB':>9s}")
    fb = med.pop("bare fwd + bwd", None)
    for k, v in med.items():
        if k in grad_names:
            continue
        total = "" if k in ("bare forward", "capture forward") else f"{(med['capture forward'] + v) / base:17.3f}"
        peak = f"{peaks[k]:9.0f}" if k in peaks else ""
        print(f"{k:18s} {v:9.3f} {v / base:11.3f} {total:>17s} {peak:>9s}")
    print(f"bare forward throughput: {n_ex / base:.1f} examples/s")
    if grad_names:
        # gradient methods run their own forward + backward: compare with a bare one (IG: with m of them)
        print(f"\n{'':18s} {'seconds':>9s} {'x (fwd+bwd)':>12s} {'x m(fwd+bwd)':>13s}")
        print(f"{'bare fwd + bwd':18s} {fb:9.3f} {1.0:12.3f}")
        for k in grad_names:
            v = med[k]
            per_m = f"{v / (args.ig_steps * fb):13.3f}" if k.startswith("ig_") else ""
            print(f"{k:18s} {v:9.3f} {v / fb:12.3f} {per_m:>13s}")


def _defined(method, adapter) -> bool:
    try:
        method.check_architecture(adapter)
        return True
    except Exception:  # noqa: BLE001 - AttrscopeError: not defined for this architecture
        return False


def bare_forward_backward(model, batch) -> None:
    """The model alone, forward with grad from its input embeddings, one backward of the summed predicted logits to
    them: the least a gradient method can cost."""
    inputs = {k: v for k, v in batch.items() if k != "input_ids"}
    with torch.enable_grad():
        E = model.get_input_embeddings()(batch["input_ids"]).detach().requires_grad_(True)
        logits = model(inputs_embeds=E, **inputs).logits
        torch.autograd.grad(logits.gather(1, logits.argmax(-1, keepdim=True)).sum(), E)


def setup(args, dev):
    """(model, adapter, padded batches on dev, number of examples)."""
    if args.random_base:
        from transformers import BertConfig, BertForSequenceClassification, LlamaConfig, LlamaForSequenceClassification

        from compute.adapters import adapter_for

        torch.manual_seed(0)
        if args.family == "llama":  # BERT-base's size as a pre-LN decoder (the LRP family's decoder rules)
            config = LlamaConfig(hidden_size=768, num_attention_heads=12, num_key_value_heads=4, intermediate_size=3072,
                                 num_hidden_layers=12, vocab_size=30522, pad_token_id=0, attn_implementation="eager")
            model = LlamaForSequenceClassification(config).to(dev).eval()
        else:
            model = BertForSequenceClassification(BertConfig(attn_implementation="eager")).to(dev).eval()
        n_ex = args.limit or max(args.batch_size, 8)
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(1000, 30000, (n_ex, args.random_base), generator=g)
        ids[:, 0], ids[:, -1] = 101, 102
        batches = [{"input_ids": ids[b0:b0 + args.batch_size].to(dev),
                    "attention_mask": torch.ones_like(ids[b0:b0 + args.batch_size]).to(dev)}
                   for b0 in range(0, n_ex, args.batch_size)]
        ad = adapter_for(model)
        ad.mask_token_id = 103  # [MASK] of bert-base-uncased
        return model, ad, batches, n_ex
    lm = load_model(args.model, device=dev)
    data = load_dataset(args.data, limit=args.limit,
                        label2id={v: k for k, v in lm.info["id2label"].items()}, num_labels=lm.info["num_labels"])
    texts = [r.text for r in data.records]
    if args.join > 1:  # long real inputs: consecutive texts joined, cut at 512 tokens
        texts = [" ".join(texts[i:i + args.join]) for i in range(0, len(texts), args.join)]
    enc = lm.tokenizer(texts, truncation=True, max_length=512)
    order = sorted(range(len(texts)), key=lambda i: -len(enc["input_ids"][i]))
    batches = []
    for b0 in range(0, len(order), args.batch_size):
        idx = order[b0:b0 + args.batch_size]
        padded = lm.tokenizer.pad({"input_ids": [enc["input_ids"][i] for i in idx]}, return_tensors="pt")
        batches.append({k: v.to(dev) for k, v in padded.items()})
    return lm.model, lm.adapter, batches, len(texts)


def _peak_child(args, name, queue):
    """In a fresh process: capture the first batch (and run ``name`` unless None); report the peak memory in MB."""
    dev = resolve_device(args.device)
    model, adapter, batches, _ = setup(args, dev)
    extra = {"head_mask": [[1] * adapter.n_heads] * adapter.n_layers} if name == "mask_lrp" else {}
    if name and name.startswith("alti["):  # alti[dense], alti[pruned]: one form of ALTI's proximities
        name, extra = "alti", {"l1_path": name[5:-1]}
    m = get_method(name, **extra) if name else None
    needs = m.needs if m else frozenset({"attentions", "hidden_states", "values", "ln1", "ln2"})
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    with torch.no_grad():
        cap = adapter.capture(batches[0], needs)
        if m:
            m.compute(cap, adapter, cap.pred)
    if dev.type == "cuda":
        queue.put(torch.cuda.max_memory_allocated(dev) / 2**20)
    else:
        queue.put(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def peak_memory(args, names) -> dict:
    """Peak memory per method (MB) for the first batch: whole-process peak on CPU, allocator peak on CUDA."""
    ctx = mp.get_context("spawn")
    out = {}
    for name in [None, *names]:
        q = ctx.Queue()
        p = ctx.Process(target=_peak_child, args=(args, name, q))
        p.start()
        out[name or "capture forward"] = q.get()
        p.join()
    return out


if __name__ == "__main__":
    main()
