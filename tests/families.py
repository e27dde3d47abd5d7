"""Tiny seeded random models of the families beyond the eight of tests/conftest.py (compute/adapters/*.py), built from
configs (never from a hub), and saved ones usable as --model PATH."""

from __future__ import annotations

from pathlib import Path

import torch

# family -> (config class, its arguments beyond the common ones, decoder)
FAMILIES = {
    "qwen2": ("Qwen2Config", dict(num_key_value_heads=2), True),
    "qwen3": ("Qwen3Config", dict(num_key_value_heads=2, head_dim=8), True),
    "mistral": ("MistralConfig", dict(num_key_value_heads=2), True),
    "gemma": ("GemmaConfig", dict(num_key_value_heads=1, head_dim=8), True),  # multi-query
    "gemma2": ("Gemma2Config", dict(num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8), True),
    "phi3": ("Phi3Config", dict(num_key_value_heads=2), True),
    "gpt_neox": ("GPTNeoXConfig", dict(rotary_pct=0.5), True),
    "olmo2": ("Olmo2Config", dict(num_key_value_heads=2), True),
    "modernbert": ("ModernBertConfig", dict(local_attention=4, global_attn_every_n_layers=2,
                                            cls_token_id=2, sep_token_id=3, bos_token_id=2, eos_token_id=3), False),
    "deberta-v2": ("DebertaV2Config", dict(relative_attention=True, pos_att_type=["p2c", "c2p"], max_relative_positions=16,
                                           position_buckets=8), False),
    "gemma3": ("Gemma3TextConfig", dict(num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, sliding_window=4,
                                        final_logit_softcapping=5.0), True),  # sliding and global layers, QK-norm
    "olmo": ("OlmoConfig", dict(clip_qkv=2.0), True),
    "starcoder2": ("Starcoder2Config", dict(num_key_value_heads=2, sliding_window=4), True),
    # mixtures of experts (the experts' eager loop: the grouped matmul has no float64 kernel)
    "mixtral": ("MixtralConfig", dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                      experts_implementation="eager"), True),
    "qwen2_moe": ("Qwen2MoeConfig", dict(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=16, shared_expert_intermediate_size=32,
                                         experts_implementation="eager"), True),
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=16, experts_implementation="eager"), True),
    # parallel attention and MLP on one norm (StableLM's use_parallel_residual), QK LayerNorms
    "stablelm": ("StableLmConfig", dict(num_key_value_heads=2, use_parallel_residual=True, qk_layernorm=True), True),
    "phi": ("PhiConfig", dict(qk_layernorm=True), True),
    "gpt_bigcode": ("GPTBigCodeConfig", dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, n_inner=64,
                                             multi_query=True), True),  # one key and value head for all queries
    "opt": ("OPTConfig", dict(ffn_dim=64, word_embed_proj_dim=32), True),  # pre-LN, positions added in the decoder
    "gptj": ("GPTJConfig", dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, rotary_dim=4), True),  # parallel
    # parallel on one bias-free LayerNorm, QK LayerNorms; logits x logit_scale (causal LM only)
    "cohere": ("CohereConfig", dict(num_key_value_heads=2, use_qk_norm=True), True),
    # every multiplier away from 1 (causal LM only)
    "granite": ("GraniteConfig", dict(num_key_value_heads=2, embedding_multiplier=3.0, residual_multiplier=0.5,
                                      attention_multiplier=0.3, logits_scaling=4.0), True),
    "olmoe": ("OlmoeConfig", dict(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, clip_qkv=2.0,
                                  experts_implementation="eager"), True),  # causal LM only
    # ALiBi
    "bloom": ("BloomConfig", dict(), True),
    # new_decoder_architecture: two norms in parallel, [q_1 .. q_g k v] per key/value group
    "falcon": ("FalconConfig", dict(alibi=True, new_decoder_architecture=True, num_kv_heads=2, bias=True), True),
    "mpt": ("MptConfig", dict(attn_config=dict(alibi=True, clip_qkv=2.0)), True),
}
NEW_FAMILIES = tuple(FAMILIES)
# Families without a block description (compute/adapters/generic.py runs them): the methods that need none.
UNDESCRIBED = {
    # OPT-350m's post-LN layers (not OPT's description, OPTAdapter.describes); GELU for a smooth path (integrated
    # gradients' completeness to 1e-5: OPT's ReLU is tested with the described family)
    "opt_postln": ("OPTConfig", dict(ffn_dim=64, word_embed_proj_dim=32, do_layer_norm_before=False,
                                     activation_function="gelu"), True),
    "albert": ("AlbertConfig", dict(embedding_size=16), False),  # one layer's weights applied at every depth
    "mobilebert": ("MobileBertConfig", dict(embedding_size=16, true_hidden_size=16, intra_bottleneck_size=16), False),
}
ALL_FAMILIES = {**FAMILIES, **UNDESCRIBED}
# Other arrangements of a described family's block that its config selects (the GlobEnc and Value Zeroing tests run
# them beside FAMILIES): Falcon-RW (ALiBi, sequential, [q_h k_h v_h] per head), Falcon-7B (rotary, parallel on one
# norm, one key and value head), the new architecture on one norm.
VARIANTS = {
    "falcon_rw": ("FalconConfig", dict(alibi=True, multi_query=False, parallel_attn=False, bias=True), True),
    "falcon_7b": ("FalconConfig", dict(multi_query=True, parallel_attn=True), True),
    "falcon_1ln": ("FalconConfig", dict(new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1),
                   True),
}


