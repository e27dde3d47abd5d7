"""Cost of the authors' TransAtt code (Chefer et al. 2021a, hila-chefer/Transformer-Explainability) beside attrscope's
transatt and mask_lrp, each relative to a bare forward + backward of the model at the same batch size, in one run.

    python benchmarks/lrp_reference_cost.py --ref-src DIR            # DIR: a checkout of Transformer-Explainability
    python benchmarks/lrp_reference_cost.py --ref-src DIR --limit 100 --repeat 3 --batch-sizes 32,1

The first --limit SST-2 dev sentences, length-sorted and padded per batch as attr-compute does. Per batch the sweep
times the bare forward + backward (bench_methods' bare_forward_backward: the stock model from its input embeddings,
gradient of the predicted logit to them), attrscope's capture forward and each method's compute on it (as
bench_methods times them; mask_lrp with every other head kept); at batch size 1 also the authors'
Generator.generate_LRP(start_layer=0) (their BERT notebook's call: forward, backward, relprop, gradient x relevance
per head, rollout) on the same sentence, which runs one example at a time, and the forward + backward it starts
with, alone (the rest is its relprop and rollout). Each figure is the median of --repeat sweeps after one warm-up
sweep; ratios are over the bare forward + backward at the same batch size.

The authors' BERT_explainability package is imported from a temporary copy whose imports are replaced for
transformers 5 (it targets 3.x/4.x): BertPreTrainedModel is given back 4.x's init_weights (5.x's post_init),
get_extended_attention_mask and get_head_mask; the unused PaddedSequence import (it pulls in gensim) becomes the
SequenceClassifierOutput import the file lacks; and the generator's one_hot.cuda() runs on the logits' device. The
shared model's safetensors weights are loaded into their BertForSequenceClassification (HF BERT's parameter names).

Before timing: their logits against the stock model's for every sentence, and for the first --check sentences their
TransAtt row against attrscope's transatt (batched): the per-layer maps mean_h (grad x R^A)^+, and the final scores
without [CLS] (its entry is a convention: the row's minimum in theirs, 0 in attrscope), each vector divided by its sum.
Once as timed (both float32) and once with their model in float64 against attrscope's dtype=float64, which tells
float32 rounding from a different computation.

--threads (default 1): torch threads; the machine's cores are shared with other work, one thread keeps ratios steady.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
SHARED = REPO.parent / "shared"

from bench_methods import bare_forward_backward  # noqa: E402

from compute.data import load_dataset  # noqa: E402
from compute.methods import get_method  # noqa: E402
from compute.models import load_model  # noqa: E402

# transformers 5's BertPreTrainedModel with what the authors' BertModel calls from 4.x's
COMPAT = '''import torch
import transformers


class BertPreTrainedModel(transformers.BertPreTrainedModel):
    def init_weights(self):  # 4.x's entry point; 5.x's post_init calls init_weights back
        if self.__dict__.get("_in_post_init"):
            return super().init_weights()
        self.__dict__["_in_post_init"] = True
        try:
            self.post_init()
        finally:
            self.__dict__["_in_post_init"] = False

    def get_extended_attention_mask(self, mask, shape, device=None):
        return (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min

    def get_head_mask(self, head_mask, n):
        return [None] * n


PreTrainedModel = transformers.PreTrainedModel
'''


def _patch(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if old not in text:
        raise SystemExit(f"{path}: expected text not found (another version of the reference?): {old!r}")
    path.write_text(text.replace(old, new))


def reference_classes(ref_src: Path):
    """The authors' BertForSequenceClassification and Generator, from a patched temporary copy."""
    tmp = Path(tempfile.mkdtemp())
    shutil.copytree(ref_src / "BERT_explainability", tmp / "BERT_explainability")
    (tmp / "te_compat.py").write_text(COMPAT)
    bert = tmp / "BERT_explainability/modules/BERT"
    _patch(bert / "BERT.py", "from transformers import (\n    BertPreTrainedModel,\n    PreTrainedModel,\n)",
           "from te_compat import BertPreTrainedModel, PreTrainedModel")
    _patch(bert / "BertForSequenceClassification.py", "from transformers import BertPreTrainedModel",
           "from te_compat import BertPreTrainedModel")
    _patch(bert / "BertForSequenceClassification.py",
           "from BERT_rationale_benchmark.models.model_utils import PaddedSequence",
           "from transformers.modeling_outputs import SequenceClassifierOutput")
    _patch(bert / "ExplanationGenerator.py", "one_hot.cuda()", "one_hot.to(output.device)")
    sys.path.insert(0, str(tmp))
    from BERT_explainability.modules.BERT.BertForSequenceClassification import BertForSequenceClassification
    from BERT_explainability.modules.BERT.ExplanationGenerator import Generator

    return BertForSequenceClassification, Generator


