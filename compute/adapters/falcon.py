"""Falcon: pre-LN decoder (LayerNorm with bias), rotary positions or ALiBi (config.alibi: Falcon-RW; A only), in one of
three arrangements its config selects: sequential (input_layernorm, post_attention_layernorm), parallel on one norm
(parallel_attn: x' = x + Attn(LN x) + MLP(LN x)) or, with new_decoder_architecture, parallel on two norms (ln_attn,
ln_mlp; one where num_ln_in_parallel_attn is 1); the fused projection holds [q_h k_h v_h] per head, [q | k | v] with
one key and value head (multi_query) or, in the new architecture, [q_1 .. q_g k v] per key/value group; a plain MLP
(GELU); ln_f after the last block."""

from __future__ import annotations

from .block import Block, MLPMaps
from .llama import LlamaAdapter


def falcon_block(cfg) -> Block:
    parallel = bool(cfg.new_decoder_architecture or cfg.parallel_attn)
    if cfg.new_decoder_architecture and (cfg.num_ln_in_parallel_attn or 2) == 2:
        ln1, ln2 = "ln_attn", "ln_mlp"
    else:
        ln1, ln2 = "input_layernorm", "input_layernorm" if parallel else "post_attention_layernorm"
    qkv = "grouped" if cfg.new_decoder_architecture else "concat_gqa" if cfg.multi_query else "per_head"
    return Block(layers="h", embeddings="word_embeddings", attention="self_attention",
                 value="self_attention.query_key_value", out_proj="self_attention.dense", ln1=ln1, ln2=ln2, mlp="mlp",
                 norms="pre", qkv=qkv, positions="alibi" if cfg.alibi else "rotary", parallel=parallel,
                 final_norm="ln_f", mlp_maps=MLPMaps(up="dense_h_to_4h", down="dense_4h_to_h", act="act"))


class FalconAdapter(LlamaAdapter):
    family = "falcon"
    model_types = ("falcon",)

    def __init__(self, model, task="classification"):
        self.block = falcon_block(model.config)
        super().__init__(model, task)

    @property
    def n_kv_heads(self) -> int:
        cfg = self.config
        return cfg.num_kv_heads if cfg.new_decoder_architecture else 1 if cfg.multi_query else self.n_heads
