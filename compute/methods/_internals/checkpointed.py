"""The gradient pass with every layer checkpointed (issue 36): what a long input's backward keeps.

A plain backward keeps every layer's activations, among them each layer's softmax [B, H, n, n] and, where the
methods read them, every layer's dF/dA: the layers times n^2. Checkpointed, each layer's forward runs under
``torch.utils.checkpoint`` (non-reentrant): the forward keeps only the layers' inputs, and the backward recomputes a
layer's activations when it reaches that layer, so that one layer's are alive at a time. The attention gradients are
reduced in tensor hooks, layer by layer as the backward makes them, to what each method keeps (``AttentionTerm``):
the recomputed attention is taken by the attention module's forward hook during the recomputation, its gradient by a
hook registered on the forward's attention tensor (the backward runs through the forward's graph, the recomputation
only fills its saved tensors). A pass whose methods read no attention (only dF/dX or dF/dh: the gradient family,
integrated gradients) runs its layers' attention through torch's scaled_dot_product_attention instead (``sdpa``):
the forward, the recomputation and the backward make no [B, H, n, n] at all.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from ...adapters import Adapter
from ...adapters.base import _ask_for_attentions


@dataclass(frozen=True)
class AttentionTerm:
    """What a method keeps of the attention probabilities A and their gradients dF/dA (the explained output's):
    ``reduce(A, dA, cap)`` maps K layers' [K, B, H, n, n] (float32 at least; ``cap``: the pass's mask and explained
    positions) to [K, ...]; ``last``: of the last layer only. The plain pass reduces every layer's at once (one
    operation for every layer), the checkpointed one each layer's in its backward hook."""

    name: str
    reduce: Callable
    last: bool = False
    grad: bool = True  # reads dF/dA (else only A)
    rules: str = "gradient"  # the pass whose A and dF/dA it reduces (Explained.rules; chefer_decoder: RuleTerm)


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
                      around: Callable | None = None):
    """Every layer's forward under non-reentrant ``torch.utils.checkpoint`` while inside, without a KV cache (the
    recomputation would append to it again). ``calls[l]`` counts the runs of layer l's forward: 1 in the forward,
    more in the backward's recomputations. ``sdpa``: the attention through scaled_dot_product_attention, in the
    forward and in each recomputation (which the backward runs after this context has closed). ``around(layer)``: a
    context the layer's forward runs in, in the forward and in its recomputations (the recomputation calls the
    forward itself: the layer's own hooks do not run; widened's cast of the layer's weights)."""
    model, layers = adapter.model, adapter.layers()
    calls = calls if calls is not None else [0] * len(layers)
    impl = "sdpa" if sdpa else None

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
