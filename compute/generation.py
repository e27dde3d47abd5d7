"""Decoding a causal LM's continuations of prompts (--task generate): greedy, or sampled with a seed, batched with
left padding and a key-value cache, stopped at an end-of-sequence token (not kept) or after --max-new-tokens.

Each example's continuation depends on its own prompt only, never on the batch it is decoded in: the positions
count its own tokens (left padding shifts none), and a sample draws from a generator of its own, seeded by the
run's seed and the example's row. A run resumed after a stop therefore decodes what the stopped run did.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import torch

from . import interrupts


@dataclass(frozen=True)
class Decoding:
    max_new_tokens: int
    do_sample: bool = False
    seed: int = 0


def eos_ids(model, tokenizer) -> frozenset[int]:
    """The tokens that end a generation: the model's generation config's, its config's and the tokenizer's."""
    found: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        found.update([value] if isinstance(value, int) else list(value or []))
    return frozenset(found)


def cache_argument(model) -> str:
    """The keyword of ``model``'s key-value cache: transformers 5 renames past_key_values to cache."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def returned_cache(res):
    """The key-value cache a forward with use_cache returned (under either name)."""
    cache = getattr(res, "cache", None)
    return cache if cache is not None else res.past_key_values


@torch.no_grad()
def decode(adapter, prompts: list[list[int]], keys: list[int], room: list[int], decoding: Decoding,
           stop: frozenset[int], pad_id: int) -> list[list[int]]:
    """Each prompt's continuation by ``adapter``'s model (token ids, the end-of-sequence token left out): at most ``room[i]`` tokens (what
    the model's length leaves after prompt i) and --max-new-tokens. ``keys``: each example's sampling key (its row)."""
    model = adapter.model
    device = next(model.parameters()).device
    B = len(prompts)
    limit = [min(decoding.max_new_tokens, r) for r in room]
    out: list[list[int]] = [[] for _ in range(B)]
    if B == 0 or max(limit) <= 0:
        return out
    n = max(map(len, prompts))
    ids = torch.full((B, n), pad_id, dtype=torch.long)
    mask = torch.zeros(B, n, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, n - len(p):] = torch.as_tensor(p, dtype=torch.long)
        mask[b, n - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)  # each example's own positions (left padding shifts none)
    takes = inspect.signature(model.forward).parameters
    cache_arg = cache_argument(model)
    rngs = [np.random.default_rng([decoding.seed, k]) for k in keys] if decoding.do_sample else None
    done = [lim <= 0 for lim in limit]
    cache, step_ids, step_pos = None, ids, positions
    for _ in range(max(limit)):
        interrupts.check()
        kwargs = {"position_ids": step_pos} if "position_ids" in takes else {}  # ALiBi reads the mask instead
        with adapter.finite_masks():  # a left pad's query sees only pads: a float64 mask would make it NaN
            res = model(input_ids=step_ids, attention_mask=mask, use_cache=True, **{cache_arg: cache}, **kwargs)
        cache = returned_cache(res)
        logits = res.logits[:, -1].double()
        if rngs is None:
            chosen = logits.argmax(-1).tolist()
        else:  # inverse-CDF sampling from each example's own uniform draw
            cdf = torch.softmax(logits, -1).cumsum(-1).cpu()
            u = torch.as_tensor([rng.random() for rng in rngs], dtype=cdf.dtype)[:, None]
            chosen = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_max(cdf.shape[1] - 1)[:, 0].tolist()
        for b, tok in enumerate(chosen):
            if done[b]:
                continue
            if tok in stop:
                done[b] = True
            else:
                out[b].append(tok)
                done[b] = len(out[b]) >= limit[b]
        if all(done):
            break
        step_ids = torch.as_tensor(chosen, dtype=torch.long, device=device)[:, None]
        mask = torch.cat([mask, torch.ones(B, 1, dtype=mask.dtype, device=device)], 1)
        step_pos = step_pos[:, -1:] + 1
    return out
