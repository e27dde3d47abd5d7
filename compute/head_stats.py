"""Mask-LRP's head statistics (METHODS.md 6.1, 14.14-15): which heads are positional, which are syntactic.

No model code: the caller runs the model (attention probabilities with pad keys at 0, [SEP] zeroed as in 6.5 if it
reproduces the reference) and feeds argmax keys batch by batch. Everything is counted with tensor ops over the whole
batch, so a pass over train + validation costs one argmax per layer on top of the forward passes.

The syntactic hit test is position-based (14.15's "more robust" option): the head's argmax key from the dependent's
first subword must be a token overlapping the head word's character span. The reference compares surface strings of
merged WordPiece words instead, which also counts a hit on another occurrence of the same word.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from compute.errors import AttrscopeError
from compute.parses import RELATIONS, Dependency
from store import HeadMaskData

Aligned = tuple[int, np.ndarray, int]  # (first subword of the dependent, bool [n] head-word tokens, relation index)


def argmax_keys(attentions: Sequence[torch.Tensor]) -> torch.Tensor:
    """j*(i) = argmax_j A[l, h, i, j] for every layer: L tensors [B, H, n, n] -> [B, L, H, n] long.

    One layer at a time, so no [B, L, H, n, n] copy is made. Ties go to the first index (torch.argmax)."""
    return torch.stack([a.argmax(dim=-1) for a in attentions], dim=1)


def align_dependencies(deps: Sequence[Dependency], spans: np.ndarray, segment: np.ndarray) -> list[Aligned]:
    """Map word-level dependencies onto one example's token positions via character-span overlap.

    spans [n, 2] token spans in their segment's text ((-1, -1) for specials), segment [n] (0 text, 1 pair, -1
    special). Returns (p, head, k) per dependency whose two words both survive truncation: p = first token
    overlapping the dependent word, head = bool [n] tokens overlapping the head word, k = index in RELATIONS."""
    if not deps:
        return []
    spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    segment = np.asarray(segment, dtype=np.int64).reshape(-1)
    seg = np.array([d.segment for d in deps])[:, None]  # [D, 1]
    ds = np.array([d.dep_span for d in deps], dtype=np.int64)  # [D, 2]
    hs = np.array([d.head_span for d in deps], dtype=np.int64)
    same = segment[None, :] == seg  # [D, n]
    t0, t1 = spans[None, :, 0], spans[None, :, 1]
    dep_cov = same & (t0 < ds[:, 1:]) & (ds[:, :1] < t1)
    head_cov = same & (t0 < hs[:, 1:]) & (hs[:, :1] < t1)
    keep = dep_cov.any(axis=1) & head_cov.any(axis=1)
    first = dep_cov.argmax(axis=1)
    index = {r: k for k, r in enumerate(RELATIONS)}
    return [(int(first[d]), head_cov[d], index[deps[d].relation]) for d in np.flatnonzero(keep)]


class HeadStatistics:
    """Running counts over a dataset: argmax offsets per head (positional) and dependency hits (syntactic).

    ``counts[l, h, w]`` counts queries whose argmax key lies ``offsets[w]`` tokens away (key - query); the offset
    table grows as longer inputs arrive. ``hits`` / ``totals`` [L, H, 4] follow RELATIONS."""

    def __init__(self, n_layers: int, n_heads: int):
        self.n_layers, self.n_heads = int(n_layers), int(n_heads)
        self._counts = np.zeros((self.n_layers, self.n_heads, 0), dtype=np.int64)
        self._min_offset = 0
        self._hits = np.zeros((self.n_layers, self.n_heads, len(RELATIONS)), dtype=np.int64)
        self._n_deps = np.zeros(len(RELATIONS), dtype=np.int64)
        self.n_examples = 0
        self.n_queries = 0

    # ----------------------------------------------------------------------------------------- counting
    def _grow(self, lo: int, hi: int) -> None:
        """Widen the offset table to cover [lo, hi] (zeros in the new columns)."""
        width = self._counts.shape[2]
        if width == 0:
            self._counts = np.zeros((self.n_layers, self.n_heads, hi - lo + 1), dtype=np.int64)
            self._min_offset = lo
            return
        cur_hi = self._min_offset + width - 1
        left, right = max(0, self._min_offset - lo), max(0, hi - cur_hi)
        if left or right:
            self._counts = np.pad(self._counts, ((0, 0), (0, 0), (left, right)))
            self._min_offset -= left

    def update(self, argmax: torch.Tensor, mask: torch.Tensor,
               aligned: Sequence[Sequence[Aligned]] | None = None) -> None:
        """Count one batch. argmax [B, L, H, n] from ``argmax_keys``; mask [B, n] bool, True on real tokens (every
        real query counts, specials included, as in the reference); aligned: per batch row, ``align_dependencies``."""
        B, L, H, n = argmax.shape
        if (L, H) != (self.n_layers, self.n_heads):
            raise AttrscopeError(f"head statistics: expected {self.n_layers} layers x {self.n_heads} heads, "
                                 f"got {L} x {H}")
        mask = mask.to(device=argmax.device, dtype=torch.bool)
        if aligned is not None and len(aligned) != B:
            raise AttrscopeError(f"head statistics: {len(aligned)} dependency lists for a batch of {B}")
        self.n_examples += int(mask.any(dim=1).sum())
        q = argmax.permute(0, 3, 1, 2)[mask]  # [Q, L, H] argmax keys of the real queries
        if q.shape[0]:
            rel = q - torch.arange(n, device=q.device).expand(B, n)[mask][:, None, None]  # key - query
            self._grow(int(rel.min()), int(rel.max()))
            W = self._counts.shape[2]
            lh = torch.arange(L * H, device=q.device).view(1, L, H)
            flat = (lh * W + (rel - self._min_offset)).reshape(-1)
            self._counts += torch.bincount(flat, minlength=L * H * W).view(L, H, W).cpu().numpy()
            self.n_queries += q.shape[0]
        if aligned is not None:
            self._update_syntactic(argmax, aligned)

    def _update_syntactic(self, argmax: torch.Tensor, aligned: Sequence[Sequence[Aligned]]) -> None:
        _, L, H, n = argmax.shape
        rows, ps, ks, heads = [], [], [], []
        for b, deps in enumerate(aligned):
            for p, head, k in deps:
                head = np.asarray(head, dtype=bool)
                if not 0 <= p < n or head.shape[0] > n:
                    raise AttrscopeError(f"head statistics: dependency at token {p} (head mask of {head.shape[0]}) "
                                         f"does not fit a batch of width {n}")
                rows.append(b), ps.append(p), ks.append(k)
                heads.append(np.pad(head, (0, n - head.shape[0])))
        if not rows:
            return
        dev = argmax.device
        rows_t = torch.tensor(rows, device=dev)
        jstar = argmax.permute(0, 3, 1, 2)[rows_t, torch.tensor(ps, device=dev)]  # [D, L, H]
        head_t = torch.from_numpy(np.stack(heads)).to(dev)  # [D, n]
        hit = head_t[torch.arange(len(rows), device=dev)[:, None, None], jstar]  # [D, L, H]
        k_t = torch.tensor(ks, device=dev)
        per_k = torch.zeros(len(RELATIONS), L, H, dtype=torch.long, device=dev).index_add_(0, k_t, hit.long())
        self._hits += per_k.permute(1, 2, 0).cpu().numpy()
        self._n_deps += np.bincount(np.asarray(ks), minlength=len(RELATIONS))

    # ----------------------------------------------------------------------------------------- results
    @property
    def offsets(self) -> np.ndarray:
        """[W] signed offsets (key - query) of the columns of ``counts``."""
        return np.arange(self._min_offset, self._min_offset + self._counts.shape[2], dtype=np.int64)

    @property
    def counts(self) -> np.ndarray:
        """[L, H, W] int64 argmax-offset counts."""
        return self._counts.copy()

    @property
    def hits(self) -> np.ndarray:
        """[L, H, 4] dependencies whose dependent's argmax key landed on the head word."""
        return self._hits.copy()

    @property
    def totals(self) -> np.ndarray:
        """[L, H, 4] aligned dependencies counted (the same for every head)."""
        return np.broadcast_to(self._n_deps, self._hits.shape).copy()

    def positional_mask(self, *, threshold: float = 0.8, exclude_self: bool = True) -> HeadMaskData:
        """M_pos[l, h] = 1 if one offset takes more than ``threshold`` of all real queries (strictly greater).

        The denominator always counts every query, self-attending ones included. ``exclude_self`` (the default) is
        the paper, which excludes offset 0; False is the reference (14.14: a head that attends to itself is
        positional; --preset masklrp)."""
        if self.n_queries == 0:
            raise AttrscopeError("head statistics: no query was counted, so no positional mask can be made")
        offsets = self.offsets
        freq = self._counts / float(self.n_queries)  # [L, H, W]
        cand = np.where(offsets == 0, -1.0, freq) if exclude_self else freq
        best = cand.argmax(axis=2)
        freq_max = np.maximum(np.take_along_axis(cand, best[..., None], axis=2)[..., 0], 0.0)
        return HeadMaskData(
            name="positional",
            mask=(freq_max > threshold).astype(np.uint8),
            arrays={"offsets": self.offsets, "counts": self.counts, "freq_max": freq_max.astype(np.float64),
                    "argmax_offset": offsets[best].astype(np.int64)},
            attrs={"threshold": float(threshold), "exclude_self": bool(exclude_self),
                   "n_queries": int(self.n_queries), "n_examples": int(self.n_examples)})

    def syntactic_mask(self, offset_distributions: dict[str, dict[int, int]], *, margin: float = 0.1) -> HeadMaskData:
        """M_synt[l, h] = 1 if for some relation k the hit rate beats thr_k = max_o lambda_k(o) + margin.

        lambda_k is the parser's word-offset distribution of relation k (``Parses.offset_distributions``): a head
        is syntactic only if it finds the head word more often than the best fixed offset would. A relation with
        no parsed or no aligned dependency selects nothing (its threshold / rates are NaN)."""
        lam_max = np.full(len(RELATIONS), np.nan)
        lam_total = np.zeros(len(RELATIONS), dtype=np.int64)
        for k, rel in enumerate(RELATIONS):
            dist = offset_distributions.get(rel) or {}
            total = sum(dist.values())
            lam_total[k] = total
            if total > 0:
                lam_max[k] = max(dist.values()) / total
        thr = lam_max + margin
        totals = self.totals
        with np.errstate(invalid="ignore", divide="ignore"):
            rates = np.where(totals > 0, self._hits / np.maximum(totals, 1), np.nan)
        with np.errstate(invalid="ignore"):
            selected = (totals > 0) & (rates > thr[None, None, :])  # NaN compares False
        return HeadMaskData(
            name="syntactic",
            mask=selected.any(axis=2).astype(np.uint8),
            arrays={"hits": self.hits, "totals": totals, "rates": rates.astype(np.float32),
                    "thresholds": thr, "lambda_max": lam_max},
            attrs={"relations": list(RELATIONS), "margin": float(margin),
                   "n_dependencies": {rel: int(c) for rel, c in zip(RELATIONS, self._n_deps)},
                   "n_parsed_dependencies": {rel: int(c) for rel, c in zip(RELATIONS, lam_total)},
                   "n_examples": int(self.n_examples)})


def combine_masks(positional: HeadMaskData, syntactic: HeadMaskData, how: str = "union") -> HeadMaskData:
    """Mask-LRP's M: "union" = binary OR (the reference writes 1 at every selected head), "sum" = M_pos + M_synt
    (the paper; 0..2, so heads that are both count twice)."""
    a, b = np.asarray(positional.mask, dtype=np.uint8), np.asarray(syntactic.mask, dtype=np.uint8)
    if a.shape != b.shape:
        raise AttrscopeError(f"head masks {positional.name!r} {a.shape} and {syntactic.name!r} {b.shape} "
                             "differ in shape")
    if how == "union":
        mask = (a.astype(bool) | b.astype(bool)).astype(np.uint8)
    elif how == "sum":
        mask = (a + b).astype(np.uint8)
    else:
        raise AttrscopeError(f"head masks: unknown combination {how!r}; use 'union' or 'sum'")
    return HeadMaskData(name="mask_lrp", mask=mask, arrays={},
                        attrs={"how": how, "sources": [positional.name, syntactic.name]})