def family_config(family: str, num_labels: int = 2, layers: int = 2):
    import transformers

    name, extra, decoder = {**ALL_FAMILIES, **VARIANTS}[family]
    ids = dict(pad_token_id=0) if not decoder else dict(pad_token_id=0, bos_token_id=1, eos_token_id=1)
    ids.update({k: v for k, v in extra.items() if k.endswith("token_id")})
    args = dict(vocab_size=120, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                max_position_embeddings=64, num_labels=num_labels, attn_implementation="eager", **ids)
    args.update({k: v for k, v in extra.items() if not k.endswith("token_id")})
    return getattr(transformers, name)(**args)


def family_heads(family: str) -> tuple[str, ...]:
    """The tasks whose head transformers has for ``family``: a sequence classifier, a causal LM (decoders) or masked
    LM (encoders)."""
    from transformers.models.auto import modeling_auto as auto

    config = type(family_config(family))
    lm = ("next-token", auto.MODEL_FOR_CAUSAL_LM_MAPPING) if is_decoder(family) else \
        ("masked-token", auto.MODEL_FOR_MASKED_LM_MAPPING)
    return tuple(task for task, mapping in (("classification", auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING), lm)
                 if config in mapping)


def family_model(family: str, task: str | None = None, seed: int = 0, dtype=torch.float64, layers: int = 2,
                 num_labels: int = 2):
    """A seeded random model of ``family`` with the head of ``task`` (default: its first head, a sequence classifier
    where transformers has one, else a causal LM), in eval mode (weights spread as conftest's)."""
    import transformers

    from conftest import TASK_AUTO_CLASSES, _spread

    task = task or family_heads(family)[0]
    torch.manual_seed(seed)
    config = family_config(family, 1 if task == "regression" else num_labels, layers)
    model = getattr(transformers, TASK_AUTO_CLASSES[task]).from_config(config, attn_implementation="eager")
    return _spread(model).to(dtype).eval()


def model_task(model) -> str:
    """The task a tiny model's head is for: a causal LM's next token, else classification."""
    return "next-token" if type(model).__name__.endswith("ForCausalLM") else "classification"


def family_capture(ad, batch: dict, needs):
    """``ad``'s capture of ``batch``, explaining as a run does: a causal LM's next word after the last real token
    (compute.run.dispatch.explaining: its output vector there is ``cap.logits``, its argmax ``cap.pred``)."""
    from compute.run.dispatch import explaining
    from compute.tasks.base import Part
    from compute.tasks.word_targets import LM_READOUT

    cap = ad.capture(batch, needs)
    if ad.task == "next-token":
        explaining(cap, Part(explain_pos=cap.explain_pos, readout=LM_READOUT, target=None), fresh=False)
    return cap


