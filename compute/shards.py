"""``--shard K/N``: which contiguous rows of the dataset one process of a split run computes.

The dataset (after --limit) is cut into N contiguous shards balanced by token count, not by example count: a run's
cost follows its tokens. The cuts are decided from the tokenised (truncated) lengths alone, so the same dataset,
tokenizer and --max-length give the same ranges in every process, with no communication between them. Each shard
is a store of its own (``<output>.shard-K-of-N.h5`` beside the output the user named); ``attr-compute merge``
(compute.merge) puts them back together in dataset order.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass

from .errors import UsageError

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_shard(value: str) -> tuple[int, int]:
    """(K, N) of "K/N"; a UsageError (exit 2) names a malformed or out-of-range value."""
    m = _SPEC.match(str(value))
    if not m:
        raise UsageError(f"--shard must be K/N (this process's shard K of N, counted from 0, e.g. 0/4), not '{value}'")
    k, n = int(m.group(1)), int(m.group(2))
    if n < 1:
        raise UsageError(f"--shard {value}: N must be at least 1")
    if k >= n:
        raise UsageError(f"--shard {value}: K counts from 0, so it must be below N (0/{n} .. {n - 1}/{n})")
    return k, n


def check_shard(flag: str, value) -> Exception | None:
    """The option's check (compute.options)."""
    if value is None:
        return None
    try:
        parse_shard(value)
    except UsageError as err:
        return err
    return None


def shard_output(output: str, k: int, n: int) -> str:
    """The shard's store beside the output the user named: out.h5 -> out.shard-K-of-N.h5. Every task of a Slurm
    array can then pass the same -o, and the merged store takes the name the user gave."""
    stem, ext = os.path.splitext(output)
    return f"{stem}.shard-{k}-of-{n}{ext or '.h5'}"


def split_by_tokens(lengths: list[int], n: int) -> list[tuple[int, int]]:
    """N contiguous [start, stop) ranges of the examples whose token counts are as even as contiguity allows: cut k
    sits at the prefix sum closest to k/N of the tokens (ties: the earlier cut), so each shard is within one example's
    length of the ideal share. Every shard keeps at least one example (needs len(lengths) >= n)."""
    m = len(lengths)
    prefix = [0]
    for length in lengths:
        prefix.append(prefix[-1] + length)
    total = prefix[-1]
    cuts = [0]
    for k in range(1, n):
        target = total * k / n
        # the first index whose prefix sum reaches the target, or the one before it if that is closer
        lo, hi = 0, m
        while lo < hi:
            mid = (lo + hi) // 2
            if prefix[mid] < target:
                lo = mid + 1
            else:
                hi = mid
        cut = lo - 1 if lo > 0 and target - prefix[lo - 1] <= prefix[lo] - target else lo
        cuts.append(min(max(cut, cuts[-1] + 1), m - (n - k)))  # at least one example on each side
    cuts.append(m)
    return [(cuts[k], cuts[k + 1]) for k in range(n)]


def records_fingerprint(records) -> str:
    """sha256 of what the shards are cut from: every record's row, id, text, pair, label and evidence (works for hub
    datasets too, which have no file to hash)."""
    h = hashlib.sha256()
    for r in records:
        h.update(json.dumps([r.row, r.id, r.text, r.pair, r.label, r.evidence], ensure_ascii=False).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


@dataclass(frozen=True)
class ShardPlan:
    """One shard of a split run, as recorded in its store's provenance ("shard")."""

    k: int
    n: int
    start: int  # first example (index into the dataset after --limit)
    stop: int  # one past the last
    first_row: int  # source row numbers of the first and last example
    last_row: int
    n_examples_total: int  # examples of the whole run (after --limit)
    tokens: int  # tokens of this shard (after truncation)
    tokens_total: int
    fingerprint: str  # records_fingerprint of the whole run's records

    def as_dict(self) -> dict:
        return asdict(self)


def plan_shard(spec: str, records, lengths: list[int]) -> ShardPlan:
    """The shard ``spec`` ("K/N") of ``records`` whose tokenised lengths are ``lengths``."""
    k, n = parse_shard(spec)
    if n > len(records):
        raise UsageError(f"--shard {spec}: {n} shards of {len(records)} examples: use at most {len(records)} shards")
    start, stop = split_by_tokens(lengths, n)[k]
    return ShardPlan(k=k, n=n, start=start, stop=stop, first_row=records[start].row, last_row=records[stop - 1].row,
                     n_examples_total=len(records), tokens=sum(lengths[start:stop]), tokens_total=sum(lengths),
                     fingerprint=records_fingerprint(records))


def token_lengths(tokenizer, records, max_length: int) -> list[int]:
    """Each record's token count as the run truncates it (the cost of its forward and backward passes)."""
    if not records:
        return []
    pairs = [r.pair for r in records]
    second = pairs if all(p is not None for p in pairs) else None  # mixed pairs are refused by the batches stage
    enc = tokenizer([r.text for r in records], second, truncation=True, max_length=max_length, verbose=False)
    return [len(ids) for ids in enc["input_ids"]]
