"""``torchrun ... attr-compute DATASET``: one worker per process through torch.distributed.

torchrun (or any launcher that sets RANK, WORLD_SIZE and LOCAL_RANK, e.g. srun with those variables) starts one
process per device. Each rank computes ``--shard RANK/WORLD_SIZE`` of the dataset (compute.shards: contiguous,
balanced by token count, decided from the data alone, so no rank waits on another to know its rows) on its local
device, into its own shard store beside the output; the ranks then gather what each did, and rank 0 merges the
shards into the store the user named (compute.merge) and removes them. The process group (NCCL on CUDA, Gloo on
CPU) is used only for that gather and for leaving together after the merge: the work itself needs no
communication.

Restarts: torchrun ``--max-restarts`` restarts every worker when one dies (TORCHELASTIC_RESTART_COUNT > 0); a
restarted rank resumes its shard store (the rows it had committed are kept), whatever --overwrite said.
"""

from __future__ import annotations

import copy
import os
import platform
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from . import interrupts
from .errors import AttrscopeError, UsageError

# Ranks wait in the gather for the slowest rank's shard, which can take hours on a large dataset. A rank that dies
# does not leave the others waiting this long: torchrun stops (or restarts) every worker when one fails.
GATHER_TIMEOUT = timedelta(hours=24)

# Test hook: "RANK:N" kills that rank with SIGKILL after N examples, on the first attempt only (tests of
# --max-restarts; a process cannot be killed from outside at a chosen point of its work).
KILL_ENV = "ATTRSCOPE_TEST_KILL_RANK"


@dataclass(frozen=True)
class World:
    """This process's place among the workers, as the launcher set it."""

    rank: int
    world_size: int
    local_rank: int
    restart: int  # how many times torchrun restarted the workers (0 on the first attempt)


def world_from_env(environ=None) -> World | None:
    """The launcher's variables, or None outside a multi-process launch (no WORLD_SIZE, or 1)."""
    env = os.environ if environ is None else environ
    if env.get("WORLD_SIZE") in (None, "", "1"):
        return None
    try:
        world_size, rank = int(env["WORLD_SIZE"]), int(env.get("RANK", ""))
        local_rank = int(env.get("LOCAL_RANK", rank))
        restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    except (KeyError, ValueError):
        raise UsageError("WORLD_SIZE is set but RANK or LOCAL_RANK is not an integer: launch with torchrun, or set "
                         "RANK, LOCAL_RANK and WORLD_SIZE for every process") from None
    if not 0 <= rank < world_size:
        raise UsageError(f"RANK {rank} is not below WORLD_SIZE {world_size}: launch with torchrun")
    return World(rank=rank, world_size=world_size, local_rank=local_rank, restart=restart)


