"""Shared machinery of the perturbation metrics (METHODS.md 8.1, 8.2): ranking, level lists, perturbed sequences and
the one predictor call.

Every metric works on all its examples at once: the examples are padded into [E, N] arrays, each (example, level) pair
becomes one row, rows that an example repeats (short inputs give equal levels) run once, and all rows of all examples
go to the model in a single :class:`~compute.metrics.base.Predictor` call, which sorts and chunks them. Only small
per-example index arrays are built in Python; nothing loops over tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import AttrscopeError
from .base import EvalExample, Predictor

ALTI_BINS = (0.01, 0.05, 0.1, 0.2, 0.5)  # ALTI REF aupc.py --bins: 1% included although the paper writes {5..50}
N_LEVELS = 9  # AOPC / LOdds / accuracy: 9 perturbation levels (i/9 or 10..90%)


@dataclass
class Padded:
    """Examples as padded arrays, so masks and gathers run over all of them at once."""

    tokens: np.ndarray  # [E, N] int64, 0 beyond n
    valid: np.ndarray  # [E, N] bool: position < n
    scores: np.ndarray  # [E, N] float64, NaN beyond n
    n: np.ndarray  # [E] int64
    explain_pos: np.ndarray  # [E] int64
    special: np.ndarray  # [E, N] bool
    words: np.ndarray | None = None  # [E, 2] target and foil token of word-prediction tasks (None: other tasks)


def pad_examples(examples: list[EvalExample]) -> Padded:
    E = len(examples)
    n = np.array([len(ex.token_ids) for ex in examples], dtype=np.int64)
    N = int(n.max()) if E else 0
    valid = np.arange(N)[None, :] < n[:, None]  # [E, N]
    tokens = np.zeros((E, N), dtype=np.int64)
    scores = np.full((E, N), np.nan)
    special = np.zeros((E, N), dtype=bool)
    if E:
        # One concatenation per array, scattered through the valid mask (row-major = example order, then position).
        tokens[valid] = np.concatenate([np.asarray(ex.token_ids, dtype=np.int64).reshape(-1) for ex in examples])
        scores[valid] = np.concatenate([np.asarray(ex.scores, dtype=np.float64).reshape(-1) for ex in examples])
        special[valid] = np.concatenate([np.asarray(ex.special, dtype=bool).reshape(-1) for ex in examples])
    explain_pos = np.array([ex.explain_pos for ex in examples], dtype=np.int64)
    words = np.array([(ex.target_token, ex.foil_token) for ex in examples], dtype=np.int64).reshape(E, 2)
    return Padded(tokens, valid, scores, n, explain_pos, special, words if (words[:, 0] >= 0).any() else None)


# ---------------------------------------------------------------------------------------------------------------- ranking
def ranked_order(scores: np.ndarray, valid: np.ndarray, protected: np.ndarray, descending: bool = True,
                 skip_last: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions by importance, protected ones removed.

    The ALTI REF sorts scipy's dense ranks descending with a stable sort; dense ranks are a monotone relabelling of
    the scores with equal scores sharing a rank, so a stable sort of the scores themselves gives the same order
    (ties: lower position first). NaN scores count as -inf (least important). ``descending=False`` puts the least
    important first (AttCAT's bottom-k%). ``skip_last``: the AttCAT / Mask-LRP selection loop scans the ranking of ALL
    n positions but stops before its last entry, so the position ranked last overall is never selected (it is dropped
    here unless it is protected anyway).

    scores, valid, protected: [E, N]. Returns order [E, N] (positions, -1 padded), rank_of [E, N] (index of each
    position in ``order``, -1 for protected and pad positions) and m [E] (number of ranked positions).
    """
    E, N = scores.shape
    s = np.where(np.isnan(scores), -np.inf, scores)
    key = np.where(valid, -s if descending else s, np.inf)  # pads last; stable sort keeps real ties before them
    full = np.argsort(key, axis=1, kind="stable")  # [E, N] all positions, most perturbed first
    excluded = protected | ~valid
    if skip_last:
        n = valid.sum(1)
        has = np.nonzero(n > 0)[0]
        excluded = excluded.copy()
        excluded[has, full[has, n[has] - 1]] = True
    keep = ~np.take_along_axis(excluded, full, axis=1)  # [E, N] in ranked order
    order = np.take_along_axis(full, np.argsort(~keep, axis=1, kind="stable"), axis=1)  # kept ones first, in order
    m = keep.sum(1).astype(np.int64)
    order = np.where(np.arange(N)[None, :] < m[:, None], order, -1)
    rank_of = np.full((E, N), -1, dtype=np.int64)
    e, r = np.nonzero(order >= 0)
    rank_of[e, order[e, r]] = r
    return order, rank_of, m


