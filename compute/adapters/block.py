"""The declarative description of one family's Transformer block: where its modules are and how they combine.

A family's file fills in a :class:`Block`; the adapter's structure (``compute.adapters.base.Adapter``), the capture and
the decomposition methods (norm family, GlobEnc, ALTI, ALTI-Logit, DecompX, Value Zeroing) read it instead of code per
architecture. Module paths are dotted attribute names: ``layers``, ``embeddings`` and ``final_norm`` from the model's
base model, the others from one layer.
"""

from __future__ import annotations

from dataclasses import dataclass

# Where the norms sit: "post" (after each residual add: BERT), "pre" (before each sublayer: GPT-2, Llama),
# "sandwich" (before each sublayer and on its output: Gemma 2), "output" (on each sublayer's output only: OLMo 2).
NORM_PLACEMENTS = ("post", "pre", "sandwich", "output")
# How the value vectors sit in the output of the value module: "separate" (a value projection; grouped heads
# repeated), "concat" ([q | k | v] of equal widths: GPT-2, ModernBERT), "concat_gqa" ([q | k | v] with fewer key/value
# heads: Phi-3), "per_head" ([q_h k_h v_h] per head: GPT-NeoX), "grouped" ([q_1 .. q_g k v] per key/value head, g
# query heads sharing it: Falcon's new_decoder_architecture).
QKV_LAYOUTS = ("separate", "concat", "concat_gqa", "per_head", "grouped")
# Where the first layer's input is read: "embeddings" (the embeddings module's output) or "layer" (the first layer
# call's own input, where the model changes the embeddings before its layers: OPT's positions, Granite's multiplier).
LAYER_INPUTS = ("embeddings", "layer")


@dataclass(frozen=True)
class MLPMaps:
    """A pre-LN block's MLP as linear maps around one elementwise factor, the form DecompX carries its parts through
    (docs/methods.md 6.3); paths from the MLP module (``Block.mlp``; a ``Sublayer``'s root: OPT's layer). Plain:
    down(act(up(u))); gated: down(act(gate(u)) * up(u)); ``fused``: up's output holds [gate | up] (Phi-3's
    gate_up_proj)."""

    up: str
    down: str
    act: str  # the attribute holding the activation
    gate: str | None = None  # None: plain
    fused: bool = False


@dataclass(frozen=True)
class Experts:
    """A mixture of experts' MLP for DecompX (docs/methods.md 6.3): the router (a module returning the router logits,
    the chosen experts' weights and their indices), the experts (``gate_up_proj`` [E, 2F, d] holding [gate | up],
    ``down_proj`` [E, d, F], ``act_fn``), an optional shared expert (``dense``'s maps) scaled by the sigmoid of
    ``shared_gate``; a layer whose MLP has no router is a dense MLP described by ``dense`` (Qwen2-MoE's
    mlp_only_layers)."""

    dense: MLPMaps
    router: str = "gate"
    experts: str = "experts"
    shared: str | None = None
    shared_gate: str | None = None


@dataclass(frozen=True)
class Block:
    layers: str  # the ModuleList of layers
    embeddings: str  # the module whose output is the first layer's input
    attention: str  # the module whose forward returns (output, attention probabilities)
    value: str  # the module whose output holds the value vectors (with their bias)
    out_proj: str  # W_O, b_O
    ln1: str | None  # post: the norm after attention's residual add; else the norm before attention (None: none)
    ln2: str | None  # a module whose input is the residual stream after attention (post: the norm after the MLP's add)
    mlp: str  # the feed-forward block as one module
    norms: str = "post"  # NORM_PLACEMENTS
    norm: str = "layernorm"  # "layernorm" | "rmsnorm"
    norm_bias: bool = True
    norm_offset: float = 0.0  # the gain is offset + weight (Gemma's RMSNorm: 1 + weight)
    qkv: str = "separate"  # QKV_LAYOUTS
    attn_out_norm: str | None = None  # a norm on the attention output before the residual add (Gemma 2, OLMo 2)
    parallel: bool = False  # attention and MLP both read the layer input: x' = x + Attn(LN1 x) + MLP(LN2 x)
    # "absolute" | "rotary" | "relative" (DeBERTa's disentangled terms) | "alibi" (a per-head bias on the scores:
    # BLOOM, Falcon, MPT): A only
    positions: str = "absolute"
    # "plain" act(W1 y) | "gated" act(W_g y) * W_u y (SwiGLU, GeGLU) | "moe" a router's chosen experts (gated MLPs)
    # weighted by its gates (Mixtral, Qwen2/3-MoE, OLMoE): the token's own step; no expert's weights are read
    mlp_kind: str = "plain"
    extra_norms: tuple[str, ...] = ()  # norms that touch only A (QK-norm) or the MLP's output (Gemma 2, OLMo 2)
    softcap: bool = False  # attention-logit soft-capping (Gemma 2): A only
    final_norm: str | None = None  # a norm after the last layer, whose output is the last hidden state
    windowed: bool = False  # sliding-window attention: a pad query may have no key in its window
    attention_flag: bool = False  # the attention module returns probabilities only when asked (DeBERTa's self)
    mlp_maps: MLPMaps | Experts | None = None  # the pre-LN MLP's linear maps (DecompX); None: not declared
    layer_input: str = "embeddings"  # LAYER_INPUTS

    def __post_init__(self):
        assert self.norms in NORM_PLACEMENTS and self.qkv in QKV_LAYOUTS and self.layer_input in LAYER_INPUTS, self

    @property
    def pre_ln(self) -> bool:
        """No norm on the residual path between layers (every placement but "post")."""
        return self.norms != "post"

    @property
    def attn_out_captured(self) -> bool:
        """The decomposition needs the attention output itself: to linearise a norm on it, or to rebuild the residual
        stream after attention of a parallel block (no module reads it)."""
        return self.attn_out_norm is not None or self.parallel