def local_device(spec: str, world: World) -> str:
    """The device of this rank: auto and cuda mean the GPU of the local rank; cpu and cuda:K are kept as given."""
    import torch

    if spec == "cuda" or (spec == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise AttrscopeError("--device cuda: CUDA is not available on this machine: use --device cpu or auto")
        if world.local_rank >= torch.cuda.device_count():
            raise AttrscopeError(f"local rank {world.local_rank} has no GPU (this node has "
                                 f"{torch.cuda.device_count()}): start at most that many processes per node "
                                 "(torchrun --nproc-per-node)")
        return f"cuda:{world.local_rank}"
    return "cpu" if spec == "auto" else spec


def rank_config(cfg, world: World):
    """``cfg`` for this rank: its shard, its device, and --resume for a shard begun before a restart."""
    from .run.plan import bundled_dataset, default_output
    from .shards import shard_output

    if cfg.shard is not None:
        raise UsageError("--shard and a torchrun launch exclude each other: torchrun gives each process its shard")
    output = cfg.output or default_output(cfg.dataset or bundled_dataset())
    mine = copy.copy(cfg)
    mine.output = output
    mine.shard = f"{world.rank}/{world.world_size}"
    mine.device = local_device(cfg.device, world)
    shard_exists = os.path.exists(shard_output(output, world.rank, world.world_size))
    if world.restart > 0 or cfg.resume:
        # a restarted worker (or a --resume of a stopped launch) goes on with its shard, or begins it if it had not
        mine.resume, mine.overwrite = shard_exists, not shard_exists and cfg.overwrite
    return mine


def check_output(cfg, output: str) -> None:
    """The store the ranks will be merged into: refused before any work if it exists and may not be replaced."""
    if os.path.isdir(output):
        raise AttrscopeError(f"-o '{output}' is a directory: pass a file name, e.g. -o {os.path.join(output, 'run.h5')}")
    if os.path.exists(output) and not (cfg.overwrite or cfg.resume):
        raise AttrscopeError(f"store '{output}' already exists: pass --overwrite to replace it")


def backend_for(device: str) -> str:
    """NCCL between GPUs, Gloo between CPU processes."""
    return "nccl" if device.startswith("cuda") else "gloo"


@contextmanager
def process_group(world: World | None, device_spec: str):
    """The process group of this launch (NCCL on CUDA, Gloo on CPU), torn down on the way out; yields this rank's
    device. Outside a launch (``world`` None) nothing is set up and the device is as given."""
    if world is None:
        yield device_spec
        return
    import torch.distributed as dist

    device = local_device(device_spec, world)
    if device.startswith("cuda"):
        import torch

        torch.cuda.set_device(device)
    # The launcher's store outlives a restart, and the keys the ranks of a dead attempt left in it (their Gloo
    # addresses) would be read by the next attempt's ranks: each attempt keeps its keys under its own prefix.
    store, rank, world_size = next(dist.rendezvous("env://", timeout=GATHER_TIMEOUT))
    store = dist.PrefixStore(f"attrscope/attempt-{world.restart}", store)
    dist.init_process_group(backend_for(device), store=store, rank=rank,
                            world_size=world_size, timeout=GATHER_TIMEOUT)
    try:
        yield device
    finally:
        dist.destroy_process_group()


def run_distributed(cfg, progress, world: World) -> dict:
    """This rank's shard, the gather, and on rank 0 the merge. Returns the merged run's summary (rank 0) or this
    rank's (the others)."""
    import torch.distributed as dist

    from .runner import run

    t0 = time.perf_counter()
    mine = rank_config(cfg, world)
    check_output(cfg, mine.output)
    with process_group(world, mine.device):
        backend = dist.get_backend()
        try:
            summary = run(mine, _kill_hook(progress, world))
        except interrupts.Interrupted as err:  # the runner's hint is a one-process command: this is a launch
            kept = str(err).split("; finish it with:")[0].split("; compute the rest with:")[0]
            raise interrupts.Interrupted(f"{kept}; finish with the same torchrun command and --resume (torchrun "
                                         "--max-restarts N does that by itself)") from None
        done = {"rank": world.rank, "local_rank": world.local_rank, "node": platform.node(),
                "device": summary["device"], "shard": summary["store"], "examples": summary["examples"],
                "examples_this_run": summary["examples_this_run"], "tokens": summary["tokens"],
                "resumed_from": summary["resumed_from"], "wall_seconds": summary["wall_seconds"],
                "forward_seconds": summary["forward_seconds"], "method_seconds": summary["method_seconds"]}
        try:
            ranks = [None] * world.world_size
            dist.all_gather_object(ranks, done)  # waits for the slowest rank
            merged = _merge(cfg, mine.output, ranks, backend, world, t0, progress) if world.rank == 0 else summary
            # the ranks leave together: a rank whose process ended while rank 0 was still merging was sometimes
            # aborted in the process group's teardown ("terminate called without an active exception")
            dist.barrier()
            return merged
        except KeyboardInterrupt:  # the merge writes a temporary file: nothing half-written is left at -o
            raise interrupts.Interrupted(
                f"interrupted after this rank's shard: shard store '{summary['store']}' is complete; finish with "
                "the same torchrun command and --resume (the shards are merged then)") from None


def _merge(cfg, output: str, ranks: list[dict], backend: str, world: World, t0: float, progress) -> dict:
    from .merge import merge_shards

    shards = [r["shard"] for r in ranks]
    launch = {"world_size": world.world_size, "backend": backend, "restarts": world.restart,
              "ranks": [{k: r[k] for k in ("rank", "local_rank", "node", "device", "examples", "tokens",
                                            "resumed_from", "wall_seconds")} for r in ranks]}
    merged = merge_shards(output, shards, argv=cfg.argv, progress=progress, replace=True,
                          extra_provenance={"distributed": launch})
    for path in shards:  # merged: the shards are the store's copy now
        os.remove(path)
    methods = {}
    for r in ranks:
        for name, secs in r["method_seconds"].items():
            methods[name] = methods.get(name, 0.0) + secs
    return {
        "examples": merged["examples"],
        "examples_this_run": sum(r["examples_this_run"] for r in ranks),
        "tokens": sum(r["tokens"] for r in ranks),
        "device": f"{world.world_size} ranks ({backend}): " + ", ".join(sorted({f"{r['node']}:{r['device']}" for r in ranks})),
        "wall_seconds": round(time.perf_counter() - t0, 3),
        "forward_seconds": round(sum(r["forward_seconds"] for r in ranks), 3),  # summed over the ranks
        "method_seconds": {k: round(v, 3) for k, v in methods.items()},
        "merge_seconds": merged["seconds"],
        "store": merged["store"],
        "store_bytes": os.path.getsize(output),
    }


class _KillAfter:
    """The Progress of the run, which SIGKILLs this process once ``after`` examples are done (KILL_ENV)."""

    def __init__(self, inner, after: int):
        self.inner, self.after, self.done = inner, after, 0

    def advance(self, n: int) -> None:
        self.inner.advance(n)
        self.done += n
        if self.done >= self.after:
            time.sleep(0.5)  # the writer thread commits the windows submitted so far: the restart resumes after them
            os.kill(os.getpid(), signal.SIGKILL)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _kill_hook(progress, world: World):
    spec = os.environ.get(KILL_ENV)
    if not spec or world.restart > 0:
        return progress
    rank, _, after = spec.partition(":")
    return _KillAfter(progress, int(after)) if int(rank) == world.rank else progress
