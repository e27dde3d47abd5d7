"""The measured peak memory of one example per method against compute/memory_model.py's formulas, on a tiny float32
Llama (2 layers, 4 heads, d 32 and d_ff 64 unless --hidden/--d-ff say otherwise) on the CPU with the CPU's chunk
budgets (issue 27 item 6).

    MALLOC_MMAP_THRESHOLD_=65536 python benchmarks/memory_model_check.py --methods raw_attention,rollout,alti,norm,grad_l2 -n 1024,2048,4096
    MALLOC_MMAP_THRESHOLD_=65536 python benchmarks/memory_model_check.py --hidden 1024 --d-ff 2752 -n 256,1024   # the n d terms
    MALLOC_MMAP_THRESHOLD_=65536 python benchmarks/memory_model_check.py --long -n 2048,4096   # issue 36's acceptance
    MALLOC_MMAP_THRESHOLD_=65536 python benchmarks/memory_model_check.py --layers 4 --hidden 256 --heads 8 --d-ff 1024 \
        --methods lrp -n 2048   # a tiny-but-long model (issue 36)
    MALLOC_MMAP_THRESHOLD_=65536 python benchmarks/memory_model_check.py --long --methods lrp,transatt,attnlrp \
        -n 1024 --pass-mb 1   # the checkpointed passes (a pass's memory of 1 MiB) at a length float64 affords

Each row: the peak resident memory of the capture and the method above what the process held before
(compute.memory.peak_bytes, Linux VmHWM) and the model's peak above the weights. Run it with glibc's mmap threshold
fixed (the environment variable above; tests/test_memory_model.py does): with the default, freed large blocks raise
the threshold and later ones come from a heap that keeps earlier pages, and the resident peak undercounts them.

``--long`` (issue 36): the tiny-but-long model (4 layers, d 256, 8 heads, d_ff 1024), each method and length in a
fresh process (``--fresh``), each peak above the bare forward's ("forward": a capture of nothing) against the model's,
and against the bound: twice one layer's float32 [H, n, n] plus what the method keeps (``--matrices cls``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from compute import memory_model as mm  # noqa: E402

TINY = mm.ModelShape("tiny Llama", layers=2, d=32, heads=4, kv_heads=4, d_ff=64, vocab=100)
LONG = mm.ModelShape("tiny-but-long Llama", layers=4, d=256, heads=8, kv_heads=8, d_ff=1024, vocab=100)
BARE = "forward"  # the bare forward: the capture of nothing
# issue 36's methods: each layer's attention consumed as the forward makes it: the head means, and the
# decomposition's layer-wise products, which read each layer in a forward of their own
HEAD_MEANS = ("raw_attention", "rollout", "w_fixedres")
LAYER_PARTS = ("norm_n", "norm_fixedres", "norm_res", "norm_resln", "globenc", "w_res", "alti", "alti_l2",
               "alti_logit")
STREAMED = HEAD_MEANS + LAYER_PARTS
PASS_MB: list[int] = []  # --pass-mb, passed on to the fresh processes


def predicted(name: str, n: int, shape: mm.ModelShape = TINY) -> int:
    """The model's peak above the weights for the tiny float32 model with the CPU's budgets."""
    run = mm.Run(n, 4, mm.Budgets.cpu())
    return mm.estimate(name, shape, run).peak - mm.weights(shape, run)


def measure(methods: list[str], ns: list[int], shape: mm.ModelShape = TINY) -> dict[str, int]:
    """{"<method> <n>": peak bytes}; "forward" is the bare forward (a capture of nothing)."""
    import torch
    import transformers as T

    from compute.adapters import adapter_for
    from compute.memory import peak_bytes
    from compute.methods import REGISTRY

    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = T.LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.d, intermediate_size=shape.d_ff,
                        num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                        num_key_value_heads=shape.kv_heads, max_position_embeddings=max(ns), pad_token_id=0,
                        num_labels=shape.labels)
    model = T.LlamaForSequenceClassification(cfg)
    model.config._attn_implementation = "eager"
    adapter = adapter_for(model.eval())
    # one pass first, unmeasured: a fresh process's first work also allocates the libraries' own buffers
    with torch.no_grad():
        adapter.model(input_ids=torch.randint(1, shape.vocab, (1, min(ns))))
    out = {}
    for name in methods:
        params = {"baseline": "zero"} if name.startswith("ig_") else {}
        if name == "mask_lrp":  # every other head kept
            params["head_mask"] = [[(l + h) % 2 for h in range(shape.heads)] for l in range(shape.layers)]
        method = None if name == BARE else REGISTRY[name](**params)
        for n in ns:
            enc = {"input_ids": torch.randint(1, shape.vocab, (1, n)),
                   "attention_mask": torch.ones(1, n, dtype=torch.long)}

            def work():
                if method is None:
                    adapter.capture(enc, frozenset())
                    return
                cap = adapter.capture(enc, method.needs)
                cap.passes = method.passes
                # as the runner: the forward's output (its KV cache) dropped, --matrices cls (the explained rows)
                cap.output, cap.kept_matrices, cap.kept_row = None, "cls", cap.explain_pos
                method.compute(cap, adapter, torch.zeros(1, dtype=torch.long))

            out[f"{name} {n}"] = peak_bytes(work)
    return out


def measure_fresh(methods: list[str], ns: list[int], shape: mm.ModelShape) -> dict[str, int]:
    """``measure`` of each method and length in a process of its own (nothing of another's heap in its peak)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_", "65536")}
    out = {}
    for name in methods:
        for n in ns:
            res = subprocess.run([sys.executable, __file__, "--json", "--methods", name, "-n", str(n),
                                  "--layers", str(shape.layers), "--heads", str(shape.heads),
                                  "--hidden", str(shape.d), "--d-ff", str(shape.d_ff),
                                  *(["--pass-mb", str(PASS_MB[0])] if PASS_MB else [])],
                                 env=env, capture_output=True, text=True, check=True)
            out.update(json.loads(res.stdout.strip().splitlines()[-1]))
    return out


def predicted_above_forward(name: str, n: int, shape: mm.ModelShape) -> int:
    """The model's peak of ``name`` above its bare forward's."""
    run = mm.Run(n, 4, mm.Budgets.cpu())
    return mm.estimate(name, shape, run).peak - mm.bare_forward(shape, run)


def bound(name: str, n: int, shape: mm.ModelShape) -> int:
    """Issue 36's bound on a method's peak above the bare forward: twice one layer's float32 [H, n, n] and what the
    method stores with --matrices cls (its scores, layer views and explained rows, float32)."""
    from compute.methods import REGISTRY

    cls = REGISTRY[name]
    views = shape.layers if cls.has_layer_views else 0
    rows = shape.layers if cls.has_matrices else 0
    return 2 * shape.heads * n * n * mm.F32 + (1 + views + rows) * n * mm.F32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default=None, help="comma-separated methods [raw_attention,rollout,alti,norm,grad_l2; "
                    "with --long: forward and the streamed methods]")
    ap.add_argument("-n", default="1024,2048,4096", help="comma-separated token counts")
    ap.add_argument("--layers", type=int, default=TINY.layers, help="layers [2]")
    ap.add_argument("--heads", type=int, default=TINY.heads, help="heads (as many key/value heads) [4]")
    ap.add_argument("--hidden", type=int, default=TINY.d, help="d [32]")
    ap.add_argument("--d-ff", type=int, default=TINY.d_ff, help="the feed-forward width [64]")
    ap.add_argument("--long", action="store_true", help="the tiny-but-long model, fresh processes, above the forward")
    ap.add_argument("--fresh", action="store_true", help="each method and length in a process of its own")
    ap.add_argument("--json", action="store_true", help="print the measured bytes as JSON only")
    ap.add_argument("--pass-mb", type=int, help="a gradient pass's memory on the CPU (gradients.IG_CPU_BYTES, in "
                    "MiB) for the measurement and the model alike: small, the checkpointed passes at short lengths")
    a = ap.parse_args()
    if a.pass_mb is not None:
        from compute.methods._internals import gradients

        gradients.IG_CPU_BYTES = a.pass_mb << 20
        PASS_MB.append(a.pass_mb)
    ns = [int(x) for x in a.n.split(",")]
    shape = LONG if a.long else replace(TINY, layers=a.layers, heads=a.heads, kv_heads=a.heads, d=a.hidden,
                                        d_ff=a.d_ff)
    default = ",".join((BARE, *STREAMED)) if a.long else "raw_attention,rollout,alti,norm,grad_l2"
    methods = (a.methods or default).split(",")
    if a.long and BARE not in methods:
        methods.insert(0, BARE)
    got = (measure_fresh if a.long or a.fresh else measure)(methods, ns, shape)
    if a.json:
        print(json.dumps(got))
        return
    if not a.long:
        print("| method | n | measured MiB | predicted MiB | measured / predicted |\n|---|---|---|---|---|")
        for name in methods:
            for n in ns:
                m, p = got[f"{name} {n}"], predicted(name, n, shape)
                print(f"| {name} | {n} | {m / 2**20:.0f} | {p / 2**20:.0f} | {m / p:.2f} |")
        return
    print("| method | n | forward MiB | above the forward MiB | predicted MiB | measured / predicted | bound MiB "
          "| within |\n|---|---|---|---|---|---|---|---|")
    for name in methods:
        if name == BARE:
            continue
        for n in ns:
            fwd = got[f"{BARE} {n}"]
            above, p, b = got[f"{name} {n}"] - fwd, predicted_above_forward(name, n, shape), bound(name, n, shape)
            print(f"| {name} | {n} | {fwd / 2**20:.0f} | {above / 2**20:.0f} | {p / 2**20:.0f} | {above / p:.2f} "
                  f"| {b / 2**20:.0f} | {'yes' if above <= b else 'no'} |")


if __name__ == "__main__":
    main()
