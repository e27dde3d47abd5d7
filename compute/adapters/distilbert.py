"""DistilBERT: a post-LN encoder like BERT with other module names; the head reads [CLS]."""

from __future__ import annotations

import torch

from .base import Adapter
from .block import Block

BLOCK = Block(layers="transformer.layer", embeddings="embeddings", attention="attention", value="attention.v_lin",
              out_proj="attention.out_lin", ln1="sa_layer_norm", ln2="output_layer_norm", mlp="ffn", norms="post")


class DistilBertAdapter(Adapter):
    family = "distilbert"
    model_types = ("distilbert",)
    block = BLOCK
    pre_ln = BLOCK.pre_ln
    lrp = True

    def lrp_linears(self, layer):
        at = layer.attention
        return {"q": at.q_lin, "k": at.k_lin, "v": at.v_lin, "o": at.out_lin, "f1": layer.ffn.lin1, "f2": layer.ffn.lin2}

    def ffn_parts(self, layer):
        return layer.ffn.lin1, layer.ffn.activation, layer.ffn.lin2

    def head_parts(self):
        return self.model.pre_classifier, torch.relu, self.model.classifier

    def lm_head_parts(self):
        m = self.model
        return m.vocab_transform, m.activation, m.vocab_layer_norm, m.vocab_projector

    def sequence_lrp_head(self):
        return [self.model.pre_classifier, self.model.classifier]  # -> ReLU -> dropout -> classifier

    def lm_lrp_head(self):
        return [self.model.vocab_transform, self.model.vocab_projector]  # -> GELU -> LayerNorm -> projector

    def _head(self, h):
        # DistilBertForSequenceClassification: classifier(dropout(relu(pre_classifier(h)))).
        m = self.model
        return m.classifier(m.dropout(torch.relu(m.pre_classifier(h))))
