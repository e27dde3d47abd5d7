"""Padding waste of the run's batching (issue 26 item 7): real vs padded sums of n and n^2 of a dataset.

Tokenises the dataset as ``attr-compute`` does (the shared model's tokenizer) and cuts it into batches as the run does
(compute.run.batches: windows of --batch-size x 8 rows, a token budget, length buckets for the run's largest
``Method.cost_exponent``: 2 for a run with value_zeroing, decompx, decompx_nohead or the ALTI family, as the default
--methods all; 1 for a run of linear methods only). Prints, for each cut, the sum of n (what the forward pass and the
linear methods pay) and of n^2 (what the quadratic methods pay), real and padded (every example counted at its
batch's longest), beside the cut before this work (windows sorted by length into batches of --batch-size, no budget,
no buckets).

``--mixed FILE`` writes the issue's mixed set first (60 SST-2 train sentences and 10 examples of about 150-170 tokens,
each made of consecutive train sentences, spread among them) and measures it. ``--time`` also runs attr-compute on the
dataset at the default batching and at --batch-size 1 (``--reps`` alternating rounds, each its own process, the
CPU's threads as given) and prints each method's seconds (the summary's method_seconds, the median) and their ratio.

    python benchmarks/padding.py --data ../shared/data/sst2/dev.tsv
    python benchmarks/padding.py --mixed /tmp/mixed.tsv --time --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
SHARED = HERE.parent / "shared"
sys.path.insert(0, str(HERE))


def make_mixed(path: str, tokenizer, train: Path) -> None:
    """60 sentences (8 words or more) from the end of SST-2 train and 10 joined ones of 150-170 tokens."""
    rows = [line.split("\t") for line in train.read_text(encoding="utf-8").splitlines()[1:]]
    sentences = [(text.strip(), label) for text, label in rows[-6000:] if len(text.split()) >= 8]
    short, rest = sentences[:60], iter(sentences[60:])
    long, parts = [], []
    while len(long) < 10:
        parts.append(next(rest))
        text = " ".join(t for t, _ in parts)
        n = len(tokenizer(text)["input_ids"])
        if n >= 150:
            if n <= 170:
                long.append((text, parts[-1][1]))
            parts = []
    mixed = list(short)
    for k, row in enumerate(long):  # one long example among every seven
        mixed.insert(7 * k + 3, row)
    with open(path, "w", encoding="utf-8") as f:
        f.write("sentence\tlabel\n" + "".join(f"{t}\t{label}\n" for t, label in mixed))


def old_batches(lengths: list[int], batch_size: int, window: int) -> list[list[int]]:
    """The cut before issue 26: each window of batch_size x window rows sorted by length into batches of batch_size."""
    out = []
    for w0 in range(0, len(lengths), batch_size * window):
        idx = sorted(range(w0, min(w0 + batch_size * window, len(lengths))), key=lambda i: -lengths[i])
        out += [idx[b:b + batch_size] for b in range(0, len(idx), batch_size)]
    return out


def new_batches(lengths: list[int], batch_size: int, window: int, tokens: int, exponent: int) -> list[list[int]]:
    from compute.run.batches import batches

    out = []
    for w0 in range(0, len(lengths), batch_size * window):
        rows = lengths[w0:w0 + batch_size * window]
        out += [[w0 + i for i in b] for b in batches(rows, batch_size, tokens, exponent)]
    return out


def sums(lengths: list[int], groups: list[list[int]], e: int) -> tuple[int, int]:
    return (sum(lengths[i] ** e for g in groups for i in g),
            sum(len(g) * max(lengths[i] for i in g) ** e for g in groups))


def time_methods(data: str, model: str, reps: int, threads: int, methods: str) -> dict:
    child = ("import json, sys, torch; torch.set_num_threads(int(sys.argv[1])); "
             "from compute.runner import RunConfig, run; "
             "print(json.dumps(run(RunConfig(**json.loads(sys.argv[2])))['method_seconds']))")
    runs: dict[str, list[dict]] = {"default": [], "batch 1": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(reps):
            for name, extra in (("default", {}), ("batch 1", {"batch_size": 1})):
                cfg = {"dataset": data, "model": model, "methods": methods, "device": "cpu", "overwrite": True,
                       "output": os.path.join(tmp, "o.h5"), **extra}
                p = subprocess.run([sys.executable, "-c", child, str(threads), json.dumps(cfg)], capture_output=True,
                                   text=True, env={**os.environ, "PYTHONPATH": str(HERE)})
                if p.returncode:
                    sys.exit(p.stderr[-3000:])
                runs[name].append(json.loads(p.stdout.strip().splitlines()[-1]))
    return {m: {k: statistics.median(r[m] for r in v) for k, v in runs.items()} for m in runs["default"][0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(SHARED / "data" / "sst2" / "dev.tsv"))
    ap.add_argument("--mixed", metavar="FILE", help="write the mixed set here and measure it (instead of --data)")
    ap.add_argument("--model", default=str(SHARED / "models" / "minilm-sst2"))
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--batch-tokens", type=int)
    ap.add_argument("--time", action="store_true", help="time every method at the default batching and at batch 1")
    ap.add_argument("--methods", default="all")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    from transformers import AutoTokenizer

    from compute.data import load_dataset
    from compute.options import DEFAULT_BATCH_TOKENS

    tokenizer = AutoTokenizer.from_pretrained(a.model)
    data = a.data
    if a.mixed:
        make_mixed(a.mixed, tokenizer, SHARED / "data" / "sst2" / "train.tsv")
        data = a.mixed
    records = load_dataset(data).records
    lengths = [len(x) for x in tokenizer([r.text for r in records], truncation=True, max_length=512)["input_ids"]]
    tokens = a.batch_tokens or DEFAULT_BATCH_TOKENS
    window = 8
    print(f"{data}: {len(lengths)} examples of {min(lengths)}-{max(lengths)} tokens; --batch-size {a.batch_size}, "
          f"--batch-tokens {tokens}, windows of {a.batch_size * window} rows")
    old = old_batches(lengths, a.batch_size, window)
    print(f"{'cut':<44} {'groups':>6} {'sum n':>9} {'padded':>9} {'ratio':>6} {'sum n^2':>11} {'padded':>11} "
          f"{'ratio':>6}")
    for label, groups in (("before: sorted batches of --batch-size", old),
                          ("now, a run with n^2 methods (--methods all)", new_batches(lengths, a.batch_size, window,
                                                                                       tokens, 2)),
                          ("now, a run of linear methods only", new_batches(lengths, a.batch_size, window, tokens, 1))):
        (r1, p1), (r2, p2) = sums(lengths, groups, 1), sums(lengths, groups, 2)
        print(f"{label:<44} {len(groups):>6} {r1:>9} {p1:>9} {p1 / r1:>6.3f} {r2:>11} {p2:>11} {p2 / r2:>6.3f}")
    if a.time:
        print(f"\nseconds per method (median of {a.reps}, {a.threads} threads): default batching vs --batch-size 1")
        for m, t in time_methods(data, a.model, a.reps, a.threads, a.methods).items():
            print(f"  {m:<16} {t['default']:8.2f} {t['batch 1']:8.2f}  {t['default'] / max(t['batch 1'], 1e-9):6.2f}x")


if __name__ == "__main__":
    main()
