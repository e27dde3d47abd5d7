"""Stage 4b, generate (--task generate): a window's prompts continued (compute/generation.py; or the continuation
the data gives), the window's tokens made prompt + continuation, and a batch's steps (compute/run/steps.py). A
window is decoded in the run's batches, in dataset order: a resumed run decodes the window as the stopped run did."""

from __future__ import annotations

import torch

from ..generation import Decoding, decode, eos_ids
from ..models import LoadedModel
from ..options import DEFAULT_MAX_NEW_TOKENS
from ..tasks import TaskRows
from .batches import Tokenized
from .steps import Steps


def decoding(options: dict) -> Decoding:
    """The run's decoding, from the task's options (recorded in the store)."""
    return Decoding(max_new_tokens=options.get("max_new_tokens") or DEFAULT_MAX_NEW_TOKENS,
                    do_sample=bool(options.get("do_sample")), seed=options.get("seed") or 0)


def continued(lm: LoadedModel, records, tok: Tokenized, rows: TaskRows, batch_size: int,
              max_length: int) -> Tokenized:
    """The window's tokens with each prompt's continuation after it: the given one, else decoded (set in
    ``rows.info[i]["continuation"]``), at most what ``max_length`` leaves after the prompt."""
    todo = [i for i, info in enumerate(rows.info) if "continuation" not in info]
    how = decoding(lm.task.options)
    stop = eos_ids(lm.model, lm.tokenizer)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    for k in range(0, len(todo), batch_size):
        part = todo[k:k + batch_size]
        made = decode(lm.adapter, [tok.input_ids[i] for i in part], [records[i].row for i in part],
                      [max_length - len(tok.input_ids[i]) for i in part], how, stop, pad)
        for i, ids in zip(part, made):
            rows.info[i]["continuation"] = ids
    extra = [rows.info[i]["continuation"] for i in range(len(tok))]
    strings = iter(tok.tokens) if tok.tokens is not None else None
    tokens = None
    if strings is not None:  # each example's own strings, then its continuation's
        tokens = [s for ids, more in zip(tok.input_ids, extra)
                  for s in [next(strings) for _ in ids] + token_strings(lm.tokenizer.convert_ids_to_tokens, more)]
    return Tokenized(
        input_ids=[ids + more for ids, more in zip(tok.input_ids, extra)],
        token_type_ids=None if tok.token_type_ids is None else [t + [0] * len(more) for t, more in
                                                                zip(tok.token_type_ids, extra)],
        offsets=None if tok.offsets is None else [list(o) + [(-1, -1)] * len(more) for o, more in
                                                  zip(tok.offsets, extra)],
        segments=[s + [0] * len(more) for s, more in zip(tok.segments, extra)],
        n_orig=[n + len(more) for n, more in zip(tok.n_orig, extra)], tokens=tokens)


def token_strings(convert_ids_to_tokens, ids: list[int]) -> list[str]:
    """The tokens' strings; an id the model's vocabulary has beyond the tokenizer's (padded rows) as <id>."""
    return [s if s is not None else f"<{i}>" for i, s in zip(ids, convert_ids_to_tokens(list(ids)))]


def batch_steps(rows: TaskRows, batch: list[int], device: torch.device) -> Steps:
    """The steps of a batch's examples: their prompts' lengths, continuations and given foils."""
    infos = [rows.info[i] for i in batch]
    foils = [info["foils"] for info in infos] if any("foils" in info for info in infos) else None
    return Steps.of([rows.position[i] + 1 for i in batch], [info["continuation"] for info in infos], foils, device)
