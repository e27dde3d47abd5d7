"""The head-statistics pass of ``attr-compute`` (Mask-LRP, METHODS.md 6.1): run the model over a dataset, count where
every head's attention peaks, and turn the counts into the positional, syntactic and combined head masks that
``mask_lrp`` propagates through. Runs before the main loop, because the store must hold the masks before it switches
to SWMR mode and ``mask_lrp`` needs them from the first batch."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from store import HeadMaskData, open_store

from . import interrupts
from .padding import pad_sequences
from .data import Record
from .errors import AttrscopeError
from .head_stats import HeadStatistics, align_dependencies, argmax_keys, combine_masks
from .methods._internals.gradients import kept_keys
from .parses import load_parses
from .run.progress import Progress, bar


@dataclass
class HeadPassOptions:
    source: str  # dataset the statistics come from (recorded)
    batch_size: int = 32
    max_length: int = 512
    parses: str | None = None  # CoNLL-U file; None: spaCy
    exclude_self: bool = True  # positional offset 0 excluded (the paper); False: counted (the reference)
    mask_sep: bool = False  # [SEP] masked as a key, as the reference's explanation pass (METHODS.md 6.5)
    combine: str = "union"  # "union" (the reference) | "sum" (the paper)
    pos_threshold: float = 0.8
    synt_margin: float = 0.1


def compute_head_masks(lm, records: list[Record], opt: HeadPassOptions, message=None,
                       progress: Progress | None = None) -> list[HeadMaskData]:
    """Parse the texts, run the model over ``records`` in length-sorted batches (no gradients), count, and build
    the three masks with their statistics and provenance. ``progress``: the bar of the examples counted;
    ``message`` (default: the progress's) says what the masks hold."""
    progress = progress or Progress()
    message = message or progress.message
    if not records:
        raise AttrscopeError("the head-statistics dataset is empty: pass --head-stats-data with examples")
    t0 = time.perf_counter()
    texts = [r.text for r in records]
    pairs = [r.pair for r in records] if any(r.pair is not None for r in records) else None
    parses = load_parses([r.id for r in records], texts, pairs, opt.parses)
    t_parse = time.perf_counter() - t0

    tok = lm.tokenizer
    if not getattr(tok, "is_fast", False):
        raise AttrscopeError("head statistics need a fast tokenizer (character offsets): use a model whose tokenizer "
                             "has a tokenizer.json")
    enc = tok(texts, pairs, truncation=True, max_length=opt.max_length, return_offsets_mapping=True,
              return_token_type_ids=True, verbose=False)
    adapter = lm.adapter
    device = next(lm.model.parameters()).device
    stats = HeadStatistics(adapter.n_layers, adapter.n_heads)
    order = sorted(range(len(records)), key=lambda i: -len(enc["input_ids"][i]))
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    t1 = time.perf_counter()
    with bar(progress, len(records), "head statistics"):
        for b0 in range(0, len(order), opt.batch_size):
            interrupts.check()  # a stop asked for: between batches
            rows = order[b0:b0 + opt.batch_size]
            ids = [enc["input_ids"][i] for i in rows]
            batch = {"input_ids": pad_sequences(ids, pad_id, device),
                     "attention_mask": pad_sequences([[1] * len(x) for x in ids], 0, device),
                     "token_type_ids": pad_sequences([enc["token_type_ids"][i] for i in rows], 0, device)}
            aligned = []
            for i in rows:
                seg = np.array([-1 if s is None else s for s in enc.sequence_ids(i)])
                spans = np.asarray(enc["offset_mapping"][i], dtype=np.int64)
                spans[seg < 0] = -1
                aligned.append(align_dependencies(parses.by_example[i], spans, seg))
            real = batch["attention_mask"].bool()
            if opt.mask_sep:  # as the explanation pass of the LRP methods (Explained.mask_sep)
                batch["attention_mask"] = kept_keys(real, adapter.sep_mask(batch["input_ids"], real)).long()
            with torch.no_grad():
                cap = adapter.capture(batch, frozenset({"attentions"}))
            stats.update(argmax_keys(cap.attentions), real, aligned)
            progress.advance(len(rows))
    t_model = time.perf_counter() - t1

    pos = stats.positional_mask(threshold=opt.pos_threshold, exclude_self=opt.exclude_self)
    syn = stats.syntactic_mask(parses.offset_distributions(), margin=opt.synt_margin)
    comb = combine_masks(pos, syn, opt.combine)
    common = {"dataset": opt.source, "n_examples": len(records), "mask_sep": opt.mask_sep,
              "seconds_parse": round(t_parse, 3), "seconds_model": round(t_model, 3)}
    pos.attrs.update(common)
    syn.attrs.update({**common, "parser": parses.provenance()})
    comb.attrs.update({**common, "n_positional": int(pos.mask.sum()), "n_syntactic": int(syn.mask.sum())})
    message(f"head statistics over {len(records)} examples ({parses.parser} parses, {t_parse:.1f} s; model "
            f"{t_model:.1f} s): {int(pos.mask.sum())} positional, {int(syn.mask.sum())} syntactic, "
            f"{int((comb.mask > 0).sum())} heads in the mask_lrp mask")
    return [pos, syn, comb]


def masks_from_store(path: str, n_layers: int, n_heads: int) -> list[HeadMaskData]:
    """The head masks of another store (``--head-mask STORE.h5``), checked against the model's shape."""
    with open_store(path) as s:  # a missing or damaged store: its StoreError is the message
        names = s.head_masks
        if "mask_lrp" not in names:
            raise AttrscopeError(f"store '{path}' holds no mask_lrp head mask: make one with "
                                 "attr-compute --methods mask_lrp")
        out = []
        for name in names:
            hm = s.head_mask(name)
            out.append(HeadMaskData(name=name, mask=np.asarray(hm), arrays=dict(hm.stats),
                                    attrs={**hm.attrs, "copied_from": path}))
    shape = out[0].mask.shape
    if shape != (n_layers, n_heads):
        raise AttrscopeError(f"the head masks in '{path}' are {shape[0]} x {shape[1]} but the model has {n_layers} "
                             f"layers x {n_heads} heads: compute them with this model")
    return out
