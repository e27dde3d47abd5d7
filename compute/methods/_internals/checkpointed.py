"""The gradient pass with every layer checkpointed (issue 36): what a long input's backward keeps.

A plain backward keeps every layer's activations, among them each layer's softmax [B, H, n, n] and, where the
methods read them, every layer's dF/dA: the layers times n^2. Checkpointed, each layer's forward runs under
``torch.utils.checkpoint`` (non-reentrant): the forward keeps only the layers' inputs, and the backward recomputes a
layer's activations when it reaches that layer, so that one layer's are alive at a time. The attention gradients are
reduced in tensor hooks, layer by layer as the backward makes them, to what each method keeps (``AttentionTerm``):
the recomputed attention is taken by the attention module's forward hook during the recomputation, its gradient by a
hook registered on the forward's attention tensor (the backward runs through the forward's graph, the recomputation
only fills its saved tensors). Where the model's attention goes through transformers' attention interface
(``supports_head_chunks``), the pass runs it a chunk of heads at a time instead (``HeadChunks``: the forward, the
recomputation and the backward each make one chunk's [B, h, n, n] at a time, with the model's own eager function,
and the terms sum each chunk's heads, ``AttentionTerm.heads``), as many heads a chunk as the block budget holds.
A pass whose methods read no attention (only dF/dX or dF/dh: the gradient family,
integrated gradients) runs its layers' attention through torch's scaled_dot_product_attention instead (``sdpa``):
the forward, the recomputation and the backward make no [B, H, n, n] at all.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from ...adapters import Adapter
from ...adapters.base import _ask_for_attentions
from ...attention_streaming import CHUNK_COPIES, heads_per_chunk  # noqa: F401 - the rule, one declaration
from . import budget


def _head_mean(heads: Callable, finish: Callable | None, A, dA, cap):
    mean = heads(A, dA, cap) / A.shape[2]
    return mean if finish is None else finish(mean, cap)


@dataclass(frozen=True)
class AttentionTerm:
    """What a method keeps of the attention probabilities A and their gradients dF/dA (the explained output's):
    ``reduce(A, dA, cap)`` maps K layers' [K, B, H, n, n] (float32 at least; ``cap``: the pass's mask and explained
    positions) to [K, ...]; ``last``: of the last layer only. The plain pass reduces every layer's at once (one
    operation for every layer), the checkpointed one each layer's in its backward hook. A term that is a mean over
    the heads declares ``heads(A, dA, cap)``, its sum over the heads given ([K, B, h, n, n] -> [K, ...]), and
    ``finish(mean, cap)`` (None: the mean itself): ``reduce`` is made of them, and the head-chunked pass adds up
    each chunk's sum (HeadChunks)."""

    name: str
    reduce: Callable | None = None
    last: bool = False
    grad: bool = True  # reads dF/dA (else only A)
    rules: str = "gradient"  # the pass whose A and dF/dA it reduces (Explained.rules; chefer_decoder: RuleTerm)
    heads: Callable | None = None
    finish: Callable | None = None

    def __post_init__(self):
        if self.reduce is None:
            object.__setattr__(self, "reduce", partial(_head_mean, self.heads, self.finish))


def wide(t: torch.Tensor) -> torch.Tensor:
    """float32 at least (gradients.wide: the methods compute in float32 at least)."""
    return t.float() if t.element_size() < 4 else t


def supports_sdpa(adapter: Adapter) -> bool:
    """Whether the model's attention can run through scaled_dot_product_attention with the eager one's numbers:
    transformers says so (_supports_sdpa) and no logit soft-capping (Gemma 2's: SDPA would drop it)."""
    model = adapter.model
    return bool(getattr(type(model), "_supports_sdpa", False)) and not getattr(
        model.config, "attn_logit_softcapping", None)


@contextmanager
def attention_implementation(model, name: str | None):
    """The model's attention implementation set to ``name`` while inside (None: left as it is). The config's setter
    sets its sub-configs too; the model's masks are made for it (an SDPA boolean mask, or none where causal)."""
    config = model.config
    was = config._attn_implementation
    if name is None or name == was:
        yield
        return
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = was


