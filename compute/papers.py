"""The papers attrscope reproduces, as data: one entry per paper, keyed by its preset name.

For each paper: ``run``, the run preset (``attr-compute --preset NAME``: the class it explains and its reference
code's method conventions, METHODS.md 1.3 and 14), and ``tables``, its SST-2 results that ``attr-compute report``
sets beside ours (METHODS.md 12). The CLI's ``--preset`` choices are :data:`PRESET_NAMES`. A metric's own variant
per paper stays on the metric class (``Metric.presets``, keyed by these names); tests/test_papers.py checks that the
CLI, the metric presets, the report tables and this module agree. Pure data: imports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Paper:
    name: str  # the preset name (--preset, metric@name)
    run: dict  # target, pos_self, methods: {method: params}
    # Report tables: {"paper": title, "metric": base name, "preset": None or this paper's name (the metric variant
    # the paper's evaluation uses), "settings": stored settings the variant must have (absent = the default),
    # "values": {our method: paper's number}, "claim": the method the paper ranks first, "note": optional}
    tables: tuple[dict, ...] = ()


_GRAD_BASELINES = ("grad_l2", "gxi_l2", "gxi_mean", "ig_l2", "ig_mean")
_ALTI_TABLE2 = "ALTI (Ferrando et al. 2022), Table 2, BERT SST-2"

_LIST = (
    Paper(
        "alti",
        # ALTI's code drops the LayerNorm epsilon (14.1), measures its L1 distance with F.pairwise_distance (1e-6
        # added to every component; docs/departures.md) and row-normalises its "Norm Rollout" baseline (14.6); its
        # Captum baselines explain the softmax probability, feed the embedding output back through inputs_embeds
        # (14.4) and integrate over 100 steps (2.4).
        run={"target": "predicted", "methods": {
            "alti": {"eps_quirk": True, "pairwise_eps": 1e-6}, "alti_l2": {"eps_quirk": True},
            "norm_resln": {"row_normalise": True},
            **{m: {"output": "prob", "double_embedding": True} for m in _GRAD_BASELINES},
            **{m: {"output": "prob", "double_embedding": True, "steps": 100} for m in ("ig_l2", "ig_mean")}}},
        tables=(
            {"paper": _ALTI_TABLE2, "metric": "comprehensiveness", "preset": None, "settings": {"variant": "alti"},
             "values": {"grad_l2": .204, "ig_l2": .223, "ig_mean": .211, "gxi_l2": .199, "gxi_mean": .207,
                        "rollout": .074, "globenc": .174, "alti": .317, "alti_l2": .300, "norm_resln": .134},
             "claim": "alti",
             "note": "alti_l2 and 'Norms' (norm_resln, row-normalised under --preset alti) from Table 4"},
            {"paper": _ALTI_TABLE2, "metric": "sufficiency", "preset": None, "settings": {"variant": "alti"},
             "values": {"grad_l2": .076, "ig_l2": .084, "ig_mean": .112, "gxi_l2": .080, "gxi_mean": .073,
                        "rollout": .270, "globenc": .125, "alti": .044, "alti_l2": .045, "norm_resln": .180},
             "claim": "alti",
             "note": "alti_l2 and 'Norms' from Table 4"},
        )),
    Paper(
        "globenc",
        # GlobEnc's saliency (14.7): gold-class logit, gradient x input on the embedding output, L2 norm = gxi_l2.
        run={"target": "label", "methods": {"gxi_l2": {"output": "logit"}}},
        tables=(
            {"paper": "GlobEnc (Modarressi et al. 2022), Table 1, BERT-base SST-2 (Spearman with gradient x input)",
             "metric": "spearman", "preset": None,
             "values": {"w_fixedres": -0.24, "w_res": 0.19, "norm_n": 0.44, "norm_fixedres": 0.48, "norm_res": 0.73,
                        "norm_resln": -0.21, "globenc": 0.77},
             "claim": "globenc",
             "note": "W (raw attention product) has no method here"},
        )),
    Paper(
        "attcat",
        # AttCAT's explanation pass masks [CLS]/[SEP] as keys (14.9) and explains the gold label (14.10).
        run={"target": "label",
             "methods": {m: {"mask_specials": True} for m in ("cat", "attcat", "grads", "attgrads")}},
        tables=(
            {"paper": "AttCAT (Qiang et al. 2022), Table 1, BERT SST2 (AOPC, deletion)",
             "metric": "aopc", "preset": "attcat",
             "values": {"raw_attention": .331, "rollout": .286, "grads": .335, "attgrads": .351, "partial_lrp": .341,
                        "transatt": .354, "cat": .352, "attcat": .371},
             "claim": "attcat"},
            {"paper": "AttCAT (Qiang et al. 2022), Table 1, BERT SST2 (LOdds, [PAD] replacement)",
             "metric": "lodds", "preset": "attcat",
             "values": {"raw_attention": -.885, "rollout": -.641, "grads": -.252, "attgrads": -.603,
                        "partial_lrp": -.922, "transatt": -1.038, "cat": -1.115, "attcat": -1.319},
             "claim": "attcat"},
            {"paper": "AttCAT (Qiang et al. 2022), Table 2, SST2 (Kendall tau, lower = more class-confident)",
             "metric": "kendall", "preset": None,
             "values": {"grads": .150, "attgrads": .116, "partial_lrp": .955, "transatt": .336, "cat": .101,
                        "attcat": .018},
             "claim": "attcat"},
        )),
    Paper(
        "masklrp",
        # Mask-LRP's explanation pass masks [SEP] as a key (6.5); its statistics count offset 0 as positional and it
        # explains the gold label (14.14); its MGAE rolls out the attention relevance before the 1/2 of the A.V rule
        # (cam1_preserve in its BERT.py; docs/departures.md).
        run={"target": "label", "pos_self": "count",
             "methods": {**{m: {"mask_sep": True} for m in ("lrp", "partial_lrp", "transatt", "gae")},
                         "mask_lrp": {"mask_sep": True, "rollout_unhalved": True}}},
        tables=(
            {"paper": "Mask-LRP (Song et al. 2024), Table 1, BERT-base SST-2 (AOPC, [PAD])",
             "metric": "aopc", "preset": "masklrp",
             "values": {"raw_attention": .374, "rollout": .337, "lrp": .336, "partial_lrp": .396, "transatt": .423,
                        "attcat": .405, "mask_lrp": .438},
             "claim": "mask_lrp",
             "note": "the paper's 'GAE' is transatt (METHODS.md 14.13)"},
            {"paper": "Mask-LRP (Song et al. 2024), Table 1, BERT-base SST-2 (LOdds, [PAD])",
             "metric": "lodds", "preset": "masklrp",
             "values": {"raw_attention": -.992, "rollout": -.911, "lrp": -.888, "partial_lrp": -1.052,
                        "transatt": -1.171, "attcat": -1.110, "mask_lrp": -1.208},
             "claim": "mask_lrp",
             "note": "the paper's 'GAE' is transatt (METHODS.md 14.13)"},
        )),
    Paper(
        "normxlogit",
        # NormXLogit's Captum baselines: logits, inputs_embeds quirk, zero IG baseline (7.2).
        run={"target": "predicted", "methods": {
            **{m: {"double_embedding": True} for m in _GRAD_BASELINES},
            **{m: {"double_embedding": True, "baseline": "zero"} for m in ("ig_l2", "ig_mean")}}},
        tables=(
            {"paper": "NormXLogit (Abbasi et al.), Table 1, BERT SST-2 (AOPC, [MASK])",
             "metric": "aopc", "preset": "normxlogit",
             "values": {"grad_l2": .331, "gxi_mean": .339, "ig_mean": .367, "decompx": .574, "norm": .311,
                        "logat": .364, "normxlogit": .423},
             "claim": "decompx",
             "note": "Grad. Norm = grad_l2, GI = gxi_mean, IG = ig_mean (L1 aggregations in the paper's code); the "
                     "table lists DecompX (BERT only) above NormXLogit, whose claim is over the gradient methods"},
        )),
    Paper(
        "decompx",
        # DecompX's reference (mohsenfayyaz/DecompX, experiments/notebooks): every method explains the predicted
        # class (the classifier column of the logits' argmax; the gradient notebooks' prediction_based gradients of
        # that logit); Gradient x Input is gxi_l2's default (embedding output, L2). Its IG ("IG_ALL_ZERO_NORM") sums
        # the gradients at alpha = 0.1..1 from a zero baseline: the right Riemann sum of 10 steps up to its factor
        # 10 (its inner points go through inputs_embeds, embedded twice; not reproduced). ALTI came from ALTI's own
        # code (ALTI/run_alti.ipynb runs transformer-contributions), so it has --preset alti's quirks.
        run={"target": "predicted", "methods": {
            "gxi_l2": {"output": "logit"}, "ig_l2": {"baseline": "zero", "rule": "riemann", "steps": 10},
            "alti": {"eps_quirk": True, "pairwise_eps": 1e-6}}},
        tables=(
            {"paper": "DecompX (Modarressi et al. 2023), Table 1, BERT-base SST-2 (AOPC, [MASK], most important)",
             "metric": "aopc", "preset": "decompx",
             "values": {"globenc": .307, "alti": .416, "gxi_l2": .310, "ig_l2": .340, "decompx": .627,
                        "decompx_nohead": .288},
             "claim": "decompx",
             "note": "decompx_nohead from Table A.1 ('w/o Classification Head'); GlobEnc + FFN has no method here; "
                     "the paper's IG embeds 9 of its 10 points twice (inputs_embeds)"},
            {"paper": "DecompX (Modarressi et al. 2023), Table 1, BERT-base SST-2 (Accuracy, [MASK], most important)",
             "metric": "accuracy", "preset": "decompx",
             "values": {"globenc": .6714, "alti": .5765, "gxi_l2": .6669, "ig_l2": .6448, "decompx": .4080,
                        "decompx_nohead": .6993},
             "claim": "decompx",
             "note": "the paper prints percentages; decompx_nohead from Table A.1; GlobEnc + FFN has no method here"},
        )),
)

PAPERS: dict[str, Paper] = {p.name: p for p in _LIST}
PRESET_NAMES: tuple[str, ...] = tuple(PAPERS)  # --preset choices, in this order
PRESETS: dict[str, dict] = {name: p.run for name, p in PAPERS.items()}  # the run presets (runner.py)
REPORT_TABLES: list[dict] = [t for p in PAPERS.values() for t in p.tables]  # attr-compute report, in this order
