"""--task generate's cost on the CPU: the target-independent methods over every step of a generation against one
next-token target on the full sequence (issue 37's acceptance: within 1.5x).

A tiny random Llama (the shared MiniLM's WordPiece vocabulary, no EOS so every prompt gets --new tokens) continues
the first N SST-2 dev sentences greedily (compute/generation.py, batched, left-padded); then, on the same prompt +
continuation sequences in the same batches, the runner's stage for generation batches (every step, one pass:
compute/run/steps.py) and its stage for next-token batches (the last position only) run the same methods. Printed
per method: seconds for all steps, seconds for one target, their ratio; and the forward pass's and decoding's.

    python benchmarks/generate_cost.py -n 100 --new 16 --threads 1
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parents[1]
SHARED = HERE.parent / "shared"
sys.path.insert(0, str(HERE))  # this checkout's packages
# The target-independent methods that read every step's row off the one pass (Method.compute_rows); decompx_nohead
# carries only the explained row through its last layer, so it runs on the step rows (add it with --methods).
TARGET_INDEPENDENT = ("raw_attention,rollout,norm,norm_n,norm_res,norm_resln,norm_fixedres,globenc,w_res,w_fixedres,"
                      "alti,alti_l2,value_zeroing")


def tiny_llama(vocab: int, layers: int, hidden: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0,
                         bos_token_id=None, eos_token_id=None, attn_implementation="eager")
    return LlamaForCausalLM(config).eval()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=100, help="first N SST-2 dev sentences as prompts")
    ap.add_argument("--new", type=int, default=16, help="tokens generated per prompt")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--methods", default=TARGET_INDEPENDENT)
    ap.add_argument("--data", type=Path, default=SHARED / "data" / "sst2" / "dev.tsv")
    ap.add_argument("--tokenizer", type=Path, default=SHARED / "models" / "minilm-sst2")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoTokenizer

    from compute.adapters import adapter_for
    from compute.generation import Decoding, decode
    from compute.methods import get_method
    from compute.models import LoadedModel
    from compute.run.dispatch import Timings, launch_batch, launch_steps_batch
    from compute.run.steps import Steps
    from compute.tasks import TaskRows, get_task

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    with open(args.data, newline="") as f:
        texts = [row["sentence"] for row, _ in zip(csv.DictReader(f, delimiter="\t"), range(args.n))]
    prompts = [ids[1:-1] for ids in tok(texts)["input_ids"]]  # without [CLS] and [SEP]: a decoder reads text
    model = tiny_llama(len(tok), args.layers, args.hidden)
    adapter = adapter_for(model, "next-token")
    lm = LoadedModel(model=model, tokenizer=tok, adapter=adapter, task=get_task("next-token"), info={})
    names = [m.strip() for m in args.methods.split(",")]

    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))  # length buckets, as the runner's batches
    batches = [order[k:k + args.batch_size] for k in range(0, len(order), args.batch_size)]
    t0 = time.perf_counter()
    made = {}
    for batch in batches:
        for i, ids in zip(batch, decode(adapter, [prompts[i] for i in batch], batch, [10 ** 6] * len(batch),
                                        Decoding(args.new), frozenset(), 0)):
            made[i] = ids
    decode_s = time.perf_counter() - t0
    assert all(len(made[i]) == args.new for i in made)

    def padded(seqs):
        n = max(map(len, seqs))
        ids = torch.zeros(len(seqs), n, dtype=torch.long)
        mask = torch.zeros(len(seqs), n, dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, :len(s)], mask[b, :len(s)] = torch.as_tensor(s), 1
        return {"input_ids": ids, "attention_mask": mask}

    steps_t, one_t = Timings(methods={m: 0.0 for m in names}), Timings(methods={m: 0.0 for m in names})
    methods = {m: get_method(m) for m in names}
    for batch in batches:
        seqs = [prompts[i] + made[i] for i in batch]
        enc = padded(seqs)
        steps = Steps.of([len(prompts[i]) for i in batch], [made[i] for i in batch], None, torch.device("cpu"))
        launch_steps_batch(lm, methods, enc, steps, None, "none", steps_t).result()
        rows = TaskRows.plain([-1] * len(batch))
        rows.position = [len(s) - 1 for s in seqs]
        rows.target_token = [s[-1] for s in seqs]  # one next-token target on the full sequence
        launch_batch(lm, methods, enc, rows, "label", 2, "none", one_t).result()

    print(f"{len(prompts)} prompts x {args.new} new tokens, tiny Llama ({args.layers} layers, d={args.hidden}), "
          f"{args.threads} thread(s), batches of {args.batch_size}; torch {torch.__version__}")
    print(f"decoding: {decode_s:.2f} s")
    print(f"{'':16} {'all steps (s)':>14} {'one target (s)':>15} {'ratio':>7}")
    print(f"{'forward':16} {steps_t.forward:14.3f} {one_t.forward:15.3f} {steps_t.forward / one_t.forward:7.2f}")
    for m in names:
        a, b = steps_t.methods[m], one_t.methods[m]
        print(f"{m:16} {a:14.3f} {b:15.3f} {a / b:7.2f}")
    a, b = sum(steps_t.methods.values()), sum(one_t.methods.values())
    print(f"{'all methods':16} {a:14.3f} {b:15.3f} {a / b:7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
