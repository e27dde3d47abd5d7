"""Generation steps (--task generate): a batch of generations explained step by step, as rows of next-token
explanations read off one forward pass.

Step t of an example whose prompt has p tokens explains position e = p - 1 + t (the row whose logits gave generated
token t) over the tokens 0..e. The model is causal, so one forward over prompt + continuation serves every step: the
step's row is the sequence with its mask cut after e, which is the prefix's own right-padded next-token row (the
later tokens are its padding: masked, and unseen by the rows up to e anyway). The target-independent methods read
their rows off the one pass (``Method.compute_rows``); so do the input-gradient methods and integrated gradients
(one forward over the B sequences, then one backward per step index: every example's step t at once,
``gradients.Outputs.of_steps``); the other target-dependent ones run on the step rows (``rows_capture``: the batch
repeated per step, each copy its step's mask, target and foil: exact, one backward for all steps).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from ..adapters import Captured
from ..tasks.base import Outcome, long_tensor
from ..tasks.word_targets import LM_READOUT, word_outcome
from .parts import _KEPT, _PAIR_LISTS, _ROW_FIELDS, _TOKEN_FIELDS, _TOKEN_LISTS


@dataclass
class Steps:
    """The step rows of a batch of B generations (R rows in all, an example's steps consecutive, in order)."""

    example: torch.Tensor  # [R] the example of each row
    position: torch.Tensor  # [R] its explained position (prompt length - 1 + step)
    target: torch.Tensor  # [R] the generated token
    foil: torch.Tensor  # [R] the given foil token (-1: none)
    grid: torch.Tensor  # [B, S] the positions as a padded grid (S: the most steps of an example; padding repeats 0)
    flat: torch.Tensor  # [R] each row's index into the grid flattened (b * S + t)
    row_grid: torch.Tensor  # [B, S] each grid cell's row (R where the example has no such step)
    counts: list[int]  # steps per example
    prompt_last: torch.Tensor  # [B] each prompt's last position (the store's explained position of the example)
    reach: list[int]  # per step index, the columns its rows need (their furthest position + 1): known on the host

    @classmethod
    def of(cls, prompt_lengths: list[int], targets: list[list[int]], foils: list[list[int]] | None,
           device) -> "Steps":
        """Steps of examples with these prompt lengths and generated tokens (``foils``: per step, -1 none)."""
        counts = [len(t) for t in targets]
        S = max(counts, default=0)
        example = np.repeat(np.arange(len(counts)), counts)
        step = np.concatenate([np.arange(c) for c in counts]) if counts else np.zeros(0, dtype=np.int64)
        position = np.asarray(prompt_lengths, dtype=np.int64)[example] - 1 + step
        grid = np.zeros((len(counts), max(S, 1)), dtype=np.int64)
        grid[example, step] = position
        row_grid = np.full((len(counts), max(S, 1)), len(example), dtype=np.int64)
        row_grid[example, step] = np.arange(len(example))
        flat_foils = [f for row in foils for f in row] if foils is not None else [-1] * len(example)
        return cls(example=long_tensor(example, device), position=long_tensor(position, device),
                   target=long_tensor([t for row in targets for t in row], device),
                   foil=long_tensor(flat_foils, device), grid=long_tensor(grid, device),
                   flat=long_tensor(example * max(S, 1) + step, device), row_grid=long_tensor(row_grid, device),
                   counts=counts, reach=np.where(row_grid < len(example), grid + 1, 0).max(0, initial=0).tolist()[:S],
                   prompt_last=long_tensor([p - 1 for p in prompt_lengths], device))

    def rows(self, per_example_steps: torch.Tensor) -> torch.Tensor:
        """[B, S, ...] (one entry per grid cell) -> [R, ...] (one per step row)."""
        return per_example_steps.flatten(0, 1)[self.flat]

    def mask(self, mask: torch.Tensor) -> torch.Tensor:
        """[R, n] bool: each row's tokens up to its explained position (the prefix it explains)."""
        cols = torch.arange(mask.shape[1], device=mask.device)
        return mask[self.example] & (cols[None, :] <= self.position[:, None])


def rows_capture(cap: Captured, steps: Steps) -> Captured:
    """``cap`` (one pass over B sequences) as R step rows: every tensor taken at each row's example, the mask cut
    after its explained position, an empty memo. The model output is not carried (the rows' logits are set by
    ``explaining_steps``)."""
    ex, mask = steps.example, steps.mask(cap.mask)
    out = {}
    for f in dataclasses.fields(cap):
        value = getattr(cap, f.name)
        if f.name in _KEPT:
            out[f.name] = value
        elif f.name in ("memo", "stacks"):
            out[f.name] = {}
        elif f.name in ("output", "logits", "foil") or value is None:
            out[f.name] = None
        elif f.name == "mask":
            out[f.name] = mask
        elif f.name == "lengths":
            out[f.name] = steps.position + 1
        elif f.name == "explain_pos":
            out[f.name] = steps.position
        elif f.name in ("special", "sep"):
            out[f.name] = value[ex] & mask
        elif f.name in _TOKEN_FIELDS or f.name in _ROW_FIELDS:
            out[f.name] = value[ex]
        elif f.name in _TOKEN_LISTS or f.name in _PAIR_LISTS:
            out[f.name] = list(cap.stack(f.name)[:, ex].unbind(0)) if value else []
        elif f.name == "inputs":  # a method that runs the model again runs each prefix (the later tokens masked)
            inputs = {k: t[ex] for k, t in value.items()}
            inputs["attention_mask"] = mask.to(value["attention_mask"].dtype)
            out[f.name] = inputs
        else:
            raise TypeError(f"compute/run/steps.py does not know how to take Captured.{f.name} per step: add it")
    return dataclasses.replace(cap, **out)


def step_logits(cap: Captured, steps: Steps) -> torch.Tensor:
    """[R, V] each step's logits: the model's output at its explained position, in float32 at least."""
    logits = cap.output.logits[steps.example, steps.position]
    return logits.float() if logits.element_size() < 4 else logits


def step_foils(logits: torch.Tensor, steps: Steps, contrast: str | None) -> torch.Tensor | None:
    """[R] the token each step is contrasted with: the runner-up (``top2``: the most probable token other than the
    generated one), the given foils, or None (no contrast)."""
    if contrast == "top2":
        others = logits.clone()
        others[torch.arange(len(steps.target), device=logits.device), steps.target] = float("-inf")
        return others.argmax(-1)
    return steps.foil if contrast == "column" else None


def explaining_steps(rows: Captured, logits: torch.Tensor, foil: torch.Tensor | None) -> Captured:
    """The step rows set to explain each step's generated token (less its foil) at its position."""
    rows.readout, rows.foil, rows.logits = LM_READOUT, foil, logits
    return rows


def step_outcome(logits: torch.Tensor, steps: Steps, foil: torch.Tensor | None) -> Outcome:
    """Each step's prediction as the store keeps a next-token example's ([R] each)."""
    return word_outcome(logits, steps.target, foil, steps.position)
