"""Peak memory of one example (batch 1) per method, computed from the model's shapes: docs/scaling.md's table of
which methods fit a 7B model at 4,096 tokens on an 80 GB card, and the chunk sizes the methods' budgets give there.

Each method's peak is the model's weights and KV cache plus the largest of the stages it runs through: the forward
pass that captures what it ``needs`` (the layer lists kept in the model's dtype, then stacked and widened to float32,
``compute.adapters._stack_and_upcast``), or the gradient pass (every layer's activations kept for the backward), and
then the method's own tensors. Only the terms that grow with the layers times n^2 or n d, or with the model, are
counted: a term of one layer's n d is left out. ``python -m compute.memory_model`` prints the table, ``--fits`` the
fit tables of five public models (``MODELS``) on 24, 48 and 80 GB cards; --batch-size auto asks ``per_batch`` first
(compute/run/auto_batch.py). tests/test_memory_model.py holds the n^2 terms against the measured peak of a tiny model
on the CPU.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace

from .attention_streaming import heads_per_chunk, streams_attention

GB = 10**9
CARD_BYTES = 80 * GB  # "an 80 GB card"
F32 = 4  # the methods compute in float32 at least (compute.adapters._stack_and_upcast, gradients.wide)


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    d: int
    heads: int
    kv_heads: int
    d_ff: int
    vocab: int
    gated: bool = True  # SwiGLU: three d x d_ff matrices a layer (Llama, Mistral), else two
    kv_cache: bool = True  # a decoder's forward builds a KV cache (use_cache), kept with the output
    labels: int = 2  # a sequence-classification head
    head_dim: int = 0  # each head's width (0: d / heads); Gemma 2's H d_h is wider than d
    norms: int = 2  # norms a layer (Gemma 2's sandwich: four)
    qkv_bias: bool = False  # biases on the query, key and value projections (Qwen2)
    positions: int = 0  # max_position_embeddings: the longest input the model takes (0: not stated)
    softcap: bool = False  # attention logit soft-capping (Gemma 2): no SDPA attention (checkpointed.supports_sdpa)

    @property
    def d_head(self) -> int:
        return self.head_dim or self.d // self.heads

    @property
    def d_kv(self) -> int:
        return self.kv_heads * self.d_head

    @property
    def layer_params(self) -> int:
        d_q = self.heads * self.d_head
        per_layer = 2 * self.d * d_q + 2 * self.d * self.d_kv + (3 if self.gated else 2) * self.d * self.d_ff
        return per_layer + self.qkv_bias * (d_q + 2 * self.d_kv) + self.norms * self.d

    @property
    def params(self) -> int:
        return self.vocab * self.d + self.layers * self.layer_params + self.d + self.d * self.labels


# The public configs (config.json on the Hugging Face hub), with a two-class head instead of the language model's
LLAMA2_7B = ModelShape("Llama-2-7B", layers=32, d=4096, heads=32, kv_heads=32, d_ff=11008, vocab=32000,
                       positions=4096)
MISTRAL_7B = ModelShape("Mistral-7B", layers=32, d=4096, heads=32, kv_heads=8, d_ff=14336, vocab=32000,
                        positions=32768)
LLAMA3_8B = ModelShape("Llama-3-8B", layers=32, d=4096, heads=32, kv_heads=8, d_ff=14336, vocab=128256,
                       positions=8192)
QWEN25_7B = ModelShape("Qwen2.5-7B", layers=28, d=3584, heads=28, kv_heads=4, d_ff=18944, vocab=152064,
                       qkv_bias=True, positions=131072)
GEMMA2_9B = ModelShape("Gemma-2-9B", layers=42, d=3584, heads=16, kv_heads=8, d_ff=14336, vocab=256000,
                       head_dim=256, norms=4, positions=8192, softcap=True)
MODELS = (LLAMA2_7B, MISTRAL_7B, LLAMA3_8B, QWEN25_7B, GEMMA2_9B)


@dataclass(frozen=True)
class Budgets:
    """The methods' chunk budgets in bytes (compute.methods._internals.budget.work_bytes): on a GPU 1/64 of the
    card (1/8 for integrated gradients), on the CPU the methods' own constants."""

    stack: int  # layers of a layer-wise product stacked at once (LayerwiseProduct, CPU_STACK_BYTES)
    alti: int  # ALTI's blocks of source tokens (alti.CPU_BLOCK_BYTES)
    value_zeroing: int  # a block of zeroed tokens (value_zeroing.CPU_BLOCK_BYTES)
    decompx: int  # DecompX's feed-forward blocks of source tokens (token_vectors.CPU_BLOCK_BYTES)
    ig: int  # integrated gradients' rows of one pass (gradients.IG_CPU_BYTES)
    # DecompX's decomposition, [n, k, d] for k source tokens (token_vectors.CPU_STATE_BYTES; a GPU's 1 /
    # STATE_GPU_SHARE)
    decompx_state: int = 0
    device: str = "cuda"  # where the methods run: the CPU's forms differ (ALTI's pruned L1 proximities: alti_form)

    @classmethod
    def gpu(cls, card_bytes: int = CARD_BYTES) -> Budgets:
        from .methods._internals.budget import GPU_SHARE

        from .methods._internals.token_vectors import STATE_GPU_SHARE

        share = card_bytes // GPU_SHARE
        return cls(stack=share, alti=share, value_zeroing=share, decompx=share, ig=card_bytes // 8,
                   decompx_state=card_bytes // STATE_GPU_SHARE)

    @classmethod
    def cpu(cls) -> Budgets:
        from .methods import alti, value_zeroing
        from .methods._internals import budget, gradients, token_vectors

        return cls(stack=budget.CPU_STACK_BYTES, alti=alti.CPU_BLOCK_BYTES,
                   value_zeroing=value_zeroing.CPU_BLOCK_BYTES, decompx=token_vectors.CPU_BLOCK_BYTES,
                   ig=gradients.IG_CPU_BYTES, decompx_state=token_vectors.CPU_STATE_BYTES, device="cpu")


@dataclass(frozen=True)
class Run:
    n: int  # tokens
    itemsize: int = 2  # the model's dtype: 2 (bfloat16), 4 (float32)
    budgets: Budgets = field(default_factory=Budgets.gpu)
    matrices: str = "cls"  # --matrices: what a method that streams its layers keeps of its per-layer matrices


# --- the stages -------------------------------------------------------------------------------------------------
def weights(m: ModelShape, r: Run) -> int:
    return m.params * r.itemsize


def kv_cache(m: ModelShape, r: Run) -> int:
    return 2 * m.layers * r.n * m.d_kv * r.itemsize if m.kv_cache else 0


def layer_transient(m: ModelShape, r: Run) -> int:
    """One layer of the forward while it runs: its eager attention (the scores in the model's dtype beside their
    float32 softmax, and the additive [n, n] mask) or its feed-forward block (three [n, d_ff]), whichever is larger,
    and a few [n, d] of the residual stream."""
    attention = m.heads * r.n ** 2 * (r.itemsize + F32) + r.n ** 2 * r.itemsize
    return max(attention, 3 * r.n * m.d_ff * r.itemsize) + 6 * r.n * m.d * r.itemsize


def bare_forward(m: ModelShape, r: Run) -> int:
    """The peak of a forward that captures nothing: the weights, the KV cache and one layer's transient."""
    return weights(m, r) + kv_cache(m, r) + layer_transient(m, r)


def captured_lists(m: ModelShape, r: Run, needs: frozenset[str]) -> list[int]:
    """Elements of each captured layer list, in the order _stack_and_upcast stacks them (adapters.STACKED)."""
    L, n = m.layers, r.n
    sizes = {"hidden_states": (L + 1) * n * m.d, "attentions": L * m.heads * n * n, "values": L * n * m.d_kv,
             "ln1": 2 * L * n * m.d, "ln2": 2 * L * n * m.d}
    return [sizes[k] for k in ("hidden_states", "attentions", "values", "ln1", "ln2") if k in needs]


def capture(m: ModelShape, r: Run, needs: frozenset[str]) -> tuple[int, int]:
    """(peak, kept) bytes of the forward that captures ``needs``: the lists in the model's dtype, each then stacked
    (a copy) and widened to float32 (another) one after another. The head means ("attention_mean", float32 [L, n, n])
    are taken layer by layer as the forward makes each attention where ``streams_attention`` says so (into the
    [L, n, n] made at the first layer, resident as each layer is written), else from the float32 stack of every layer's attention, which is then dropped."""
    if "attention_mean" in needs and "attentions" not in needs:
        means = m.layers * r.n ** 2 * F32
        if streams_attention(m.layers, m.heads, 1, r.n, r.budgets.stack):
            peak, kept = capture(m, r, needs - {"attention_mean"})
            # its pages are written layer by layer: the last layer's attention finds L - 1 layers' means
            return max(peak + means - r.n ** 2 * F32, kept + means), kept + means
        peak, kept = capture(m, r, needs - {"attention_mean"} | {"attentions"})
        return max(peak, kept + means), kept - m.layers * m.heads * r.n ** 2 * F32 + means
    if "narrow_layers" in needs:  # DecompX's: every layer's lists, stacked below the block budget
        lists = needs - {"narrow_layers"} | DECOMP
        if not streams_attention(m.layers, m.heads, 1, r.n, r.budgets.stack):
            return capture(m, r, lists)
        kept = sum(captured_lists(m, r, lists)) * r.itemsize  # as the forward made them: no stack, no float32 copy
        return kept + layer_transient(m, r) - m.heads * r.n ** 2 * r.itemsize, kept
    w, wide = r.itemsize, max(r.itemsize, F32)
    sizes = captured_lists(m, r, needs)
    # the last layer's attention is both the transient's output and the list's last entry; of the L + 1 hidden
    # states, the last layer's output is not made yet, its input and the embedding output are the forward's own
    # (the bare forward keeps them: measured on a tiny Llama, tests/test_memory_model.py)
    peak = sum(sizes) * w + layer_transient(m, r) - ("attentions" in needs) * m.heads * r.n ** 2 * w \
        - ("hidden_states" in needs) * 3 * r.n * m.d * w
    for i, s in enumerate(sizes):
        before, after = sum(sizes[:i]) * wide, sum(sizes[i + 1:]) * w
        peak = max(peak, before + after + 2 * s * w)  # the stack beside the list
        if w < F32:
            peak = max(peak, before + after + s * (w + F32))  # the float32 stack beside the stack
    return peak, sum(sizes) * wide


def pass_row(m: ModelShape, r: Run, checkpointed: bool = False, sdpa: bool = False) -> int:
    """A rough count of what one row of a forward keeps for its backward (gradients.row_bytes): every layer's 16
    d-vectors and 3 attention maps per token, or checkpointed every layer's input and one layer's (``sdpa``: the
    mask's [n, n] instead of the maps)."""
    layer = r.n * (16 * m.d + (r.n if sdpa else 3 * m.heads * r.n)) * r.itemsize
    return m.layers * r.n * m.d * r.itemsize + layer if checkpointed else m.layers * layer


def checkpoints(m: ModelShape, r: Run, rows: int = 1) -> bool:
    """Whether a gradient pass checkpoints every layer (gradients.checkpoints): ``rows`` rows' plain pass (in the
    pass's dtype, r.itemsize) beyond the pass's memory (the IG budget)."""
    return rows * pass_row(m, r) > r.budgets.ig


def sdpa_layer_transient(m: ModelShape, r: Run) -> int:
    """One layer of a checkpointed forward with the SDPA attention (checkpointed.layer_checkpoints' ``sdpa``): no
    [H, n, n], the boolean [n, n] mask, the feed-forward block's three [n, d_ff] and a few [n, d]."""
    return r.n ** 2 + 3 * r.n * m.d_ff * r.itemsize + 6 * r.n * m.d * r.itemsize


def sdpa_layer_backward(m: ModelShape, r: Run) -> int:
    """One layer's backward in a checkpointed pass with the SDPA attention: its recomputed activations (12 n d and
    4 n d_ff) and the mask, then the larger of the attention's backward (the query, key and value gradients, with
    float32 accumulators where the model is narrower) and the feed-forward block's."""
    n, w = r.n, r.itemsize
    saved = (12 * n * m.d + 4 * n * m.d_ff) * w + n ** 2
    return saved + max(3 * n * m.d * (w + (F32 if w < F32 else 0)), 3 * n * m.d_ff * w)


def layer_backward(m: ModelShape, r: Run, hook: tuple[int, int] | None = None) -> int:
    """One layer's backward in a checkpointed pass: its recomputed activations (the float32 softmax, the attention
    in the model's dtype where narrower, 12 n d and 4 n d_ff), dF/dA, and the larger of the softmax's backward (its
    float32 output, and dF/dA widened where the model is narrower: measured on the CPU in float32), the
    feed-forward block's and the hook reducing A and dF/dA (``hook``: [H, n, n] float32 copies made, where the
    model is narrower, and of its own; checkpointed.TermHooks)."""
    n, w, A = r.n, r.itemsize, m.heads * r.n ** 2
    saved = A * (F32 + (w if w < F32 else 0)) + (12 * n * m.d + 4 * n * m.d_ff) * w
    reduce = 0 if hook is None else (hook[0] * (w < F32) + hook[1]) * A * F32
    softmax = (1 + (w < F32)) * A * F32  # its output, and dF/dA widened where the model is narrower
    return saved + A * w + max(softmax, 3 * n * m.d_ff * w, reduce)


def chunk_heads(m: ModelShape, r: Run) -> int:
    """Heads a chunk of the head-chunked pass (checkpointed.HeadChunks: the block budget's)."""
    return heads_per_chunk(m.heads, 1, r.n, r.budgets.stack)


def chunked_layer_transient(m: ModelShape, r: Run) -> int:
    """One layer of a head-chunked forward (checkpointed.HeadChunks): one chunk's eager attention (its scores in the
    model's dtype beside their float32 softmax), the additive [n, n] mask, or the feed-forward block, and a few
    [n, d] with the chunks' outputs and their concatenation."""
    attention = chunk_heads(m, r) * r.n ** 2 * (r.itemsize + F32) + r.n ** 2 * r.itemsize
    return max(attention, 3 * r.n * m.d_ff * r.itemsize) + 8 * r.n * m.d * r.itemsize


def chunked_layer_backward(m: ModelShape, r: Run, hook: tuple[int, int]) -> int:
    """One layer's backward in a head-chunked pass: the mask, and the larger of the feed-forward block's backward
    beside the layer's recomputed activations (12 n d and 4 n d_ff, no [H, n, n]) and the attention's, whose chunks
    come after the feed-forward block's saved tensors are freed: the attention's 12 n d, the query, key and value
    gradients (the latter two in float32) and one chunk's recomputed softmax (float32, and A in the model's dtype
    where narrower), then dF/dA, its float32 copy where narrower and the softmax's gradient, or the terms' ``hook``
    [h, n, n] float32 copies (as layer_backward's) beside A and dF/dA."""
    n, w, Ah = r.n, r.itemsize, chunk_heads(m, r) * r.n ** 2
    narrow = w < F32
    softmax = Ah * (F32 + narrow * w) + Ah * (w + narrow * F32 + F32)
    terms = 2 * Ah * w + (hook[0] * narrow + hook[1]) * Ah * F32
    attention = 12 * n * m.d * w + n * m.d * w + 2 * n * m.d_kv * F32 + max(softmax, terms)
    return n ** 2 * w + max((12 * n * m.d + 4 * n * m.d_ff) * w + 3 * n * m.d_ff * w, attention)


def gradient_pass(m: ModelShape, r: Run, checkpointed: bool = False,
                  hook: tuple[int, int] | None = None, sdpa: bool = False,
                  chunked: bool = False) -> tuple[int, int]:
    """(peak, kept) bytes of the gradient pass (GradientPass). Plain: the forward's tensors saved for the backward
    (per layer the float32 softmax, the attention in the model's dtype where that is narrower, 12 n d and 4 n d_ff
    activations), the gradients of every layer's attention (kept for the methods) and one layer's backward (the
    softmax's and the feed-forward block's). ``checkpointed`` (no KV cache): every layer's input and the gradients of
    the hidden states, with one layer's forward, or one layer's backward (``layer_backward``; ``sdpa``: the SDPA
    attention's, ``sdpa_layer_backward``; ``chunked``: a chunk of heads at a time, ``chunked_layer_backward``)."""
    L, n, w = m.layers, r.n, r.itemsize
    A = m.heads * n * n
    if checkpointed:
        states = (L + 1) * n * m.d * w
        kept = 2 * states  # + dF/dh of every layer
        if chunked:
            return max(states + chunked_layer_transient(m, r), kept + chunked_layer_backward(m, r, hook)), kept
        if sdpa:
            return max(states + sdpa_layer_transient(m, r), kept + sdpa_layer_backward(m, r)), kept
        return max(states + layer_transient(m, r), kept + layer_backward(m, r, hook)), kept
    saved = L * (A * (F32 + (w if w < F32 else 0)) + (12 * n * m.d + 4 * n * m.d_ff) * w)
    kept = saved + L * A * w + kv_cache(m, r)  # + dF/dA of every layer
    return kept + max(2 * A * F32, 3 * n * m.d_ff * w), kept


def rules_layer_backward(m: ModelShape, r: Run, rows: int, hook: int) -> int:
    """One layer's backward in the decoder rules' checkpointed pass (r.itemsize: the pass's, 8 for the LRP family)
    of ``rows`` rows (2: the doubled batch): its recomputed tensors (the softmax's float32 output and the attention
    beside it where the pass is wider, 16 n d and 6 n d_ff activations with the rules' saved operands and factors),
    and the largest of: dF/dA with the hook's ``hook`` [H, n, n] of the rules' rows (R^{A,l}, dF/dA times it, its
    positive part: RuleOperands) or with its float32 copy (the softmax's backward starts), the softmax's backward
    (two [H, n, n] a row at most: its float32 result and the scores' gradient, then the scores' two), the
    feed-forward block's."""
    n, w, A = r.n, r.itemsize, m.heads * r.n ** 2
    saved = A * (F32 + (w if w != F32 else 0)) + (16 * n * m.d + 6 * n * m.d_ff) * w
    attention = rows * A * w + max(hook * A * w, rows * A * F32)
    return rows * saved + max(attention, rows * 2 * A * max(w, F32), rows * 3 * n * m.d_ff * w)


def rules_pass(m: ModelShape, r: Run, rows: int, hook: int) -> tuple[int, int]:
    """(peak, kept) bytes of the decoder rules' checkpointed pass (no KV cache): every layer's input, of ``rows``
    rows, with one layer's forward or one layer's backward (no layer's dF/dh kept: <dF/dh, h> [n] in a hook)."""
    states = rows * (m.layers + 1) * r.n * m.d * r.itemsize
    return max(states + rows * layer_transient(m, r), states + rules_layer_backward(m, r, rows, hook)), states


def _mats(m: ModelShape, r: Run, k: float) -> int:
    """k float32 [L, n, n] matrices."""
    return int(k * m.layers * r.n ** 2 * F32)


def stack_layers(m: ModelShape, r: Run) -> int:
    """Layers per stack of a layer-wise product (decomposition.layer_groups): as many as the budget holds."""
    per = F32 * r.n * m.heads * (m.d + 3 * r.n)  # LayerwiseProduct.bytes_per_row
    return max(1, min(m.layers, r.budgets.stack // per))


def layerwise(m: ModelShape, r: Run) -> int:
    """A layer-wise product's work: one stack's projected values [n, H, d] and three [H, n, n], its [n, n] results,
    the [L, n, n] matrices twice (the product and its valid block), the folded d x d weights of every layer."""
    K = stack_layers(m, r)
    return K * F32 * r.n * m.heads * (m.d + 3 * r.n) + 2 * K * r.n ** 2 * F32 + _mats(m, r, 2) \
        + m.layers * m.d * m.d * F32


def alti_block_tokens(m: ModelShape, r: Run) -> int:
    """ALTI's source tokens per block: a [n, k, d] block and its difference within the budget."""
    return max(1, r.budgets.alti // (2 * r.n * m.d * F32))


def value_zeroing_block_tokens(m: ModelShape, r: Run) -> int:
    """Value zeroing's zeroed tokens per block on the pre-LN models of the tables: a gated MLP's three [k, n, d_ff]
    activations and four [k, n, d] states of each layer processed at once (one where the layers stream, else a
    stack) within the budget (value_zeroing.zeroed_distances_pre_ln)."""
    K = 1 if streams_attention(m.layers, m.heads, 1, r.n, r.budgets.stack) else stack_layers(m, r)
    return max(1, min(r.n, r.budgets.value_zeroing // (K * r.n * (3 * m.d_ff + 4 * m.d) * F32)))


def ig_rows(m: ModelShape, r: Run) -> int:
    """Integrated gradients' rows per forward/backward (gradients.rows_per_pass), checkpointed where one row's plain
    pass does not fit, with the SDPA attention where the model has it."""
    ckpt = checkpoints(m, r)
    return max(1, r.budgets.ig // pass_row(m, r, ckpt, ckpt and not m.softcap))


def decompx_block_tokens(m: ModelShape, r: Run) -> int:
    """DecompX's source tokens per block (token_vectors.source_blocks): STATE_COPIES [n, k, d] within the budget."""
    from .methods._internals.token_vectors import STATE_COPIES

    return max(1, min(r.n, r.budgets.decompx_state // (STATE_COPIES * r.n * m.d * F32)))


def decompx(m: ModelShape, r: Run) -> int:
    """DecompX's work: STATE_COPIES of a block's parts [n, k, d] (PSEUDO columns more while a stage's sums are
    sought), and where k < n each share's dots over every source and their weights, 2 PSEUDO [n, n]; the
    feed-forward blocks (budget); every layer's weights in float32 and per-token factors. Above the block budget
    (the capture's lists narrow: token_vectors.Layers) one layer's step at a time (``decompx_layer``) beside every
    layer's output projection in float32 (the decomposition's stacked weights) and the explained rows [L, n, d]."""
    from .methods._internals.token_vectors import PSEUDO, STATE_COPIES

    k = decompx_block_tokens(m, r)
    blocked = k < r.n
    state = STATE_COPIES * r.n * (k + PSEUDO * blocked) * m.d * F32 + blocked * 2 * PSEUDO * r.n ** 2 * F32
    if streams_attention(m.layers, m.heads, 1, r.n, r.budgets.stack):
        W_O = m.layers * m.d * m.heads * m.d_head * F32
        return state + r.budgets.decompx + decompx_layer(m, r) + W_O + m.layers * r.n * m.d * F32
    return state + r.budgets.decompx + ffn_weights(m) + m.layers * 2 * m.d * m.d * F32 + m.layers * r.n * m.d * F32 * 4


def decompx_layer(m: ModelShape, r: Run) -> int:
    """One layer's step of DecompX a layer at a time, in float32: its attention [H, n, n] and a few [n, d], its
    weights cast (the value and output maps, the MLP's maps and the transposed copies of two: 5 d d_ff for a gated
    MLP) and the MLP's factors while they are made (three [n, d_ff])."""
    maps = (5 if m.gated else 4) * m.d * m.d_ff + 2 * m.d * m.heads * m.d_head
    return (m.heads * r.n ** 2 + maps + 3 * r.n * m.d_ff + 8 * r.n * m.d) * F32


def ffn_weights(m: ModelShape) -> int:
    return m.layers * (3 if m.gated else 2) * m.d * m.d_ff * F32  # stacked_ffn: every layer's weights in float32


# --- the layer-streamed decomposition (issue 36: compute.methods._internals.decomposition.streamed_layers) --------
def layer_lists(m: ModelShape, r: Run, narrow: bool = False) -> int:
    """One layer's decomposition lists while its end hook runs (Adapter.each_layer): its attention and seven [n, d]
    (input, output, values, both norms' input and output) in the model's dtype, and their float32 copies where that
    is narrower (``narrow``: the attention's not; streamed_layers' narrow_attention); beside them the forward's
    additive mask [n, n], alive through the forward (measured on the tiny-but-long Llama: 16 MiB at 2,048 tokens)."""
    A, vectors = m.heads * r.n ** 2, 7 * r.n * m.d
    wide = (vectors + (0 if narrow else A)) * F32 if r.itemsize < F32 else 0
    return (A + vectors) * r.itemsize + wide + r.n ** 2 * r.itemsize


def gram_chunk(m: ModelShape, r: Run) -> int:
    """The head-Gram quadratic form's two [H, k, n] temporaries (decomposition.gram_quadratic: k queries a block,
    within the block budget; all n where they fit)."""
    per_query = 2 * m.heads * r.n * F32
    return min(r.n, max(1, r.budgets.stack // per_query)) * per_query


def kept_views(m: ModelShape, r: Run) -> tuple[int, int]:
    """(held through the layers, added at the end) by a streamed layer-wise product: every layer's matrix under
    --matrices all (and their stack at the end), else the running product M^l ... M^1 and the kept rows."""
    if r.matrices == "all":
        return _mats(m, r, 1), _mats(m, r, 1)
    return r.n ** 2 * F32 + 2 * m.layers * r.n * F32, 0


@dataclass(frozen=True)
class Streamed:
    """A method that streams its layers where the stack of every layer's attention exceeds the block budget
    (compute.attention_streaming, the capture's "layer_parts"); below it ``stacked`` (the capture's stacks).
    ``work``: (m, r) -> one layer's own tensors beside its lists (the product's next [n, n] included);
    ``weights``: float32 [L, d, d] stacks it keeps (W_O, a kind's folded weight, the Gram matrix's upper block
    triangle, formed a layer at a time: LayerWeights.gram_blocks; for the pre-LN models of the tables); ``held``: (m, r) -> (held through the layers, added
    at the end), by default ``kept_views``; ``narrow``: the layer's attention is not widened (narrow_attention)."""

    stacked: Formula
    work: object
    weights: float
    held: object = kept_views
    narrow: bool = False


def weight_stacks(m: ModelShape, s: Streamed) -> int:
    """A streamed method's float32 [L, d, d] weight stacks (``Streamed.weights``): made once for a batch."""
    return int(s.weights * m.layers * m.d * m.d * F32)


def streamed(m: ModelShape, r: Run, s: Streamed) -> dict:
    """The stages of a streamed method: the runner's capture (nothing kept: a bare forward), then the method's own
    forward (no KV cache: Adapter.each_layer; the runner has dropped the capture's output), each layer's lists and
    work at its end beside what is held, and what the end adds. Without a KV cache the layer's own keys and values
    [n, d_kv] are its transient's (the bare forward's are in its cache)."""
    base = weights(m, r) + weight_stacks(m, s)
    held, end = s.held(m, r)
    own = layer_transient(m, r) + 2 * r.n * m.d_kv * r.itemsize
    return {"capture": weights(m, r) + kv_cache(m, r) + layer_transient(m, r),
            "layers": base + held + max(own, layer_lists(m, r, s.narrow) + s.work(m, r)),
            "views": base + 2 * held + end if r.matrices == "all" else base + held + end}


def alti_logit_held(m: ModelShape, r: Run) -> tuple[int, int]:
    """ALTI-Logit keeps per layer the explained token's contributions carried to the inputs, (C^{l-1} ... C^1)^T Z^l
    [n, d], for its directions (found from the top), and ALTI's running product [n, n]."""
    return m.layers * r.n * m.d * F32 + r.n ** 2 * F32, 0


# --- the methods ----------------------------------------------------------------------------------------------
MEANS, HIDDEN = frozenset({"attention_mean"}), frozenset({"hidden_states"})
DECOMP = frozenset({"attentions", "hidden_states", "values", "ln1", "ln2"})


def _nothing(m: ModelShape, r: Run) -> int:
    return 0


@dataclass(frozen=True)
class Checkpointed:
    """A gradient method's checkpointed pass (where ``checkpoints``): what its hooks make of each layer's A and dF/dA
    (``hook``: layer_backward's), the bytes its terms hold through the backward (``held``) and its work after the
    pass (``work``); ``attention``: it reads A or dF/dA (else the pass runs the SDPA attention where the model has
    it: GradientPass.sdpa)."""

    work: object
    hook: tuple[int, int] | int | None = None  # the decoder rules' (``rules``): rules_layer_backward's
    held: object = _nothing
    attention: bool = True
    rules: bool = False  # the decoder rules' pass (rules_pass: no dF/dh kept)
    chunked: bool = False  # the attention a chunk of heads at a time (checkpointed.HeadChunks; ``hook`` a chunk's)


@dataclass(frozen=True)
class Formula:
    """How a method runs: on the captured ``needs`` ("capture"), after the gradient pass ("gradients"), as
    integrated gradients' rows of gradient passes ("integrated"), or after a gradient pass in float64, the weights
    cast a layer at a time ("float64", the LRP family on decoders); ``work``: (m, r) -> the bytes it adds to what its
    pass keeps."""

    stage: str
    work: object
    text: str  # what it materialises, for the doc
    needs: frozenset[str] = frozenset()
    rows: int = 1  # the pass's rows per example (2: the LRP family's doubled batch, its plain half for dF/dA)
    streamed: Checkpointed | None = None  # the gradient stage's checkpointed pass (None: the plain pass only)


def _attention_stacks(k: float, itemsize: int = F32):
    """k [L, H, n, n] tensors of ``itemsize`` (and one [L, n, n] result); a float32 stack of a narrower model's
    tensors has the stack in the model's dtype beside it while it is widened (gradients.stacked)."""
    def work(m, r):
        narrow = r.itemsize if r.itemsize < itemsize else 0
        return int((k * itemsize + narrow) * m.layers * m.heads * r.n ** 2) + _mats(m, r, 1)
    return work


FORMULAS: dict[str, Formula] = {}


def _add(names, f: Formula):
    for name in names.split():
        FORMULAS[name] = f


_add("raw_attention", Formula("capture", lambda m, r: _mats(m, r, 1) + r.n ** 2 * F32,
                              "head means [L,n,n] (layer by layer); their valid block [L,n,n]", MEANS))
# rollout and W_FIXEDRES stream their layers above the block budget (STREAMED, below); below it the capture's head
# means from the stack of every layer's attention, and 2 [L,n,n] (normalised, stored)
_STACKED_MEANS = Formula("capture", lambda m, r: _mats(m, r, 2) + r.n ** 2 * F32,
                         "head means [L,n,n]; 2 [L,n,n] (normalised, stored)", MEANS)
# The layer-wise products stream their layers above the block budget (STREAMED); below it, their stacked formulas.
_STACKED_NORMS = Formula("capture", layerwise, "capture [L,H,n,n] + 5 L n d; a stack of K layers' [n,H,d] + 3 [H,n,n]; "
                         "2 [L,n,n]; L d^2", DECOMP)
_STACKED_ALTI = Formula("capture", lambda m, r: _mats(m, r, 2) + r.n ** 2 * F32 + r.budgets.alti,
                        "capture [L,H,n,n]; 2 [L,n,n]; ALTI's [n,k,d] blocks (budget): its proximities need no stack "
                        "of [H,n,n]", DECOMP)
_STACKED_ALTI_L2 = Formula("capture", lambda m, r: layerwise(m, r) + r.budgets.alti,
                           "as the norm family, and ALTI's [n,k,d] blocks (budget)", DECOMP)
STREAMED_TEXT = "a layer at a time: its [H,n,n]{wide} + {work}; {held}"
_CLS = "the running product [n,n] and the kept rows (--matrices all: every layer's [n,n])"


def _norm_work(m, r):  # the Gram form's blocks of queries, the layer's matrix and three [n, n] beside it
    return gram_chunk(m, r) + 5 * r.n ** 2 * F32


def alti_form(m: ModelShape, r: Run) -> str:
    """The form of ALTI's L1 proximities on a streamed layer (l1_proximity.l1_proximities' "auto"): "pruned" where
    the code may choose it (``may_prune``: on the CPU, the layer's attention in the vectors' float32, from
    PROBE_MIN_TOKENS tokens, d large enough for pruning to pay; its probe then decides from the numbers: counted as
    the larger of both forms), else "dense" (a GPU's kernel or dense form)."""
    from .methods._internals.l1_proximity import may_prune

    return "pruned" if may_prune(r.n, m.d, r.budgets.device, r.itemsize < F32) else "dense"


def alti_pruned_work(m: ModelShape, r: Run) -> int:
    """The pruned form's tensors on one layer (l1_proximity.pruned_l1_proximities), float32 unless said: U [H, d, n]
    (each head's projected values, gathered by rows), the pairs' bounds [n, n] and their ranks r [n, n] (int64), the
    sorted components [n, K <= d] (float32, their int64 order, their signs) with the signs, |a| and U's squares
    [n, d] (8 [n, d] in all); then the larger of <s_i, T_ij> (attention_inner: every head's [H, n, n] with its sum,
    or by blocks of queries within the stack budget, two [H, k, n] while the next is made, into an [n, n]) and the
    steps' four [n, n] (the result, the excess, a step's T and a head's gathered rows)."""
    n, nn = r.n, r.n ** 2 * F32
    per_query = m.heads * n * F32
    k = max(1, r.budgets.stack // per_query)
    inner = m.heads * nn + nn if k >= n else nn + 2 * k * per_query + k * n * F32
    return n * m.heads * m.d * F32 + 3 * nn + 8 * n * m.d * F32 + max(inner, 4 * nn)


def _alti_work(m, r):
    """A float32 copy of the layer's attention in another layout within the block budget (the GPU kernel's,
    compute/kernels/alti_l1.py, or the dense form's source-major one: SourceBlocks; beyond it the dense form widens
    and lays out a block of sources at a time), the projected values [n, H, d], the source blocks (budget), three
    [n, n] (the proximities, their valid block and the normalised matrix, alive together in Alti.stack_matrices);
    where the CPU may prune (``alti_form``), the larger of that and the pruned form's."""
    copy = min(m.heads * r.n ** 2 * F32, r.budgets.alti)
    dense = copy + r.n * m.heads * m.d * F32 + r.budgets.alti + 3 * r.n ** 2 * F32
    return max(dense, alti_pruned_work(m, r)) if alti_form(m, r) == "pruned" else dense


STREAMED: dict[str, Streamed] = {}
for _names, _s, _text in (
        ("norm_n norm_fixedres norm_res norm_resln", Streamed(_STACKED_NORMS, _norm_work, 1.5, narrow=True),
         STREAMED_TEXT.format(wide="", work="the Gram form's query blocks (budget)", held=_CLS)),
        ("globenc", Streamed(_STACKED_NORMS, _norm_work, 2.5, narrow=True),
         STREAMED_TEXT.format(wide="", work="the Gram form's query blocks (budget)", held=_CLS)),
        ("w_res", Streamed(_STACKED_NORMS, lambda m, r: 6 * r.n ** 2 * F32 + 4 * r.n * m.d * F32, 2, narrow=True),
         STREAMED_TEXT.format(wide="", work="[n,n]s", held=_CLS)),
        ("alti", Streamed(_STACKED_ALTI, _alti_work, 1, narrow=True),
         STREAMED_TEXT.format(wide="", work="its float32 source-major copy by blocks, the [n,H,d] values, ALTI's blocks (budget)", held=_CLS)),
        ("alti_l2", Streamed(_STACKED_ALTI_L2, lambda m, r: gram_chunk(m, r) + 6 * r.n ** 2 * F32, 1.5, narrow=True),
         STREAMED_TEXT.format(wide="", work="the inner products' and the Gram form's query blocks (budget)",
                              held=_CLS)),
        ("alti_logit", Streamed(_STACKED_ALTI_L2, _alti_work, 1, alti_logit_held, narrow=True),
         STREAMED_TEXT.format(wide="", work="as ALTI", held="ALTI's running product [n,n] and every layer's "
                                                           "contributions to the explained token carried to the inputs [L,n,d]"))):
    for _name in _names.split():
        STREAMED[_name] = _s
        FORMULAS[_name] = Formula("streamed", None, _text, frozenset({"layer_parts"}))
# rollout, W_FIXEDRES (HeadMeanProduct): each layer's head mean as their own forward makes the layer (its lists the
# attention alone: layer_lists' seven [n, d] overcount it by one layer's n d), then M^l from it: the mean, a copy of
# its valid block, the mask's [n, n] and M^l; the product's next [n, n] after them
for _name in ("rollout", "w_fixedres"):
    STREAMED[_name] = Streamed(_STACKED_MEANS, lambda m, r: 4 * r.n ** 2 * F32, 0, narrow=True)
    FORMULAS[_name] = Formula("streamed", None, STREAMED_TEXT.format(
        wide="", work="its head mean and 3 [n,n] (M^l)", held=_CLS), frozenset({"layer_means"}))
_STACKED_VALUE_ZEROING = Formula("capture", lambda m, r: layerwise(m, r) + r.budgets.value_zeroing + ffn_weights(m),
     "as the norm family, the zeroed tokens' blocks (budget), every layer's FFN weights in float32", DECOMP)


def value_zeroing_block(m: ModelShape, r: Run) -> int:
    """A streamed layer's block of zeroed tokens: k tokens of a pre-LN MLP's [n, 3 d_ff + 4 d] within the budget
    (at least one)."""
    return value_zeroing_block_tokens(m, r) * r.n * (3 * m.d_ff + 4 * m.d) * F32


def _value_zeroing_work(m: ModelShape, r: Run) -> int:
    """The layer's projected values [n, H, d] (source-major), the source-major copy of its attention in the model's
    dtype where that fits the block budget (else a block at a time: SourceBlocks), and the larger of its block of
    zeroed tokens beside the distances [n, n] and, after the blocks, its [n, n]s (distances, valid block,
    normalised, the product's next)."""
    copy = m.heads * r.n ** 2 * r.itemsize
    return r.n * m.heads * m.d * F32 + (copy if copy <= r.budgets.stack else 0) \
        + max(value_zeroing_block(m, r) + r.n ** 2 * F32, 5 * r.n ** 2 * F32)


# streamed on the pre-LN models of the tables: the block's own MLP modules in the model's dtype, no float32 copy of
# any layer's feed-forward weights (a post-LN layer's are cast while it is processed)
STREAMED["value_zeroing"] = Streamed(_STACKED_VALUE_ZEROING, _value_zeroing_work, 1, narrow=True)
FORMULAS["value_zeroing"] = Formula("streamed", None, STREAMED_TEXT.format(
    wide="", work="its [n,H,d] values, a block of zeroed tokens (budget)", held=_CLS), frozenset({"layer_parts"}))
_add("decompx decompx_nohead", Formula("capture", decompx,
     "capture (above the block budget: each layer's as the forward made it); the decomposition of k source tokens "
     "[n,k,d] x 5 (k from its budget; k < n: 10 [n,n] of bias-share sums); FFN blocks (budget); float32 weights "
     "(above the block budget: one layer's step, its attention widened and weights cast)", frozenset({"narrow_layers"})))
_add("norm logat normxlogit", Formula("capture", lambda m, r: (m.layers + 1) * r.n * m.d * F32,
                                      "hidden states [L+1,n,d]; the forward's one-layer attention", HIDDEN))
def _cat_stacks(m: ModelShape, r: Run) -> int:
    """cat_terms: the hidden states and their gradients stacked in float32."""
    return 2 * (m.layers + 1) * r.n * m.d * F32


_add("grad_l2 gxi_l2 gxi_mean cat", Formula("gradients", _cat_stacks,
     "gradient pass: saved activations (float32 softmax) + dF/dA [L,H,n,n]; checkpointed: the layers' inputs, one "
     "layer recomputed with the SDPA attention (no [H,n,n])", streamed=Checkpointed(_cat_stacks, attention=False)))
_add("grads", Formula("gradients", _cat_stacks,
     "gradient pass + dF/dA [L,H,n,n]; checkpointed: the layers' inputs, one layer recomputed a chunk of heads at a "
     "time (the block budget's), the last dF/dA's rows", streamed=Checkpointed(_cat_stacks, hook=(1, 0), chunked=True)))
_add("attnlrp", Formula("gradients", lambda m, r: 2 * (m.layers + 1) * r.n * m.d * F32
                         + m.layers * r.n * (2 * m.d + m.d_ff) * r.itemsize,
     "gradient pass with the rules' factors (two norms' [n,d] and the activation's [n,d_ff] a layer) + dF/dA; "
     "checkpointed: the layers' inputs, one layer recomputed with its factors, <dF/dh, h> [n] in a hook",
     streamed=Checkpointed(_nothing, hook=0, rules=True)))
_add("attcat", Formula("gradients", _attention_stacks(1),
     "gradient pass + the attentions stacked in float32 [L,H,n,n]; checkpointed: one layer recomputed a chunk of "
     "heads at a time, its received attention [n] summed per chunk", streamed=Checkpointed(_cat_stacks, hook=(1, 0),
                                                                                         chunked=True)))
# the plain pass's terms: the attentions and their gradients stacked, and their product
_add("gae", Formula("gradients", _attention_stacks(3),
     "gradient pass + attentions, their gradients and product stacked, 3 [L,H,n,n]; checkpointed: one layer "
     "recomputed a chunk of heads at a time, its A_bar [n,n] summed per chunk, 2 [L,n,n]",
     streamed=Checkpointed(lambda m, r: _mats(m, r, 2), hook=(2, 1), chunked=True,
                           held=lambda m, r: _mats(m, r, 1) + r.n ** 2 * F32)))
_add("attgrads", Formula("gradients", lambda m, r: 2 * m.heads * r.n ** 2 * F32,
                         "gradient pass + the last layer's attention and its gradient (variant ref); checkpointed: "
                         "a chunk of heads at a time, its map [n,n] summed per chunk",
                         # the chunk's A w_h and dF/dA on the real block, the map's sum and the block [n,n] (measured
                         # on the tiny-but-long model: one head a chunk)
                         streamed=Checkpointed(_nothing, hook=(2, 3), chunked=True)))
def _ig_work(m: ModelShape, r: Run) -> int:
    """Integrated gradients' own float32 [n, d]s (gradients.integrated_gradients): X and X' widened and the sum of
    the steps' gradients (a row and the spare), and per row of a pass its path point and its weighted gradient."""
    return (4 + 2 * ig_rows(m, r)) * r.n * m.d * F32


_add("ig_l2 ig_mean", Formula("integrated", _ig_work,
                              "gradient passes of ig_rows rows at once (no dF/dA), checkpointed where one row does not "
                              "fit (the SDPA attention: no [H,n,n]); the path points of a pass"))
# the decoder rules' float64 [L, H, n, n] terms beside the gradient pass's: the float64 attention its backward keeps
# (the pass's formula counts the float32 softmax), R^{A,l}'s stacks of A and dF/dA (lrp, partial_lrp: 3 and the
# rest, fitted to a tiny Llama's measured peak, 4 layers, d 256, n = 2,048: 3.19); transatt and mask_lrp over the
# doubled batch (its plain half's dF/dA): twice the pass, the dF/dA stack of both halves, the product and its
# positive part (3.19 + 4, each a [L, H, n, n] of the plain half or the rules')
# Checkpointed (issue 36: where rows x pass_row in float64 exceed the pass's memory): the layers' inputs and one
# layer recomputed, its R^{A,l} reduced in the hook to [n,n] (``hook``: its float64 [H,n,n] temporaries; ``held``:
# the float64 [L,n,n] maps, made at the backward's first layer); then cat_terms' float64 stacks of the rules' rows
def _rules_maps(k: int):
    """k [L, n, n] maps in the pass's dtype (r.itemsize)."""
    return lambda m, r: _mats(m, r, k * r.itemsize / F32)


_add("lrp", Formula("float64", _attention_stacks(3.2, 8),
                    "gradient pass and relevance in float64, a layer's weights cast at a time; checkpointed: the "
                    "layers' inputs, one layer recomputed", streamed=Checkpointed(_nothing, hook=0, rules=True)))
_add("partial_lrp", Formula("float64", _attention_stacks(3.2, 8),
                            "as lrp; checkpointed: each layer's R^{A,l} head mean [n,n] in its hook",
                            streamed=Checkpointed(_rules_maps(2), hook=2, held=_rules_maps(1), rules=True)))
_add("transatt mask_lrp", Formula("float64", _attention_stacks(7.2, 8),
                                  "as lrp over a doubled batch (its plain half: dF/dA); checkpointed: each layer's "
                                  "dF/dA R^{A,l} head mean [n,n] in its hook", rows=2,
                                  streamed=Checkpointed(_rules_maps(2), hook=3, held=_rules_maps(1), rules=True)))


@dataclass(frozen=True)
class Estimate:
    method: str
    peak: int  # bytes
    stages: dict  # stage -> bytes, each with the weights


def float64_casts(m: ModelShape) -> int:
    """The LRP family's float64 casts (widened): the forward's of the modules outside the layers and of one layer,
    and the backward's of one Linear (its weight, |W| and [W, |W|] for the alpha1-beta0 rule)."""
    return 8 * (m.params - m.layers * m.layer_params + m.layer_params + 4 * m.d * m.d_ff)


def estimate(method: str, m: ModelShape, r: Run) -> Estimate:
    f = FORMULAS[method]
    base = weights(m, r) + kv_cache(m, r)
    if f.stage == "streamed":
        s = STREAMED[method]
        if streams_attention(m.layers, m.heads, 1, r.n, r.budgets.stack):
            stages = streamed(m, r, s)
            return Estimate(method, max(stages.values()), stages)
        f = s.stacked
    if f.stage == "capture":
        peak, kept = capture(m, r, f.needs)
        stages = {"capture": base + peak, "method": base + kept + f.work(m, r)}
        return Estimate(method, max(stages.values()), stages)
    fwd = bare_forward(m, r)  # the runner's plain forward (nothing captured) comes first
    if f.stage == "float64" and f.streamed is not None and checkpoints(m, replace(r, itemsize=8), f.rows):
        mt, s = replace(r, itemsize=8), f.streamed
        peak, kept = rules_pass(m, mt, f.rows, s.hook)
        # the backward's casts: one layer's (its recomputation) and one Linear's rule weights (the forward's casts of
        # the modules outside the layers are gone: the embedding's table is read once, at the start)
        casts = float64_casts(m) - 8 * (m.params - m.layers * m.layer_params)
        stages = {"forward": fwd, "gradient pass": base - kv_cache(m, r) + casts + peak + s.held(m, mt),
                  "method": base - kv_cache(m, r) + kept + s.work(m, mt)}
    elif f.stage == "float64":  # widened: no float64 copy of the model
        mt = replace(r, itemsize=8)
        peak, kept = gradient_pass(m, mt)
        stages = {"forward": fwd, "gradient pass": base + float64_casts(m) + f.rows * peak,
                  "method": base + f.rows * kept + f.work(m, mt)}
    elif f.stage == "integrated":  # ig_rows rows of one pass, no gradients of the attentions kept
        if checkpoints(m, r):  # a row: the layers' inputs, one layer's forward or backward (only dF/dX asked for)
            states = (m.layers + 1) * r.n * m.d * r.itemsize
            layer = (max(layer_transient(m, r), layer_backward(m, r)) if m.softcap else
                     max(sdpa_layer_transient(m, r), sdpa_layer_backward(m, r)))  # the SDPA attention
            row = states + layer - kv_cache(m, r)  # no KV cache
        else:
            peak, kept = gradient_pass(m, r)
            row = peak - m.layers * m.heads * r.n ** 2 * r.itemsize - kv_cache(m, r)
        stages = {"forward": fwd, "gradient pass": base + ig_rows(m, r) * row + f.work(m, r)}
    elif f.streamed is not None and checkpoints(m, r):
        s = f.streamed
        peak, kept = (rules_pass(m, r, 1, s.hook) if s.rules
                      else gradient_pass(m, r, True, s.hook, not s.attention and not m.softcap, s.chunked))
        stages = {"forward": fwd, "gradient pass": base - kv_cache(m, r) + peak + s.held(m, r),
                  "method": base - kv_cache(m, r) + kept + s.work(m, r)}
    else:
        peak, kept = gradient_pass(m, r)
        stages = {"forward": fwd, "gradient pass": base + peak, "method": base + kept + f.work(m, r)}
    return Estimate(method, max(stages.values()), stages)


def longest(fits) -> int:
    """The most tokens, to 16, for which ``fits(n)`` holds (it holds up to some n and not beyond; 0: not even 16)."""
    lo, hi = 0, 1 << 17
    while hi - lo > 16:
        mid = (lo + hi) // 2 // 16 * 16
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def longest_fitting(method: str, m: ModelShape, card_bytes: int = CARD_BYTES, itemsize: int = 2) -> int:
    """The most tokens whose batch-1 peak stays within ``card_bytes`` (0: not even 16)."""
    return longest(lambda n: estimate(method, m, Run(n, itemsize, Budgets.gpu(card_bytes))).peak <= card_bytes)


def per_batch(method: str, m: ModelShape, r: Run) -> tuple[int, int]:
    """(fixed, each): a batch of b examples of ``r.n`` tokens peaks at about fixed + b x each bytes above the model's
    weights (--batch-size auto). What does not grow with the batch: the block budgets (a block holds its budget
    whatever the batch), the LRP family's float64 casts of the weights and a layer-streamed method's float32 weight
    stacks (``weight_stacks``: at the smallest blocks every such method streams); everything else is one example's,
    b times."""
    # the smallest blocks: one layer, one token, one row
    bare = replace(r, budgets=replace(r.budgets, stack=0, alti=0, value_zeroing=0, decompx=0, ig=0, decompx_state=0))
    once = (float64_casts(m) if FORMULAS[method].stage == "float64" else 0) + \
        (weight_stacks(m, STREAMED[method]) if method in STREAMED else 0)
    one = estimate(method, m, bare).peak
    return once + max(estimate(method, m, r).peak - one, 0), one - weights(m, r) - once


# --- the table ------------------------------------------------------------------------------------------------
def table(n: int = 4096, card_bytes: int = CARD_BYTES) -> str:
    """docs/scaling.md's table: every method's batch-1 peak at ``n`` tokens in bfloat16 for both 7B shapes."""
    from .methods import REGISTRY

    run = Run(n, 2, Budgets.gpu(card_bytes))
    lines = [f"| method | what it holds | {LLAMA2_7B.name} GB | {MISTRAL_7B.name} GB | fits {card_bytes // GB} GB "
             f"| longest n that fits ({LLAMA2_7B.name} / {MISTRAL_7B.name}) |",
             "|---|---|---|---|---|---|"]
    for name in REGISTRY:
        a, b = (estimate(name, shape, run) for shape in (LLAMA2_7B, MISTRAL_7B))
        fits = "yes" if max(a.peak, b.peak) <= card_bytes else "no"
        longest = " / ".join(str(longest_fitting(name, s, card_bytes) or "none") for s in (LLAMA2_7B, MISTRAL_7B))
        lines.append(f"| {name} | {FORMULAS[name].text} | {a.peak / GB:.1f} | {b.peak / GB:.1f} | {fits} | {longest} |")
    return "\n".join(lines)


def chunk_table(n: int = 4096, card_bytes: int = CARD_BYTES) -> str:
    """The chunk sizes the budgets give at ``n`` tokens on the card, for both 7B shapes."""
    rows = []
    for shape in (LLAMA2_7B, MISTRAL_7B):
        r = Run(n, 2, Budgets.gpu(card_bytes))
        rows.append(f"| {shape.name} | {r.budgets.stack / GB:.2f} | {stack_layers(shape, r)} | "
                    f"{alti_block_tokens(shape, r)} | {value_zeroing_block_tokens(shape, r)} | {ig_rows(shape, r)} |")
    head = ("| model | block budget GB (1/64 of the card) | layers per stack | ALTI source tokens per block "
            "| value zeroing tokens per block | IG rows per pass (1/8 of the card) |\n|---|---|---|---|---|---|")
    return head + "\n" + "\n".join(rows)


FIT_LENGTHS = (4096, 16384)
FIT_CARDS_GB = (24, 48, 80)
# docs/scaling.md's generated fit tables lie between these lines (``--fits --write`` replaces them)
FITS_BEGIN = "<!-- fit tables: python -m compute.memory_model --fits --write docs/scaling.md -->"
FITS_END = "<!-- end of the fit tables -->"


def shapes_table(models=MODELS) -> str:
    """The shapes the fit tables are computed from."""
    lines = ["| model | layers | d | heads | KV heads | head dim | d_ff | vocab | positions | parameters (two-class "
             "head) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for m in models:
        lines.append(f"| {m.name} | {m.layers} | {m.d} | {m.heads} | {m.kv_heads} | {m.d_head} | {m.d_ff} | "
                     f"{m.vocab:,} | {m.positions:,} | {m.params / 1e9:.2f}B |")
    return "\n".join(lines)


def fit_table(m: ModelShape, lengths=FIT_LENGTHS, cards_gb=FIT_CARDS_GB, itemsize: int = 2) -> str:
    """Every method's batch-1 peak on ``m`` at each of ``lengths`` and, per card, whether it fits at each length and
    the longest input that fits (block budgets as on that card)."""
    from .methods import REGISTRY

    head = " / ".join(f"{n:,}" for n in lengths)
    lines = ["| method | " + " | ".join(f"GB at {n:,}" for n in lengths) + " | "
             + " | ".join(f"{c} GB: fits {head}; longest n" for c in cards_gb) + " |",
             "|---" * (1 + len(lengths) + len(cards_gb)) + "|"]
    for name in REGISTRY:
        peaks = [estimate(name, m, Run(n, itemsize, Budgets.gpu(max(cards_gb) * GB))).peak for n in lengths]
        cells = []
        for c in cards_gb:
            card = c * GB
            fits = ["yes" if estimate(name, m, Run(n, itemsize, Budgets.gpu(card))).peak <= card else "no"
                    for n in lengths]
            cells.append(" / ".join(fits) + f"; {longest_fitting(name, m, card, itemsize) or 'none'}")
        lines.append(f"| {name} | " + " | ".join(f"{p / GB:.1f}" for p in peaks) + " | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fit_tables(models=MODELS) -> str:
    """docs/scaling.md's generated block: the shapes, then one fit table per model, in bfloat16 at batch 1."""
    parts = [shapes_table(models)]
    for m in models:
        parts += [f"**{m.name}** (bfloat16, batch 1; GB at the {max(FIT_CARDS_GB)} GB card's block budgets):",
                  fit_table(m)]
    return "\n\n".join(parts)


def write_fits(path: str) -> None:
    """Replace the fit tables between FITS_BEGIN and FITS_END in ``path`` with :func:`fit_tables`."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    begin, end = text.find(FITS_BEGIN), text.find(FITS_END)
    if begin < 0 or end < begin:
        raise SystemExit(f"{path}: no lines '{FITS_BEGIN}' ... '{FITS_END}' to replace: add them where the tables go")
    text = text[:begin] + FITS_BEGIN + "\n\n" + fit_tables() + "\n\n" + text[end:]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=4096, help="tokens [4096]")
    ap.add_argument("--card-gb", type=int, default=CARD_BYTES // GB, help="the card's memory in GB [80]")
    ap.add_argument("--fits", action="store_true",
                    help=f"the fit tables instead: {', '.join(m.name for m in MODELS)} at "
                         f"{' and '.join(map(str, FIT_LENGTHS))} tokens on {', '.join(map(str, FIT_CARDS_GB))} GB")
    ap.add_argument("--write", metavar="DOC", help="with --fits: replace the fit tables in DOC (docs/scaling.md)")
    a = ap.parse_args(argv)
    if a.fits:
        if a.write:
            write_fits(a.write)
        else:
            print(fit_tables())
        return
    print(table(a.n, a.card_gb * GB))
    print()
    print(chunk_table(a.n, a.card_gb * GB))


if __name__ == "__main__":
    main()