def reference_model(classes, model_dir: Path, dtype=torch.float32):
    """The authors' classifier with the shared model's weights (in ``dtype``), and their Generator on it."""
    from safetensors.torch import load_file
    from transformers import BertConfig

    BertForSequenceClassification, Generator = classes
    model = BertForSequenceClassification(BertConfig.from_pretrained(model_dir)).eval()
    missing, unexpected = model.load_state_dict(load_file(model_dir / "model.safetensors"), strict=False)
    if set(missing) != {"bert.embeddings.position_ids"} or unexpected:
        raise SystemExit(f"weights do not fit the reference model: missing {missing}, unexpected {unexpected}")
    emb = model.bert.embeddings  # a buffer the checkpoint does not hold
    emb.position_ids = torch.arange(emb.position_embeddings.num_embeddings)[None]
    model.to(dtype)
    return model, Generator(model)


def batches_of(tokenizer, texts, size):
    """Length-sorted padded batches (as attr-compute and bench_methods make them)."""
    enc = tokenizer(texts, truncation=True, max_length=512)
    order = sorted(range(len(texts)), key=lambda i: -len(enc["input_ids"][i]))
    out = []
    for b0 in range(0, len(order), size):
        idx = order[b0:b0 + size]
        out.append(dict(tokenizer.pad({"input_ids": [enc["input_ids"][i] for i in idx]}, return_tensors="pt")))
    return out


def reference_maps(ref):
    """The per-layer maps generate_LRP rolled out, read back from the attention modules (its own expression)."""
    maps = []
    for blk in ref.bert.encoder.layer:
        grad, cam = blk.attention.self.get_attn_gradients(), blk.attention.self.get_attn_cam()
        n = cam.shape[-1]
        maps.append((grad[0].reshape(-1, n, n) * cam[0].reshape(-1, n, n)).clamp(min=0).mean(dim=0))
    return torch.stack(maps).detach()


def reference_forward_backward(ref, batch) -> None:
    """The part of generate_LRP before its relprop: their model's forward (hooks saving every layer's input and the
    attention gradients) and the predicted logit's backward, which also fills every parameter's .grad."""
    logits = ref(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])[0]
    ref.zero_grad()
    logits[0, logits[0].argmax()].backward(retain_graph=True)


