"""The papers' reference conventions (METHODS.md 1.3 and 14): per ``--preset``, the class each paper explains
and its methods' parameters."""

from __future__ import annotations

# Reference conventions per paper (METHODS.md 1.3 and 14): the class each paper explains and method parameters.
_GRAD_BASELINES = ("grad_l2", "gxi_l2", "gxi_mean", "ig_l2", "ig_mean")
PRESETS: dict[str, dict] = {
    # ALTI's code drops the LayerNorm epsilon (14.1), measures its L1 distance with F.pairwise_distance (1e-6 added
    # to every component; docs/departures.md) and row-normalises its "Norm Rollout" baseline (14.6); its Captum
    # baselines explain the softmax probability, feed the embedding output back through inputs_embeds (14.4) and
    # integrate over 100 steps (2.4).
    "alti": {"target": "predicted", "methods": {
        "alti": {"eps_quirk": True, "pairwise_eps": 1e-6}, "alti_l2": {"eps_quirk": True},
        "norm_resln": {"row_normalise": True},
        **{m: {"output": "prob", "double_embedding": True} for m in _GRAD_BASELINES},
        **{m: {"output": "prob", "double_embedding": True, "steps": 100} for m in ("ig_l2", "ig_mean")}}},
    # GlobEnc's saliency (14.7): gold-class logit, gradient x input on the embedding output, L2 norm = gxi_l2.
    "globenc": {"target": "label", "methods": {"gxi_l2": {"output": "logit"}}},
    # AttCAT's explanation pass masks [CLS]/[SEP] as keys (14.9) and explains the gold label (14.10).
    "attcat": {"target": "label", "methods": {m: {"mask_specials": True}
                                              for m in ("cat", "attcat", "grads", "attgrads")}},
    # Mask-LRP's explanation pass masks [SEP] as a key (6.5); its statistics count offset 0 as positional and it
    # explains the gold label (14.14); its MGAE rolls out the attention relevance before the 1/2 of the A.V rule
    # (cam1_preserve in its BERT.py; docs/departures.md).
    "masklrp": {"target": "label", "pos_self": "count",
                "methods": {**{m: {"mask_sep": True} for m in ("lrp", "partial_lrp", "transatt", "gae")},
                            "mask_lrp": {"mask_sep": True, "rollout_unhalved": True}}},
    # NormXLogit's Captum baselines: logits, inputs_embeds quirk, zero IG baseline (7.2).
    "normxlogit": {"target": "predicted", "methods": {
        **{m: {"double_embedding": True} for m in _GRAD_BASELINES},
        **{m: {"double_embedding": True, "baseline": "zero"} for m in ("ig_l2", "ig_mean")}}},
}
