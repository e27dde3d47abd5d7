"""Stage 3, head masks: mask_lrp's head masks, made before the store is opened (the store holds them before it
switches to SWMR mode, and mask_lrp needs them from the first batch)."""

from __future__ import annotations

import os

from store import HeadMaskData

from ..data import load_dataset
from ..errors import AttrscopeError
from ..methods import Method
from ..options import DEFAULT_BATCH_SIZE
from .load import Loaded, task_columns
from .plan import RunPlan
from .progress import Progress


def attach_head_masks(plan: RunPlan, loaded: Loaded, methods: dict[str, Method],
                      progress: Progress) -> tuple[dict[str, Method], list[HeadMaskData]]:
    """The methods with mask_lrp given its head mask, and the masks to store. A bare --methods all on a machine
    without a dependency parser skips mask_lrp with a message instead, --methods default silently."""
    if "mask_lrp" not in methods:
        return methods, []
    cfg = plan.cfg
    try:
        masks = head_masks(plan, loaded, progress)
    except AttrscopeError as err:
        if not plan.every_method or cfg.parses or cfg.head_mask or cfg.head_stats_data:
            raise
        if plan.announce_skips:
            progress.message(f"--methods all: skipping mask_lrp ({err})")
        return {name: m for name, m in methods.items() if name != "mask_lrp"}, []
    methods["mask_lrp"].params["head_mask"] = next(h for h in masks if h.name == "mask_lrp").mask.tolist()
    methods["mask_lrp"].check_architecture(loaded.lm.adapter)
    return methods, masks


def head_masks(plan: RunPlan, loaded: Loaded, progress: Progress) -> list[HeadMaskData]:
    """The resumed store's own masks, another store's (--head-mask), or a statistics pass."""
    from ..head_pass import HeadPassOptions, compute_head_masks, masks_from_store

    cfg, lm = plan.cfg, loaded.lm
    L, H = lm.adapter.n_layers, lm.adapter.n_heads
    if cfg.resume:
        return masks_from_store(plan.output, L, H)
    if cfg.head_mask:
        if not os.path.exists(cfg.head_mask):
            raise AttrscopeError(f"--head-mask: store '{cfg.head_mask}' not found: check the path")
        return masks_from_store(cfg.head_mask, L, H)
    # under --shard, the statistics of the whole run, so that every shard gets the same masks
    records = loaded.run_records if loaded.run_records is not None else loaded.data.records
    source = loaded.data.source
    if cfg.head_stats_data:
        id2label = lm.info["id2label"]
        other = load_dataset(cfg.head_stats_data, text_column=cfg.text_column, pair_column=cfg.pair_column,
                             label_column=cfg.label_column, id_column=cfg.id_column, split=cfg.split,
                             limit=cfg.head_stats_limit, label2id={v: k for k, v in id2label.items()},
                             num_labels=len(id2label), **task_columns(cfg, lm))
        records, source = other.records, other.source
    if cfg.head_stats_limit is not None:
        records = records[:cfg.head_stats_limit]
    # --batch-size auto is probed with the methods, after this pass; the pass (a forward only) takes the default
    batch_size = DEFAULT_BATCH_SIZE if cfg.batch_size == "auto" else cfg.batch_size
    opt = HeadPassOptions(source=source, batch_size=batch_size, max_length=loaded.max_length, parses=cfg.parses,
                          exclude_self=plan.pos_self == "exclude", combine=cfg.mask_combine,
                          mask_sep=bool(plan.method_params["mask_lrp"].get("mask_sep")))
    return compute_head_masks(lm, records, opt, progress=progress)
