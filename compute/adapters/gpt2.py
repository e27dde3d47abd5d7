"""GPT-2: pre-LN decoder (LayerNorm), absolute positions, a fused [q | k | v] projection (Conv1D); ln_f after the
last block; the classifier reads the last real token."""

from __future__ import annotations

from .base import Adapter
from .block import Block, MLPMaps

BLOCK = Block(layers="h", embeddings="drop", attention="attn", value="attn.c_attn", out_proj="attn.c_proj",
              ln1="ln_1", ln2="ln_2", mlp="mlp", norms="pre", qkv="concat", final_norm="ln_f",
              mlp_maps=MLPMaps(up="c_fc", down="c_proj", act="act"))  # Conv1D (GPT-BigCode: nn.Linear)


class _LinearView:
    """W and b of a GPT-2 Conv1D (y = x W + b) in nn.Linear's convention (weight [out, in])."""

    def __init__(self, conv):
        self.weight = conv.weight.t()
        self.bias = conv.bias


class GPT2Adapter(Adapter):
    """r = x + Attn(ln_1(x)), x' = r + MLP(ln_2(r)); the embedding module's output is dropout's (token + position
    embeddings = hidden_states[0])."""

    family = "gpt2"
    model_types = ("gpt2",)
    block = BLOCK
    pre_ln = BLOCK.pre_ln

    def out_proj(self, layer):
        return _LinearView(layer.attn.c_proj)

    def head_parts(self):
        return None, None, self.model.score  # a linear score on the final norm's output

    def _head(self, h):
        return self.model.score(h)  # per-position logits before HF pools the last real token

    def lm_head_parts(self):
        return None, None, None, self.model.lm_head  # on ln_f's output
