"""Damaged stores through every consumer, and faults while a store or an export is written (issue 29).

Consumers of a damaged copy (seeded flips, truncations, zeroed blocks: tests/store_fuzz.mutate):

    read     the reader API, everything (tests/store_fuzz.read_everything)
    eval     attr-compute eval COPY --metrics sufficiency
    resume   attr-compute DATA ... -o COPY --resume (the copy is of an interrupted store)
    export   attr-compute export COPY -o OUT.csv --metrics
    report   attr-compute report COPY
    tui      attr-tui COPY, the app driven headless (j j End f Esc x Esc) when it opens

each in a long-lived worker process that runs the commands in process (click's CliRunner) with a time limit, so
a hang or a crash is counted, not suffered. Verdicts: clean (one line, exit 1 or 2), internal ("internal error"
line), traceback (a traceback, several lines, or a crash of the interpreter), hang (no answer within the limit),
equal / different (success, and the output compared with the same command's on the intact store), and for the
TUI notice (it opened and showed an error notification; "equal"/"different": it opened with none, and the copy
reads as the intact store / not).

Faults: SIGKILL of merge and export at a random moment of their writing (after their temporary file appears),
then the same command again; a full disk (a small tmpfs, where this machine lets us mount one) under export,
merge, eval and a run.

The code under test is the checkout given by --repo (default: this one): its compute/, store/, tui/ come first on
the path of every process started here.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import pickle
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
CONSUMERS = ("read", "eval", "resume", "export", "report", "tui")
VERDICTS = ("clean", "internal", "traceback", "hang", "equal", "different", "notice")
LIMITS = {"eval": 60.0, "resume": 60.0, "tui": 30.0}  # seconds before a call counts as a hang (others: 20)
METHODS = "rollout,norm"
SMALL_N, LARGE_N = 24, 240  # examples of the fuzzed target and of the faults' (larger) stores


# ------------------------------------------------------------------------------------------------------ building
def run_args(data: str, model: str, out: str, *extra: str) -> list[str]:
    """One attr-compute run of the benchmark (--batch-size 2: a window commits 16 examples)."""
    return [data, "--model", model, "--methods", METHODS, "--matrices", "all", "--batch-size", "2",
            "--metrics", "comprehensiveness", "--device", "cpu", "-q", "-o", out, *extra]


def cli(repo: str, args: list[str], timeout: float = 600.0, **popen) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compute.cli", *args], cwd=repo, capture_output=True, text=True,
                          timeout=timeout, env=_env(repo), **popen)


def _env(repo: str) -> dict:
    return {**os.environ, "PYTHONPATH": repo, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _write_data(path: Path, n: int, seed: int) -> str:
    sys.path.insert(0, str(TESTS))
    from conftest import WORDS

    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14)))
            f.write(json.dumps({"id": f"ex{i}", "text": words, "label": i % 2}) + "\n")
    return str(path)


_STOP_AFTER_FIRST_COMMIT = r"""
import sys
sys.path.insert(0, sys.argv[1])
import compute.interrupts as interrupts
from store.writer import StoreWriter
from compute.cli import main
committed = []
real_append, real_check = StoreWriter.append, interrupts.check
def append(w, *a, **k):
    out = real_append(w, *a, **k)
    committed.append(1)
    return out
def check():
    if committed:
        raise KeyboardInterrupt
    real_check()
