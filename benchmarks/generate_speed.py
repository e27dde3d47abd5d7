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
generation, the store's writing and loading the tiny checkpoint (inseq's timing excludes its load). Both sides
report wall-clock and process CPU seconds: on a machine shared with other work the CPU seconds are the comparable
figure (the wall clock also counts the time the process waited for a core).

With --next-token also the issue's overlap case, one next-token target per prompt: inseq's loop (`attribute` on one
prompt at a time, one new token) against attrscope's `--task next-token` on the same prompts (the model's top word,
batched).

    python benchmarks/generate_speed.py --inseq-python /work/venv-inseq/bin/python --threads 1 --next-token
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
    seconds, cpu, loop, loop_cpu = {}, {}, {}, {}
    for method in methods_of(args):
        attribution_model = inseq.load_model(model, method, tokenizer=tok)
        extra = {"n_steps": 50} if method == "integrated_gradients" else {}
        run = lambda xs, new: attribution_model.attribute(  # noqa: E731
            xs, generation_args={"max_new_tokens": new, "do_sample": False}, attributed_fn="logit",
            skip_special_tokens=False, show_progress=False, **extra)
        run(texts[:2], args.new_tokens)  # warm-up
        start, c0 = time.perf_counter(), time.process_time()
        out = run(texts, args.new_tokens)
        seconds[method], cpu[method] = time.perf_counter() - start, time.process_time() - c0
        steps = sum(len(a.target_attributions[0]) for a in out.sequence_attributions)
        print(f"inseq {method}: {seconds[method]:.2f} s ({cpu[method]:.2f} s CPU)", file=sys.stderr, flush=True)
        if args.next_token:  # one prompt at a time, one new token
            start, c0 = time.perf_counter(), time.process_time()
            for t in texts:
                run(t, 1)
            loop[method], loop_cpu[method] = time.perf_counter() - start, time.process_time() - c0
            print(f"inseq {method} next token, loop: {loop[method]:.2f} s ({loop_cpu[method]:.2f} s CPU)",
                  file=sys.stderr, flush=True)
    Path(args.out).write_text(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "next_token_seconds": loop,
                                          "next_token_cpu_seconds": loop_cpu, "threads": args.threads,
                                          "prompts": len(texts), "new_tokens": args.new_tokens, "positions": steps,
                                          "inseq": "0.7.1", "transformers": transformers.__version__}))


def methods_of(args) -> list[str]:
    return [m for m in INSEQ_METHODS if not args.methods or m in args.methods.split(",")]


def attrscope_side(args) -> dict[str, tuple[float, float]]:
    """attr-compute --task generate (and --task next-token with --next-token) on the same prompts, timed per method
    in this process: {(task, method): (wall seconds, CPU seconds)}."""
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

        def once(path: str, method: str, out: str, task: str = "generate") -> None:
            task_options = ({"max_new_tokens": args.new_tokens} if task == "generate" else {"text_column": "prompt"})
            run(RunConfig(dataset=path, model=str(MODEL), task=task, methods=method, device="cpu", ig_steps=50,
                          ig_baseline="zero", matrices="none", output=str(Path(tmp) / out), **task_options))

        ours_methods = [INSEQ_METHODS[m] for m in methods_of(args)]
        tasks = ("generate", "next-token") if args.next_token else ("generate",)
        for task in tasks:
            once(data(texts[:2], "warm.jsonl"), ",".join(ours_methods), f"warm-{task}.h5", task)
        every = data(texts, "prompts.jsonl")
        for ours in ours_methods:
            for task in tasks:
                start, c0 = time.perf_counter(), time.process_time()
                once(every, ours, f"{ours}-{task}.h5", task)
                seconds[task, ours] = (time.perf_counter() - start, time.process_time() - c0)
                print(f"attrscope {task} {ours}: {seconds[task, ours][0]:.2f} s ({seconds[task, ours][1]:.2f} s CPU)",
                      file=sys.stderr, flush=True)
    return seconds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", choices=("both", "inseq"), default="both")
    parser.add_argument("--inseq-python", default="/work/venv-inseq/bin/python")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--out", default="/tmp/inseq_speed.json")
    parser.add_argument("--methods", default="", help="inseq's names, comma-separated [default: all three]")
    parser.add_argument("--next-token", action="store_true", help="also one next-token target per prompt")
    args = parser.parse_args(argv)
    if args.side == "inseq":
        return inseq_side(args)
    subprocess.run([args.inseq_python, __file__, "--side", "inseq", "--threads", str(args.threads), "--prompts",
                    str(args.prompts), "--new-tokens", str(args.new_tokens), "--out", args.out, "--methods",
                    args.methods] + (["--next-token"] if args.next_token else []), check=True)
    theirs = json.loads(Path(args.out).read_text())
    ours = attrscope_side(args)
    print(f"{args.prompts} prompts, {args.threads} thread(s), tiny Llama; seconds wall / CPU, speed-up on each")
    print(f"{'case':11} {'inseq':22} {'wall':>7} {'CPU':>7} {'attrscope':10} {'wall':>7} {'CPU':>7} "
          f"{'x wall':>7} {'x CPU':>7}")
    cases = [("generate", "seconds", "cpu_seconds")]
    if args.next_token:
        cases.append(("next-token", "next_token_seconds", "next_token_cpu_seconds"))
    for task, wall_key, cpu_key in cases:
        label = f"{args.new_tokens} steps" if task == "generate" else "next token"
        for theirs_name in methods_of(args):
            ours_name = INSEQ_METHODS[theirs_name]
            tw, tc = theirs[wall_key][theirs_name], theirs[cpu_key][theirs_name]
            ow, oc = ours[task, ours_name]
            print(f"{label:11} {theirs_name:22} {tw:7.2f} {tc:7.2f} {ours_name:10} {ow:7.2f} {oc:7.2f} "
                  f"{tw / ow:6.2f}x {tc / oc:6.2f}x")


if __name__ == "__main__":
    main()
