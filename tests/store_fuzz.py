"""Damage a store on purpose and read every copy completely: each must end in StoreError or in exactly the numbers
of the original, never hang, never crash the interpreter, never raise anything else.

Used by tests/test_store_fuzz.py (a seeded sample inside the suite) and benchmarks/fuzz_store.py (the counts for a
report). Copies are read by a long-lived worker process, one copy at a time with a time limit, so a hang or a crash
is observed and counted instead of stopping the run.
"""

from __future__ import annotations

import os
import pickle
import select
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
KINDS = ("flip", "truncate", "zero")


def read_everything(path: str):
    """Everything the reader API can give of a store, as plain values (for an exact comparison)."""
    from store import open_store

    out = {}
    with open_store(path) as s:
        out["header"] = (s.n_layers, s.n_heads, s.num_labels, s.labels, s.methods, s.complete, s.summary,
                         s.config, sorted((k, str(v)) for k, v in s.model_info.items()), len(s), s.has_evidence,
                         s.task)
        out["index"] = s.index.tobytes()
        out["ids"] = s.ids()
        examples = []
        for ex in s:
            e = [ex.id, ex.text, ex.pair, ex.tokens, ex.token_ids.tolist(), ex.spans.tolist(), ex.segment.tolist(),
                 ex.label, ex.pred, ex.probs.tolist(), ex.target, ex.explain_pos, ex.truncated, ex.n_orig_tokens,
                 None if ex.evidence is None else ex.evidence.tolist(), repr(sorted(ex.task_info.items()))]
            for m in s.methods:
                e.append((m, ex.scores(m).tobytes()))
                for arr in (ex.layer_scores(m), ex.matrices(m), ex.class_scores(m)):
                    e.append(None if arr is None else arr.tobytes())
                e.append(sorted(ex.example_values(m).items()))
            examples.append(e)
        out["examples"] = examples
        out["methods"] = [(m, s.method_info(m)) for m in s.methods]
        scales = {}
        for m in s.methods:
            st = s.scale_stats(m)
            scales[m] = None if st is None else {k: (v.count, v.min, v.max, v.max_abs, v.hist.tolist())
                                                 for k, v in st.items()}
        out["scales"] = scales
        masks = {}
        for name in s.head_masks:
            hm = s.head_mask(name)
            masks[name] = (np.asarray(hm).tolist(), hm.attrs, {k: np.asarray(v).tolist() for k, v in hm.stats.items()})
        out["head_masks"] = masks
        metrics = {}
        for m in s.metric_methods:
            for name in s.metric_names(m):
                info = s.metric_info(m, name)
                metrics[(m, name)] = (s.metric_values(m, name).tobytes(), info["settings"], info["summary"],
                                      info["higher_is_better"], info["description"],
                                      None if info["curves"] is None else info["curves"].tobytes(),
                                      None if info["levels"] is None else info["levels"].tobytes())
        out["metrics"] = metrics
    return out


def mutate(data: bytes, kind: str, rng: np.random.Generator) -> bytes:
    """One damaged copy: a few flipped bytes, a truncation, or a zeroed block."""
    b = bytearray(data)
    if kind == "flip":
        for _ in range(int(rng.integers(1, 5))):
            i = int(rng.integers(0, len(b)))
            b[i] ^= int(rng.integers(1, 256))
        return bytes(b)
    if kind == "truncate":
        return bytes(b[: int(rng.integers(0, len(b)))])
    size = int(rng.integers(64, 8193))
    start = int(rng.integers(0, max(1, len(b) - 64)))
    b[start:start + size] = bytes(min(size, len(b) - start))
    return bytes(b)


_WORKER = r"""
import pickle, sys, traceback
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from store import StoreError
from store_fuzz import read_everything
expected = pickle.load(open(sys.argv[3], "rb"))
print("ready", flush=True)
for line in sys.stdin:
    path = line.rstrip("\n")
    try:
        got = read_everything(path)
        verdict = "identical" if got == expected else "wrong"
    except StoreError as err:
        verdict = "error" if "\n" not in str(err) else "error-multiline"
    except BaseException as err:
        verdict = "raw:" + type(err).__name__ + ":" + " ".join(str(err).split())[:120]
    print(verdict, flush=True)
"""


