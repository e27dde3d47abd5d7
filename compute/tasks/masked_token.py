"""masked-token: a masked language model's prediction at its mask token (subject-verb agreement, BLiMP minimal
pairs, METHODS.md 7.1 and 8.7): the explained position is the mask, the output the target word's logit there, or
target minus foil."""

from __future__ import annotations

from ..errors import AttrscopeError
from .word_targets import WordTargetTask


class MaskedToken(WordTargetTask):
    name = "masked-token"
    description = "a masked LM at its mask token: the target word's logit (minus the foil's)"
    auto_class = "AutoModelForMaskedLM"
    class_suffixes = ("ForMaskedLM",)

    def positions(self, lm, records, tok):
        mask_id = lm.tokenizer.mask_token_id
        if mask_id is None:
            raise AttrscopeError("--task masked-token needs a tokenizer with a mask token: this one has none")
        out = []
        for r, ids in zip(records, tok.input_ids):
            count = ids.count(mask_id)
            if count != 1:
                why = ("none is left after truncation at --max-length (raise it)" if count == 0
                       else f"it has {count} (mask one word per example)")
                raise AttrscopeError(f"example '{r.id}' must hold exactly one {lm.tokenizer.mask_token} token, "
                                     f"but {why}")
            out.append(ids.index(mask_id))
        return out