def check(lm, classes, model_dir, ref, gen, texts, n_check):
    tok, model, ad = lm.tokenizer, lm.model, lm.adapter
    worst, same = 0.0, 0
    for t in texts:  # with grad: the authors' forward hooks the attention probabilities' gradient
        one = tok(t, return_tensors="pt")
        theirs = ref(input_ids=one["input_ids"], attention_mask=one["attention_mask"])[0].detach()
        with torch.no_grad():
            stock = model(**one).logits
        worst = max(worst, (theirs - stock).abs().max().item())
        same += int(theirs.argmax() == stock.argmax())
    print(f"logits, authors' model vs stock model, {len(texts)} sentences at batch 1: max abs diff {worst:.3e}, "
          f"same predicted class {same}/{len(texts)}")

    sub = texts[:n_check]
    batch = dict(tok.pad({"input_ids": tok(sub)["input_ids"]}, return_tensors="pt"))
    # float64 twins: what is left between them is float32 rounding
    gens = {"float32": gen, "float64": reference_model(classes, model_dir, torch.float64)[1]}
    print(f"\nTransAtt, authors' generate_LRP(start_layer=0) at batch 1 vs attrscope transatt (first {n_check} "
          "sentences as one padded batch); float32: the reference as run and attrscope's default (the timed pair), "
          "float64: the reference's model in float64 and attrscope's dtype=float64")
    print("| precision | sentence | tokens | maps max abs diff / max abs | scores Spearman "
          "| scores max abs diff (L1-normalised) |")
    print("|---|---|---|---|---|---|")
    for prec, g in gens.items():
        m = get_method("transatt", **({"dtype": "float64"} if prec == "float64" else {}))
        with torch.no_grad():
            cap = ad.capture(batch, m.needs)
            res = m.compute(cap, ad, cap.pred)
        for b, t in enumerate(sub):
            n = int(cap.lengths[b])
            one = tok(t, return_tensors="pt")
            row = g.generate_LRP(one["input_ids"], one["attention_mask"], start_layer=0)[0].detach().double()
            maps = reference_maps(g.model).double()
            ours_maps = res.matrices[b, :, :n, :n].double()
            map_diff = ((maps - ours_maps).abs().max() / maps.abs().max()).item()
            theirs_s, ours_s = row[1:].numpy(), res.scores[b, 1:n].double().numpy()  # [CLS] left out
            theirs_s, ours_s = theirs_s / theirs_s.sum(), ours_s / ours_s.sum()
            rho = spearmanr(theirs_s, ours_s).statistic
            print(f"| {prec} | {b} | {n} | {map_diff:.2e} | {rho:.6f} | {np.abs(theirs_s - ours_s).max():.2e} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref-src", type=Path, required=True, help="a checkout of hila-chefer/Transformer-Explainability")
    ap.add_argument("--model", type=Path, default=SHARED / "models" / "minilm-sst2")
    ap.add_argument("--data", default=str(SHARED / "data" / "sst2" / "dev.tsv"))
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batch-sizes", default="32,1", help="attrscope's batch sizes (the authors' code runs at 1)")
    ap.add_argument("--check", type=int, default=5, help="sentences of the TransAtt agreement check")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the machine's cores are shared)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    lm = load_model(str(args.model), device=torch.device("cpu"))
    model, ad = lm.model, lm.adapter
    data = load_dataset(args.data, limit=args.limit, label2id={v: k for k, v in lm.info["id2label"].items()},
                        num_labels=lm.info["num_labels"])
    texts = [r.text for r in data.records]
    classes = reference_classes(args.ref_src)
    ref, gen = reference_model(classes, args.model)
    check(lm, classes, args.model, ref, gen, texts, args.check)

    sizes = [int(s) for s in args.batch_sizes.split(",")]
    batches = {bs: batches_of(lm.tokenizer, texts, bs) for bs in sizes}
    half = [[(l + h) % 2 for h in range(ad.n_heads)] for l in range(ad.n_layers)]
    methods = {"transatt": get_method("transatt"), "mask_lrp": get_method("mask_lrp", head_mask=half)}
    needs = frozenset().union(*(m.needs for m in methods.values()))

    def sweep():
        t = {}

        def add(key, t0):
            t[key] = t.get(key, 0.0) + time.perf_counter() - t0

        for bs in sizes:
            for batch in batches[bs]:
                t0 = time.perf_counter()
                bare_forward_backward(model, batch)
                add((bs, "bare fwd + bwd"), t0)
                with torch.no_grad():
                    t0 = time.perf_counter()
                    cap = ad.capture(batch, needs)
                    add((bs, "attrscope capture forward"), t0)
                    for name, m in methods.items():
                        cap.memo.clear()
                        t0 = time.perf_counter()
                        m.compute(cap, ad, cap.pred)
                        add((bs, f"attrscope {name}"), t0)
                if bs == 1:
                    t0 = time.perf_counter()
                    gen.generate_LRP(batch["input_ids"], batch["attention_mask"], start_layer=0)
                    add((bs, "authors' TransAtt"), t0)
                    t0 = time.perf_counter()
                    reference_forward_backward(ref, batch)
                    add((bs, "authors' fwd + bwd alone"), t0)
        return t

    sweep()  # warm-up
    runs = [sweep() for _ in range(args.repeat)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"\n{len(texts)} sentences, {torch.get_num_threads()} torch thread(s), CPU, median of {args.repeat} sweeps")
    print("| batch | timed | seconds | x bare fwd+bwd | (capture + method) / bare fwd+bwd |")
    print("|---|---|---|---|---|")
    for (bs, key), v in med.items():
        base = med[(bs, "bare fwd + bwd")]
        total = ""
        if key.startswith("attrscope ") and key != "attrscope capture forward":
            total = f"{(med[(bs, 'attrscope capture forward')] + v) / base:.3f}"
        print(f"| {bs} | {key} | {v:.3f} | {v / base:.3f} | {total} |")


if __name__ == "__main__":
    main()
