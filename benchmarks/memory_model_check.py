"""The measured peak memory of one example per method against compute/memory_model.py's formulas, on a tiny float32
Llama (2 layers, 4 heads, d 32 and d_ff 64 unless --hidden/--d-ff say otherwise) on the CPU with the CPU's chunk
budgets (issue 27 item 6).

    MALLOC_MMAP_THRESHOLD_=65536 python benchmarks/memory_model_check.py --methods raw_attention,rollout,alti,norm,grad_l2 -n 1024,2048,4096
    MALLOC_MMAP_THRESHOLD_=65536 python benchmarks/memory_model_check.py --hidden 1024 --d-ff 2752 -n 256,1024   # the n d terms
    MALLOC_MMAP_THRESHOLD_=65536 python benchmarks/memory_model_check.py --layers 4 --hidden 256 --heads 8 --d-ff 1024 \
        --methods lrp -n 2048   # a tiny-but-long model (issue 36)

Each row: the peak resident memory of the capture and the method above what the process held before
(compute.memory.peak_bytes, Linux VmHWM) and the model's peak above the weights. Run it with glibc's mmap threshold
fixed (the environment variable above; tests/test_memory_model.py does): with the default, freed large blocks raise
the threshold and later ones come from a heap that keeps earlier pages, and the resident peak undercounts them.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from compute import memory_model as mm  # noqa: E402

TINY = mm.ModelShape("tiny Llama", layers=2, d=32, heads=4, kv_heads=4, d_ff=64, vocab=100)


def predicted(name: str, n: int, shape: mm.ModelShape = TINY) -> int:
    """The model's peak above the weights for the tiny float32 model with the CPU's budgets."""
    run = mm.Run(n, 4, mm.Budgets.cpu())
    return mm.estimate(name, shape, run).peak - mm.weights(shape, run)


def measure(methods: list[str], ns: list[int], shape: mm.ModelShape = TINY) -> dict[str, int]:
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
        method = REGISTRY[name](**({"baseline": "zero"} if name.startswith("ig_") else {}))  # Llama: no [MASK]
        for n in ns:
            enc = {"input_ids": torch.randint(1, shape.vocab, (1, n)),
                   "attention_mask": torch.ones(1, n, dtype=torch.long)}

            def work():
                cap = adapter.capture(enc, method.needs)
                cap.passes = method.passes
                method.compute(cap, adapter, torch.zeros(1, dtype=torch.long))

            out[f"{name} {n}"] = peak_bytes(work)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="raw_attention,rollout,alti,norm,grad_l2")
    ap.add_argument("-n", default="1024,2048,4096", help="comma-separated token counts")
    ap.add_argument("--layers", type=int, default=TINY.layers, help="layers [2]")
    ap.add_argument("--heads", type=int, default=TINY.heads, help="heads (as many key/value heads) [4]")
    ap.add_argument("--hidden", type=int, default=TINY.d, help="d [32]")
    ap.add_argument("--d-ff", type=int, default=TINY.d_ff, help="the feed-forward width [64]")
    ap.add_argument("--json", action="store_true", help="print the measured bytes as JSON only")
    a = ap.parse_args()
    methods, ns = a.methods.split(","), [int(x) for x in a.n.split(",")]
    shape = replace(TINY, layers=a.layers, heads=a.heads, kv_heads=a.heads, d=a.hidden, d_ff=a.d_ff)
    got = measure(methods, ns, shape)
    if a.json:
        print(json.dumps(got))
        return
    print("| method | n | measured MiB | predicted MiB | measured / predicted |\n|---|---|---|---|---|")
    for name in methods:
        for n in ns:
            m, p = got[f"{name} {n}"], predicted(name, n, shape)
            print(f"| {name} | {n} | {m / 2**20:.0f} | {p / 2**20:.0f} | {m / p:.2f} |")


if __name__ == "__main__":
    main()