StoreWriter.append, interrupts.check = append, check
main(sys.argv[2:])
"""


def build(work: Path, repo: str, log) -> dict:
    """The tiny model, the data, the fuzzed targets (complete; interrupted after its first window), the larger
    store and shards the faults use; each made by the checkout under test."""
    if (work / "paths.json").exists():  # built before (--work): the same targets for another checkout
        paths = json.loads((work / "paths.json").read_text())
        if all(os.path.exists(p) for p in (paths["complete"], paths["interrupted"], paths["big"], *paths["shards"])):
            log(f"reusing the targets in {work}")
            return paths
    sys.path.insert(0, str(TESTS))
    from conftest import write_tiny_model_dir

    t0 = time.monotonic()
    model = str(write_tiny_model_dir(work / "model"))
    small = _write_data(work / "small.jsonl", SMALL_N, 1)
    large = _write_data(work / "large.jsonl", LARGE_N, 2)
    paths = {"model": model, "small": small, "large": large, "complete": str(work / "complete.h5"),
             "interrupted": str(work / "interrupted.h5"), "shards_out": str(work / "sh.h5"),
             "big": str(work / "big.h5")}
    for args in (run_args(small, model, paths["complete"]),
                 run_args(large, model, paths["shards_out"], "--shard", "0/2"),
                 run_args(large, model, paths["shards_out"], "--shard", "1/2")):
        done = cli(repo, args)
        if done.returncode:
            raise RuntimeError(f"building the targets failed: {done.stderr.strip()}")
    done = subprocess.run([sys.executable, "-c", _STOP_AFTER_FIRST_COMMIT, repo,
                           *run_args(small, model, paths["interrupted"])], cwd=repo, capture_output=True, text=True,
                          env=_env(repo))
    if done.returncode != 130:
        raise RuntimeError(f"the interrupted target was not made: {done.returncode} {done.stderr.strip()}")
    paths["shards"] = sorted(glob.glob(str(work / "sh.shard-*-of-2.h5")))
    done = cli(repo, ["merge", paths["big"], *paths["shards"], "-q"])
    if done.returncode:
        raise RuntimeError(f"merging the shards failed: {done.stderr.strip()}")
    (work / "paths.json").write_text(json.dumps(paths))
    log(f"built the targets in {time.monotonic() - t0:.0f} s: complete {os.path.getsize(paths['complete']):,} B, "
        f"interrupted {os.path.getsize(paths['interrupted']):,} B, merged {os.path.getsize(paths['big']):,} B")
    return paths


# ------------------------------------------------------------------------------------------------------- worker
def _digest(obj) -> str:
    return hashlib.sha256(pickle.dumps(obj)).hexdigest()


def _examples_digest(path: str) -> str:
    """What a resumed store holds (examples, methods; not the provenance, which names the command and the time)."""
    from store import open_store

    with open_store(path) as s:
        out = [len(s), s.complete, s.methods]
        for ex in s:
            out.append([ex.id, ex.text, ex.tokens, ex.token_ids.tobytes(), ex.label, ex.pred, ex.probs.tobytes()])
            for m in s.methods:
                out.append([None if a is None else a.tobytes()
                            for a in (ex.scores(m), ex.layer_scores(m), ex.matrices(m))])
    return _digest(out)


def _metrics_digest(path: str) -> str:
    from store import open_store

    with open_store(path) as s:
        return _digest(sorted((m, n, s.metric_values(m, n).tobytes(), json.dumps(s.metric_info(m, n)["summary"],
                                                                                  sort_keys=True, default=str))
                              for m in s.metric_methods for n in s.metric_names(m)))


def _cli_failure(res, prog: str) -> str | None:
    """The verdict of a CLI call that failed (None: it succeeded)."""
    if res.exit_code == 0:
        return None
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        return "traceback"
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    if "Traceback" in res.stderr or len(lines) != 1:
        return "traceback"
    if "internal error" in lines[0]:
        return "internal"
    return "clean" if lines[0].startswith(f"{prog}: error:") else "traceback"


class Consumers:
    """The consumers, run in this (worker) process; each returns (verdict-or-None, digest, detail)."""

    def __init__(self, paths: dict, work: Path):
        from click.testing import CliRunner

        self.paths, self.work, self.runner = paths, work, CliRunner()
        self.notes: list[str] = []
        self._patch_tui()

    def _patch_tui(self) -> None:
        import asyncio

        from tui.app import AttrApp

        notes = self.notes

        def headless(app, *a, **k):
            async def drive():
                async with app.run_test(size=(80, 24)) as pilot:
                    for key in ("j", "j", "end", "f", "escape", "x", "escape"):
                        await pilot.press(key)
                        await pilot.pause(0.05)
                    await pilot.pause(0.5)
                    notes[:] = [n.message for n in app._notifications if n.severity == "error"]
            asyncio.run(drive())

        AttrApp.run = headless

    def _compute(self, args) -> tuple[str | None, str]:
        from compute.cli import main

        res = self.runner.invoke(main, [str(a) for a in args], catch_exceptions=True)
        return _cli_failure(res, "attr-compute"), (res.stdout if res.exit_code == 0 else res.stderr.strip()[:200])

    def read(self, path: str):
        from store_fuzz import read_everything

        from store import StoreError

        try:
            return None, _digest(read_everything(path)), ""
        except StoreError as err:
            return ("clean" if "\n" not in str(err) else "traceback"), None, str(err)[:200]
        except Exception as err:  # noqa: BLE001 - counted
            return "traceback", None, f"{type(err).__name__}: {err}"[:200]

    def eval(self, path: str):
        bad, out = self._compute(["eval", path, "--metrics", "sufficiency", "--device", "cpu", "-q"])
        return (bad, None, out) if bad else (None, _metrics_digest(path), "")

    def resume(self, path: str):
        p = self.paths
        bad, out = self._compute(run_args(p["small"], p["model"], path, "--resume"))
        return (bad, None, out) if bad else (None, _examples_digest(path), "")

    def export(self, path: str):
        out = self.work / "export" / "x.csv"
        shutil.rmtree(out.parent, ignore_errors=True)
        out.parent.mkdir()
        bad, detail = self._compute(["export", path, "-o", out, "--metrics"])
        if bad:
            return bad, None, detail
        return None, _digest([f.read_bytes() for f in sorted(out.parent.iterdir())]), ""

    def report(self, path: str):
        bad, out = self._compute(["report", path])
        return (bad, None, out) if bad else (None, _digest(out), "")

    def tui(self, path: str):
        from tui.cli import main

        self.notes.clear()
        res = self.runner.invoke(main, [path], catch_exceptions=True)
        bad = _cli_failure(res, "attr-tui")
        if bad:
            return bad, None, res.stderr.strip()[:200]
        if self.notes:
            return "notice", None, self.notes[0][:200]
        return None, self.read(path)[1], ""  # opened silently: right only if the copy reads as the intact store


def worker(repo: str, work: str) -> None:
    """Answer {"consumer", "path", "baseline"} lines with {"verdict", "detail"} lines."""
    sys.path[:0] = [repo, str(TESTS)]
    os.environ.setdefault("TERM", "xterm-256color")
    work_p = Path(work)
    paths = json.loads((work_p / "paths.json").read_text())
    consumers = Consumers(paths, work_p)
    base_file = work_p / "baselines.json"
    baselines = json.loads(base_file.read_text()) if base_file.exists() else {}
    print("ready", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        name = req["consumer"]
        try:
            bad, digest, detail = getattr(consumers, name)(req["path"])
        except BaseException as err:  # noqa: BLE001 - a consumer that escapes its own handling
            bad, digest, detail = "traceback", None, f"{type(err).__name__}: {err}"[:200]
        if req.get("baseline"):
            if bad:
                verdict = f"baseline failed: {bad}: {detail}"
            else:
                baselines[name] = digest
                base_file.write_text(json.dumps(baselines))
                verdict = "equal"
        elif bad:
            verdict = bad
        else:
            verdict = "equal" if digest == baselines.get(name) else "different"
        print(json.dumps({"verdict": verdict, "detail": detail}), flush=True)


class Worker:
    def __init__(self, repo: str, work: Path):
        self.args = [sys.executable, str(Path(__file__).resolve()), "--worker", repo, str(work)]
        self.cwd = str(work)
        self.env = _env(repo)
        self.p = None
        self._start()

    def _start(self):
        self.p = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True, cwd=self.cwd, env=self.env)
        if self._line(180) != "ready":
            raise RuntimeError("the consumer worker did not start")

    def _line(self, timeout: float) -> str | None:
        ready, _, _ = select.select([self.p.stdout], [], [], timeout)
        return self.p.stdout.readline().strip() if ready else None

    def call(self, consumer: str, path: str, baseline: bool = False) -> tuple[str, str, float]:
        t0 = time.monotonic()
        self.p.stdin.write(json.dumps({"consumer": consumer, "path": path, "baseline": baseline}) + "\n")
        self.p.stdin.flush()
        line = self._line(LIMITS.get(consumer, 20.0))
        took = time.monotonic() - t0
        if line is None or line == "":
            verdict = "hang" if line is None else "traceback"  # no answer; or the interpreter died (a crash)
            self.p.kill()
            self.p.wait()
            self._start()
            return verdict, "no answer in time" if line is None else "the worker died", took
        got = json.loads(line)
        return got["verdict"], got["detail"], took

    def close(self):
        if self.p.poll() is None:
            self.p.stdin.close()
            self.p.wait(timeout=60)


def fuzz_consumers(paths: dict, work: Path, repo: str, copies: int, seed: int, consumers, log) -> dict:
    sys.path.insert(0, str(TESTS))
    from store_fuzz import KINDS, mutate

    (work / "baselines.json").unlink(missing_ok=True)  # another checkout's, when --work is reused
    copy = str(work / "damaged.h5")
    sources = {"complete": Path(paths["complete"]).read_bytes(), "interrupted": Path(paths["interrupted"]).read_bytes()}
    worker_ = Worker(repo, work)
    counts = {c: Counter() for c in consumers}
    notes: dict[str, dict[str, str]] = {c: {} for c in consumers}
    slowest = {c: 0.0 for c in consumers}
    try:
        for c in consumers:  # each consumer's output on the intact store, at the same path
            Path(copy).write_bytes(sources["interrupted" if c == "resume" else "complete"])
            verdict, detail, _ = worker_.call(c, copy, baseline=True)
            if verdict != "equal":
                raise RuntimeError(f"{c} on the intact store: {verdict} {detail}")
        rngs = {k: np.random.default_rng([seed, i]) for i, k in enumerate(sources)}
        t0 = time.monotonic()
        for i in range(copies):
            kind = KINDS[i % len(KINDS)]
            damaged = {k: mutate(data, kind, rngs[k]) for k, data in sources.items()}
            for c in consumers:
                Path(copy).write_bytes(damaged["interrupted" if c == "resume" else "complete"])
                verdict, detail, took = worker_.call(c, copy)
                counts[c][verdict] += 1
                slowest[c] = max(slowest[c], took)
                notes[c].setdefault(verdict, f"copy {i} ({kind}): {detail}")
            if (i + 1) % 10 == 0:
                log(f"{i + 1}/{copies} copies, {time.monotonic() - t0:.0f} s")
    finally:
        worker_.close()
    return {"counts": {c: dict(v) for c, v in counts.items()}, "notes": notes,
            "slowest_s": {c: round(v, 1) for c, v in slowest.items()}}


# ------------------------------------------------------------------------------------------------------- faults
def _kill_when(cmd: list[str], repo: str, appears, rng: random.Random, max_delay: float) -> tuple[bool, int]:
    """Start ``cmd``; once ``appears()`` is true, SIGKILL it after up to ``max_delay`` s. Returns (killed while
    running, return code)."""
    p = subprocess.Popen(cmd, cwd=repo, env=_env(repo), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while p.poll() is None and not appears() and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(rng.uniform(0, max_delay))
    running = p.poll() is None
    if running:
        p.send_signal(signal.SIGKILL)
    return running, p.wait()


def kill_trials(paths: dict, work: Path, repo: str, trials: int, seed: int, log) -> dict:
    """SIGKILL of merge and export while they write, then the same command again."""
    from store import StoreError

    rng = random.Random(seed)
    folder = work / "killed"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    expected = _examples_digest(paths["big"])
    out_csv = folder / "x.csv"
    done = cli(repo, ["export", paths["big"], "-o", str(out_csv), "--chunk-size", "4"])
    if done.returncode:
        raise RuntimeError(f"the intact export failed: {done.stderr.strip()}")
    expected_csv = out_csv.read_bytes()
    out_csv.unlink()
    rows = {}
    py = [sys.executable, "-m", "compute.cli"]
    merged = folder / "m.h5"
    merge_cmd = py + ["merge", str(merged), *paths["shards"], "-q"]
    export_cmd = py + ["export", paths["big"], "-o", str(out_csv), "--chunk-size", "4"]
    for fault, cmd, temps, target in (
            ("SIGKILL in merge", merge_cmd, lambda: glob.glob(str(folder / "m.h5.merging*")), merged),
            ("SIGKILL in export", export_cmd, lambda: glob.glob(str(folder / ".x.csv.*.part")), out_csv)):
        r = Counter()
        for _ in range(trials):
            for f in folder.iterdir():
                if f.name != ".keep" and not f.name.startswith("."):  # keep earlier trials' hidden leftovers
                    f.unlink()
            before = set(temps())  # hidden parts of earlier kills stay: the new one is waited for
            killed, _ = _kill_when(cmd, repo, lambda: bool(set(temps()) - before), rng, 0.3)
            r["trials"] += 1
            r["killed while writing"] += killed
            if target.exists():
                r["target left"] += 1
                try:
                    ok = (_examples_digest(str(target)) == expected if target.suffix == ".h5"
                          else target.read_bytes() == expected_csv)
                except StoreError:
                    ok = False
                r["target left, equal" if ok else "target left, damaged"] += 1
                target.unlink()
            r["temp files left after the kill (sum)"] += len(temps())
            again = subprocess.run(cmd, cwd=repo, env=_env(repo), capture_output=True, text=True, timeout=600)
            if again.returncode == 0:
                same = (_examples_digest(str(target)) == expected if target.suffix == ".h5"
                        else target.read_bytes() == expected_csv)
                r["rerun: exit 0, equal" if same else "rerun: exit 0, different"] += 1
            else:
                r["rerun: " + (_classify_rc(again, "attr-compute"))] += 1
            r["temp files left after the rerun (sum)"] += len(temps())
        rows[fault] = dict(r)
        log(f"{fault}: {dict(r)}")
    return rows


def _classify_rc(done: subprocess.CompletedProcess, prog: str) -> str:
    if done.returncode < 0 or done.returncode in (134, 139):
        return f"crash (signal {-done.returncode if done.returncode < 0 else done.returncode - 128})"
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    if done.returncode == 0:
        return "exit 0"
    if "Traceback" in done.stderr or len(lines) != 1:
        return f"traceback ({len(lines)} lines)"
    if "internal error" in lines[0]:
        return "internal"
    return "clean" if lines[0].startswith(f"{prog}: error:") else "traceback"


def full_disk(paths: dict, work: Path, repo: str, log) -> dict:
    """Export, merge, eval and a run onto a small tmpfs. Skipped (one row saying so) where mounting fails."""
    from store import StoreError, open_store

    mnt = work / "full"
    mnt.mkdir(exist_ok=True)
    size = 256 * 1024
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                      capture_output=True).returncode:
        return {"ENOSPC": {"skipped": "cannot mount a tmpfs here"}}
    rows = {}
    try:
        def fresh(room: int | None = None):
            """An empty disk, then filled but for ``room`` bytes (None: all of it free)."""
            for f in mnt.iterdir():
                f.unlink()
            if room is not None:
                with open(mnt / "filler", "wb") as fh:
                    fh.write(b"\0" * max(0, shutil.disk_usage(mnt).free - room))

        def call(name, args, room, check=None):
            fresh(room)
            t0 = time.monotonic()
            try:
                done = cli(repo, args, timeout=300)
                verdict = _classify_rc(done, "attr-compute")
                line = (done.stderr.strip().splitlines() or [""])[-1][:160]
            except subprocess.TimeoutExpired:
                verdict, line = "hang", ""
            row = {"verdict": verdict, "seconds": round(time.monotonic() - t0, 1), "last line": line,
                   "files left": sorted(f.name for f in mnt.iterdir() if f.name != "filler")}
            if check:
                row.update(check())
            rows[name] = row
            log(f"ENOSPC {name}: {row}")

        call("export", ["export", paths["big"], "-o", str(mnt / "x.csv")], 64 * 1024)
        call("merge", ["merge", str(mnt / "m.h5"), *paths["shards"], "-q"], 64 * 1024)

        def store_after():
            try:
                with open_store(str(mnt / "s.h5")) as s:
                    return {"store after": f"opens, {len(s)} examples, metrics {sorted(s.metric_methods)}"}
            except StoreError as err:
                return {"store after": f"refused: {str(err)[:120]}"}

        # eval of a store on a disk with a few KB left: its metrics do not fit
        fresh()
        shutil.copy(paths["complete"], mnt / "s.h5")
        try:  # fill the disk: the metrics' first write fails
            with open(mnt / "filler", "wb") as fh:
                fh.write(b"\0" * shutil.disk_usage(mnt).free)
        except OSError:
            pass
        t0 = time.monotonic()
        try:
            done = cli(repo, ["eval", str(mnt / "s.h5"), "--metrics", "sufficiency", "--device", "cpu", "-q"],
                       timeout=300)
            verdict, line = _classify_rc(done, "attr-compute"), (done.stderr.strip().splitlines() or [""])[-1][:160]
        except subprocess.TimeoutExpired:
            verdict, line = "hang", ""
        rows["eval"] = {"verdict": verdict, "seconds": round(time.monotonic() - t0, 1), "last line": line,
                        **store_after()}
        log(f"ENOSPC eval: {rows['eval']}")

        def run_after():
            try:
                with open_store(str(mnt / "r.h5")) as s:
                    return {"store after": f"opens, {len(s)} examples"}
            except StoreError as err:
                return {"store after": f"refused: {str(err)[:120]}"}

        call("run", run_args(paths["large"], paths["model"], str(mnt / "r.h5")), 128 * 1024, run_after)
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
    return rows


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--worker":
    worker(sys.argv[2], sys.argv[3])