@contextmanager
def layer_checkpoints(adapter: Adapter, calls: list[int] | None = None, sdpa: bool = False,
                      around: Callable | None = None, impl: str | None = None):
    """Every layer's forward under non-reentrant ``torch.utils.checkpoint`` while inside, without a KV cache (the
    recomputation would append to it again). ``calls[l]`` counts the runs of layer l's forward: 1 in the forward,
    more in the backward's recomputations. ``sdpa``: the attention through scaled_dot_product_attention, in the
    forward and in each recomputation (which the backward runs after this context has closed); ``impl``: another
    attention implementation (HeadChunks'), likewise. ``around(layer)``: a
    context the layer's forward runs in, in the forward and in its recomputations (the recomputation calls the
    forward itself: the layer's own hooks do not run; widened's cast of the layer's weights)."""
    model, layers = adapter.model, adapter.layers()
    calls = calls if calls is not None else [0] * len(layers)
    impl = "sdpa" if sdpa else impl

    def checkpointed(l: int, forward):
        def body(*args, **kwargs):
            calls[l] += 1
            with attention_implementation(model, impl):  # the recomputation runs as the forward did
                if around is None:
                    return forward(*args, **kwargs)
                with around(layers[l]):
                    return forward(*args, **kwargs)

        return lambda *args, **kwargs: checkpoint(body, *args, use_reentrant=False, **kwargs)

    own = [("forward" in vars(layer), vars(layer).get("forward")) for layer in layers]
    config, cache = model.config, getattr(model.config, "use_cache", None)
    try:
        for l, layer in enumerate(layers):
            layer.forward = checkpointed(l, layer.forward)
        if cache is not None:
            config.use_cache = False
        with attention_implementation(model, impl):  # the model's masks made for it
            yield calls
    finally:
        for layer, (had, fwd) in zip(layers, own):
            if had:
                layer.forward = fwd
            else:
                del layer.forward
        if cache is not None:
            config.use_cache = cache


class TermHooks:
    """The hooks of a checkpointed gradient pass that reduce each layer's A and dF/dA to the ``terms`` asked for, in
    the backward: ``results[name]`` [L, ...] (or [1, ...] for a term of the last layer). ``scale``: what the backward
    started from (output_grads' float16 loss scaling), divided out of dF/dA. ``operands``: what the terms reduce in
    place of (A, dF/dA), ``operands(l, A, dA, term)`` (the decoder rules' R^{A,l} and the plain dF/dA:
    chefer_decoder_rules.RuleOperands), and ``operands.forward(l)`` told when the forward has run layer l."""

    def __init__(self, adapter: Adapter, cap, calls: list[int], operands=None):
        self.adapter, self.cap, self.calls, self.operands = adapter, cap, calls, operands
        self.L = adapter.n_layers
        self.recomputed: dict[int, torch.Tensor] = {}
        self.terms: tuple[AttentionTerm, ...] = ()
        self.results: dict[str, torch.Tensor] = {}
        self.scale = 1.0

    @contextmanager
    def hooked(self):
        """The attention modules' hooks for the forward (and the recomputations, which run them again)."""
        handles = []
        try:
            for l, layer in enumerate(self.adapter.layers()):
                module = self.adapter.attention_probs_module(layer)
                if self.adapter.block is not None and self.adapter.block.attention_flag:
                    handles.append(module.register_forward_pre_hook(_ask_for_attentions, with_kwargs=True))
                handles.append(module.register_forward_hook(self._attention_hook(l)))
            yield self
        finally:
            for h in handles:
                h.remove()

    def _attention_hook(self, l: int):
        def hook(_m, _inp, out):
            a = out[1]
            if a is None or not a.requires_grad:
                return
            if self.calls[l] <= 1:  # the forward: only a hook on the tensor (the backward runs through it)
                a.register_hook(lambda g: self._reduce(l, g))
                if self.operands is not None:
                    self.operands.forward(l)
            else:  # the backward's recomputation of layer l: its attention, read by the gradient's hook
                self.recomputed[l] = a.detach()
        return hook

    def _reduce(self, l: int, g: torch.Tensor) -> None:
        A = self.recomputed.pop(l)
        terms = [t for t in self.terms if not t.last or l == self.L - 1]
        if not terms:
            return
        A = wide(A)[None]
        dA = None
        if any(t.grad for t in terms):  # widened only where a term reads it
            dA = wide(g)[None] if self.scale == 1 else wide(g)[None] / self.scale
        for term in terms:
            r = term.reduce(*(self.operands(l, A, dA, term) if self.operands else (A, dA)), self.cap)
            if term.last:
                self.results[term.name] = r
                continue
            out = self.results.get(term.name)
            if out is None:  # every layer's in one tensor made at the first (the last layer's: the backward's first)
                out = self.results[term.name] = r.new_zeros((self.L, *r.shape[1:]))
            out[l] = r[0]

    def run(self, terms: tuple[AttentionTerm, ...], backward: Callable):
        """``backward()`` with the hooks reducing to ``terms``: (its result, {term name: [L or 1, ...]})."""
        self.terms, self.results = terms, {}
        try:
            out = backward()
        finally:
            self.terms, self.recomputed = (), {}
        return out, self.results


