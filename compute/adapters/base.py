"""Architecture adapters: read a model's per-layer internals with forward hooks on the stock Hugging Face modules.

One batched forward pass fills a :class:`Captured` with what the requested methods need (METHODS.md section 0 and
DESIGN.md section 5): the embedding-module output, every layer's input and output, the attention probabilities, the
value vectors (with bias), and the inputs and outputs of both LayerNorms. Nothing is copied or patched from the
modelling files; adapters only know module names and how each family's classification head reads a token.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from ..errors import AttrscopeError
from ..tasks.readout import Readout
from .block import Block

# Internals a method can ask for (Method.needs). "attn_out" (the attention output before any norm on it) is captured
# only where the family's block needs it (Block.attn_out_captured). "attention_mean": every layer's head-mean
# attention in float32 [B, n, n], taken from each layer's attention as the forward makes it where the stack of every
# layer's [B, H, n, n] would exceed the block budget (issue 36: compute.attention_streaming), else from
# that stack (one operation for every layer: the op budgets). "layer_parts": the decomposition's lists (``PARTS``),
# captured and stacked by the same rule, or, where the stack would exceed the budget, none: the methods then read
# each layer's as a forward of their own makes it (``each_layer``; compute.methods._internals.decomposition).
# "narrow_layers": the decomposition's lists (``PARTS``) of every layer, stacked and widened as the others where the
# float32 stack of every layer's attention fits the block budget, else each layer's kept as the forward made it (the
# model's dtype, one tensor a layer: no stack, no float32 copy), a list another method of the batch asks for by name
# excepted: DecompX, which reads a layer's at a time, widened when it uses it (issue 36).
# "layer_means": "attention_mean" where the stack of every layer's attention fits the block budget, else nothing: the
# methods that fold each layer's head mean into a running product (rollout, W_FIXEDRES) read each layer's as a
# forward of their own makes it (``each_layer``), never every layer's [B, n, n] at once (issue 36).
NEEDS = frozenset({"attentions", "attention_mean", "layer_means", "layer_parts", "narrow_layers", "hidden_states",
                   "values", "ln1", "ln2", "attn_out"})
PARTS = frozenset({"attentions", "hidden_states", "values", "ln1", "ln2", "attn_out"})  # a layer's decomposition


@dataclass
class Captured:
    """Padded batch tensors. Layer lists are indexed l = 0..L-1 for layer l+1 (METHODS.md indices are 1-based).

    hidden_states has L+1 entries: hidden_states[0] is the embedding-module output, hidden_states[l] the output of
    layer l (= input of layer l+1), as in Hugging Face's ``output_hidden_states``.
    """

    input_ids: torch.Tensor  # [B, n]
    mask: torch.Tensor  # [B, n] bool, True on real tokens
    lengths: torch.Tensor  # [B]
    explain_pos: torch.Tensor  # [B] row explained by the methods ([CLS] for encoder classifiers)
    logits: torch.Tensor  # [B, C] the output vector the target indexes (the task's readout at explain_pos)
    special: torch.Tensor | None = None  # [B, n] bool, True on special tokens ([CLS], [SEP], ...)
    sep: torch.Tensor | None = None  # [B, n] bool, True on separator tokens ([SEP], </s>)
    inputs: dict = field(default_factory=dict)  # the model's forward inputs (gradient methods re-run the model)
    hidden_states: list[torch.Tensor] = field(default_factory=list)
    attentions: list[torch.Tensor] = field(default_factory=list)  # [B, H, n, n]
    attention_mean: list[torch.Tensor] = field(default_factory=list)  # [B, n, n] float32: the heads' mean
    values: list[torch.Tensor] = field(default_factory=list)  # [B, n, d] = W_V x + b_V
    ln1_in: list[torch.Tensor] = field(default_factory=list)
    ln1_out: list[torch.Tensor] = field(default_factory=list)
    ln2_in: list[torch.Tensor] = field(default_factory=list)
    ln2_out: list[torch.Tensor] = field(default_factory=list)
    attn_out: list[torch.Tensor] = field(default_factory=list)  # [B, n, d] the out-projection's output
    # Target-independent intermediates shared by several methods of one batch (e.g. the per-layer head logits).
    memo: dict = field(default_factory=dict)
    # The passes the batch's methods declare (Method.passes), set by the runner: the shared gradient pass records
    # the LRP tensors only where "lrp" is among them. None (a caller that declares nothing): every pass records all.
    passes: frozenset[str] | None = None
    # What the batch's methods keep of the attentions and their gradients (Method.attention_terms), set by the
    # runner: a checkpointed gradient pass reduces them all in its first backward. None: each method's own.
    attention_terms: frozenset | None = None
    # The task's explained output (compute.tasks): where a forward's output vector is read (every forward a method
    # runs reads its F there) and the foil subtracted from the target (-1: none; None: no foils in the batch).
    readout: Readout = Readout()
    foil: torch.Tensor | None = None
    output: object = None  # the model's forward output (the task reads its parts and prediction off it)
    # What the store keeps of the methods' per-layer matrices (--matrices, set by the runner): "all", "cls" (row
    # ``kept_row`` [B] of each) or "none"; a method that streams the layers keeps only that (MethodResult.matrix_rows)
    kept_matrices: str = "all"
    kept_row: torch.Tensor | None = None
    # The layer lists above stacked into one tensor each ([L, B, ...]; hidden_states [L + 1, B, n, d]) by ``stack``:
    # what the methods vectorised across layers read.
    stacks: dict = field(default_factory=dict)

    def stack(self, name: str) -> torch.Tensor:
        """The captured list ``name`` as one tensor with the layer first, made once (one copy); the list's entries
        become views of it, so the layers are not held twice."""
        st = self.stacks.get(name)
        layers = getattr(self, name)
        if name == "attention_mean" and not layers and self.attentions:
            # from the stack of every head's (a capture that kept them): one operation for every layer
            st = self.stacks[name] = self.stack("attentions").mean(dim=2)
            self.attention_mean = list(st.unbind(0))
            return st
        # made already when the list's entries are views of it (their base is the stack's own base: it is a view of
        # the concatenation); else not made yet, or the list was replaced since (a copy's)
        if st is None or layers[0]._base is not (st if st._base is None else st._base):
            st = self.stacks[name] = torch.cat(layers).view(len(layers), *layers[0].shape)
            setattr(self, name, list(st.unbind(0)))
        return st

    def cached(self, key: str, fn):
        if key not in self.memo:
            self.memo[key] = fn()
        return self.memo[key]

    @property
    def probs(self) -> torch.Tensor:
        return torch.softmax(self.logits.float(), dim=-1)

    @property
    def pred(self) -> torch.Tensor:
        return self.logits.argmax(dim=-1)


class _Shuttable(list):
    """A capture list that keeps nothing appended while ``shut`` (Adapter.each_layer)."""

    shut = False

    def append(self, item) -> None:
        if not self.shut:
            super().append(item)


def _keep_value(lst, value_of):
    def hook(_m, _inp, out):
        lst.append(value_of(_first(out)))
    return hook


def _replace_last(lst):
    def hook(_m, _inp, out):
        lst[-1] = out if torch.is_tensor(out) else out[0]  # a norm's tensor, or a base model's last hidden state
    return hook


def _keep_attention(lst):
    def hook(_m, _inp, out):
        lst.append(out[1])  # (context, attention probabilities)
    return hook


STACKED = ("hidden_states", "attentions", "attention_mean", "values", "ln1_in", "ln1_out", "ln2_in", "ln2_out",
           "attn_out")  # Captured's layer lists


def _keep_head_mean(cap: Captured, layers: int):
    """A hook keeping only the heads' mean of each layer's attention, in float32 at least, written into the [L, B, n, n]
    stack made at the first layer (no stack copied at the end): the layer's [B, H, n, n] is freed when the forward
    moves on."""
    def hook(_m, _inp, out):
        a = out[1]
        if a is None:  # not an eager attention: the capture's check names the fix
            return
        st = cap.stacks.get("attention_mean")
        if st is None:
            st = cap.stacks["attention_mean"] = a.new_empty((layers, a.shape[0], *a.shape[2:]), dtype=wide_dtype(a))
        cap.attention_mean.append(head_mean(a, st[len(cap.attention_mean)]))
    return hook


def wide_dtype(t: torch.Tensor) -> torch.dtype:
    """float32 at least, as _stack_and_upcast widens."""
    return t.dtype if t.element_size() >= 4 else torch.float32


def head_mean(a: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The heads' mean of one layer's attention [B, H, n, n] -> [B, n, n], in float32 at least (summed so, no widened
    copy of the heads), into ``out`` where given."""
    if out is None:
        return torch.mean(a, dim=1, dtype=wide_dtype(a))
    return torch.mean(a, dim=1, dtype=out.dtype, out=out)


