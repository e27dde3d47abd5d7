"""``attr-compute run --shard K/N`` and ``attr-compute merge`` (compute.shards, compute.merge): two shards merged are
the single-process run's store, value by value; the shards are balanced by tokens; resume works per shard; merge
refuses shards of different plans with one line and leaves nothing behind."""

from __future__ import annotations

import json
import os
import random
import shutil

import numpy as np
import pytest

from cli_results import invoke, ok, one_line
from conftest import WORDS
from store_compare import assert_same_store
from store import open_store

# Batch size 1: every batch is one example in every run, so shard and single-process results are the same floats
# (bitwise); the metrics batch perturbed sequences of several examples together (1e-5).
METHODS = "rollout,norm,alti,grad_l2,attcat"
METRICS = "comprehensiveness,sufficiency"
RUN = ("--methods", METHODS, "--matrices", "all", "--batch-size", 1, "--metrics", METRICS, "-q")
CHEAP = ("--methods", "rollout", "--matrices", "none", "--batch-size", 1, "-q")
N_EXAMPLES = 40

pytestmark = pytest.mark.usefixtures("one_thread")


def write_data(path, seed=0, n=N_EXAMPLES):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            words = (i * 7) % 11 + (25 if i < 12 else 1)  # long examples first: halves by count are uneven
            f.write(json.dumps({"id": f"ex{i}", "text": " ".join(rng.choice(WORDS) for _ in range(words)),
                                "label": i % 2}) + "\n")
    return path


class StopAfterFirstCommit:
    """Stops a run as Ctrl-C would: ``compute.interrupts.check`` raises KeyboardInterrupt at the first safe point
    after the store's first commit (``StoreWriter.append``)."""

    def __init__(self, mp):
        import compute.interrupts as interrupts
        from store.writer import StoreWriter

        self.committed = 0
        real_append, real_check = StoreWriter.append, interrupts.check

        def append(writer, *args, **kwargs):
            out = real_append(writer, *args, **kwargs)
            self.committed += 1
            return out

        def check():
            if self.committed:
                raise KeyboardInterrupt
            real_check()

        mp.setattr(StoreWriter, "append", append)
        mp.setattr(interrupts, "check", check)


@pytest.fixture(scope="module")
def runs(tiny_model_dirs, tmp_path_factory):
    """A single-process run, shard 0/2, shard 1/2 (stopped after its first window, then resumed), and their merge."""
    tmp = tmp_path_factory.mktemp("shards")
    data = write_data(tmp / "data.jsonl")
    model = tiny_model_dirs["bert"]
    args = (data, "--model", model, *RUN)
    ok(invoke(*args, "-o", tmp / "full.h5"))
    ok(invoke(*args, "-o", tmp / "out.h5", "--shard", "0/2"))
    shard1 = tmp / "out.shard-1-of-2.h5"
    with pytest.MonkeyPatch.context() as mp:  # a commit is a window: 8 batches of one example
        StopAfterFirstCommit(mp)
        stopped = invoke(*args, "-o", tmp / "out.h5", "--shard", "1/2")
    assert stopped.exit_code == 130 and "--resume" in stopped.stderr, stopped.stderr
    with open_store(shard1) as s:
        interrupted = {"n": len(s), "complete": s.complete}
    shutil.copy(shard1, tmp / "interrupted.h5")
    ok(invoke(*args, "-o", tmp / "out.h5", "--shard", "1/2", "--resume"))
    merged = ok(invoke("merge", tmp / "out.h5", shard1, tmp / "out.shard-0-of-2.h5"))  # any order
    return {"tmp": tmp, "data": data, "model": model, "full": tmp / "full.h5", "merged": tmp / "out.h5",
            "shards": [tmp / "out.shard-0-of-2.h5", shard1], "interrupted": interrupted, "merge_stderr": merged.stderr}


def test_merged_store_equals_single_process_run(runs):
    with open_store(runs["full"]) as full, open_store(runs["merged"]) as merged:
        assert_same_store(merged, full, N_EXAMPLES, METRICS.split(","), 5)
        # one provenance listing every shard
        prov = merged.config
        assert prov["shard"] is None and prov["config"]["shard"] is None
        shards = prov["merged_from"]
        assert [s["k"] for s in shards] == [0, 1] and all(s["n"] == 2 for s in shards)
        assert shards[0]["rows"][0] == 0 and shards[1]["rows"][1] == N_EXAMPLES - 1
        assert shards[0]["rows"][1] + 1 == shards[1]["rows"][0]
        assert sum(s["examples"] for s in shards) == N_EXAMPLES
        assert all(s["host"]["node"] and s["device"] == "cpu" for s in shards)
        assert merged.summary["examples"] == N_EXAMPLES and merged.summary["shards"] == 2
    assert "40 examples from 2 shards" in runs["merge_stderr"]


