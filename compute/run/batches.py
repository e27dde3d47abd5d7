"""Stage 4, batches: tokenise the records a window at a time (ahead, on a worker thread), cut each window of
consecutive rows into batches of about equal lengths within a token budget, and pad a batch's inputs. A window is
the commit unit: it is stored in the original order, so the store is always a prefix of the dataset, which is what
makes --resume simple."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import torch

from ..ahead import ahead
from ..data import Record
from ..errors import AttrscopeError
from ..models import LoadedModel
from ..padding import to_device

# Padding may add this much to a batch's sum of lengths, and to a part's sum of n**cost_exponent (compute/run/parts.py).
SLACK = 0.15


@dataclass
class Tokenized:
    """The tokenised examples: per example the lists the tokenizer gave, and the same as flat arrays (one row per
    token, ``starts[i]`` the first of example i) from which padded inputs and the store's per-example views are cut
    without a loop over examples."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]] | None
    offsets: list[list[tuple[int, int]]] | None
    segments: list[list[int]]
    n_orig: list[int]
    tokens: list[str] | None = None  # every token's string, flat (tokenize(strings=True))
    lengths: np.ndarray = field(init=False)  # [E] tokens of each example
    starts: np.ndarray = field(init=False)  # [E] its first row in the flat arrays
    flat_ids: np.ndarray = field(init=False)  # [T] int64
    flat_type_ids: np.ndarray | None = field(init=False)  # [T] int64
    flat_spans: np.ndarray = field(init=False)  # [T, 2] int32 character spans, -1 for special tokens or none
    flat_segments: np.ndarray = field(init=False)  # [T] int8: 0, 1 (the pair text), -1 special

    def __post_init__(self):
        self.lengths = np.fromiter(map(len, self.input_ids), dtype=np.int64, count=len(self.input_ids))
        self.starts = np.cumsum(self.lengths) - self.lengths
        total = int(self.lengths.sum())
        self.flat_ids = np.fromiter(chain.from_iterable(self.input_ids), dtype=np.int64, count=total)
        self.flat_type_ids = None if self.token_type_ids is None else np.fromiter(
            chain.from_iterable(self.token_type_ids), dtype=np.int64, count=total)
        self.flat_segments = np.fromiter(chain.from_iterable(self.segments), dtype=np.int8, count=total)
        if self.offsets is None:
            self.flat_spans = np.full((total, 2), -1, dtype=np.int32)
        else:
            self.flat_spans = np.fromiter(chain.from_iterable(chain.from_iterable(self.offsets)), dtype=np.int32,
                                          count=2 * total).reshape(total, 2)
            self.flat_spans[self.flat_segments < 0] = -1

    def __len__(self) -> int:
        return len(self.input_ids)


def tokenize(lm: LoadedModel, records: list[Record], max_length: int, strings: bool = False) -> Tokenized:
    """The records tokenised and truncated to ``max_length``; with ``strings`` also every token's string."""
    tok = lm.tokenizer
    texts = [r.text for r in records]
    pairs = [r.pair for r in records]
    has_pair = any(p is not None for p in pairs)
    if has_pair and any(p is None for p in pairs):
        raise AttrscopeError("some examples have a pair text and some do not: fill the pair column for every row")
    second = pairs if has_pair else None
    if not records:
        return Tokenized([], None, None, [], [], [] if strings else None)
    fast = getattr(tok, "is_fast", False)
    enc = tok(texts, second, truncation=True, max_length=max_length, return_offsets_mapping=fast,
              return_token_type_ids=True, verbose=False)
    ids = enc["input_ids"]
    empty = next((r for r, x in zip(records, ids) if not x), None)
    if empty is not None:
        raise AttrscopeError(f"example '{empty.id}' has no tokens (empty text and no special tokens): remove or "
                             "fill it")
    n_orig = [len(x) for x in ids]
    cut = [i for i, n in enumerate(n_orig) if n >= max_length]  # only these can have been truncated
    if cut:
        full = tok([texts[i] for i in cut], [second[i] for i in cut] if second else None, truncation=False,
                   verbose=False)["input_ids"]
        for i, x in zip(cut, full):
            n_orig[i] = len(x)
    segments = [[-1 if s is None else s for s in enc.sequence_ids(i)] if fast else [0] * len(x)
                for i, x in enumerate(ids)]
    tokens = None
    if strings:  # a fast tokenizer has them at hand (3x faster than looking every id up again)
        tokens = list(chain.from_iterable(e.tokens for e in enc.encodings)) if fast else \
            tok.convert_ids_to_tokens(list(chain.from_iterable(ids)))
    return Tokenized(input_ids=ids, token_type_ids=enc.get("token_type_ids"),
                     offsets=enc["offset_mapping"] if fast else None, segments=segments, n_orig=n_orig, tokens=tokens)


