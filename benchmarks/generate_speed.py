"""Step-by-step generation attribution, attrscope against inseq 0.7.1 (issue 37): the same tiny random Llama
(tests/fixtures/inseq/llama, benchmarks/inseq_reference.py), the same 100 SST-2 dev prompts of 20-40 words (mapped
onto the tiny vocabulary), 16 new
tokens each (greedy, stopping at EOS), the same methods (inseq's saliency, input_x_gradient, integrated_gradients
with 50 steps, Gauss-Legendre, from inseq's baseline; attrscope's grad_l2, gxi_mean, ig_l2 with --ig-steps 50
--ig-baseline zero, which is inseq's baseline on this checkpoint: its [UNK] row is zero), the same thread count, in
one run.

inseq runs in its own environment (see benchmarks/inseq_reference.py for how it is made); this script calls that
environment's python on itself with --side inseq, which times inseq's `attribute` (generation included) per method
after one warm-up and writes the seconds as JSON. attrscope is timed in this process through compute.runner.run (the
API behind `attr-compute run`), after a warm-up run on two prompts, one run per method; each timed run includes the
generation, the store's writing and loading the tiny checkpoint (inseq's timing excludes its load).

    python benchmarks/generate_speed.py --inseq-python /work/venv-inseq/bin/python --threads 1
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "tests" / "fixtures" / "inseq" / "llama"
SST2_DEV = REPO.parent / "shared" / "data" / "sst2" / "dev.tsv"
INSEQ_METHODS = {"saliency": "grad_l2", "input_x_gradient": "gxi_mean", "integrated_gradients": "ig_l2"}


def prompts(count: int, tokenizer) -> list[str]:
    """The first ``count`` dev sentences of 20-40 words, each word replaced by a word of the tiny tokenizer's
    vocabulary chosen by its CRC-32 (the tiny vocabulary knows some 60 words; an [UNK] does not survive inseq's
    decode-and-compare of the prompt, and attrscope would refuse mostly unknown text)."""
    words = sorted(w for w in tokenizer.get_vocab() if w.isalpha() and len(w) > 1)
    with SST2_DEV.open() as f:
        rows = [r["sentence"].split() for r in csv.DictReader(f, delimiter="\t")]
    chosen = [" ".join(words[zlib.crc32(w.encode()) % len(words)] for w in r) for r in rows if 20 <= len(r) <= 40]
    if len(chosen) < count:
        raise SystemExit(f"only {len(chosen)} SST-2 dev sentences of 20-40 words; asked for {count}")
    return chosen[:count]


def inseq_side(args) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from lxt_reference import TORCHVISION_NOTE  # noqa: F401 - the torchvision stub before transformers

    import inseq
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    tok = transformers.AutoTokenizer.from_pretrained(MODEL)
    texts = prompts(args.prompts, tok)
    seconds = {}
    for method in INSEQ_METHODS:
        attribution_model = inseq.load_model(model, method, tokenizer=tok)
        extra = {"n_steps": 50} if method == "integrated_gradients" else {}
        run = lambda xs: attribution_model.attribute(  # noqa: E731
            xs, generation_args={"max_new_tokens": args.new_tokens, "do_sample": False}, attributed_fn="logit",
            skip_special_tokens=False, show_progress=False, **extra)
        run(texts[:2])  # warm-up
        start = time.perf_counter()
        out = run(texts)
        seconds[method] = time.perf_counter() - start
        steps = sum(len(a.target_attributions[0]) for a in out.sequence_attributions)
        print(f"inseq {method}: {seconds[method]:.2f} s", file=sys.stderr, flush=True)
    Path(args.out).write_text(json.dumps({"seconds": seconds, "threads": args.threads, "prompts": len(texts),
                                          "new_tokens": args.new_tokens, "positions": steps,
                                          "inseq": "0.7.1", "transformers": transformers.__version__}))


def attrscope_side(args) -> dict[str, float]:
    """attr-compute --task generate on the same prompts, timed per method in this process."""
    import tempfile

    import torch
    import transformers

    sys.path.insert(0, str(REPO))
    from compute.runner import RunConfig, run

    torch.set_num_threads(args.threads)
    tok = transformers.AutoTokenizer.from_pretrained(MODEL)
    texts = prompts(args.prompts, tok)
    seconds = {}
    with tempfile.TemporaryDirectory() as tmp:
        def data(rows: list[str], name: str) -> str:
            path = Path(tmp) / name
            path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in rows))
            return str(path)

        def once(path: str, method: str, out: str) -> None:
            run(RunConfig(dataset=path, model=str(MODEL), task="generate", max_new_tokens=args.new_tokens,
                          methods=method, device="cpu", ig_steps=50, ig_baseline="zero", matrices="none",
                          output=str(Path(tmp) / out)))

        once(data(texts[:2], "warm.jsonl"), ",".join(INSEQ_METHODS.values()), "warm.h5")
        every = data(texts, "prompts.jsonl")
        for ours in INSEQ_METHODS.values():
            start = time.perf_counter()
            once(every, ours, f"{ours}.h5")
            seconds[ours] = time.perf_counter() - start
            print(f"attrscope {ours}: {seconds[ours]:.2f} s", file=sys.stderr, flush=True)
    return seconds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", choices=("both", "inseq"), default="both")
    parser.add_argument("--inseq-python", default="/work/venv-inseq/bin/python")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--out", default="/tmp/inseq_speed.json")
    args = parser.parse_args(argv)
    if args.side == "inseq":
        return inseq_side(args)
    subprocess.run([args.inseq_python, __file__, "--side", "inseq", "--threads", str(args.threads), "--prompts",
                    str(args.prompts), "--new-tokens", str(args.new_tokens), "--out", args.out], check=True)
    theirs = json.loads(Path(args.out).read_text())
    ours = attrscope_side(args)
    print(f"{args.prompts} prompts x {args.new_tokens} new tokens, {args.threads} thread(s), tiny Llama")
    print(f"{'inseq':24} {'s':>8} {'attrscope':12} {'s':>8} {'speed-up':>9}")
    for theirs_name, ours_name in INSEQ_METHODS.items():
        t, o = theirs["seconds"][theirs_name], ours[ours_name]
        print(f"{theirs_name:24} {t:8.2f} {ours_name:12} {o:8.2f} {t / o:8.2f}x")


if __name__ == "__main__":
    main()
