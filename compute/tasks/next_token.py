"""next-token: a causal language model's prediction of the word after a prefix (METHODS.md section 9 for the pre-LN
architectures): the explained position is the last real token, the output the target word's logit there (the given
next word, or the model's top word), or target minus foil."""

from __future__ import annotations

from .word_targets import WordTargetTask


class NextToken(WordTargetTask):
    name = "next-token"
    description = "a causal LM after a prefix: the next word's logit (minus the foil's)"
    auto_class = "AutoModelForCausalLM"
    class_suffixes = ("ForCausalLM", "LMHeadModel")

    def positions(self, lm, records, tok):
        return [len(ids) - 1 for ids in tok.input_ids]