def test_shards_are_balanced_by_tokens(runs):
    plans, lengths = [], []
    for path in runs["shards"]:
        with open_store(path) as s:
            plans.append(s.config["shard"])
            lengths.append([len(e.token_ids) for e in s])
    assert [p["k"] for p in plans] == [0, 1] and plans[0]["stop"] == plans[1]["start"]
    tokens = [sum(x) for x in lengths]
    assert tokens == [p["tokens"] for p in plans] and sum(tokens) == plans[0]["tokens_total"]
    assert abs(tokens[0] - tokens[1]) <= max(max(x) for x in lengths)  # at most one example's length apart
    # the examples are uneven: an even split by count would be further apart than that
    by_count = [sum(x) for x in (sum(lengths, [])[:20], sum(lengths, [])[20:])]
    assert abs(by_count[0] - by_count[1]) > abs(tokens[0] - tokens[1])


def test_an_interrupted_shard_resumes(runs):
    assert runs["interrupted"] == {"n": 8, "complete": False}
    with open_store(runs["shards"][1]) as s:
        assert s.complete and s.summary["resumed_from"] == 8
        plan = s.config["shard"]
        assert [e.row for e in s] == list(range(plan["start"], plan["stop"]))


def test_split_by_tokens_is_balanced_and_deterministic():
    from compute.shards import split_by_tokens

    rng = random.Random(1)
    for _ in range(300):
        lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 50))]
        for n in range(1, min(len(lengths), 7) + 1):
            ranges = split_by_tokens(lengths, n)
            assert ranges == split_by_tokens(list(lengths), n)
            assert ranges[0][0] == 0 and ranges[-1][1] == len(lengths)
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])) and all(a < b for a, b in ranges)
            tokens = [sum(lengths[a:b]) for a, b in ranges]
            if n == 2:
                assert abs(tokens[0] - tokens[1]) <= max(lengths)
            if all(b - a > 1 for a, b in ranges):  # no shard forced down to its one example
                assert all(abs(t - sum(lengths) / n) <= max(lengths) for t in tokens), (lengths, n, tokens)


@pytest.mark.parametrize("value,why", [("2/2", "below N"), ("0/0", "at least 1"), ("1", "K/N"), ("a/b", "K/N"),
                                       ("-1/2", "K/N")])
def test_bad_shard_values_are_usage_errors(value, why, tmp_path):
    line = one_line(invoke(write_data(tmp_path / "d.jsonl"), "--shard", value, "-o", tmp_path / "o.h5"), code=2)
    assert why in line
    assert list(tmp_path.iterdir()) == [tmp_path / "d.jsonl"]


def test_more_shards_than_examples_is_refused(runs, tmp_path):
    line = one_line(invoke(write_data(tmp_path / "d.jsonl", n=3), "--model", runs["model"], *CHEAP,
                           "--shard", "0/4", "-o", tmp_path / "o.h5"), code=2)
    assert "at most 3 shards" in line


def _refused(runs, tmp_path, *shards) -> str:
    out = tmp_path / "merged.h5"
    line = one_line(invoke("merge", out, *shards))
    assert not out.exists() and not any(p.name.startswith("merged.h5") for p in tmp_path.iterdir())
    return line


