"""DecompX's cost beside its authors' code (mohsenfayyaz/DecompX), measured in one run, one thread, on mixed lengths.

    python benchmarks/decompx_reference_cost.py --ref-src DIR   # DIR: a checkout of mohsenfayyaz/DecompX

The data: the first --short SST-2 train sentences (8 words or more) and --long inputs of --join consecutive
sentences after them, one long input among every few short ones. The authors' code runs one input at a time with
the demo's configuration (benchmarks/successors_reference.py: biases "absdot", LN1, FFN "GeLU_ZO", LN2, classifier
with pooler, every layer's output). attrscope runs `attr-compute run --methods decompx` at its default settings
(length buckets, batches of 32), in process, the model loaded beforehand as the authors' is. Each is timed
--repeat times, alternating; the table gives the medians of the process's CPU seconds (time.process_time: on a
machine shared with other work the wall time measures the others' load too) and of the wall time, and their ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
SHARED = REPO.parent / "shared"

from successors_reference import reference_decompx_model  # noqa: E402


def mixed_texts(short: int, long: int, join: int) -> list[str]:
    rows = [line.split("\t")[0].strip() for line in
            (SHARED / "data" / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    sentences = [t for t in rows if len(t.split()) >= 8]
    texts = sentences[:short]
    rest = sentences[short:]
    every = max(1, short // max(long, 1))
    for k in range(long):  # one long input among every `every` short ones
        texts.insert(k * (every + 1) + every // 2, " ".join(rest[k * join:(k + 1) * join]))
    return texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref-src", type=Path, required=True, help="a checkout of mohsenfayyaz/DecompX")
    ap.add_argument("--model", type=Path, default=SHARED / "models" / "minilm-sst2")
    ap.add_argument("--short", type=int, default=30)
    ap.add_argument("--long", type=int, default=6)
    ap.add_argument("--join", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    from compute.runner import RunConfig, run

    texts = mixed_texts(args.short, args.long, args.join)
    tok = AutoTokenizer.from_pretrained(args.model)
    lengths = sorted(len(tok(t)["input_ids"]) for t in texts)
    print(f"{len(texts)} inputs, tokens {lengths[0]}-{lengths[-1]} (median {lengths[len(lengths) // 2]})")
    ref_model, config = reference_decompx_model(args.ref_src, args.model)
    tmp = Path(tempfile.mkdtemp())
    data = tmp / "mixed.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"{t}\t0\n" for t in texts), encoding="utf-8")

    def authors():
        with torch.no_grad():
            for t in texts:
                ref_model(**tok(t, return_tensors="pt"), return_dict=False, output_hidden_states=True,
                          output_attentions=False, decompx_config=config)

    def attrscope(k=[0]):
        k[0] += 1
        run(RunConfig(dataset=str(data), model=str(args.model), methods="decompx", output=str(tmp / f"{k[0]}.h5")))

    attrscope()  # the model's files read once (page cache), as the authors' model already is
    names = ("authors' DecompX (batch 1)", "attrscope decompx (defaults)")
    cpu, wall = {k: [] for k in names}, {k: [] for k in names}
    for _ in range(args.repeat):
        for name, fn in zip(names, (authors, attrscope)):
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            cpu[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - t0)
    print("| code | CPU seconds | wall seconds |\n|---|---|---|")
    for k in names:
        print(f"| {k} | {statistics.median(cpu[k]):.2f} | {statistics.median(wall[k]):.2f} |")
    ratio = [statistics.median(t[names[0]]) / statistics.median(t[names[1]]) for t in (cpu, wall)]
    print(f"attrscope is {ratio[0]:.2f}x faster than the authors' code in CPU time ({ratio[1]:.2f}x in wall time)")


if __name__ == "__main__":
    main()
