"""Damaged copies of a store (seeded byte flips, truncations, zeroed blocks) end in StoreError or in exactly the
original numbers: none hangs, none crashes the interpreter, none raises anything else (tests/store_fuzz.py)."""

from __future__ import annotations

import time

from store_fuzz import fuzz, make_target

TIME_LIMIT_S = 5.0  # per copy; a clean failure takes well under a second (the slowest read must stay below 2 s)


def _check(report: dict, copies: int) -> None:
    counts = report["counts"]
    assert set(counts) <= {"error", "identical"}, report["notes"]
    assert sum(counts.values()) == copies
    assert counts.get("error", 0) > copies // 2  # the mutations do damage: most copies must be refused
    assert report["slowest_s"] < 2.0, report


def test_damaged_copies_of_a_complete_store(tmp_path):
    path = tmp_path / "target.h5"
    make_target(str(path))
    t0 = time.monotonic()
    _check(fuzz(str(path), copies=210, seed=20261123, workdir=str(tmp_path), timeout=TIME_LIMIT_S), 210)
    assert time.monotonic() - t0 < 60


def test_damaged_copies_of_a_store_whose_writer_was_killed(tmp_path):
    """Still marked open for write: read in SWMR mode, where HDF5 retries failed metadata reads."""
    path = tmp_path / "killed.h5"
    make_target(str(path), complete=False)
    _check(fuzz(str(path), copies=60, seed=7, workdir=str(tmp_path), timeout=TIME_LIMIT_S), 60)
