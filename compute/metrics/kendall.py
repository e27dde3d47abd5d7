"""Kendall-tau class confidence (AttCAT, METHODS.md 8.3 and 14.11).

A class-confident explanation ranks tokens differently for the explained class than for the other classes, so a LOW
tau between the two attributions is better."""

from __future__ import annotations

import numpy as np

from .base import EvalExample, Metric, MetricResult
from .spearman import check_choice


def _signs(x: np.ndarray) -> np.ndarray:
    """sign(x_i - x_j) for every pair, by comparison (no overflow on huge values). [..., n] -> [..., n, n] int8."""
    a = x[..., :, None]
    b = x[..., None, :]
    return (a > b).astype(np.int8) - (a < b).astype(np.int8)


def tau_b(x: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Kendall tau-b of x [n] with each row of Y [K, n] (scipy.stats.kendalltau's default variant). -> [K].

    tau_b = (concordant - discordant) / sqrt((n0 - tx)(n0 - ty)), n0 = n(n-1)/2 pairs, tx / ty = pairs tied in x / y.
    NaN where x or a row of Y is constant or n < 2. O(n^2) memory per row; n <= 512 here."""
    x = np.asarray(x, dtype=np.float64)
    Y = np.atleast_2d(np.asarray(Y, dtype=np.float64))
    n = x.size
    if n < 2 or not (np.isfinite(x).all() and np.isfinite(Y).all()):
        return np.full(Y.shape[0], np.nan)
    sx = _signs(x)  # [n, n]
    sy = _signs(Y)  # [K, n, n]
    s = (sy.reshape(len(Y), -1).astype(np.float64) @ sx.reshape(-1).astype(np.float64)) / 2.0  # pairs count twice
    n0 = n * (n - 1) / 2.0
    tx = ((sx == 0).sum() - n) / 2.0  # the diagonal is not a pair
    ty = ((sy == 0).sum(axis=(1, 2)) - n) / 2.0
    den = np.sqrt((n0 - tx) * (n0 - ty))
    with np.errstate(invalid="ignore", divide="ignore"):
        tau = np.where(den > 0, s / np.where(den > 0, den, 1.0), np.nan)
    return np.clip(tau, -1.0, 1.0)


class KendallTau(Metric):
    """Mean over the other classes of Kendall's tau between the explained class's attribution and each other class's.

    Needs per-class scores (``EvalExample.class_scores`` [C, n], a store made with --target all); NaN without them.
    Settings:
    * ``cls``: "label" (AttCAT's REF explains and compares the gold class; NaN where there is no gold label, -1) or
      "predicted".
    * ``form``: "argsort" (REF: tau-b between the ARGSORT INDEX ARRAYS argsort(-E_c) and argsort(-E_o), numpy's default
      sort kind as in the REF, exactly scipy.stats.kendalltau(np.argsort(-a), np.argsort(-b))) or "rank" (tau-b
      between the score vectors themselves, ties handled as tau-b). The two differ in general: the argsort arrays list
      positions in rank order, so the first compares which positions come at each rank, the second the rank each
      position gets.
    * ``exclude_specials``: drop special tokens from both vectors first (default False: the REF keeps every position).
    Multi-class: the tau is averaged over every class o != c. For 2 classes that is the REF's o = 1 - gold; the REF's
    "1 - label" (class -1 = the last class for gold 2 on MNLI, and never class 1) is a bug and is not reproduced."""

    name = "kendall"
    description = "Kendall tau between the explained and the other classes' token rankings (lower = class-specific)"
    reference = "Qiang et al. (2022) AttCAT, Kendall-tau confidence; METHODS.md 8.3, 14.11"
    higher_is_better = False
    order = 60
    needs_class_scores = True

    def __init__(self, cls: str = "label", form: str = "argsort", exclude_specials: bool = False, **settings):
        super().__init__(cls=check_choice("cls", cls, ("label", "predicted")),
                         form=check_choice("form", form, ("argsort", "rank")),
                         exclude_specials=bool(exclude_specials), **settings)

    def example_value(self, ex: EvalExample) -> float:
        if ex.class_scores is None:
            return float("nan")
        E = np.asarray(ex.class_scores, dtype=np.float64)  # [C, n]
        c = int(ex.label if self.settings["cls"] == "label" else ex.pred)
        if E.ndim != 2 or E.shape[0] < 2 or not 0 <= c < E.shape[0]:
            return float("nan")
        if self.settings["exclude_specials"]:
            E = E[:, ~np.asarray(ex.special, dtype=bool)]
        if self.settings["form"] == "argsort":
            E = np.argsort(-E, axis=-1).astype(np.float64)  # [C, n] positions in rank order, per class
        others = np.delete(E, c, axis=0)  # [C-1, n]
        tau = tau_b(E[c], others)
        return float(tau.mean()) if np.isfinite(tau).all() else float("nan")

    def evaluate(self, examples: list[EvalExample], predictor=None) -> MetricResult:
        return MetricResult(values=np.array([self.example_value(ex) for ex in examples], dtype=np.float64))
