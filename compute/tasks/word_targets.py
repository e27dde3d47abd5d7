"""The two tasks that explain a language model's word prediction at one position (masked-token, next-token): the
target word (given, or the model's own top prediction) and an optional foil, contrasted as logit(target) -
logit(foil) (the contrastive explanations of Yin & Neubig 2022, which inseq offers for generation)."""

from __future__ import annotations

import numpy as np
import torch

from ..errors import AttrscopeError
from .base import Outcome, Part, Task, TaskRows, long_tensor, none_like
from .readout import Readout, explained

LM_READOUT = Readout(field="logits", at_position=True)


def word_token(tokenizer, word: str, where: str) -> int:
    """The one token id of ``word`` as it reads after a space (byte-level BPE and SentencePiece vocabularies mark
    that), else at the start of a word; a word the vocabulary splits is refused: the methods explain one logit."""
    pieces = []
    for text in (" " + word.strip(), word.strip()):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) == 1:
            return int(ids[0])
        pieces = pieces or tokenizer.convert_ids_to_tokens(ids)
    raise AttrscopeError(f"{where}: the word '{word}' is {len(pieces)} tokens for this tokenizer "
                         f"({' '.join(pieces)}): targets and foils must be single tokens; choose a word the "
                         "vocabulary holds whole")


class WordTargetTask(Task):
    target_modes = ("predicted", "label")  # "label" = the data's target words (required then)

    def labels(self, id2label):
        return {0: "target", 1: "foil"}

    def positions(self, lm, records, tok) -> list[int]:
        raise NotImplementedError

    def prepare(self, lm, records, tok):
        rows = TaskRows.plain([-1] * len(records))
        rows.position = self.positions(lm, records, tok)
        for i, r in enumerate(records):
            where = f"example '{r.id}'"
            target, foil = getattr(r, "target", None), getattr(r, "foil", None)
            if target is not None:
                rows.target_token[i] = word_token(lm.tokenizer, target, where)
            if foil is not None:
                rows.foil_token[i] = word_token(lm.tokenizer, foil, where)
        return rows

    def check_rows(self, rows: TaskRows, records, target_mode: str) -> None:
        if target_mode == "label":
            missing = next((r for r, t in zip(records, rows.target_token) if t < 0), None)
            if missing is not None:
                raise AttrscopeError(f"--target label needs a target word, but example '{missing.id}' has none: "
                                     "fill the target column or use --target predicted")

    def parts(self, cap, rows, target_mode):
        device = cap.input_ids.device
        pos = long_tensor(rows.position, device)
        logits = LM_READOUT(cap.output, pos)
        given = long_tensor(rows.target_token, device)
        # a given target word is explained under either mode; without one, the model's top word
        target = torch.where(given >= 0, given, logits.argmax(-1))
        foil = long_tensor(rows.foil_token, device)
        return [Part(explain_pos=pos, readout=LM_READOUT, target=target,
                     foil=foil if any(f >= 0 for f in rows.foil_token) else None)]

    def outcome(self, cap, parts, rows):
        (part,) = parts
        return word_outcome(part.readout(cap.output, part.explain_pos).float(), part.target, part.foil,
                            part.explain_pos)


def word_outcome(logits: torch.Tensor, target: torch.Tensor, foil: torch.Tensor | None,
                 explain_pos: torch.Tensor) -> Outcome:
    """The prediction of a word at one position per row, from its logits [R, V]: the target's and the foil's
    probabilities, the explained output (target less foil)."""
    probs = torch.softmax(logits.double(), -1)  # double: a 50k-word softmax keeps small probabilities exact
    b = torch.arange(logits.shape[0], device=logits.device)
    p_target = probs[b, target]
    foil_or_none = foil if foil is not None else torch.full_like(target, -1)
    p_foil = torch.where(foil_or_none >= 0, probs[b, foil_or_none.clamp_min(0)],
                         torch.full_like(p_target, float("nan")))
    zeros = np.zeros(logits.shape[0], dtype=np.int64)
    return Outcome(pred=logits.argmax(-1),
                   probs=torch.stack([p_target, p_foil], 1).float(), target=zeros,
                   explain_pos=explain_pos,
                   output=explained(logits, target, foil),
                   target_token=target, foil_token=foil_or_none,
                   span_end=none_like(logits), pred_end=none_like(logits))
