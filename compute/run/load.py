"""Stage 2, load: the model, its tokenizer and the dataset, and the checks that need them."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..data import Dataset, load_dataset
from ..errors import AttrscopeError, UsageError
from ..models import LoadedModel, load_model, resolve_device
from ..options import DEFAULT_MAX_NEW_TOKENS, UNKNOWN_SAMPLE
from ..tasks.generate import chat_prompt
from ..shards import ShardPlan, plan_shard, token_lengths
from .plan import RunPlan
from .progress import Progress


@dataclass(frozen=True)
class Loaded:
    lm: LoadedModel
    data: Dataset
    max_length: int  # truncation: --max-length, or what the model accepts
    shard: ShardPlan | None = None  # --shard: the rows of this process (data.records holds only those)
    run_records: list | None = None  # --shard: every record of the run (the head statistics read them all)


def load(plan: RunPlan, progress: Progress) -> Loaded:
    cfg = plan.cfg
    lm = load_model(cfg.model, device=resolve_device(cfg.device), dtype=cfg.dtype,
                    allow_random_head=cfg.allow_random_head, task=cfg.task)
    lm.task.options = task_options(cfg, lm.task.name)
    lm.task.check_target_mode(plan.target_mode)
    info = lm.info
    if info.get("random_head"):
        progress.message(f"--allow-random-head: {len(info['random_head'])} weights of the task head are random "
                         "(recorded in the store): the results explain no trained classifier")
    id2label = info["id2label"]
    data = load_dataset(
        plan.dataset, text_column=cfg.text_column, pair_column=cfg.pair_column, label_column=cfg.label_column,
        id_column=cfg.id_column, evidence_column=cfg.evidence_column, split=cfg.split, limit=cfg.limit,
        label2id={v: k for k, v in id2label.items()}, num_labels=len(id2label), **task_columns(cfg, lm))
    for note in data.notes:  # e.g. BLiMP pairs that differ in more than one word, skipped
        progress.message(note)
    if lm.task.name == "classification" and plan.target_mode == "label" and any(r.label < 0 for r in data.records):
        first = next(r for r in data.records if r.label < 0)
        raise AttrscopeError(f"--target label needs gold labels, but example '{first.id}' has none: use --target predicted")
    limit = max_length(cfg.max_length, lm)
    if lm.task.name == "generate":
        lm.task.options["max_length"] = limit  # a prompt leaves room for a token within it (Generate.prepare)
        if cfg.chat_template:
            data = replace(data, records=[replace(r, text=chat_prompt(lm.tokenizer, r.text, cfg.model))
                                          for r in data.records])
    unknown = unknown_share_error(lm.tokenizer, data.records, cfg.max_unknown_share, limit)
    if unknown is not None:
        raise unknown
    shard, run_records = None, None
    if cfg.shard is not None:  # cut after --limit, from the lengths the run will compute with
        run_records = data.records
        shard = plan_shard(cfg.shard, run_records, token_lengths(lm.tokenizer, run_records, limit))
        data = replace(data, records=run_records[shard.start:shard.stop])
    return Loaded(lm=lm, data=data, max_length=limit, shard=shard, run_records=run_records)


def unknown_share_error(tokenizer, records: list, max_share: float, max_length: int) -> AttrscopeError | None:
    """The error when more than ``max_share`` of the tokens of the first UNKNOWN_SAMPLE records' texts (and pair
    texts) are the tokenizer's unknown token: a tokenizer that does not know the words is a wrong setup, not a result
    (every example would read as [UNK]s). None for a tokenizer without an unknown token (byte-level BPE)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or max_share >= 1 or not records:
        return None
    sample = records[:UNKNOWN_SAMPLE]
    texts = [r.text for r in sample] + [r.pair for r in sample if r.pair is not None]
    ids = tokenizer(texts, add_special_tokens=False, truncation=True, max_length=max_length, verbose=False)["input_ids"]
    total = sum(map(len, ids))
    unknown = sum(x.count(unk) for x in ids)
    if total == 0 or unknown / total <= max_share:
        return None
    return AttrscopeError(
        f"{unknown} of the {total} tokens ({unknown / total:.0%}) of the first {len(sample)} examples' texts are the "
        f"unknown token '{tokenizer.unk_token}', more than --max-unknown-share allows (at most {max_share}): the "
        "tokenizer does not know the data's words (is it the model's own, with its files?): fix the model directory "
        "or the data, or pass --max-unknown-share 1 to run anyway")


def task_options(cfg, task: str) -> dict:
    """The task's options from the run's (recorded in the store)."""
    if task == "generate":
        contrast = cfg.contrast or ("column" if cfg.contrast_column else None)
        return {"max_new_tokens": None if cfg.continuation_column else cfg.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
                "do_sample": cfg.do_sample, "seed": cfg.seed if cfg.do_sample else None,
                "forced": cfg.continuation_column is not None, "chat_template": cfg.chat_template,
                "contrast": contrast}
    return {"regression_rank": cfg.regression_rank} if task == "regression" else {}


def task_columns(cfg, lm: LoadedModel) -> dict:
    """load_dataset's task arguments: the task, its mask token, the column flags."""
    return dict(task=lm.task.name, mask_token=getattr(lm.tokenizer, "mask_token", None),
                target_column=cfg.target_column, foil_column=cfg.foil_column,
                word_index_column=cfg.word_index_column, answers_column=cfg.answers_column,
                continuation_column=cfg.continuation_column, contrast_column=cfg.contrast_column)


def max_length(asked: int | None, lm: LoadedModel) -> int:
    """--max-length, at most the model's positions; by default the positions or the tokenizer's declared length,
    whichever is shorter (a tokenizer's model_max_length is its default truncation, not the model's limit: some
    checkpoints declare less than the model takes)."""
    positions = int(getattr(lm.model.config, "max_position_embeddings", 512))
    if lm.info["model_type"] in ("roberta", "xlm-roberta", "camembert"):
        positions -= 2  # positions start after padding_idx
    if asked is None:
        tok_max = getattr(lm.tokenizer, "model_max_length", positions) or positions
        return min(positions, tok_max if tok_max < 1_000_000 else positions)
    if asked > positions:
        raise UsageError(f"--max-length {asked} exceeds the model's {positions} positions (max_position_embeddings): "
                         f"use at most {positions}")
    return asked