def protected_mask(P: Padded, protect: str) -> np.ndarray:
    """[E, N] positions never perturbed. "cls_sep": every special token (AttCAT, Mask-LRP) and the explained position;
    "cls": the explained position only (NormXLogit: [SEP] can be masked); "ends": positions 0 and n-1 by position
    (ALTI REF aupc.py, which re-adds [CLS] and the final [SEP]; a pair's middle [SEP] is ranked like any token)."""
    pos = np.arange(P.tokens.shape[1])[None, :]
    explained = pos == P.explain_pos[:, None]
    if protect == "cls_sep":
        return (P.special | explained) & P.valid
    if protect == "cls":
        return explained & P.valid
    if protect == "ends":  # the explained position too (a masked LM's mask; [CLS] or the last token otherwise)
        return ((pos == 0) | (pos == P.n[:, None] - 1) | explained) & P.valid
    raise AttrscopeError(f"unknown protect '{protect}': use cls_sep or cls")


# ----------------------------------------------------------------------------------------------------------------- levels
def alti_levels(m: np.ndarray) -> np.ndarray:
    """[E] -> [E, 6]: j = [0] + [ceil(m * b) for b in ALTI_BINS], the same float64 products as the REF's Python."""
    m = np.asarray(m, dtype=np.int64)
    j = np.ceil(m[:, None].astype(np.float64) * np.array(ALTI_BINS)).astype(np.int64)
    return np.concatenate([np.zeros((len(m), 1), dtype=np.int64), j], axis=1)


def ninths_levels(n_total: np.ndarray) -> np.ndarray:
    """[E] -> [E, 9]: round(i / 9 * n_total), i = 1..9 (AttCAT, Mask-LRP; n_total counts the special tokens).
    np.round rounds half to even like Python's round, on the same float64 expression."""
    n = np.asarray(n_total, dtype=np.int64)
    return np.round(np.arange(1, 10) / 9 * n[:, None]).astype(np.int64)


def tenths_levels(n_total: np.ndarray) -> np.ndarray:
    """[E] -> [E, 9]: int(n_total * i / 10), i = 1..9 (NormXLogit's 10..90%; the product is exact, so no float
    surprises from 0.1 * i)."""
    n = np.asarray(n_total, dtype=np.int64)
    return ((n[:, None] * np.arange(1, 10)) / 10).astype(np.int64)


DECOMPX_RATIOS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # DecompX REF analysis_v3.ipynb MASKING_RATIOS


def ranked_tenths_levels(m: np.ndarray) -> np.ndarray:
    """[E] -> [E, 9]: floor(m * r), r = 0.1..0.9, m = the ranked (perturbable) tokens (DecompX REF: [CLS] and [SEP]
    never ranked, so the base is the sentence's other tokens); the same float64 products as the REF's Python."""
    m = np.asarray(m, dtype=np.int64)
    return np.floor(m[:, None].astype(np.float64) * np.array(DECOMPX_RATIOS)).astype(np.int64)


LEVELS = {"ninths": ninths_levels, "tenths": tenths_levels, "ranked_tenths": ranked_tenths_levels}
RANKED_BASE = {"ranked_tenths"}  # level schemes counted on the ranked tokens m, not on the whole length n


def running(p: np.ndarray, kind: str) -> np.ndarray:
    """ALTI REF monotone curves over the levels (axis 1): "min" = running minimum from 1 (comprehensiveness),
    "max" = running maximum from 0 (sufficiency). Probabilities lie in [0, 1], so the start values never win."""
    acc = np.minimum if kind == "min" else np.maximum
    return acc.accumulate(p, axis=1)