def test_merge_refuses_shards_of_different_plans(runs, tmp_path):
    shard0, shard1 = runs["shards"]
    # another option: one shard with other methods
    ok(invoke(runs["data"], "--model", runs["model"], *CHEAP, "-o", tmp_path / "cheap.h5", "--shard", "1/2"))
    assert "--methods" in _refused(runs, tmp_path, shard0, tmp_path / "cheap.shard-1-of-2.h5")
    # another dataset (same options as that shard)
    ok(invoke(write_data(tmp_path / "other.jsonl", seed=5), "--model", runs["model"], *CHEAP,
              "-o", tmp_path / "other.h5", "--shard", "0/2"))
    assert "different datasets" in _refused(runs, tmp_path, tmp_path / "other.shard-0-of-2.h5",
                                            tmp_path / "cheap.shard-1-of-2.h5")
    # overlapping: one shard twice
    shutil.copy(shard0, tmp_path / "again.h5")
    assert "both shard 0/2" in _refused(runs, tmp_path, shard0, tmp_path / "again.h5", shard1)
    # a missing shard
    assert "shard 1/2 missing" in _refused(runs, tmp_path, shard0)
    # not a shard store; an interrupted shard
    assert "not a shard store" in _refused(runs, tmp_path, runs["full"], shard1)
    assert "not complete" in _refused(runs, tmp_path, shard0, runs["tmp"] / "interrupted.h5")
    # the output exists already
    (tmp_path / "merged.h5").write_text("")
    line = one_line(invoke("merge", tmp_path / "merged.h5", shard0, shard1))
    assert "already exists" in line and (tmp_path / "merged.h5").read_text() == ""


def test_mask_lrp_shards_share_the_whole_runs_head_masks(tiny_model_dirs, tmp_path):
    """mask_lrp's head statistics are taken over the whole run in every shard, so the shards merge and the merged
    store equals the single-process run."""
    from test_head_pass import write_data as write_parsed_data

    data, parses, _ = write_parsed_data(tmp_path, n=10)
    args = (data, "--model", tiny_model_dirs["bert"], "--methods", "mask_lrp", "--parses", parses,
            "--batch-size", 1, "--matrices", "none", "-q")
    ok(invoke(*args, "-o", tmp_path / "full.h5"))
    for k in (0, 1):
        ok(invoke(*args, "-o", tmp_path / "out.h5", "--shard", f"{k}/2"))
    ok(invoke("merge", tmp_path / "out.h5", tmp_path / "out.shard-0-of-2.h5", tmp_path / "out.shard-1-of-2.h5"))
    with open_store(tmp_path / "full.h5") as full, open_store(tmp_path / "out.h5") as merged:
        assert merged.head_masks == full.head_masks and full.head_masks
        for name in full.head_masks:
            a, b = merged.head_mask(name), full.head_mask(name)
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
            assert a.stats.keys() == b.stats.keys()
            for key in b.stats:
                np.testing.assert_array_equal(a.stats[key], b.stats[key])
        assert merged.ids() == full.ids() and len(full) == 10
        for i in range(len(full)):
            np.testing.assert_array_equal(merged[i].scores("mask_lrp"), full[i].scores("mask_lrp"))


def test_the_early_resume_check_reads_the_shards_store():
    """--resume names a damaged store before torch loads: under --shard, the shard's store, not OUT."""
    from compute.cli import _resumed_output

    assert _resumed_output(["d.jsonl", "-o", "out.h5", "--shard", "1/2", "--resume"]) == "out.shard-1-of-2.h5"
    assert _resumed_output(["d.jsonl", "--shard=0/3", "--output=o.h5", "--resume"]) == "o.shard-0-of-3.h5"
    assert _resumed_output(["d.jsonl", "-o", "out.h5", "--resume"]) == "out.h5"
    assert _resumed_output(["d.jsonl", "-o", "out.h5", "--shard", "x", "--resume"]) is None  # the plan's usage error


def test_a_damaged_shard_store_is_named_on_resume(tmp_path):
    data = write_data(tmp_path / "d.jsonl", n=4)
    (tmp_path / "out.shard-1-of-2.h5").write_bytes(b"not a store")
    line = one_line(invoke(data, "-o", tmp_path / "out.h5", "--shard", "1/2", "--resume"))
    assert "out.shard-1-of-2.h5" in line


def test_merge_checks_the_output_directory_first(tmp_path):
    """A missing (or read-only) directory of OUT is one line naming it, before any shard is read (the shards here
    are not even stores: reading them would be another error)."""
    shards = [tmp_path / "a.h5", tmp_path / "b.h5"]
    for s in shards:
        s.write_bytes(b"not read")
    line = one_line(invoke("merge", tmp_path / "missing" / "out.h5", *shards))
    assert f"output directory '{tmp_path / 'missing'}' does not exist: create it or choose another OUT" in line
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    if os.access(locked, os.W_OK):
        pytest.skip("running as root: a mode 555 directory stays writable")
    line = one_line(invoke("merge", locked / "out.h5", *shards))
    assert f"output directory '{locked}' is not writable: choose another OUT" in line
    assert list(locked.iterdir()) == []
