"""BERT, RoBERTa, XLM-R, CamemBERT and ELECTRA: post-LN encoders with LayerNorm, absolute positions, a plain MLP;
the sequence head reads [CLS]."""

from __future__ import annotations

import torch

from .base import Adapter
from .block import Block

BLOCK = Block(layers="encoder.layer", embeddings="embeddings", attention="attention.self",
              value="attention.self.value", out_proj="attention.output.dense", ln1="attention.output.LayerNorm",
              ln2="output.LayerNorm", mlp="intermediate", norms="post")


class BertAdapter(Adapter):
    """BERT, RoBERTa and ELECTRA share module names (``attention.self``, ``attention.output.LayerNorm``, ...)."""

    family = "bert"
    model_types = ("bert", "roberta", "xlm-roberta", "electra", "camembert")
    block = BLOCK
    pre_ln = BLOCK.pre_ln
    lrp = True

    def lrp_linears(self, layer):
        sa = layer.attention.self
        return {"q": sa.query, "k": sa.key, "v": sa.value, "o": layer.attention.output.dense,
                "f1": layer.intermediate.dense, "f2": layer.output.dense}

    def ffn_parts(self, layer):
        return layer.intermediate.dense, layer.intermediate.intermediate_act_fn, layer.output.dense

    def head_parts(self):
        m = self.model
        if self.config.model_type == "bert":
            return m.bert.pooler.dense, m.bert.pooler.activation, m.classifier
        # RoBERTa's head applies tanh, ELECTRA's its own activation (GELU)
        return m.classifier.dense, getattr(m.classifier, "activation", torch.tanh), m.classifier.out_proj

    def lm_head_parts(self):
        m, kind = self.model, self.config.model_type
        if kind == "bert":
            t = m.cls.predictions.transform
            return t.dense, t.transform_act_fn, t.LayerNorm, m.cls.predictions.decoder
        if kind == "electra":
            g = m.generator_predictions
            return g.dense, g.activation, g.LayerNorm, m.generator_lm_head
        head = m.lm_head  # RoBERTa, XLM-R, CamemBERT: dense -> GELU -> LayerNorm -> decoder
        return head.dense, torch.nn.functional.gelu, head.layer_norm, head.decoder

    def sequence_lrp_head(self):
        m = self.model
        if self.config.model_type == "bert":
            return [m.bert.pooler.dense, m.classifier]  # pooler dense -> tanh -> dropout -> classifier
        return [m.classifier.dense, m.classifier.out_proj]  # RoBERTa (tanh) / ELECTRA (GELU) heads

    def lm_lrp_head(self):
        m, kind = self.model, self.config.model_type
        if kind == "bert":
            return [m.cls.predictions.transform.dense, m.cls.predictions.decoder]
        if kind == "electra":
            return [m.generator_predictions.dense, m.generator_lm_head]
        return [m.lm_head.dense, m.lm_head.decoder]

    def _head(self, h):
        B, n, d = h.shape
        m = self.model
        if self.config.model_type == "bert":
            # BertForSequenceClassification: classifier(dropout(tanh(W_pool h + b_pool))).
            pooler = m.bert.pooler
            return m.classifier(m.dropout(pooler.activation(pooler.dense(h))))
        # RoBERTa/ELECTRA heads read features[:, 0]: feed every token as its own length-1 sequence.
        return m.classifier(h.reshape(B * n, 1, d)).reshape(B, n, -1)