# --- the attention a chunk of heads at a time (the gradient pass's terms: attcat, grads, attgrads, gae) -----------
HEADS_IMPL = "attrscope_head_chunks"  # the attention implementation's name (transformers' attention interface)


def _eager(module):
    """The eager attention function of the module's own modeling file (its numbers: the softmax's dtype, soft-capping,
    GPT-2's scaling)."""
    return getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)


def supports_head_chunks(adapter: Adapter) -> bool:
    """Whether the model's attention goes through transformers' attention interface (_supports_attention_backend) with
    an eager function of its modeling file that a chunk of heads can run: no per-head parameters (attention sinks),
    not GPT-2's reordered and upcast attention (its own path, not the interface's)."""
    model = adapter.model
    if not getattr(type(model), "_supports_attention_backend", False) or adapter.block is None \
            or getattr(model.config, "reorder_and_upcast_attn", False):
        return False
    modules = [adapter.attention_probs_module(layer) for layer in adapter.layers()]
    return all(_eager(m) is not None and getattr(m, "sinks", None) is None for m in modules)


class _OneGroup:
    """The attention module as a chunk's eager function sees it: its key and value heads already repeated to the
    chunk's query heads (num_key_value_groups 1), everything else the module's."""

    num_key_value_groups = 1

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        return getattr(self._module, name)


def _chunks(H: int, Hkv: int, h: int, device):
    """(query heads, their key/value heads) of each chunk of ``h`` heads: a slice and an index."""
    g = H // Hkv
    for h0 in range(0, H, h):
        s = slice(h0, min(H, h0 + h))
        yield s, torch.arange(s.start, s.stop, device=device) // g


def _kv(t: torch.Tensor, s: slice, idx: torch.Tensor, H: int) -> torch.Tensor:
    return t[:, s] if t.shape[1] == H else t.index_select(1, idx)


def _mask(mask, s: slice):
    return mask if mask is None or mask.shape[1] == 1 else mask[:, s]


class _HeadChunked(torch.autograd.Function):
    """A layer's attention output [B, n, H, d_h] made a chunk of heads at a time by the module's eager function; its
    backward recomputes each chunk's attention, takes the chunk's gradients (query, key, value and dF/dA) and hands
    A and dF/dA to the pass's terms before the next chunk is made."""

    @staticmethod
    def forward(ctx, run, module, kwargs, query, key, value, mask):
        ctx.run, ctx.module, ctx.kwargs = run, module, kwargs
        ctx.save_for_backward(query, key, value, mask)
        eager, one, H = _eager(module), _OneGroup(module), query.shape[1]
        outs = [eager(one, query[:, s], _kv(key, s, idx, H), _kv(value, s, idx, H), _mask(mask, s), **kwargs)[0]
                for s, idx in _chunks(H, key.shape[1], run.heads, query.device)]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

    @staticmethod
    def backward(ctx, grad):
        query, key, value, mask = ctx.saved_tensors
        run, module = ctx.run, ctx.module
        eager, one, H = _eager(module), _OneGroup(module), query.shape[1]
        dq = torch.empty_like(query)
        dk, dv = (torch.zeros(t.shape, dtype=wide(t).dtype, device=t.device) for t in (key, value))
        layer = run.layer_of[module]
        for s, idx in _chunks(H, key.shape[1], run.heads, query.device):
            q, k, v = (t.detach().requires_grad_(True) for t in (query[:, s], _kv(key, s, idx, H),
                                                                    _kv(value, s, idx, H)))
            with torch.enable_grad():
                out, A = eager(one, q, k, v, _mask(mask, s), **ctx.kwargs)
                gq, gk, gv, gA = torch.autograd.grad(out, (q, k, v, A), grad[:, :, s])
            dq[:, s] = gq
            dk.index_add_(1, idx, wide(gk))
            dv.index_add_(1, idx, wide(gv))
            run.chunk(layer, A.detach(), gA)
            del out, A, gA, gq, gk, gv
        run.layer_done(layer)
        return None, None, None, dq, dk.to(key.dtype), dv.to(value.dtype), None


