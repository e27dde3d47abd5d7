"""Evidence alignment by dot product (NormXLogit's BLiMP evaluation, METHODS.md 8.7 and 14.19).

How much of the attribution mass falls on the tokens the grammar says decide the answer (the evidence), after the
scores are turned into a distribution."""

from __future__ import annotations

import numpy as np

from ..errors import UsageError
from .base import EvalExample, Metric, MetricResult
from .spearman import check_choice

EXCLUDABLE = ("explained", "specials")


def parse_exclude(value) -> str:
    """The ``exclude`` setting as a canonical string: "none", "explained", "specials" or "explained+specials".
    Accepts those strings (any order, "+" or "," separated) or a list of the parts."""
    if value is None:
        parts: list[str] = []
    elif isinstance(value, str):
        parts = [p.strip() for p in value.replace(",", "+").split("+") if p.strip() and p.strip() != "none"]
    else:
        parts = [str(p) for p in value]
    bad = [p for p in parts if p not in EXCLUDABLE]
    if bad:
        raise UsageError(f"metric setting exclude={value!r}: '{bad[0]}' is not one of none, {', '.join(EXCLUDABLE)}")
    return "+".join(p for p in EXCLUDABLE if p in parts) or "none"


def evidence_view(ex: EvalExample, exclude: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The scores [m] and evidence [m] bool at the kept positions (the excluded ones removed from both ranking and
    score vector), or None where the metric is undefined: no evidence, or no evidence token among the kept ones."""
    if ex.evidence is None:
        return None
    scores = np.asarray(ex.scores, dtype=np.float64)  # [n]
    evidence = np.asarray(ex.evidence, dtype=bool)  # [n]
    if evidence.shape != scores.shape:
        raise ValueError(f"example {ex.id}: evidence has shape {evidence.shape}, expected {scores.shape}")
    keep = np.ones(scores.size, dtype=bool)
    if "specials" in exclude:
        keep &= ~np.asarray(ex.special, dtype=bool)
    if "explained" in exclude and 0 <= ex.explain_pos < scores.size:
        keep[ex.explain_pos] = False
    s, e = scores[keep], evidence[keep]
    if not e.any() or not np.isfinite(s).all():
        return None
    return s, e


def softmax(s: np.ndarray) -> np.ndarray:
    z = np.exp(s - s.max())
    return z / z.sum()


class EvidenceDotProduct(Metric):
    """Sum over the evidence positions of the normalised scores (higher = more mass on the evidence).

    Settings:
    * ``normalise``: "softmax" (NormXLogit/LogAt REF), "sum" (ALTI/GlobEnc in the same paper: scores divided by their
      sum; NaN where the sum is 0) or "auto" (default): softmax for signed methods, sum for non-negative ones. The
      caller passes ``signed`` (the method's ``Method.signed``); without it "auto" decides from the data (any negative
      score in any example = signed) and records the decision in ``settings["signed"]``.
    * ``exclude``: positions removed from both the ranking and the score vector before normalising: "none" (default),
      "explained" (the explained position: BLiMP's <mask> target, METHODS.md 8.7), "specials", or both
      ("explained+specials").
    NaN where the example has no evidence among the kept positions.
    ``curves[:, 0]`` holds each example's uniform-random baseline |evidence| / n_kept (``levels[:, 0]`` = n_kept), so
    the summary's "random" (their mean) is stored per example too and survives concatenating results."""

    name = "dot_product"
    description = "attribution mass on the evidence tokens after softmax / sum normalisation (BLiMP)"
    reference = "Abbasi et al., NormXLogit, evidence alignment; METHODS.md 8.7, 14.19"
    higher_is_better = True
    needs_evidence = True
    order = 90

    @classmethod
    def context_settings(cls, ctx):
        # a masked word's own position (the mask) is not a candidate for its evidence: METHODS.md 8.7 removes it
        explained = {"exclude": "explained"} if ctx.task == "masked-token" else {}
        return {"signed": ctx.signed, **explained}

    def __init__(self, normalise: str = "auto", exclude="none", signed: bool | None = None, **settings):
        super().__init__(normalise=check_choice("normalise", normalise, ("auto", "softmax", "sum")),
                         exclude=parse_exclude(exclude), signed=None if signed is None else bool(signed), **settings)

    def _mode(self, examples: list[EvalExample]) -> str:
        if self.settings["normalise"] != "auto":
            return self.settings["normalise"]
        if self.settings["signed"] is None:
            self.settings["signed"] = any(bool((np.asarray(ex.scores) < 0).any()) for ex in examples)
        return "softmax" if self.settings["signed"] else "sum"

    def evaluate(self, examples: list[EvalExample], predictor=None) -> MetricResult:
        mode = self._mode(examples)
        E = len(examples)
        values = np.full(E, np.nan)
        curves = np.full((E, 1), np.nan)  # uniform-random baseline per example
        levels = np.full((E, 1), -1, dtype=np.int64)  # n_kept
        for i, ex in enumerate(examples):
            view = evidence_view(ex, self.settings["exclude"])
            if view is None:
                continue
            s, e = view
            curves[i, 0] = e.sum() / e.size
            levels[i, 0] = e.size
            if mode == "softmax":
                p = softmax(s)
            else:
                total = s.sum()
                if total == 0:
                    continue
                p = s / total
            values[i] = p[e].sum()
        return MetricResult(values=values, curves=curves, levels=levels)

    def summary(self, result: MetricResult) -> dict:
        out = super().summary(result)
        out["random"] = random_baseline(result)
        return out


def random_baseline(result: MetricResult) -> float:
    """Mean of curves[:, 0] over the examples with a finite value (the per-example random baseline)."""
    v = np.asarray(result.values, dtype=np.float64)
    if result.curves is None:
        return float("nan")
    r = np.asarray(result.curves, dtype=np.float64)[:, 0]
    ok = np.isfinite(v) & np.isfinite(r)
    return float(r[ok].mean()) if ok.any() else float("nan")
