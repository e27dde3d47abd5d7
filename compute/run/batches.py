"""Stage 4, batches: tokenise the records, cut them into windows of consecutive rows and, inside a window, into
length-sorted batches (less padding). A window is the commit unit: it is stored in the original order, so the store
is always a prefix of the dataset, which is what makes --resume simple."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..padding import pad_sequences
from ..data import Record
from ..errors import AttrscopeError
from ..models import LoadedModel


@dataclass
class Tokenized:
    input_ids: list[list[int]]
    token_type_ids: list[list[int]] | None
    offsets: list[list[tuple[int, int]]] | None
    segments: list[list[int]]
    n_orig: list[int]


def tokenize(lm: LoadedModel, records: list[Record], max_length: int) -> Tokenized:
    tok = lm.tokenizer
    texts = [r.text for r in records]
    pairs = [r.pair for r in records]
    has_pair = any(p is not None for p in pairs)
    if has_pair and any(p is None for p in pairs):
        raise AttrscopeError("some examples have a pair text and some do not: fill the pair column for every row")
    second = pairs if has_pair else None
    if not records:
        return Tokenized([], None, None, [], [])
    fast = getattr(tok, "is_fast", False)
    enc = tok(texts, second, truncation=True, max_length=max_length, return_offsets_mapping=fast,
              return_token_type_ids=True, verbose=False)
    full = tok(texts, second, truncation=False, verbose=False)["input_ids"]
    empty = next((r for r, ids in zip(records, enc["input_ids"]) if not ids), None)
    if empty is not None:
        raise AttrscopeError(f"example '{empty.id}' has no tokens (empty text and no special tokens): remove or fill it")
    segments = []
    for i in range(len(records)):
        seq = enc.sequence_ids(i) if fast else [0] * len(enc["input_ids"][i])
        segments.append([-1 if s is None else int(s) for s in seq])
    return Tokenized(
        input_ids=enc["input_ids"], token_type_ids=enc.get("token_type_ids"),
        offsets=enc["offset_mapping"] if fast else None, segments=segments, n_orig=[len(x) for x in full])


def matrix_bytes(tok: Tokenized, n_matrix_layers: list[int], store_dtype: str) -> int:
    """Bytes of the full [L, n, n] matrices before compression (``n_matrix_layers``: one entry per method)."""
    n_sq = sum(len(x) ** 2 for x in tok.input_ids)
    per = 2 if store_dtype == "float16" else 4
    return sum(n_sq * layers * per for layers in n_matrix_layers)


@dataclass(frozen=True)
class Window:
    start: int  # first row (index into the records of this run)
    batches: list[list[int]]  # row indices, each batch longest first


def windows(tok: Tokenized, batch_size: int, window: int) -> Iterator[Window]:
    lengths = [len(x) for x in tok.input_ids]
    size = batch_size * window
    for w0 in range(0, len(lengths), size):
        idx = list(range(w0, min(w0 + size, len(lengths))))
        idx.sort(key=lambda i: -lengths[i])  # longest first: an out-of-memory shows up at once
        yield Window(w0, [idx[b0:b0 + batch_size] for b0 in range(0, len(idx), batch_size)])


def encode(tok: Tokenized, batch: list[int], pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The padded model inputs of the rows ``batch``."""
    ids = [tok.input_ids[i] for i in batch]
    enc = {"input_ids": pad_sequences(ids, pad_id, device),
           "attention_mask": pad_sequences([[1] * len(s) for s in ids], 0, device)}
    if tok.token_type_ids is not None:
        enc["token_type_ids"] = pad_sequences([tok.token_type_ids[i] for i in batch], 0, device)
    return enc