def _head_means_of_stack(cap: Captured) -> None:
    """``attention_mean`` from the stacked attentions (one operation for every layer), which are then dropped: no
    method of the batch reads them."""
    cap.stack("attention_mean")
    cap.attentions = []
    del cap.stacks["attentions"]


def _stack_and_upcast(cap: Captured, narrow: frozenset[str] = frozenset()) -> None:
    """Every captured layer list stacked (``Captured.stack``), widened to float32 when the model runs in half
    precision (the methods compute in float32 at least): one operation per list, not one per layer. The lists named
    in ``narrow`` stay as the forward made them."""
    if cap.logits is not None and cap.logits.element_size() < 4:
        cap.logits = cap.logits.float()
    for name in STACKED:
        if getattr(cap, name) and name not in narrow:
            st = cap.stack(name)
            if st.element_size() < 4:  # every task's internals (a language model's capture has no logits)
                cap.stacks[name] = st = st.float()
                setattr(cap, name, list(st.unbind(0)))


def _ask_for_attentions(_m, args, kwargs):
    """A forward pre-hook: the attention module's output_attentions argument (its third) set, so that it returns its
    probabilities (DeBERTa's self-attention returns None otherwise)."""
    if len(args) > 2:
        return (*args[:2], True, *args[3:]), kwargs
    return args, {**kwargs, "output_attentions": True}