# ------------------------------------------------------------------------------------------------------- perturbed rows
def plan_rows(counts: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct (example, count) pairs of the examples with ``ok``, so a repeated level runs once.

    counts: [E, K] number of ranked positions each level takes; ok: [E]. Returns row_ex [R], row_count [R] and
    row_of [E, K] (the row of each level, -1 for examples not evaluated)."""
    E, K = counts.shape
    base = int(counts.max()) + 1 if counts.size else 1
    key = np.arange(E, dtype=np.int64)[:, None] * base + counts  # [E, K]
    sel = np.broadcast_to(np.asarray(ok, dtype=bool)[:, None], (E, K))
    uniq, inv = np.unique(key[sel], return_inverse=True)
    row_of = np.full((E, K), -1, dtype=np.int64)
    row_of[sel] = inv.reshape(-1)
    return uniq // base, uniq % base, row_of


def drop_mask(rank_of: np.ndarray, row_ex: np.ndarray, row_count: np.ndarray, keep_top: bool = False) -> np.ndarray:
    """[R, N] positions each row perturbs. keep_top=False: the first ``count`` ranked positions (comprehensiveness,
    AOPC); keep_top=True: every ranked position except the first ``count`` (sufficiency). Protected and pad
    positions are never in it."""
    r = rank_of[row_ex]  # [R, N]
    top = (r >= 0) & (r < row_count[:, None])
    return ((r >= 0) & ~top) if keep_top else top


def _split(flat: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    """Cut a flat array into consecutive pieces of ``lengths`` [R] (np.split of zero pieces would return one)."""
    return np.split(flat, np.cumsum(lengths)[:-1]) if len(lengths) else []


def delete(P: Padded, row_ex: np.ndarray, drop: np.ndarray) -> list[np.ndarray]:
    """Deletion: the kept positions of each row, compacted in their original order (protected ones, e.g. [CLS] and
    [SEP], stay where they are). Boolean indexing of the [R, N] matrix reads row-major, so one split cuts the rows."""
    keep = P.valid[row_ex] & ~drop  # [R, N]
    return _split(P.tokens[row_ex][keep], keep.sum(1))


def replace(P: Padded, row_ex: np.ndarray, drop: np.ndarray, token_id: int) -> list[np.ndarray]:
    """Replacement by ``token_id`` ([PAD] or [MASK]), length kept."""
    seq = np.where(drop, np.int64(token_id), P.tokens[row_ex])  # [R, N]
    return _split(seq[P.valid[row_ex]], P.n[row_ex])


def explained_where(P: Padded, row_ex: np.ndarray, drop: np.ndarray, deleted: bool) -> np.ndarray | None:
    """[R, 3] per perturbed row: where the explained position went (deletion moves it left by the dropped tokens
    before it; it is never dropped itself) and the example's target and foil tokens. None outside word-prediction
    tasks (the predictor reads the classifier's output)."""
    if P.words is None:
        return None
    pos = P.explain_pos[row_ex]
    if deleted:
        before = np.arange(drop.shape[1])[None, :] < pos[:, None]
        pos = pos - (drop & before).sum(1)
    return np.concatenate([pos[:, None], P.words[row_ex]], axis=1)


def attend_masks(sequences: list[np.ndarray], convention: str = "all") -> list[np.ndarray]:
    """Per sequence the positions the perturbed pass attends to: all of them, explicitly, so a predictor never
    derives a mask from [PAD] ids.

    "all" (AttCAT, Mask-LRP: replaced [PAD]s attended) and "original" (NormXLogit: the example's own mask, replaced
    positions stay attended) give the same masks here: stored examples hold no padding, and the batch padding the
    Predictor adds is always masked. Deletion has nothing to choose."""
    if convention not in ("all", "original"):
        raise AttrscopeError(f"unknown attend '{convention}': use all or original")
    lengths = np.array([len(s) for s in sequences], dtype=np.int64)
    return _split(np.ones(int(lengths.sum()), dtype=bool), lengths)


def chosen_probabilities(predictor: Predictor, sequences: list[np.ndarray], attend: list[np.ndarray] | None,
                         row_of: np.ndarray, cls: np.ndarray,
                         where: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """ONE predictor call over every row. Returns p [E, K]: probability of each example's class ``cls`` [E] at each
    level (NaN where row_of is -1), and top [E, K]: the argmax class of the row (-1 there). ``where``: the rows'
    explained positions and words (explained_where), for word-prediction tasks."""
    E, K = row_of.shape
    p = np.full((E, K), np.nan)
    top = np.full((E, K), -1, dtype=np.int64)
    if not sequences:
        return p, top
    if predictor is None:
        raise AttrscopeError("this metric perturbs inputs and needs a model (Predictor); none was given")
    raw = predictor(sequences, attend) if where is None else predictor(sequences, attend, where)
    probs = np.asarray(raw, dtype=np.float64)  # [R, C]
    if probs.ndim != 2 or probs.shape[0] != len(sequences):
        raise AttrscopeError(f"predictor returned shape {probs.shape} for {len(sequences)} sequences (want [R, C])")
    has = row_of >= 0
    c = np.broadcast_to(np.asarray(cls, dtype=np.int64)[:, None], (E, K))
    if np.any(has & ((c < 0) | (c >= probs.shape[1]))):
        raise AttrscopeError(f"class index outside the model's {probs.shape[1]} classes")
    p[has] = probs[row_of[has], c[has]]
    top[has] = probs.argmax(1)[row_of[has]]
    return p, top


# --------------------------------------------------------------------------------------- comprehensiveness / sufficiency
def alti_deletion(examples: list[EvalExample], predictor: Predictor, sufficiency: bool):
    """ALTI REF aupc.py: rank the tokens between position 0 and n-1, build the 6 deletion levels, run them.

    Returns (p [E, 6] raw probability of the predicted class per level, f [E] = p of the full re-encoded input,
    j [E, 6] levels, -1 where m == 0). Sufficiency adds one row per example for f (= keep all m ranked tokens)."""
    P = pad_examples(examples)
    E = len(examples)
    _, rank_of, m = ranked_order(P.scores, P.valid, protected_mask(P, "ends"))
    j = alti_levels(m)  # [E, 6]
    ok = m > 0
    counts = np.concatenate([j, m[:, None]], axis=1) if sufficiency else j  # [E, 7] or [E, 6]
    row_ex, row_count, row_of = plan_rows(counts, ok)
    drop = drop_mask(rank_of, row_ex, row_count, keep_top=sufficiency)
    seqs = delete(P, row_ex, drop)
    pred = np.array([ex.pred for ex in examples], dtype=np.int64).reshape(E)
    p, _ = chosen_probabilities(predictor, seqs, attend_masks(seqs), row_of, pred,
                                explained_where(P, row_ex, drop, deleted=True))
    f = p[:, 6] if sufficiency else p[:, 0]
    return p[:, :6], f, np.where(ok[:, None], j, -1)


# ---------------------------------------------------------------------------------------- AOPC / LOdds / accuracy
LEVEL_CHOICES = {
    "levels": tuple(LEVELS),
    "perturbation": ("delete", "pad", "mask"),
    "protect": ("cls_sep", "cls"),
    "cls": ("label", "predicted"),
    "side": ("top", "bottom"),
    "attend": ("all", "original"),
}
LEVEL_DEFAULTS = {"levels": "ninths", "perturbation": "delete", "protect": "cls_sep", "cls": "predicted",
                  "side": "top", "attend": "all", "skip_last": None, "pad_id": None, "mask_id": None}


# The settings of the perturbation-curve metrics that --perturbation, --levels, --metric-class and --side set.
LEVEL_OVERRIDES = ("perturbation", "levels", "cls", "side")


def token_id_settings(ctx) -> dict:
    """What perturbing by [PAD] / [MASK] needs from the run's tokenizer (a MetricContext): pad_id, and mask_id where
    the tokenizer has a mask token."""
    return {"pad_id": ctx.pad_id, **({"mask_id": ctx.mask_id} if ctx.mask_id is not None else {})}


def resolve_settings(metric: str, given: dict, defaults: dict, presets: dict) -> dict:
    """Defaults, then the preset, then the caller's settings; every key filled in (the store records them).
    skip_last None -> True for "ninths" (the AttCAT / Mask-LRP loop), False for "tenths"."""
    given = dict(given)
    preset = given.pop("preset", None)
    if preset is not None and preset not in presets:
        raise AttrscopeError(f"{metric}: unknown preset '{preset}': use one of {', '.join(presets)}")
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise AttrscopeError(f"{metric}: unknown setting(s) {', '.join(unknown)}: known are {', '.join(defaults)}")
    s = {**defaults, **(presets[preset] if preset else {}), **given}
    for k, choices in LEVEL_CHOICES.items():
        if k in s and s[k] not in choices:
            raise AttrscopeError(f"{metric}: {k} must be one of {', '.join(choices)}, not {s[k]!r}")
    if s.get("skip_last") is None:
        s["skip_last"] = s["levels"] == "ninths"
    for k in ("skip_last", "absolute"):
        if k in s:
            s[k] = bool(s[k])
    s["preset"] = preset
    return s


@dataclass
class LevelCurves:
    p0: np.ndarray  # [E] probability of the chosen class, unperturbed
    pk: np.ndarray  # [E, 9] the same after perturbing level k
    top: np.ndarray  # [E, 9] argmax class after perturbing, -1 where not evaluated
    counts: np.ndarray  # [E, 9] tokens actually perturbed, -1 where not evaluated
    ok: np.ndarray  # [E] evaluated


def level_curves(examples: list[EvalExample], predictor: Predictor, s: dict, cls: np.ndarray,
                 metric: str) -> LevelCurves:
    """AOPC-style curves (METHODS.md 8.2): the unperturbed row and 9 levels of k most (or least) important tokens
    perturbed, k capped at the perturbable tokens. cls [E]: the class whose probability is read (-1: not evaluated)."""
    if s["perturbation"] != "delete":
        id_key = f"{s['perturbation']}_id"
        if s[id_key] is None:
            raise AttrscopeError(f"{metric}: perturbation '{s['perturbation']}' needs {id_key} (the tokenizer's "
                                 f"[{s['perturbation'].upper()}] id)")
    P = pad_examples(examples)
    _, rank_of, m = ranked_order(P.scores, P.valid, protected_mask(P, s["protect"]),
                                 descending=s["side"] == "top", skip_last=s["skip_last"])
    k = np.minimum(LEVELS[s["levels"]](m if s["levels"] in RANKED_BASE else P.n), m[:, None])  # [E, 9]
    # Nothing to explain without a perturbable ordinary token ([CLS][SEP] alone, even where [SEP] may be masked).
    ok = ((rank_of >= 0) & ~P.special).any(1) & (cls >= 0)
    counts = np.concatenate([np.zeros((len(examples), 1), dtype=np.int64), k], axis=1)  # [E, 10], level 0 = p0
    row_ex, row_count, row_of = plan_rows(counts, ok)
    drop = drop_mask(rank_of, row_ex, row_count)
    if s["perturbation"] == "delete":
        seqs = delete(P, row_ex, drop)
    else:
        seqs = replace(P, row_ex, drop, int(s[f"{s['perturbation']}_id"]))
    p, top = chosen_probabilities(predictor, seqs, attend_masks(seqs, s["attend"]), row_of, cls,
                                  explained_where(P, row_ex, drop, deleted=s["perturbation"] == "delete"))
    return LevelCurves(p[:, 0], p[:, 1:], top[:, 1:], np.where(ok[:, None], k, -1), ok)


def chosen_class(examples: list[EvalExample], which: str) -> np.ndarray:
    """[E] gold label ("label"; -1 without one) or the model's prediction ("predicted")."""
    return np.array([ex.label if which == "label" else ex.pred for ex in examples], dtype=np.int64).reshape(-1)
