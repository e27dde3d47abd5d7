"""Issue 26's measurements on one GPU, in one run of a few minutes (benchmarks/gpu_check.sh calls this).

Needs nothing outside the project but a folder ASSETS with a BERT-base-uncased-vocabulary tokenizer (the shared
MiniLM's files: vocab.txt, tokenizer.json, tokenizer_config.json, special_tokens_map.json) in ASSETS/tokenizer and
SST-2 dev in ASSETS/dev.tsv. The model is a seeded random BERT-base classifier built here (12 layers, hidden 768,
12 heads), saved with that tokenizer so attr-compute can load it. Each step runs under its own time limit; a step
that fails is reported and the next one runs. Everything is written to OUT: one log per step and summary.md (the
tables, last).

    python benchmarks/gpu_check.py ASSETS OUT                # on a GPU machine
    python benchmarks/gpu_check.py ASSETS OUT --dry-run      # here: CPU, a 2-layer model, a few examples

Steps:
  1. method/forward ratios (benchmarks/bench_methods.py) at n = 128, batch 64 (Value Zeroing and DecompX on 16
     examples, batch 16) and at n = 512, batch 8;
  2. end to end on SST-2 dev (872 sentences), --methods all but integrated gradients and mask_lrp (whose head
     statistics need a parser), float32, bfloat16 and float16: wall seconds and the run's own split (forward,
     methods);
  3. the half-precision runs against the float32 run, per method (max |diff| / max |float32|, mean and min
     Spearman);
  4. --batch-size auto on the same run: the probe's seconds and the size it chose;
  5. GPU against CPU float32 on 48 dev sentences, every method but integrated gradients and mask_lrp;
  6. a batch that runs out of memory (torch.cuda.set_per_process_memory_fraction) halved and retried: the same
     numbers as a run that fits;
  7. the Triton kernels against their torch paths (benchmarks/kernel_*.py), when the scripts and Triton are there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

EXCLUDED = ("ig_l2", "ig_mean", "mask_lrp")  # IG: its own, m-fold cost; mask_lrp: its head statistics need a parser
HEAVY = ("value_zeroing", "decompx", "decompx_nohead")  # about n forwards each: timed on fewer examples


def methods(exclude=()) -> str:
    from compute.methods import REGISTRY

    return ",".join(m for m in REGISTRY if m not in EXCLUDED and m not in exclude)


class Check:
    def __init__(self, assets: Path, out: Path, dry: bool):
        self.assets, self.out, self.dry = assets, out, dry
        self.work = Path(os.environ.get("GPU_CHECK_WORK", "/tmp/gpu_check"))
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        out.mkdir(parents=True, exist_ok=True)
        self.device = "cpu" if dry else "cuda"
        self.summary: list[str] = []
        self.env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                    "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}

    # --- running ------------------------------------------------------------------------------------------------
    def run(self, name: str, argv: list[str], limit: float) -> tuple[bool, str, float]:
        """Run ``argv`` under ``limit`` seconds, its output in OUT/name.log; (finished with 0, output, seconds)."""
        t0 = time.perf_counter()
        try:
            p = subprocess.run(argv, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=limit)
            ok, text = p.returncode == 0, p.stdout + p.stderr
        except subprocess.TimeoutExpired as err:
            ok, text = False, f"{err.stdout or ''}{err.stderr or ''}\nTIMED OUT after {limit} s"
        seconds = time.perf_counter() - t0
        (self.out / f"{name}.log").write_text(f"$ {' '.join(argv)}\n{text}\n[{seconds:.1f} s, ok={ok}]\n")
        print(f"[{name}] {'ok' if ok else 'FAILED'} in {seconds:.1f} s", flush=True)
        return ok, text, seconds

    def compute(self, name: str, args: list[str], limit: float) -> tuple[bool, dict, float]:
        """attr-compute run ... --summary-json: (ok, the run's summary, seconds of the whole process)."""
        code = "import sys; sys.argv = ['attr-compute', *sys.argv[1:]]; from compute.cli import main; main()"
        ok, text, seconds = self.run(name, [sys.executable, "-c", code, "run", *args], limit)
        return ok, (read_store(args[args.index("-o") + 1])[0] if ok else {}), seconds

    def note(self, text: str) -> None:
        self.summary.append(text)
        (self.out / "summary.md").write_text("\n".join(self.summary) + "\n")

    # --- the steps ---------------------------------------------------------------------------------------------
    def environment(self) -> None:
        import torch

        lines = [f"torch {torch.__version__}, Python {sys.version.split()[0]}"]
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            lines.append(f"GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs")
        try:
            import triton

            lines.append(f"triton {triton.__version__}")
        except ImportError:
            lines.append("triton: not installed (the torch paths run)")
        import transformers

        lines.append(f"transformers {transformers.__version__}")
        self.note("# GPU check\n\n" + "\n".join(f"- {x}" for x in lines) + "\n")

    def model(self) -> Path:
        """The random BERT-base classifier (seed 0) with the assets' tokenizer, saved for attr-compute."""
        import torch
        from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

        torch.manual_seed(0)
        size = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128) if self.dry \
            else {}
        model = BertForSequenceClassification(BertConfig(num_labels=2, **size))
        path = self.work / "model"
        model.save_pretrained(path)
        AutoTokenizer.from_pretrained(self.assets / "tokenizer").save_pretrained(path)
        return path

    def ratios(self, model: Path) -> None:
        bench = [sys.executable, "benchmarks/bench_methods.py", "--device", self.device, "--ig-steps", "16"]
        if self.dry:  # the small model on a few dev sentences (--random-base builds a BERT-base)
            bench += ["--model", str(model), "--data", str(self.assets / "dev.tsv")]
        sizes = {128: ["--random-base", "128", "--batch-size", "64", "--limit", "512", "--repeat", "3"],
                 "heavy": ["--random-base", "128", "--batch-size", "16", "--limit", "16", "--repeat", "2"],
                 512: ["--random-base", "512", "--batch-size", "8", "--limit", "32", "--repeat", "2"]}
        if self.dry:
            sizes = {k: ["--limit", "8", "--batch-size", "4", "--repeat", "1"] for k in sizes}
        runs = [("ratios_128", sizes[128] + ["--methods", methods(exclude=HEAVY) + ",ig_l2,mask_lrp"], 150),
                ("ratios_128_heavy", sizes["heavy"] + ["--methods", ",".join(HEAVY)], 120),
                ("ratios_512", sizes[512] + ["--methods", methods(exclude=HEAVY)], 120)]
        for name, args, limit in runs:
            ok, text, _ = self.run(name, bench + args, limit)
            self.note(f"## {name} (benchmarks/bench_methods.py {' '.join(args)})\n\n```\n{_tail(text, 48)}\n```\n")

    def end_to_end(self, model: Path) -> dict:
        data = str(self.assets / "dev.tsv")
        limit = ["--limit", "16"] if self.dry else []
        stores = {}
        rows = []
        for dtype in ("float32", "bfloat16", "float16"):
            store = str(self.work / f"e2e_{dtype}.h5")
            ok, info, seconds = self.compute(f"e2e_{dtype}", [
                data, "--model", str(model), "--methods", methods(), "--batch-size", "128", "--device", self.device,
                "--dtype", dtype, "-o", store, "--overwrite", *limit], 240)
            stores[dtype] = store if ok else None
            if ok:
                rows.append(f"| {dtype} | {seconds:.1f} | {info.get('wall_seconds')} | {info.get('forward_seconds')} "
                            f"| {sum(info.get('method_seconds', {}).values()):.2f} | {info.get('examples')} |")
        self.note("## End to end, SST-2 dev, --methods " + methods() + ", --batch-size 128\n\n"
                  "| dtype | process s | run wall s | forward s | methods s | examples |\n|---|---|---|---|---|---|\n"
                  + "\n".join(rows) + "\n")
        return stores

    def agreement(self, title: str, ref: str | None, other: str | None) -> None:
        if ref is None or other is None:
            self.note(f"## {title}\n\nnot run (a store is missing)\n")
            return
        rows = compare_stores(ref, other)
        self.note(f"## {title}\n\n| method | max abs diff / max abs ref | mean Spearman | min Spearman |\n"
                  "|---|---|---|---|\n" + "\n".join(
                      f"| {m} | {r:.2e} | {mean:.6f} | {low:.6f} |" for m, r, mean, low in rows) + "\n")

    def auto_batch(self, model: Path) -> None:
        limit = ["--limit", "16"] if self.dry else []
        ok, info, seconds = self.compute("auto_batch", [
            str(self.assets / "dev.tsv"), "--model", str(model), "--methods", methods(), "--batch-size", "auto",
            "--device", self.device, "-o", str(self.work / "auto.h5"), "--overwrite", *limit], 240)
        how = json.dumps(read_store(self.work / "auto.h5")[1].get("batch_size", {})) if ok else "(failed)"
        self.note(f"## --batch-size auto\n\nprocess {seconds:.1f} s, run {info.get('wall_seconds')} s; "
                  f"batch size: {how}\n")

    def cpu_against_gpu(self, model: Path) -> None:
        stores = {}
        for device in ("cpu", self.device):
            store = str(self.work / f"agree_{device}.h5")
            ok, _, _ = self.compute(f"agree_{device}", [
                str(self.assets / "dev.tsv"), "--model", str(model), "--methods", methods(), "--batch-size", "16",
                "--device", device, "-o", store, "--overwrite", "--limit", "8" if self.dry else "48"], 240)
            stores[device] = store if ok else None
        self.agreement(f"{self.device} against CPU, float32, first 48 SST-2 dev sentences", stores["cpu"],
                       stores[self.device])

    def out_of_memory(self, model: Path) -> None:
        """value_zeroing at a batch that does not fit a capped allocator: halved and retried, the same numbers."""
        data, limit = str(self.assets / "dev.tsv"), "16" if self.dry else "64"
        args = [data, "--model", str(model), "--methods", "value_zeroing,alti", "--device", self.device,
                "--limit", limit]
        ok, _, _ = self.compute("oom_reference", [*args, "--batch-size", "8", "-o", str(self.work / "fits.h5"),
                                                  "--overwrite"], 180)
        code = ("import sys, torch; torch.cuda.set_per_process_memory_fraction(float(sys.argv[1])) "
                "if torch.cuda.is_available() else None; sys.argv = ['attr-compute', *sys.argv[2:]]; "
                "from compute.cli import main; main()")
        fraction = "0.5" if self.dry else "0.02"
        ok2, text, seconds = self.run("oom_halved", [sys.executable, "-c", code, fraction, "run", *args,
                                                     "--batch-size", limit, "-o", str(self.work / "halved.h5"),
                                                     "--overwrite"], 180)
        halvings = [line for line in text.splitlines() if "out of memory on a batch" in line]
        self.note(f"## Out of memory: --batch-size {limit} under set_per_process_memory_fraction({fraction})\n\n"
                  f"finished: {ok2}, {seconds:.1f} s; halvings: {len(halvings)}"
                  + (f" (first: {halvings[0].strip()})" if halvings else "") + "\n")
        if ok and ok2:
            self.agreement("halved run against a run that fits", str(self.work / "fits.h5"),
                           str(self.work / "halved.h5"))

    def kernels(self) -> None:
        for script in ("kernel_alti_l1.py", "kernel_shares.py"):
            if (REPO / "benchmarks" / script).exists():
                ok, text, _ = self.run(script[:-3], [sys.executable, f"benchmarks/{script}"], 120)
                self.note(f"## benchmarks/{script}\n\n```\n{_tail(text, 30)}\n```\n")


