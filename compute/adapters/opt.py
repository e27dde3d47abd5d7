"""OPT (pre-LN: every size but 350m): GPT-2's block with separate q, k, v projections, learned positions added to the
token embeddings inside the decoder (hidden_states[0] is the first layer's input), the feed-forward layers fc1, ReLU,
fc2 in the layer itself (no MLP module: ``mlp`` composes them) and a final LayerNorm. OPT-350m (post-LN, with
projections in and out of a narrower embedding) is not described: it runs as any undescribed family
(compute/adapters/generic.py)."""

from __future__ import annotations

from .base import Sublayer
from .block import Block, MLPMaps
from .llama import LlamaAdapter

BLOCK = Block(layers="decoder.layers", embeddings="decoder.embed_tokens", attention="self_attn",
              value="self_attn.v_proj", out_proj="self_attn.out_proj", ln1="self_attn_layer_norm",
              ln2="final_layer_norm", mlp="fc1", norms="pre", final_norm="decoder.final_layer_norm",
              layer_input="layer", mlp_maps=MLPMaps(up="fc1", down="fc2", act="activation_fn"))  # from the layer


class OPTAdapter(LlamaAdapter):
    family = "opt"
    model_types = ("opt",)
    block = BLOCK

    @classmethod
    def describes(cls, model) -> bool:
        cfg = model.config
        return bool(cfg.do_layer_norm_before) and cfg.word_embed_proj_dim == cfg.hidden_size

    def mlp(self, layer):
        return Sublayer(lambda y: layer.fc2(layer.activation_fn(layer.fc1(y))), layer.fc1, layer.fc2,
                        root=layer)
