"""decompx and value_zeroing against their authors' procedures on the shared model (docs/methods.md).

    python benchmarks/successors_reference.py decompx --ref-src DIR   # DIR: a checkout of mohsenfayyaz/DecompX
    python benchmarks/successors_reference.py value_zeroing

attrscope runs the first --limit SST-2 dev sentences as one padded float32 batch. For each example the table gives
the Spearman correlation of the two score vectors and the largest absolute difference (and that over the largest
|reference| value).

decompx: the authors' src/modeling_bert.py is imported from a temporary copy whose transformers imports are replaced
by equivalents (it was written for transformers 4.18: apply_chunking_to_forward moved, the docstring decorators and
head-pruning helpers are not needed, get_extended_attention_mask and get_head_mask are given back to BertModel, the
non-persistent position_ids buffer is refilled); its logits are checked against the stock model's. It runs one
sentence at a time with the paper's configuration (biases "absdot", LN1, FFN "GeLU_ZO", LN2, vector aggregation,
classifier with pooler, "ZO").

value_zeroing: the authors' modelling file also targets transformers 4.x; its procedure is run here instead: per
example, layer and token, the model is run again with that token's value-module output zeroed (a hook where the
authors edit the file), sklearn's cosine_distances against the real layer output, rows normalised, layers multiplied
without residual. Twice: as published (scoring/value_zeroing.py hands sklearn the float32 arrays the model made, and
sklearn keeps float32, so 1 - cos is computed in float32), and with the arrays cast to float64.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = REPO.parent / "shared"

from compute.adapters import adapter_for  # noqa: E402
from compute.methods import get_method  # noqa: E402


def load(model_dir: Path, limit: int):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, attn_implementation="eager").eval()
    with open(SHARED / "data" / "sst2" / "dev.tsv") as f:
        sentences = [r["sentence"] for r in csv.DictReader(f, delimiter="\t")][:limit]
    return tok, model, sentences


def report(name: str, pairs) -> None:
    rhos = [spearmanr(o, r).statistic for o, r in pairs]
    diffs = [np.abs(o - r).max() for o, r in pairs]
    rel = [np.abs(o - r).max() / np.abs(r).max() for o, r in pairs]
    print(f"| {name} | {np.mean(rhos):.6f} | {np.min(rhos):.6f} | {max(diffs):.2e} | {max(rel):.2e} |")


def header() -> None:
    print("| compared | mean Spearman | min Spearman | max abs diff | max diff / max abs ref |")
    print("|---|---|---|---|---|")


def reference_decompx_model(ref_src: Path, model_dir: Path):
    tmp = Path(tempfile.mkdtemp())
    pkg = tmp / "decompx_ref"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    shutil.copy(ref_src / "src" / "decompx_utils.py", pkg / "decompx_utils.py")
    text = (ref_src / "src" / "modeling_bert.py").read_text()
    start = text.index("from transformers.modeling_utils import (")
    end = text.index("from transformers.models.bert.configuration_bert import BertConfig")
    shim = ("from transformers.modeling_utils import PreTrainedModel\n"
            "from transformers.pytorch_utils import apply_chunking_to_forward\n"
            "from transformers.utils import ModelOutput, logging\n"
            "def find_pruneable_heads_and_indices(*a, **k): raise NotImplementedError\n"
            "def prune_linear_layer(*a, **k): raise NotImplementedError\n"
            "def _keep(*a, **k): return lambda f: f\n"
            "add_code_sample_docstrings = add_start_docstrings = add_start_docstrings_to_model_forward = _keep\n"
            "replace_return_docstrings = _keep\n")
    (pkg / "modeling_bert.py").write_text(text[:start] + shim + text[end:])
    sys.path.insert(0, str(tmp))
    import decompx_ref.modeling_bert as mb
    from decompx_ref.decompx_utils import DecompXConfig

    def extended_mask(self, mask, shape, device=None, dtype=None):
        return (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min

    mb.BertModel.get_extended_attention_mask = extended_mask
    mb.BertModel.get_head_mask = lambda self, head_mask, n, *a, **k: [None] * n
    model = mb.BertForSequenceClassification.from_pretrained(model_dir).eval()
    emb = model.bert.embeddings
    emb.position_ids = torch.arange(emb.position_embeddings.num_embeddings)[None]
    emb.token_type_ids = torch.zeros_like(emb.position_ids)
    config = DecompXConfig(include_biases=True, bias_decomp_type="absdot", include_LN1=True, include_FFN=True,
                           FFN_approx_type="GeLU_ZO", include_LN2=True, aggregation="vector",
                           include_classifier_w_pooler=True, tanh_approx_type="ZO", output_all_layers=True,
                           output_aggregated="norm", output_pooler="norm", output_classifier=True)
    return model, config


@torch.no_grad()
def compare_decompx(args) -> None:
    tok, model, sentences = load(args.model, args.limit)
    ref_model, config = reference_decompx_model(args.ref_src, args.model)
    ad = adapter_for(model)
    enc = dict(tok(sentences, return_tensors="pt", padding=True))
    dx, nohead = get_method("decompx"), get_method("decompx_nohead")
    cap = ad.capture(enc, dx.needs)
    every, ours, free = dx.compute_classes(cap, ad, 2), dx.compute(cap, ad, cap.pred), nohead.compute(cap, ad, cap.pred)
    rows = {"pred": [], "all": [], "final": [], "layers": []}
    for b, s in enumerate(sentences):
        n = int(cap.lengths[b])
        one = tok(s, return_tensors="pt")
        logits, _, last, layers = ref_model(**one, return_dict=False, output_hidden_states=True,
                                            output_attentions=False, decompx_config=config)
        assert torch.allclose(logits, model(**one).logits, atol=1e-5), "the reference model's logits differ"
        cls = last.classifier[0].numpy()  # [n, C]
        norms = np.stack([a[0].numpy() for a in layers.aggregated])[:, 0]  # [L, n]: the [CLS] row per layer
        rows["pred"].append((ours.scores[b, :n].numpy(), cls[:, int(cap.pred[b])]))
        rows["all"].append((every[b, :, :n].numpy().T.ravel(), cls.ravel()))
        rows["final"].append((free.scores[b, :n].numpy(), norms[-1]))
        rows["layers"].append((free.layer_scores[b, :, :n].numpy().ravel(), norms.ravel()))
    header()
    report("decompx, predicted class's logit shares", rows["pred"])
    report("decompx, every class's logit shares", rows["all"])
    report("decompx_nohead, final norms", rows["final"])
    report("decompx layer views (norms, every layer)", rows["layers"])


@torch.no_grad()
def compare_value_zeroing(args) -> None:
    """Against the authors' procedure twice: as published (the layer outputs go to sklearn's cosine_distances as the
    float32 arrays the model made, so 1 - cos is computed in float32) and with the same arrays cast to float64."""
    from sklearn.metrics.pairwise import cosine_distances

    tok, model, sentences = load(args.model, args.limit)
    ad = adapter_for(model)
    enc = dict(tok(sentences, return_tensors="pt", padding=True))
    m = get_method("value_zeroing")
    cap = ad.capture(enc, m.needs)
    res = m.compute(cap, ad, cap.pred)
    rows = {kind: {"final": [], "views": [], "matrices": []} for kind in ("published", "float64")}
    for b in range(len(sentences)):
        n = int(cap.lengths[b])
        one = {k: v[b:b + 1, :n] for k, v in enc.items()}
        hidden = model(**one, output_hidden_states=True).hidden_states
        mats = {kind: [] for kind in rows}
        for l, layer in enumerate(ad.layers()):
            real = hidden[l + 1][0].numpy()  # float32, as the authors' script hands it to sklearn
            D = {kind: np.zeros((n, n)) for kind in rows}
            for j in range(n):
                def zero(_m, _i, out, j=j):
                    out = out.clone()
                    out[:, j] = 0
                    return out
                hook = ad.value_module(layer).register_forward_hook(zero)
                try:
                    new = model(**one, output_hidden_states=True).hidden_states[l + 1][0].numpy()
                finally:
                    hook.remove()
                D["published"][:, j] = cosine_distances(new, real).diagonal()
                D["float64"][:, j] = cosine_distances(new.astype(np.float64), real.astype(np.float64)).diagonal()
            for kind in rows:
                mats[kind].append(D[kind] / D[kind].sum(-1, keepdims=True))
        e = int(cap.explain_pos[b])
        for kind, C in mats.items():
            R, views = C[0], [C[0][e]]
            for M in C[1:]:
                R = M @ R
                views.append(R[e])
            rows[kind]["final"].append((res.scores[b, :n].double().numpy(), R[e]))
            rows[kind]["views"] += [(res.layer_scores[b, l, :n].double().numpy(), v) for l, v in enumerate(views)]
            rows[kind]["matrices"].append((res.matrices[b, :, :n, :n].double().numpy().ravel(), np.stack(C).ravel()))
    header()
    for kind, label in (("published", "as published (float32 cosine_distances)"),
                        ("float64", "with the arrays cast to float64")):
        report(f"value_zeroing, final scores; authors' procedure {label}", rows[kind]["final"])
        report(f"value_zeroing, layer views (each layer's row); {label}", rows[kind]["views"])
        report(f"value_zeroing, per-layer matrices; {label}", rows[kind]["matrices"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("method", choices=("decompx", "value_zeroing"))
    ap.add_argument("--ref-src", type=Path, help="decompx: a checkout of mohsenfayyaz/DecompX")
    ap.add_argument("--model", type=Path, default=SHARED / "models" / "minilm-sst2")
    ap.add_argument("--limit", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.method == "decompx":
        if args.ref_src is None:
            ap.error("decompx needs --ref-src DIR (a checkout of mohsenfayyaz/DecompX)")
        compare_decompx(args)
    else:
        compare_value_zeroing(args)


if __name__ == "__main__":
    main()