_ACTIVE: list["HeadChunks"] = []


def _head_chunked_attention(module, query, key, value, attention_mask, **kwargs):
    """The attention implementation HEADS_IMPL: the active HeadChunks' layer, no attention probabilities returned."""
    return _HeadChunked.apply(_ACTIVE[-1], module, kwargs, query, key, value, attention_mask), None


def _register() -> None:
    """HEADS_IMPL in transformers' attention interface, its masks the eager attention's (additive, [B, 1, n, n])."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask
    from transformers.modeling_utils import AttentionInterface

    if HEADS_IMPL not in AttentionInterface._global_mapping:
        AttentionInterface.register(HEADS_IMPL, _head_chunked_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(HEADS_IMPL, eager_mask)


class HeadChunks(TermHooks):
    """The checkpointed gradient pass's attention a chunk of ``heads`` heads at a time (HEADS_IMPL): each chunk's A
    and dF/dA summed into the terms' ``heads`` as the backward makes them, a layer's terms finished when its last
    chunk is done. ``hooked()`` makes it the attention of the forward and of the recomputations."""

    def __init__(self, adapter: Adapter, cap, calls: list[int], heads: int):
        super().__init__(adapter, cap, calls)
        _register()
        self.heads, self.H = heads, adapter.n_heads
        self.layer_of = {adapter.attention_probs_module(layer): l for l, layer in enumerate(adapter.layers())}
        self.sums: dict[str, torch.Tensor] = {}

    @contextmanager
    def hooked(self):
        _ACTIVE.append(self)
        try:
            yield self
        finally:
            _ACTIVE.remove(self)

    def _terms(self, l: int):
        return [t for t in self.terms if not t.last or l == self.L - 1]

    def chunk(self, l: int, A: torch.Tensor, g: torch.Tensor) -> None:
        """Chunk's A and dF/dA [B, h, n, n] of layer l into the sums of its terms."""
        terms = self._terms(l)
        if not terms:
            return
        A = wide(A)[None]
        dA = None
        if any(t.grad for t in terms):
            dA = wide(g)[None] if self.scale == 1 else wide(g)[None] / self.scale
        for t in terms:
            part = t.heads(A, dA, self.cap)
            total = self.sums.get(t.name)
            self.sums[t.name] = part if total is None else total.add_(part)

    def layer_done(self, l: int) -> None:
        for t in self._terms(l):
            mean = self.sums.pop(t.name) / self.H
            r = mean if t.finish is None else t.finish(mean, self.cap)
            if t.last:
                self.results[t.name] = r
                continue
            out = self.results.get(t.name)
            if out is None:
                out = self.results[t.name] = r.new_zeros((self.L, *r.shape[1:]))
            out[l] = r[0]

    def run(self, terms: tuple[AttentionTerm, ...], backward: Callable):
        self.sums = {}
        try:
            return super().run(terms, backward)
        finally:
            self.sums = {}


def head_chunk_budget(device: torch.device) -> int:
    """The block budget a chunk of heads keeps within (budget.work_bytes: the stack's, as the streamed methods')."""
    return budget.work_bytes(device, budget.CPU_STACK_BYTES)
