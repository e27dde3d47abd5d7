"""ModernBERT: a pre-LN encoder (LayerNorm without bias; no norm before the first layer's attention), rotary
positions with alternating local and global attention (A only), a fused [q | k | v] projection, a GeGLU MLP and a
final norm; the sequence head (dense, activation, LayerNorm, classifier) pools [CLS] or the mean
(classifier_pooling)."""

from __future__ import annotations

from .base import Adapter
from .block import Block

BLOCK = Block(layers="layers", embeddings="embeddings", attention="attn", value="attn.Wqkv", out_proj="attn.Wo",
              ln1="attn_norm", ln2="mlp_norm", mlp="mlp", norms="pre", norm_bias=False, qkv="concat",
              positions="rotary", mlp_kind="gated", final_norm="final_norm", windowed=True)


class ModernBertAdapter(Adapter):
    family = "modernbert"
    model_types = ("modernbert",)
    block = BLOCK
    pre_ln = BLOCK.pre_ln

    def _head(self, h):
        m = self.model
        return m.classifier(m.drop(m.head(h)))

    def lm_head_parts(self):
        m = self.model
        return m.head.dense, m.head.act, m.head.norm, m.decoder