def read_store(path) -> tuple[dict, dict]:
    """(the run's summary, its provenance config) of a finished store."""
    from store import open_store

    with open_store(str(path)) as s:
        return dict(s.summary or {}), dict(s.config or {})


def compare_stores(ref_path: str, other_path: str) -> list[tuple[str, float, float, float]]:
    """Per method: max |diff| of the final scores and layer views over max |ref|, and the mean and minimum
    per-example Spearman of the final scores (the explained token left out)."""
    from scipy.stats import spearmanr

    from store import open_store

    rows = []
    with open_store(ref_path) as ref, open_store(other_path) as other:
        for m in ref.methods:
            if m not in other.methods:
                continue
            diff = scale = 0.0
            rhos = []
            for i in range(min(len(ref), len(other))):
                a, b = ref[i], other[i]
                for get in ("scores", "layer_scores"):
                    x, y = getattr(a, get)(m), getattr(b, get)(m)
                    if x is None or y is None:
                        continue
                    diff = max(diff, float(np.abs(np.asarray(x, np.float64) - y).max()))
                    scale = max(scale, float(np.abs(x).max()))
                x, y = np.asarray(a.scores(m), np.float64), np.asarray(b.scores(m), np.float64)
                keep = np.arange(len(x)) != a.explain_pos
                if keep.sum() > 1 and np.ptp(x[keep]) > 0 and np.ptp(y[keep]) > 0:
                    rhos.append(spearmanr(x[keep], y[keep]).statistic)
            rows.append((m, diff / scale if scale else 0.0, float(np.mean(rhos)) if rhos else float("nan"),
                         float(np.min(rhos)) if rhos else float("nan")))
    return rows


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("assets", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--dry-run", action="store_true", help="CPU, a 2-layer model, a few examples")
    args = ap.parse_args()
    check = Check(args.assets, args.out, args.dry_run)
    t0 = time.perf_counter()
    check.environment()
    model = check.model()
    check.ratios(model)
    stores = check.end_to_end(model)
    for half in ("bfloat16", "float16"):
        check.agreement(f"{half} against float32, SST-2 dev", stores.get("float32"), stores.get(half))
    check.auto_batch(model)
    check.cpu_against_gpu(model)
    check.out_of_memory(model)
    check.kernels()
    check.note(f"total {time.perf_counter() - t0:.0f} s")
    print((args.out / "summary.md").read_text())


if __name__ == "__main__":
    main()