def _finite_mask(_m, args, kwargs):
    mask = kwargs.get("attention_mask")
    if mask is None or not torch.is_floating_point(mask):
        return None
    return args, {**kwargs, "attention_mask": mask.clamp_min(torch.finfo(torch.float32).min / 2)}


class Sublayer(nn.Module):
    """A block's step as one module where the model has none as the methods call it (y -> the sublayer's output):
    OPT's feed-forward layers sit in the layer itself, BLOOM's and MPT's MLP add the residual they are given, Granite
    scales each sublayer's output. ``parts`` are the layer's own modules (their parameters give the dtype); ``root``
    the module the block's ``mlp_maps`` paths start from (DecompX: compute.methods._internals.linear_mlp); ``scale``
    a constant the output is multiplied by (Granite's residual multiplier), which the maps' output map carries too."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], *parts: nn.Module, root: nn.Module | None = None,
                 scale: float = 1.0):
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.fn = fn
        self.__dict__["root"] = root  # not registered as a submodule: it may hold the whole layer (OPT)
        self.scale = scale

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        out = self.fn(y)
        return out if self.scale == 1 else self.scale * out


def last_real_token(mask: torch.Tensor) -> torch.Tensor:
    """[B] position of each row's last real token, which decoder classifiers pool (left or right padding)."""
    pos = torch.arange(mask.shape[1], device=mask.device)
    return (mask.long() * (pos + 1)).argmax(dim=-1)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def linear_weight(module: nn.Module) -> torch.Tensor:
    """W [out, in] of an nn.Linear or of a GPT-2 Conv1D (which keeps W^T: y = x W + b)."""
    from transformers.pytorch_utils import Conv1D

    return module.weight.t() if isinstance(module, Conv1D) else module.weight


def module_at(root: nn.Module, path: str | None) -> nn.Module | None:
    """The submodule at a dotted path ("" : root itself; None: none)."""
    if path is None:
        return None
    for name in filter(None, path.split(".")):
        root = getattr(root, name)
    return root


