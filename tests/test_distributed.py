"""``torchrun --nproc-per-node 2 attr-compute ...`` (compute.distributed): two Gloo workers on CPU, each its shard, rank
0 merging, give the single-process run's store; so does a launch whose rank 1 is killed mid-run and restarted by
torchrun (--max-restarts 1), which resumes its shard; ``torchrun ... attr-compute eval`` splits the perturbed passes
and writes what one process would. The launches are real torchrun processes (about 10 s each on 2 cores)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cli_results import invoke, ok, one_line
from store import open_store
from store_compare import assert_same_store
from test_shards import N_EXAMPLES, write_data

# Batch size 1: the same batches in every process, so the scores are bitwise those of one process (compute.shards)
METHODS = "rollout,alti,grad_l2,attcat"
METRICS = "comprehensiveness,sufficiency"
RUN = ("--methods", METHODS, "--matrices", "all", "--batch-size", "1", "--metrics", METRICS)
EVAL_METRICS = "aopc,lodds"

pytestmark = pytest.mark.usefixtures("one_thread")


def _script(name: str) -> str:
    """The console script installed beside this interpreter (a pyenv shim on PATH is a shell script)."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed")
    return found


def torchrun(*args, cwd, env=None, restarts: int = 0, timeout: int = 300) -> subprocess.CompletedProcess:
    cmd = [_script("torchrun"), "--standalone", "--nproc-per-node", "2", "--max-restarts", str(restarts),
           "--no-python", _script("attr-compute"), *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


def launched(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower() and "elastic" not in line]
    assert proc.returncode == 0, "\n".join(errors[:20]) or proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def launches(tiny_model_dirs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("torchrun")
    data = write_data(tmp / "data.jsonl")
    model = tiny_model_dirs["bert"]
    ok(invoke(data, "--model", model, *RUN, "-q", "-o", tmp / "full.h5"))
    (tmp / "two").mkdir()
    two = launched(torchrun(data, "--model", model, *RUN, "-o", "out.h5", cwd=tmp / "two"))
    (tmp / "killed").mkdir()  # rank 1 SIGKILLed after 17 of its examples (two windows of 8 committed), restarted
    killed = launched(torchrun(data, "--model", model, *RUN, "-o", "out.h5", cwd=tmp / "killed", restarts=1,
                               env={"ATTRSCOPE_TEST_KILL_RANK": "1:17"}))
    for name in ("eval-two.h5", "eval-one.h5"):
        shutil.copy(tmp / "full.h5", tmp / name)
    evaluated = launched(torchrun("eval", "eval-two.h5", "--metrics", EVAL_METRICS, "--metric-batch-size", "4",
                                  cwd=tmp))
    ok(invoke("eval", tmp / "eval-one.h5", "--metrics", EVAL_METRICS, "--metric-batch-size", "4", "-q"))
    return {"tmp": tmp, "data": data, "model": model, "two": two, "killed": killed, "evaluated": evaluated}


def test_two_workers_give_the_single_process_store(launches):
    tmp = launches["tmp"]
    assert sorted(os.listdir(tmp / "two")) == ["out.h5"]  # the shard stores were merged and removed
    with open_store(tmp / "full.h5") as full, open_store(tmp / "two" / "out.h5") as merged:
        assert_same_store(merged, full, N_EXAMPLES, METRICS.split(","), 4)
        launch = merged.config["distributed"]
        assert launch["world_size"] == 2 and launch["backend"] == "gloo" and launch["restarts"] == 0
        ranks = launch["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1] and [r["local_rank"] for r in ranks] == [0, 1]
        assert all(r["device"] == "cpu" and r["node"] for r in ranks)
        assert sum(r["examples"] for r in ranks) == N_EXAMPLES and all(r["resumed_from"] is None for r in ranks)
        assert [s["k"] for s in merged.config["merged_from"]] == [0, 1]
        # the shards are cut by tokens: the long examples first make rank 0's shard the shorter by count
        assert ranks[0]["examples"] < ranks[1]["examples"]
        assert abs(ranks[0]["tokens"] - ranks[1]["tokens"]) <= max(len(e.token_ids) for e in full)
    stderr = launches["two"].stderr
    assert "40 (40 this run)" in stderr and "2 ranks (gloo)" in stderr  # rank 0's summary of the merged store
    assert "Traceback" not in stderr


def test_a_killed_rank_is_restarted_and_resumes_its_shard(launches):
    tmp = launches["tmp"]
    assert sorted(os.listdir(tmp / "killed")) == ["out.h5"]
    with open_store(tmp / "full.h5") as full, open_store(tmp / "killed" / "out.h5") as merged:
        assert_same_store(merged, full, N_EXAMPLES, METRICS.split(","), 4)
        launch = merged.config["distributed"]
        assert launch["restarts"] == 1
        rank1 = launch["ranks"][1]
        # the windows committed before the kill were kept: 8 batches of one example each
        assert rank1["resumed_from"] in (8, 16), rank1
        # rank 0 was restarted too: it resumed what it had committed, which under load can be nothing yet (its shard
        # holds the long examples: the kill at rank 1's 8th batch came before rank 0's first window in one suite run)
        rank0 = launch["ranks"][0]
        assert rank0["resumed_from"] is None or rank0["resumed_from"] > 0, rank0


def test_eval_splits_the_examples_and_writes_what_one_process_writes(launches):
    tmp = launches["tmp"]
    with open_store(tmp / "eval-two.h5") as two, open_store(tmp / "eval-one.h5") as one:
        for m in one.methods:
            assert two.metric_names(m) == one.metric_names(m) == [*METRICS.split(","), *EVAL_METRICS.split(",")]
            for name in EVAL_METRICS.split(","):
                np.testing.assert_allclose(two.metric_values(m, name), one.metric_values(m, name), rtol=1e-5,
                                           atol=1e-6, err_msg=f"{m}/{name}")
                a, b = two.metric_info(m, name), one.metric_info(m, name)
                assert a["settings"] == b["settings"] and a["summary"].keys() == b["summary"].keys()
                for key, value in b["summary"].items():
                    assert a["summary"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (m, name, key)
                np.testing.assert_allclose(a["curves"], b["curves"], rtol=1e-5, atol=1e-6)
                np.testing.assert_array_equal(a["levels"], b["levels"])
    out = launches["evaluated"].stderr
    assert out.count("metric rollout/aopc: done") == 1  # rank 0 speaks, rank 1 works quietly
    assert "Traceback" not in out


@pytest.mark.parametrize("rank", [0, 1])
def test_an_existing_output_is_refused_by_every_rank(launches, rank, monkeypatch):
    """Refused before the process group is set up (so without a torchrun launch here): every rank says it."""
    tmp = launches["tmp"] / "two"
    before = (tmp / "out.h5").stat().st_mtime_ns
    for name, value in {"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank)}.items():
        monkeypatch.setenv(name, value)
    line = one_line(invoke(launches["data"], "--model", launches["model"], *RUN, "-o", tmp / "out.h5"), code=1)
    line = line.removeprefix("attr-compute: error: ")
    assert line == f"[rank {rank}] store '{tmp / 'out.h5'}' already exists: pass --overwrite to replace it"
    assert sorted(os.listdir(tmp)) == ["out.h5"] and (tmp / "out.h5").stat().st_mtime_ns == before


# --- the launch's arithmetic, without processes -----------------------------------------------------------------

def test_world_from_env():
    from compute.distributed import World, world_from_env
    from compute.errors import UsageError

    assert world_from_env({}) is None and world_from_env({"WORLD_SIZE": "1", "RANK": "0"}) is None
    assert world_from_env({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "TORCHELASTIC_RESTART_COUNT": "2"}) \
        == World(rank=3, world_size=4, local_rank=1, restart=2)
    assert world_from_env({"WORLD_SIZE": "2", "RANK": "1"}) == World(rank=1, world_size=2, local_rank=1, restart=0)
    for bad in ({"WORLD_SIZE": "2"}, {"WORLD_SIZE": "2", "RANK": "x"}, {"WORLD_SIZE": "2", "RANK": "2"}):
        with pytest.raises(UsageError):
            world_from_env(bad)


def test_rank_config_gives_each_rank_its_shard_and_resumes_after_a_restart(tmp_path):
    from compute.distributed import World, rank_config
    from compute.errors import UsageError
    from compute.run.config import RunConfig

    out = tmp_path / "out.h5"
    cfg = RunConfig("d.jsonl", output=str(out), overwrite=True, device="auto")
    first = rank_config(cfg, World(rank=1, world_size=3, local_rank=1, restart=0))
    assert (first.shard, first.device, first.resume, first.overwrite) == ("1/3", "cpu", False, True)
    assert cfg.shard is None  # the user's config is not changed
    restarted = World(rank=1, world_size=3, local_rank=1, restart=1)
    begun = rank_config(cfg, restarted)  # no shard store yet: it is begun
    assert (begun.resume, begun.overwrite) == (False, True)
    (tmp_path / "out.shard-1-of-3.h5").write_bytes(b"")
    again = rank_config(cfg, restarted)  # its shard store exists: resumed, never overwritten
    assert (again.resume, again.overwrite) == (True, False)
    with pytest.raises(UsageError, match="--shard and a torchrun launch"):
        rank_config(RunConfig("d.jsonl", shard="0/2"), restarted)


def test_rank_rows_cover_the_store_in_order():
    from compute.distributed import World
    from compute.evaluate import rank_rows

    tokens = [30, 30, 5, 5, 5, 5, 5, 5]
    rows = [rank_rows(tokens, World(rank=r, world_size=2, local_rank=r, restart=0)) for r in range(2)]
    assert rows == [(0, 1), (1, 8)]  # 30 tokens against 60 (60 against 30 is as near half: the earlier cut)
    few = [rank_rows([3, 4], World(rank=r, world_size=4, local_rank=r, restart=0)) for r in range(4)]
    assert few == [(0, 1), (1, 2), (2, 2), (2, 2)]


def test_each_rank_takes_the_gpu_of_its_local_rank(monkeypatch):
    """The CUDA choice of a launch, on a machine without one (torch.cuda mocked): auto and cuda mean the GPU of the
    local rank; an explicit device is kept; a local rank without a GPU is one line."""
    import torch

    from compute.distributed import World, local_device
    from compute.errors import AttrscopeError

    w = World(rank=5, world_size=8, local_rank=1, restart=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert local_device("auto", w) == "cpu" and local_device("cpu", w) == "cpu"
    with pytest.raises(AttrscopeError, match="CUDA is not available"):
        local_device("cuda", w)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert local_device("auto", w) == "cuda:1" == local_device("cuda", w)
    assert local_device("cpu", w) == "cpu" and local_device("cuda:0", w) == "cuda:0"
    with pytest.raises(AttrscopeError, match="local rank 2 has no GPU .*--nproc-per-node"):
        local_device("auto", World(rank=2, world_size=4, local_rank=2, restart=0))


def test_the_backend_follows_the_device():
    from compute.distributed import backend_for

    assert backend_for("cpu") == "gloo" and backend_for("cuda:3") == "nccl" and backend_for("cuda") == "nccl"


def test_a_stop_while_waiting_for_the_other_ranks_keeps_the_shard_and_says_how_to_finish(launches, tmp_path,
                                                                                         monkeypatch):
    """Ctrl-C in the gather (this rank done, another still working): the shard is complete and kept, and the line
    says to rerun the launch with --resume (not the one-process command the runner would suggest)."""
    from contextlib import contextmanager

    import torch.distributed as dist

    import compute.distributed as distributed
    from compute.interrupts import Interrupted
    from compute.run.config import RunConfig

    @contextmanager
    def no_group(world, device):
        yield device

    def stopped(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(distributed, "process_group", no_group)
    monkeypatch.setattr(dist, "get_backend", lambda: "gloo")
    monkeypatch.setattr(dist, "all_gather_object", stopped)
    out = tmp_path / "out.h5"
    cfg = RunConfig(str(launches["data"]), model=str(launches["model"]), methods="rollout", batch_size=4,
                    output=str(out))
    world = distributed.World(rank=1, world_size=2, local_rank=1, restart=0)
    from compute.run.progress import Progress

    with pytest.raises(Interrupted) as err:
        distributed.run_distributed(cfg, Progress(), world)
    shard = tmp_path / "out.shard-1-of-2.h5"
    assert str(err.value) == (f"interrupted after this rank's shard: shard store '{shard}' is complete; finish with "
                              "the same torchrun command and --resume (the shards are merged then)")
    with open_store(shard) as s:
        assert s.complete and len(s) == s.config["shard"]["stop"] - s.config["shard"]["start"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.shard-1-of-2.h5"]


def test_a_launch_without_rank_is_one_usage_line(tmp_path, monkeypatch):
    """WORLD_SIZE set by hand without RANK: the usage line (the error prefix must not need RANK itself)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    line = one_line(invoke(write_data(tmp_path / "d.jsonl"), "-o", tmp_path / "o.h5"), code=2)
    assert line.startswith("attr-compute: error: [rank ?] WORLD_SIZE is set but RANK")
    assert not (tmp_path / "o.h5").exists()
