"""DeBERTa-v2/v3: BERT's post-LN block with disentangled relative-position terms in the attention scores (they change
A only); the self-attention returns its probabilities only when asked. The head pools [CLS] (ContextPooler: dense,
activation) before the classifier."""

from __future__ import annotations

import dataclasses

from transformers.activations import ACT2FN

from .bert import BLOCK as BERT_BLOCK
from .base import Adapter

BLOCK = dataclasses.replace(BERT_BLOCK, value="attention.self.value_proj", positions="relative", attention_flag=True)


class DebertaV2Adapter(Adapter):
    family = "deberta-v2"
    model_types = ("deberta-v2",)
    block = BLOCK
    pre_ln = BLOCK.pre_ln

    def ffn_parts(self, layer):
        return layer.intermediate.dense, layer.intermediate.intermediate_act_fn, layer.output.dense

    def head_parts(self):
        m = self.model
        return m.pooler.dense, ACT2FN[m.pooler.config.pooler_hidden_act], m.classifier

    def _head(self, h):
        dense, act, classifier = self.head_parts()
        return classifier(act(dense(h)))

    def lm_head_parts(self):
        m = self.model
        if hasattr(m, "cls"):  # the legacy head: dense -> activation -> LayerNorm -> decoder
            t = m.cls.predictions.transform
            return t.dense, t.transform_act_fn, t.LayerNorm, m.cls.predictions.decoder
        head = m.lm_predictions.lm_head  # the same, with the tied word embeddings and the head's bias as decoder
        return head.dense, head.transform_act_fn, head.LayerNorm, _Decoder(m.deberta.embeddings.word_embeddings.weight,
                                                                            head.bias)


class _Decoder:
    """A vocabulary decoder as weight and bias (DeBERTa's tied word embeddings and its head's own bias)."""

    def __init__(self, weight, bias):
        self.weight, self.bias = weight, bias