class Adapter:
    """Base class: a family's file declares its block (compute.adapters.block) and its heads."""

    family: str = ""
    model_types: tuple[str, ...] = ()
    block: Block | None = None
    pre_ln: bool = False  # no norm on the residual path (Block.pre_ln), set from the block by each family
    lrp: bool = False  # Chefer's LRP rules are defined for the block (post-LN, LayerNorm, absolute attention)

    def __init__(self, model: nn.Module, task: str = "classification"):
        self.model = model
        self.config = model.config
        # Set from the tokenizer by compute.models.load_model (integrated gradients' [MASK] baseline, AttCAT's
        # special-token masking); tiny test models fall back to special_mask's positional rule.
        self.mask_token_id: int | None = None
        self.special_ids: list[int] | None = None
        self.sep_token_id: int | None = None  # Mask-LRP's explanation pass masks [SEP] as a key (METHODS.md 6.5)
        self.task = task  # compute.tasks name: which head the model has (the methods defined for it)
        if self.block is not None and self.block.windowed and not getattr(model, "_attrscope_nan_rows", False):
            # HF's eager sliding-window attention (ModernBERT's) takes its softmax in float32: a float64 mask's minimum
            # becomes -inf there, and a pad query whose window holds only pads gets NaN probabilities, which reach
            # every token (0 x NaN in the next layer, and in the backward). Half float32's minimum stays finite and
            # still gives exactly 0 (float32 and half-precision models are unchanged).
            for layer in self.layers():
                self.attention_probs_module(layer).register_forward_pre_hook(_finite_mask, with_kwargs=True)
            model._attrscope_nan_rows = True

    @contextmanager
    def finite_masks(self):
        """Every attention's additive mask kept finite (``_finite_mask``) while the block runs: a left-padded batch
        (decoding, compute/generation.py) has pad queries that see only pads, whose float64 mask minimum plus a
        score is -inf: NaN probabilities, and 0 x NaN reaches the real tokens in the next layer."""
        handles = [self.attention_probs_module(layer).register_forward_pre_hook(_finite_mask, with_kwargs=True)
                   for layer in self.layers()]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    @classmethod
    def describes(cls, model: nn.Module) -> bool:
        """Whether the family's block description holds for this checkpoint's configuration (some families have
        variants it does not describe: they run as an undescribed family, compute/adapters/generic.py)."""
        return True

    # --- structure -------------------------------------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return len(self.layers())

    @property
    def n_heads(self) -> int:
        return int(self.config.num_attention_heads if hasattr(self.config, "num_attention_heads") else self.config.n_heads)

    @property
    def n_kv_heads(self) -> int:
        return int(getattr(self.config, "num_key_value_heads", None) or self.n_heads)

    def _base(self) -> nn.Module:
        return self.model.base_model

    def layers(self) -> list[nn.Module]:
        return list(module_at(self._base(), self.block.layers))

    def embeddings(self) -> nn.Module:
        return module_at(self._base(), self.block.embeddings)

    def attention_probs_module(self, layer: nn.Module) -> nn.Module:
        """Module whose forward returns (context, attention_probs)."""
        return module_at(layer, self.block.attention)

    def value_module(self, layer: nn.Module) -> nn.Module:
        """Module whose output holds the value vectors W_V x + b_V (see :meth:`value_of`)."""
        return module_at(layer, self.block.value)

    def value_of(self, out: torch.Tensor) -> torch.Tensor:
        """The value vectors [B, n, H d_h] in the output of :meth:`value_module`, as the block's layout holds them;
        value heads shared by several query heads are repeated, so every query head has its own."""
        return self.value_columns(out)

    def value_columns(self, out: torch.Tensor) -> torch.Tensor:
        """The value columns of the value module's output layout, repeated per query head: a linear selection, so it
        also gives W_V^T [d_in, H d_h] from the module's W^T and b_V from its bias (DecompX)."""
        layout, H, kv = self.block.qkv, self.n_heads, self.n_kv_heads
        *lead, width = out.shape
        if layout == "concat":
            return out[..., 2 * width // 3:]
        if layout == "per_head":
            return out.unflatten(-1, (H, 3, width // (3 * H)))[..., 2, :].flatten(-2)
        if layout == "concat_gqa":
            dh = width // (H + 2 * kv)
            out = out[..., (H + kv) * dh:]
        if layout == "grouped":
            out = out.unflatten(-1, (kv, H // kv + 2, width // (H + 2 * kv)))[..., -1, :].flatten(-2)
        dh = out.shape[-1] // kv
        if kv == H:
            return out
        return out.unflatten(-1, (kv, dh)).repeat_interleave(H // kv, dim=-2).flatten(-2)

    def final_norm(self) -> nn.Module | None:
        """A norm applied after the last layer whose output is Hugging Face's last hidden state (GPT-2's ln_f)."""
        return module_at(self._base(), self.block.final_norm)

    def out_proj(self, layer: nn.Module) -> nn.Linear:
        """W_O, b_O of the attention block."""
        return module_at(layer, self.block.out_proj)

    def ln1(self, layer: nn.Module) -> nn.Module | None:
        return module_at(layer, self.block.ln1)

    def ln2(self, layer: nn.Module) -> nn.Module | None:
        return module_at(layer, self.block.ln2)

    def attn_out_norm(self, layer: nn.Module) -> nn.Module | None:
        """The norm on the attention output before the residual add (Gemma 2, OLMo 2), or None."""
        return module_at(layer, self.block.attn_out_norm)

    def norm_gain(self, norm: nn.Module | None, d: int) -> torch.Tensor:
        """The norm's effective gain [d] (Gemma's 1 + weight; ones for an identity or a norm without weight)."""
        w = getattr(norm, "weight", None)
        if w is None:
            return torch.ones(d, dtype=next(self.model.parameters()).dtype, device=next(self.model.parameters()).device)
        return w + self.block.norm_offset if self.block is not None and self.block.norm_offset else w

    @property
    def routed(self) -> bool:
        """A mixture of experts: a router picks each token's MLP experts (Block.mlp_kind "moe", or a config with
        several experts for a family without a block description)."""
        if self.block is not None:
            return self.block.mlp_kind == "moe"
        return max(int(getattr(self.config, k, None) or 0) for k in ("num_local_experts", "num_experts")) > 1

    @property
    def linear_values(self) -> bool:
        """The value vectors are the value module's output as ``value_columns`` selects it (a linear map of the
        layer's normed input): False where the family changes them further (OLMo's clip_qkv clamp)."""
        return True

    def norm_eps(self, norm: nn.Module) -> float:
        """The epsilon of a norm module of the block (its eps or variance_epsilon)."""
        return float(getattr(norm, "eps", getattr(norm, "variance_epsilon", 0.0)))

    @functools.cached_property
    def decoder(self) -> bool:
        """Causal attention (read from the model's attention modules): a decoder."""
        return any(getattr(m, "is_causal", False) is True for m in self.model.modules())

    @property
    def pooling(self) -> str:
        """Which token a sequence head reads, read from the model: "last" (the last real token) where its attention
        is causal, "mean" where the config pools the mean (ModernBERT's classifier_pooling), else "first"."""
        if getattr(self.config, "classifier_pooling", "cls") == "mean":
            return "mean"
        return "last" if self.decoder else "first"

    def head_per_token(self, h: torch.Tensor) -> torch.Tensor:
        """The model's own classification head applied to every token as if it were the pooled one: [..., n, d] ->
        [..., n, C] (every layer's hidden states at once). Runs in the model's dtype and returns the dtype of ``h``."""
        dtype = next(self.model.parameters()).dtype
        flat = h.reshape(-1, *h.shape[-2:])
        return self._head(flat.to(dtype)).to(h.dtype).view(*h.shape[:-1], -1)

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def lm_head_parts(self) -> tuple[nn.Linear | None, Callable | None, nn.Module | None, nn.Linear]:
        """A language-model head's modules (dense, activation, norm, decoder): logits = decoder(norm(act(dense(h))))
        for a masked LM; (None, None, None, decoder) for decoders, whose last hidden state is already normed."""
        raise AttrscopeError(f"no language-model head is known for the {self.family} family")

    def lm_head(self) -> tuple[Callable, torch.Tensor, torch.Tensor | None]:
        """The language-model head as (transform, W [V, d'], b [V] or None): logits = transform(h) W^T + b."""
        dense, act, norm, decoder = self.lm_head_parts()
        transform = (lambda h: h) if dense is None else (lambda h: norm(act(dense(h))))
        return transform, decoder.weight, decoder.bias

    def check_head(self) -> None:
        """One-line error where the per-token head of the task (LogAt, NormXLogit) is not known for the model."""
        if self.task in ("masked-token", "next-token"):
            self.lm_head_parts()

    def logit_scaling(self) -> tuple[float, float | None]:
        """(scale, cap): a causal LM's logits are cap tanh(scale z / cap) of its head's output z, as its config says
        (Cohere's logit_scale, Granite's 1 / logits_scaling, Gemma 2 and 3's final_logit_softcapping; cap None: no
        capping)."""
        cfg = self.config
        scale = float(getattr(cfg, "logit_scale", None) or 1.0) / float(getattr(cfg, "logits_scaling", None) or 1.0)
        return scale, getattr(cfg, "final_logit_softcapping", None) or None

    def head_logit(self, h: torch.Tensor, target: torch.Tensor, foil: torch.Tensor | None = None) -> torch.Tensor:
        """The language-model head applied to every token of ``h`` [..., B, n, d] (every layer's hidden states at once)
        as if it were the explained one: the target word's logit less the foil's (foil >= 0) [..., B, n] (LogAt of
        word targets), scaled and capped as the model's logits are (``logit_scaling``). Only those two rows of the
        vocabulary matrix are computed, never [B, n, V]."""
        dtype = next(self.model.parameters()).dtype
        transform, W, b = self.lm_head()
        scale, cap = self.logit_scaling() if self.task == "next-token" else (1.0, None)
        z = transform(h.to(dtype)).to(h.dtype)  # [..., B, n, d']

        def rows(t):  # [B, d'] and [B]: the vocabulary rows of the words t and their biases
            bias = b[t].to(h.dtype) if b is not None else torch.zeros(len(t), dtype=h.dtype, device=h.device)
            return W[t].to(h.dtype), bias

        def logit(w, bias):  # [..., B, n], scaled and capped as the model's logits are
            out = scale * (torch.matmul(z, w[:, :, None])[..., 0] + bias[:, None])
            return out if cap is None else cap * torch.tanh(out / cap)

        w, bias = rows(target)
        if foil is None:
            return logit(w, bias)
        has = (foil >= 0).to(h.dtype)
        w_foil, b_foil = rows(foil.clamp_min(0))
        if cap is None:  # linear in the rows: target less foil in one product
            return logit(w - has[:, None] * w_foil, bias - has * b_foil)
        return logit(w, bias) - has[:, None] * logit(w_foil, b_foil)

    def twin(self, dtype: torch.dtype) -> "Adapter":
        """This adapter on a copy of the model in ``dtype`` (made once, kept): the LRP rules run in float64 because
        they divide by sums that pass near zero, where float32 rounding of the forward is amplified (see
        compute.methods._internals.relevance)."""
        if next(self.model.parameters()).dtype == dtype:
            return self
        twins = self.__dict__.setdefault("_twins", {})
        if dtype not in twins:
            import copy

            model = copy.deepcopy(self.model).to(dtype)
            if getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
                model.set_experts_implementation("eager")  # the grouped matmul has no float64 kernel
            twin = type(self)(model, self.task)
            twin.mask_token_id, twin.special_ids, twin.sep_token_id = self.mask_token_id, self.special_ids, self.sep_token_id
            twins[dtype] = twin
        return twins[dtype]

    # --- the feed-forward block and the head as functions (DecompX, Value Zeroing) ------------------------------
    def ffn_parts(self, layer: nn.Module) -> tuple[nn.Linear, Callable, nn.Linear] | None:
        """(first Linear, activation, second Linear) of a post-LN layer's feed-forward block, FFN(y) =
        lin2(act(lin1(y))) (dropout is the identity in eval mode), or None where the family has none declared."""
        return None

    def mlp(self, layer: nn.Module) -> nn.Module | None:
        """A pre-LN block's MLP as one module: r + mlp(LN2(r)) is the block's output (None for post-LN layers)."""
        return module_at(layer, self.block.mlp) if self.pre_ln and self.block is not None else None

    def head_parts(self) -> tuple[nn.Linear, Callable, nn.Linear] | None:
        """(dense, activation, classifier) of the classification head that reads the explained token:
        logits = classifier(act(dense(h))); (None, None, score) where the head is one linear map (decoders); None
        where the family has none declared."""
        return None

    # --- relevance propagation (Chefer's LRP rules, METHODS.md 5.1) ----------------------------------------------
    def lrp_linears(self, layer: nn.Module) -> dict[str, nn.Module] | None:
        """The Linear modules of a post-LN encoder layer that the LRP rules pass through, by role: q, k, v (fed by
        the layer input), o (attention output), f1, f2 (feed-forward), or None where no rule set exists."""
        return None

    def lrp_head(self) -> list[nn.Module] | None:
        """The Linear modules of the model's head that the LRP rules pass through, bottom-up (activations and
        LayerNorms between them pass relevance unchanged): the sequence head's (``sequence_lrp_head``), a masked
        LM's dense and vocabulary decoder, a QA head's qa_outputs. None: no rule set."""
        if self.task == "qa":
            return [self.model.qa_outputs]
        if self.task == "masked-token":
            return self.lm_lrp_head()
        if self.task == "next-token":
            return None
        return self.sequence_lrp_head()

    def sequence_lrp_head(self) -> list[nn.Module] | None:
        """The classification head's two Linear modules, reading the explained token ([CLS]): dense (pooler,
        RoBERTa/ELECTRA head dense, DistilBERT pre_classifier), then the classifier. None: no rule set."""
        return None

    def lm_lrp_head(self) -> list[nn.Module] | None:
        """A masked LM head's dense and vocabulary decoder (GELU and LayerNorm between and after them)."""
        return None

    def explain_positions(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Position whose row is explained: the token the checkpoint's head pools (``pooling``): the last real token
        (decoders), else the first ([CLS]; a mean-pooling head also gets position 0: the row methods then explain
        that token's row, not the pooled mean)."""
        if self.pooling == "last":
            return last_real_token(mask)
        return torch.zeros(input_ids.shape[0], dtype=torch.long, device=input_ids.device)

    def special_mask(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B, n] bool: the tokenizer's special tokens among the real ones. Without a tokenizer's list (models
        built in tests) an encoder's first and last real tokens ([CLS] ... [SEP]) and none of a decoder's."""
        if self.special_ids is not None:
            ids = torch.as_tensor(self.special_ids, dtype=input_ids.dtype, device=input_ids.device)
            return torch.isin(input_ids, ids) & mask
        special = torch.zeros_like(mask)
        if not self.decoder:
            b = torch.arange(mask.shape[0], device=mask.device)
            special[b, 0] = True
            special[b, mask.sum(-1) - 1] = True
        return special & mask

    def sep_mask(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B, n] bool: the separator tokens. Without the tokenizer's id an encoder's last real token."""
        if self.sep_token_id is not None:
            return (input_ids == self.sep_token_id) & mask
        sep = torch.zeros_like(mask)
        if not self.decoder:
            sep[torch.arange(mask.shape[0], device=mask.device), mask.sum(-1) - 1] = True
        return sep & mask

    # --- capture ---------------------------------------------------------------------------------------------
    @contextmanager
    def hooks(self, cap: Captured, needs: frozenset[str]):
        handles = []

        # A forward hook that returns something replaces the module's output: these return None.
        def keep(lst):
            def hook(_m, _inp, out):
                lst.append(_first(out))
            return hook

        def keep_in_out(ins, outs):
            def hook(_m, inp, out):
                # [B, n, d]: a norm called on the tokens flattened ([B n, d]: OPT's before its MLP) is unflattened
                ins.append(inp[0] if inp[0].dim() > 2 else inp[0].unflatten(0, cap.mask.shape))
                outs.append(out if out.dim() > 2 else out.unflatten(0, cap.mask.shape))
            return hook

        try:
            if "hidden_states" in needs:
                handles.append(self.hook_layer_input(cap.hidden_states))
            for layer in self.layers():
                if "hidden_states" in needs:
                    handles.append(layer.register_forward_hook(keep(cap.hidden_states)))
                if "attentions" in needs:
                    handles.append(self.attention_probs_module(layer).register_forward_hook(
                        _keep_attention(cap.attentions)))
                elif "attention_mean" in needs:
                    handles.append(self.attention_probs_module(layer).register_forward_hook(
                        _keep_head_mean(cap, self.n_layers)))
                if "values" in needs:
                    handles.append(self.value_module(layer).register_forward_hook(
                        _keep_value(cap.values, self.value_of)))
                if "attn_out" in needs and self.block is not None and self.block.attn_out_captured:
                    handles.append(self.out_proj(layer).register_forward_hook(keep(cap.attn_out)))
                if self.block is not None and self.block.attention_flag and needs & {"attentions", "attention_mean"}:
                    handles.append(self.attention_probs_module(layer).register_forward_pre_hook(
                        _ask_for_attentions, with_kwargs=True))
                for name, mod in (("ln1", self.ln1(layer)), ("ln2", self.ln2(layer))):
                    if name in needs and mod is not None:
                        handles.append(mod.register_forward_hook(
                            keep_in_out(getattr(cap, f"{name}_in"), getattr(cap, f"{name}_out"))))
            if "hidden_states" in needs and self.final_norm() is not None:
                # HF's last hidden state is the final norm's output, not the last block's.
                handles.append(self.final_norm().register_forward_hook(_replace_last(cap.hidden_states)))
            yield cap
        finally:
            for h in handles:
                h.remove()

    def hook_layer_input(self, kept: list) -> torch.utils.hooks.RemovableHandle:
        """A hook keeping the first layer's input (hidden_states[0]) in ``kept``: the embedding module's output, or
        the first layer call's own input where the model changes the embeddings before its layers (a block's
        ``layer_input`` "layer"; any family without a block): OPT adds the positions, Granite multiplies by its
        embedding_multiplier, ALBERT and MobileBERT project to a wider state, and a layer shared across depths
        (ALBERT's) is called at every depth (kept once)."""
        if self.block is not None and self.block.layer_input == "embeddings":
            return self.embeddings().register_forward_hook(lambda _m, _inp, out: kept.append(_first(out)))

        def hook(_m, args, kwargs):
            if not kept:
                kept.append(args[0] if args else kwargs["hidden_states"])
        return self.layers()[0].register_forward_pre_hook(hook, with_kwargs=True)

    def forward_inputs(self, enc: dict) -> dict:
        """Keep only the tokenizer outputs this model's forward accepts."""
        keep = {"input_ids", "attention_mask", "token_type_ids"}
        if not getattr(self.config, "type_vocab_size", 0) or self.family == "distilbert":
            keep.discard("token_type_ids")
        return {k: v for k, v in enc.items() if k in keep}

    def capture(self, enc: dict, needs: frozenset[str], grad: bool = False) -> Captured:
        """One batched forward pass with hooks for ``needs``. ``enc`` holds padded tensors on the model's device.
        With ``grad`` the autograd graph is kept for a backward pass (gradient methods). ``cap.output`` keeps the
        model's output for the task; ``cap.logits`` is the classification logits where the model has them (a task
        with another head sets it per explained part)."""
        unknown = set(needs) - NEEDS
        if unknown:
            raise ValueError(f"unknown internals requested: {sorted(unknown)}")
        input_ids, mask = enc["input_ids"], enc["attention_mask"].bool()
        needs = frozenset(needs)
        # the head means from the stacked attentions where the stack fits the budget, else layer by layer; the
        # decomposition's lists likewise, else none (the methods stream them: each_layer); "layer_means" the head
        # means likewise, else none
        streams = self.streams_attention(input_ids)
        if "layer_means" in needs:
            needs = needs - {"layer_means"} | (frozenset() if streams else {"attention_mean"})
        stacked_means = "attention_mean" in needs and not needs & {"attentions", "narrow_layers"} and not streams
        hooked = needs | {"attentions"} if stacked_means else needs
        if "layer_parts" in needs and not streams or "narrow_layers" in needs:
            hooked |= PARTS
        # the lists kept narrow: those no method of the batch asks for by name (ln1, ln2: both of a norm's lists)
        narrow = frozenset()
        if "narrow_layers" in needs and streams:
            named = {list_ for need in needs for list_ in ((f"{need}_in", f"{need}_out") if need in ("ln1", "ln2")
                                                          else (need,))}
            if "attention_mean" in needs:  # the head means taken from the float32 stack (Captured.stack)
                named.add("attentions")
            narrow = frozenset(STACKED) - named
        cap = Captured(input_ids=input_ids, mask=mask, lengths=mask.sum(-1),
                       explain_pos=self.explain_positions(input_ids, mask), logits=None,
                       special=self.special_mask(input_ids, mask), sep=self.sep_mask(input_ids, mask),
                       inputs=self.forward_inputs(enc))
        with self.hooks(cap, hooked), torch.set_grad_enabled(grad):
            out = self.model(**cap.inputs)
        cap.output = out
        cap.logits = out.logits if self.task in ("classification", "regression") else None
        L = self.n_layers
        if "hidden_states" in needs and len(cap.hidden_states) != L + 1:
            raise RuntimeError(f"captured {len(cap.hidden_states)} hidden states for {L} layers")
        if "attentions" in hooked and (len(cap.attentions) != L or any(a is None for a in cap.attentions)) or \
                "attentions" not in hooked and "attention_mean" in needs and len(cap.attention_mean) != L:
            raise AttrscopeError(
                "the model returned no attention probabilities: load it with attn_implementation='eager'")
        if not grad:  # a graph's tensors stay as they are (a copy would not be differentiated)
            _stack_and_upcast(cap, narrow)
        if stacked_means:
            _head_means_of_stack(cap)
        return cap

    def each_layer(self, cap: Captured, fn: Callable[[int, Captured], None], hooked: frozenset[str] = PARTS) -> None:
        """The model's forward on ``cap.inputs`` again, calling fn(l, layer) as each layer l ends: ``layer`` a
        Captured of that layer's decomposition lists alone (``hooked``, by default ``PARTS``: one entry each;
        hidden_states its input and output), which are dropped when fn returns, so that one layer's [B, H, n, n] is
        alive at a time (issue 36: the capture of a batch whose stack of every layer's exceeds the block budget keeps
        none of them)."""
        one = Captured(input_ids=cap.input_ids, mask=cap.mask, lengths=cap.lengths, explain_pos=cap.explain_pos,
                       logits=None)
        lists = [name for name in STACKED if name != "attention_mean"]
        for name in lists:
            setattr(one, name, _Shuttable())

        def layer_end(l):
            def hook(_m, _inp, _out):
                if any(a is None for a in one.attentions):
                    return  # not an eager attention: the check after the forward names the fix
                # the layer's modules fn runs again (Value Zeroing's MLP step) are not the forward's: nothing kept
                for name in lists:
                    getattr(one, name).shut = True
                try:
                    fn(l, one)
                finally:
                    for name in lists:
                        getattr(one, name).shut = False
                for name in lists:  # this layer's dropped; its output is the next layer's input
                    del getattr(one, name)[:-1 if name == "hidden_states" else None]
            return hook

        with self.hooks(one, hooked), torch.no_grad():
            ends = [layer.register_forward_hook(layer_end(l)) for l, layer in enumerate(self.layers())]
            try:
                self.model(**cap.inputs, **self._no_cache())
            finally:
                for h in ends:
                    h.remove()
        if any(a is None for a in one.attentions):
            raise AttrscopeError(
                "the model returned no attention probabilities: load it with attn_implementation='eager'")

    def _no_cache(self) -> dict:
        """use_cache=False where the model's forward takes it: a forward read for its layers keeps no KV cache."""
        import inspect

        return {"use_cache": False} if "use_cache" in inspect.signature(self.model.forward).parameters else {}

    def streams_attention(self, input_ids: torch.Tensor) -> bool:
        """Whether a capture of the head means takes them layer by layer (compute.attention_streaming):
        the float32 stack of every layer's attention for this batch beside the block budget of its device."""
        from ..attention_streaming import streams_attention
        from ..methods._internals import budget

        B, n = input_ids.shape
        stack = budget.work_bytes(input_ids.device, budget.CPU_STACK_BYTES)
        return streams_attention(self.n_layers, self.n_heads, B, n, stack)
