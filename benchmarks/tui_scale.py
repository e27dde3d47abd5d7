"""attr-tui on large stores, end to end in a terminal: open time and key-to-screen latency, 1k against 100k examples.

    python benchmarks/tui_scale.py                    # builds /tmp/attrscope-tui-{1000,100000}.h5 once, then measures
    python benchmarks/tui_scale.py --before HEAD~3    # also the code of HEAD~3 (git archive), the two trees alternated
    python benchmarks/tui_scale.py --sizes 1000,10000 --keep-dir DIR --pilot

The stores have SST-2-like lengths (8-60 tokens), 6 layers, five methods with six layer views each (two signed) and
two faithfulness metrics per method (one with ten-level curves).
Each measurement starts ``attr-tui STORE`` (python -m tui.cli, the tree's own code) in a fresh tmux session of 80x24
and reads the screen back with ``tmux capture-pane``: "open" is from starting the process to the first example's
tokens drawn (its id and "1/N" in the detail header and its token line), "next" from sending j to the next
example's tokens drawn (the median of 30 presses, 0.15 s apart, and the slowest); beside each, the CPU time the
app's process spent (/proc: to open, and per j as the mean over the presses, the read-ahead included). The screen is read every few
milliseconds by a tmux client of its own, so the figures include a few ms of polling. Each tree's modules are
compiled to bytecode once before (as an installed attr-tui has them), so no start compiles them. Targets (issue 38): open
< 0.5 s, next < 30 ms median. The machine's load (1-minute average) is printed with each row: the figures are only
comparable at a similar load, which is why --before alternates the trees run by run.

``--pilot`` adds the in-process measurements of issue 14 (Textual's Pilot at 80x24, a fresh child process each):
"last" from End to the last example's tokens, RSS after opening, and the RSS growth after browsing 1,000 examples
and opening the metrics screen ten times (targets: last < 100 ms, RSS within 20 MB of the 1k store, growth < 20 MB).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

METHODS = (("rollout", False), ("alti", False), ("globenc", False), ("normxlogit", True), ("gxi_l2", True))
L = 6


def build(path: str, n: int, seed: int = 0) -> None:
    from store import ExampleData, MethodLayout, StoreWriter

    rng = np.random.default_rng(seed)
    layouts = [MethodLayout(m, signed=s, n_layer_views=L, description=m) for m, s in METHODS]
    w = StoreWriter.create(path, n_layers=L, n_heads=12, labels={0: "negative", 1: "positive"}, methods=layouts,
                           provenance={"benchmark": "tui_scale"}, attrs={"model_id": "synthetic-sst2-like"})
    words = ("the movie was a great fun but too long and the plot is thin yet the acting is superb "
             "un ##believ ##able , .").split()
    batch = []
    for i in range(n):
        k = int(rng.integers(8, 61))
        toks = ["[CLS]"] + [words[j] for j in rng.integers(0, len(words), k - 2)] + ["[SEP]"]
        res = {m: {"scores": (rng.normal(size=k) if s else rng.random(k)),
                   "layer_scores": (rng.normal(size=(L, k)) if s else rng.random((L, k)))} for m, s in METHODS}
        label = int(rng.integers(0, 2))
        pred = label if rng.random() < 0.9 else 1 - label
        p = float(rng.uniform(0.5, 1.0))
        batch.append(ExampleData(row=i, id=f"dev-{i:06d}", text=" ".join(toks[1:-1]), pair=None,
                                 token_ids=np.arange(k), tokens=toks, spans=np.full((k, 2), -1), segment=np.zeros(k),
                                 label=label, pred=pred, probs=np.array([1 - p, p] if pred else [p, 1 - p]),
                                 target=pred, explain_pos=0, n_orig_tokens=k, truncated=False, results=res))
        if len(batch) == 2000:
            w.append(batch)
            batch = []
    if batch:
        w.append(batch)
    w.close(complete=True, summary={"examples": n})
    # two metrics per method, one with ten-level curves, as attr-compute eval writes them
    from store import MetricData, add_metrics

    metrics = []
    for m, _ in METHODS:
        comp = rng.random(n).astype(np.float32)
        curves = np.sort(rng.random((n, 10)), axis=1)[:, ::-1].astype(np.float32)
        levels = np.tile(np.arange(1, 11, dtype=np.int32), (n, 1))
        metrics.append(MetricData(m, "comprehensiveness", comp, {"levels": "tenths"},
                                  {"mean": float(comp.mean()), "std": float(comp.std()), "n": n}, True,
                                  "synthetic", curves, levels))
        suff = rng.random(n).astype(np.float32)
        metrics.append(MetricData(m, "sufficiency", suff, {}, {"mean": float(suff.mean()), "n": n}, False))
    add_metrics(path, metrics)


CHILD = r'''
import asyncio, json, os, sys, time, resource
sys.path.insert(0, sys.argv[1])
path = sys.argv[2]
os.environ.setdefault("TERM", "xterm-256color")

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

async def main():
    from textual import events
    from tui.app import create_app
    t0 = time.perf_counter()
    app = create_app(path, color_mode="256")
    out = {}
    async with app.run_test(size=(80, 24)) as pilot:
        async def until(cond, limit=30.0):
            t = time.perf_counter()
            while not cond():
                await asyncio.sleep(0.001)  # not pilot.pause: it waits for idle, which adds its own time
                if time.perf_counter() - t > limit:
                    raise TimeoutError
        def drawn(i):
            cells = getattr(app.query_one("#tokens"), "layout_data", None)
            return app.current == i and i in app.cache and cells is not None and cells.cells
        await until(lambda: drawn(0))
        out["open_s"] = time.perf_counter() - t0
        out["rss_open_mb"] = rss_mb()
        lat = []
        for i in range(1, 31):
            await pilot.pause()
            t = time.perf_counter()
            app.post_message(events.Key("j", "j"))  # the key as the terminal driver delivers it
            await until(lambda: drawn(i))
            lat.append(time.perf_counter() - t)
        out["next_ms"] = 1000 * sum(lat) / len(lat)
        out["next_max_ms"] = 1000 * max(lat)
        n = app.example_list.row_count
        await pilot.pause()
        t = time.perf_counter()
        app.post_message(events.Key("end", None))
        await until(lambda: drawn(n - 1))
        out["last_ms"] = 1000 * (time.perf_counter() - t)
        await pilot.press("home")
        await until(lambda: drawn(0))
        before = rss_mb()
        steps = min(1000, n - 1)
        for i in range(steps):
            await pilot.press("j")
        await until(lambda: drawn(steps), 120)
        for _ in range(10):
            await pilot.press("f")
            for _ in range(20):
                await pilot.pause(0.01)
            await pilot.press("escape")
            await pilot.pause(0.01)
        out["rss_growth_mb"] = rss_mb() - before
        out["n"] = n
    print(json.dumps(out))

asyncio.run(main())
'''


def measure_pilot(tree: str, path: str) -> dict:
    res = subprocess.run([sys.executable, "-c", CHILD, tree, path], capture_output=True, text=True, timeout=900)
    if res.returncode:
        raise SystemExit(res.stderr[-3000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


# A tmux server of this run's own: the machine's default one is shared (another program's kill-server, or its last
# session closing as this run opened one, ended a run with "server exited unexpectedly").
TMUX = ["tmux", "-L", f"tui-scale-{os.getpid()}"]


def _screen(session: str) -> str:
    return subprocess.run([*TMUX, "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout


def _token_line(screen: str) -> str | None:
    """The first line of the token view (it starts at the explained token's mark ▸)."""
    return next((line for line in screen.splitlines() if "▸" in line), None)


def compiled(tree: str, into: str) -> str:
    """The bytecode of ``tree``'s packages written under ``into`` (a PYTHONPYCACHEPREFIX), as an installed attr-tui
    has it: where PYTHONDONTWRITEBYTECODE is set (as on the machine of issue 38), each start compiled every module of
    the tree again (0.1 s of CPU of the open)."""
    env = {**os.environ, "PYTHONPYCACHEPREFIX": into}
    subprocess.run([sys.executable, "-m", "compileall", "-q", "store", "tui"], cwd=tree, env=env, check=True)
    return into


def measure_tmux(tree: str, path: str, ids: list[str], presses: int = 30, size=(80, 24), pycache: str = "") -> dict:
    """attr-tui in a fresh tmux session: process start to the first example's tokens, j to the next one's (its
    bytecode read from ``pycache``, see compiled)."""
    session = f"tui-scale-{os.getpid()}-{time.monotonic_ns()}"

    def shown(screen: str, i: int) -> bool:
        return f"{ids[i]}  {i + 1}/" in screen and _token_line(screen) is not None

    def wait(cond, since: float, what: str) -> str:
        while True:
            screen = _screen(session)
            if cond(screen):
                return screen
            if time.perf_counter() - since > 60:
                raise SystemExit(f"{what}: nothing drawn after 60 s; the screen:\n{screen}")

    t0 = time.perf_counter()
    subprocess.run([*TMUX, "new-session", "-d", "-s", session, "-x", str(size[0]), "-y", str(size[1]), "-c", tree,
                    f"PYTHONPYCACHEPREFIX={pycache} exec {sys.executable} -m tui.cli {path}"], check=True)
    try:
        pid = int(subprocess.run([*TMUX, "display-message", "-p", "-t", session, "#{pane_pid}"],
                                 capture_output=True, text=True, check=True).stdout)
        wait(lambda sc: shown(sc, 0), t0, "open")
        out = {"open_s": time.perf_counter() - t0, "open_cpu_s": cpu_seconds(pid)}
        time.sleep(1.0)  # the start's reads (metrics, read-ahead) are over
        before, lat = _token_line(_screen(session)), []
        cpu = cpu_seconds(pid)
        for i in range(1, presses + 1):
            time.sleep(0.15)
            t = time.perf_counter()
            subprocess.run([*TMUX, "send-keys", "-t", session, "j"], check=True)
            screen = wait(lambda sc: shown(sc, i) and _token_line(sc) != before, t, "next")
            lat.append(time.perf_counter() - t)
            before = _token_line(screen)
        out["next_cpu_ms"] = 1000 * (cpu_seconds(pid) - cpu) / presses
        out["next_ms"] = 1000 * statistics.median(lat)
        out["next_max_ms"] = 1000 * max(lat)
        return out
    finally:
        subprocess.run([*TMUX, "kill-session", "-t", session], capture_output=True)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, every thread) of process ``pid`` so far: what the app itself spent, which a loaded
    machine stretches far less than the wall-clock figures (the whole-store check's child is not counted)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load() -> float:
    return os.getloadavg()[0]


def archive(rev: str, into: str) -> str:
    """The tree of git revision ``rev`` extracted into ``into`` (git archive: no worktree, no checkout)."""
    data = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
    os.makedirs(into, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", into], input=data, check=True)
    return into


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,100000")
    ap.add_argument("--keep-dir", default="/tmp")
    ap.add_argument("--runs", type=int, default=3, help="measurements per store and tree (medians reported)")
    ap.add_argument("--presses", type=int, default=30, help="j presses per measurement")
    ap.add_argument("--before", metavar="REV", help="also measure git revision REV, alternated with this tree")
    ap.add_argument("--pilot", action="store_true", help="also the in-process Pilot measurements (last, RSS)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    paths = {}
    for n in sizes:
        path = paths[n] = os.path.join(args.keep_dir, f"attrscope-tui-{n}.h5")
        if not os.path.exists(path):
            t = time.perf_counter()
            build(path + ".part", n)
            os.replace(path + ".part", path)
            print(f"built {path} ({os.path.getsize(path) / 2**20:.0f} MB) in {time.perf_counter() - t:.0f} s",
                  file=sys.stderr)
    from store import open_store

    ids = {}
    for n, path in paths.items():
        with open_store(path) as s:
            ids[n] = s.ids_range(0, args.presses + 1)
    # one session kept for the run: the server stays up between measurements (its exit as the next one opened was
    # the same race)
    subprocess.run([*TMUX, "new-session", "-d", "-s", "keep", "sleep 100000"], check=True)
    with tempfile.TemporaryDirectory(prefix="tui-scale-") as tmp, contextlib.ExitStack() as cleanup:
        cleanup.callback(subprocess.run, [*TMUX, "kill-server"], capture_output=True)
        trees = {"this tree": str(REPO)}
        if args.before:
            trees[args.before] = archive(args.before, os.path.join(tmp, "before"))
        pycaches = {name: compiled(tree, os.path.join(tmp, f"pycache-{i}")) for i, (name, tree) in enumerate(trees.items())}
        runs: dict[tuple[str, int], list[dict]] = {}
        for run in range(args.runs):
            for n, path in paths.items():
                for name, tree in trees.items():  # alternated: both trees see the same spells of load
                    la = load()
                    r = measure_tmux(tree, path, ids[n], args.presses, pycache=pycaches[name])
                    if args.pilot:
                        r.update(measure_pilot(tree, path))
                    r["load"] = (la + load()) / 2
                    runs.setdefault((name, n), []).append(r)
                    print(f"run {run + 1} {name} {n:,}: " + " ".join(f"{k} {v:.3g}" for k, v in r.items()),
                          file=sys.stderr)
    rows = {key: {k: float(np.median([r[k] for r in rs])) for k in rs[0]} for key, rs in runs.items()}
    pilot = args.pilot
    print(f"{'code':>12} {'examples':>9} {'open s':>7} {'(CPU)':>6} {'next ms':>8} {'(max)':>7} {'(CPU)':>6} "
          f"{'load':>5}" + (f" {'last ms':>8} {'RSS MB':>7} {'growth MB':>9}" if pilot else ""))
    for (name, n), r in rows.items():
        print(f"{name:>12} {n:>9,} {r['open_s']:7.2f} {r['open_cpu_s']:6.2f} {r['next_ms']:8.1f} "
              f"{r['next_max_ms']:7.1f} {r['next_cpu_ms']:6.1f} {r['load']:5.1f}"
              + (f" {r['last_ms']:8.1f} {r['rss_open_mb']:7.0f} {r['rss_growth_mb']:9.1f}" if pilot else ""))
    print("medians of --runs; (CPU): the app process's CPU time (every thread) to open, and per j (the mean, read-ahead "
          "included); load: the 1-minute load average around each measurement (this machine has "
          f"{os.cpu_count()} CPUs). Targets: open < 0.5 s, next < 30 ms median"
          + ("; last < 100 ms, growth < 20 MB" if pilot else ""))


if __name__ == "__main__":
    main()