def is_decoder(family: str) -> bool:
    return {**ALL_FAMILIES, **VARIANTS}[family][2]


def write_family_dir(path: Path, family: str, seed: int = 0) -> Path:
    """A saved tiny sequence classifier of ``family`` with conftest's WordPiece tokenizer (its [CLS] and [SEP] at ids
    2 and 3; a decoder's pad token is [PAD] = 0)."""
    from conftest import write_tiny_model_dir

    write_tiny_model_dir(path, "bert", seed=seed)  # the tokenizer (and a BERT model, replaced below)
    for f in ("model.safetensors", "config.json"):
        (path / f).unlink()
    model = family_model(family, seed=seed, dtype=torch.float32)
    model.config.id2label = {0: "negative", 1: "positive"}
    model.config.label2id = {"negative": 0, "positive": 1}
    model.save_pretrained(path)
    return path


def write_family_task_dir(path: Path, family: str, task: str, seed: int = 0) -> Path:
    """A saved tiny model of ``family`` with the head of ``task`` and conftest's word-level tokenizer (BERT's for
    encoders, one adding no special tokens for decoders)."""
    from conftest import write_tiny_tokenizer

    if task == "classification":
        return write_family_dir(path, family, seed)
    write_tiny_tokenizer(path, decoder=is_decoder(family))
    family_model(family, task, seed=seed, dtype=torch.float32).save_pretrained(path)
    return path


MATRIX_FAMILIES = ("bert", "distilbert", "gpt2", "llama", *NEW_FAMILIES)


def family_matrix() -> dict[str, dict[str, str]]:
    """method -> family -> "Y" or the short reason it is refused (compute.applicability), for a sequence classifier
    of every family with a block description (a causal LM where transformers has no classifier: Cohere, Granite,
    OLMoE; tiny random models; what runs depends on the block and head only)."""
    from conftest import tiny_model

    from compute.adapters import adapter_for
    from compute.applicability import applicability, short_reason

    out: dict[str, dict[str, str]] = {}
    for family in MATRIX_FAMILIES:
        model = tiny_model(family, layers=2) if family in ("bert", "distilbert", "gpt2", "llama") else \
            family_model(family)
        ad = adapter_for(model, "classification" if family in ("bert", "distilbert", "gpt2", "llama") else
                         family_heads(family)[0])
        ad.mask_token_id = 4  # as a checkpoint's tokenizer sets it (integrated gradients' [MASK] baseline)
        for name, reason in applicability(ad).items():
            out.setdefault(name, {})[family] = short_reason(reason)
    return out


def matrix_markdown() -> str:
    """The README's family x method table."""
    m = family_matrix()
    lines = ["| method | " + " | ".join(MATRIX_FAMILIES) + " |", "|---|" + "---|" * len(MATRIX_FAMILIES)]
    lines += [f"| `{name}` | " + " | ".join(row[f] for f in MATRIX_FAMILIES) + " |" for name, row in m.items()]
    return "\n".join(lines)


def write_long_model_dir(path: Path, positions: int = 8192, seed: int = 0,
                         model_max_length: int | None = None) -> Path:
    """A saved tiny Llama sequence classifier (2 layers, d 32, 4 heads, rotary positions) that takes ``positions``
    tokens, with conftest's WordPiece tokenizer (``model_max_length``: what the tokenizer declares, if anything):
    long documents (issue 36)."""
    import json

    from conftest import tiny_model, write_tiny_model_dir

    write_tiny_model_dir(path, "bert", seed=seed)  # the tokenizer (and a BERT model, replaced below)
    for f in ("model.safetensors", "config.json"):
        (path / f).unlink()
    model = tiny_model("llama", seed=seed, dtype=torch.float32, layers=2)
    model.config.max_position_embeddings = positions
    model.config.id2label = {0: "negative", 1: "positive"}
    model.config.label2id = {"negative": 0, "positive": 1}
    model.save_pretrained(path)
    if model_max_length is not None:
        config = path / "tokenizer_config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), "model_max_length": model_max_length}))
    return path