def tokenized_windows(lm: LoadedModel, records: list[Record], max_length: int, rows: int,
                      seconds: Callable[[float], None] = lambda _: None) -> Iterator[Tokenized]:
    """The records tokenised ``rows`` at a time (a window each, token strings included), each made on a worker
    thread while the run computes the window before; ``seconds`` is told what each took there."""
    def chunks() -> Iterator[Tokenized]:
        for w0 in range(0, len(records), rows):
            t0 = time.perf_counter()
            tok = tokenize(lm, records[w0:w0 + rows], max_length, strings=True)
            seconds(time.perf_counter() - t0)
            yield tok

    return ahead(chunks(), depth=1, name="attrscope-tokenizer")


def matrix_bytes(tok: Tokenized, n_matrix_layers: list[int], store_dtype: str) -> int:
    """Bytes of the full [L, n, n] matrices before compression (``n_matrix_layers``: one entry per method)."""
    n_sq = int((tok.lengths ** 2).sum())
    per = 2 if store_dtype == "float16" else 4
    return sum(n_sq * layers * per for layers in n_matrix_layers)


def batches(lengths: Sequence[int], batch_size: int, tokens: int, exponent: int = 1) -> list[list[int]]:
    """The rows 0..len(lengths)-1 in batches: sorted longest first (an out-of-memory shows up at once), cut where a
    batch would exceed ``batch_size`` examples, ``tokens`` padded tokens (examples x its longest; a longer example
    is a batch of its own), or pad its sum of n**exponent by more than SLACK (a length bucket; ``exponent``: the
    largest ``Method.cost_exponent`` of the run, so that no method pays more than SLACK for padding)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    cur: list[int] = []
    real = 0
    for i in order:
        n = int(lengths[i])
        if cur:
            b, longest = len(cur) + 1, int(lengths[cur[0]])
            padded = b * longest ** exponent
            if b > batch_size or b * longest > tokens or padded > (1 + SLACK) * (real + n ** exponent):
                out.append(cur)
                cur, real = [], 0
        cur.append(i)
        real += n ** exponent
    if cur:
        out.append(cur)
    return out


def parts(lengths: Sequence[int], exponent: int, tokens: int | None = None) -> list[slice]:
    """A batch's rows (``lengths`` longest first) in consecutive parts whose padded sum of n**exponent (rows x the
    part's longest**exponent) exceeds the real one by at most SLACK, and whose padded tokens stay within ``tokens``
    (None: no limit): the parts a method whose cost grows as n**exponent runs on. A batch cut for that exponent
    (``batches``) is one part unless ``tokens`` cuts it (a method's memory under --batch-size auto)."""
    out: list[slice] = []
    start, real = 0, 0
    for i, n in enumerate(lengths):
        n = int(n)
        b, longest = i - start + 1, int(lengths[start])
        if i > start and (b * longest ** exponent > (1 + SLACK) * (real + n ** exponent)
                          or tokens is not None and b * longest > tokens):
            out.append(slice(start, i))
            start, real = i, 0
        real += n ** exponent
    if len(lengths):
        out.append(slice(start, len(lengths)))
    return out


def encode(tok: Tokenized, rows: list[int], pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The padded model inputs of ``rows`` (right-padded to the longest), gathered from the flat arrays at once."""
    rows_ = np.asarray(rows, dtype=np.int64)
    lengths = tok.lengths[rows_]
    cols = np.arange(int(lengths.max()))
    real = cols[None, :] < lengths[:, None]
    at = np.minimum(tok.starts[rows_, None] + cols[None, :], len(tok.flat_ids) - 1)  # padding reads a real token
    enc = {"input_ids": np.where(real, tok.flat_ids[at], pad_id), "attention_mask": real.astype(np.int64)}
    if tok.flat_type_ids is not None:
        enc["token_type_ids"] = np.where(real, tok.flat_type_ids[at], 0)
    return {k: to_device(torch.from_numpy(v), device) for k, v in enc.items()}