class Reader:
    """A worker process that reads copies on request; restarted after a hang or a crash."""

    def __init__(self, expected_pickle: str, workdir: str):
        self.args = [sys.executable, "-c", _WORKER, str(REPO), str(HERE), expected_pickle]
        self.workdir = workdir
        self.p = None
        self._start()

    def _start(self):
        self.p = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True, cwd=self.workdir)
        if self._line(60) != "ready":
            raise RuntimeError("the fuzz reader did not start")

    def _line(self, timeout: float) -> str | None:
        ready, _, _ = select.select([self.p.stdout], [], [], timeout)
        if not ready:
            return None
        return self.p.stdout.readline().strip()

    def read(self, path: str, timeout: float) -> tuple[str, float]:
        t0 = time.monotonic()
        self.p.stdin.write(path + "\n")
        self.p.stdin.flush()
        line = self._line(timeout)
        took = time.monotonic() - t0
        if line is None:
            self.p.kill()
            self.p.wait()
            self._start()
            return "hang", took
        if line == "":  # the worker died: the interpreter crashed
            self.p.wait()
            self._start()
            return "crash", took
        return line, took

    def close(self):
        if self.p and self.p.poll() is None:
            self.p.stdin.close()
            self.p.wait(timeout=30)


def fuzz(store_path: str, copies: int, seed: int, workdir: str, timeout: float = 5.0) -> dict:
    """Read ``copies`` damaged copies of ``store_path``. Returns counts per verdict, the slowest read and examples."""
    expected = read_everything(store_path)
    workdir = os.path.abspath(workdir)
    pick = os.path.join(workdir, "expected.pickle")
    with open(pick, "wb") as fh:
        pickle.dump(expected, fh)
    data = Path(store_path).read_bytes()
    rng = np.random.default_rng(seed)
    reader = Reader(pick, workdir)
    counts, slowest, notes = Counter(), 0.0, {}
    copy = os.path.join(workdir, "damaged.h5")
    try:
        for i in range(copies):
            kind = KINDS[i % len(KINDS)]
            Path(copy).write_bytes(mutate(data, kind, rng))
            verdict, took = reader.read(copy, timeout)
            key = verdict.split(":")[0]
            counts[key] += 1
            slowest = max(slowest, took)
            notes.setdefault(key, f"copy {i} ({kind}): {verdict}")
    finally:
        reader.close()
    return {"counts": dict(counts), "slowest_s": slowest, "notes": notes}


def make_target(path: str, n_examples: int = 12, complete: bool = True) -> None:
    """The store the fuzz damages: three method layouts (full and cls matrices, class scores, per-example values),
    evidence flags, a head mask and a metric with curves, unicode and pair texts (tests/test_store.py's examples).
    ``complete=False`` leaves it as a killed writer does: open for write, no scale statistics."""
    from store import HeadMaskData, MetricData, add_metrics
    from test_store import create, example

    w = create(Path(path), evidence=True,
               head_masks=[HeadMaskData("positional", np.eye(3, 4, dtype=np.uint8),
                                        {"freq_max": np.linspace(0, 1, 12).reshape(3, 4), "n": np.int64(7)},
                                        {"threshold": 0.8})])
    exs = [example(i) for i in range(n_examples)]
    for i, e in enumerate(exs):
        e.evidence = np.arange(len(e.token_ids)) % 3 == i % 3
    half = n_examples // 2
    w.append(exs[:half])
    w.append(exs[half:])
    if not complete:
        w._f.flush()
        w._f.id.close()  # leaves the superblock's open-for-write flags set, as a SIGKILL does
        return
    w.close(complete=True, summary={"examples": n_examples})
    N = n_examples
    add_metrics(path, [MetricData("rollout", "aopc@attcat", np.linspace(-0.5, 0.5, N), {"levels": "ninths"},
                                  {"mean": 0.0, "n": N}, True, "aopc", np.arange(N * 3, dtype=float).reshape(N, 3) / 30,
                                  np.tile(np.arange(3), (N, 1)))])
