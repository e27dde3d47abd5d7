"""Attention-block decomposition of post-LN layers (Kobayashi et al. 2021; METHODS.md 1.1 and 10).

For layer l, query i and source token j (heads h, centering P = I - 11^T/d):

    u_j^h      = W_O^h (W_V^h x_j + b_V^h)                         value vector through the output projection
    z_{i<-j}   = sum_h A_ij^h u_j^h                                attention only
    z+_{i<-j}  = z_{i<-j} + [i=j] x_i                              plus the residual on the diagonal
    T_i(x_j)   = gamma1 * P z+_{i<-j} / sigma1_i                   LN1-linearised (sigma1_i of the REAL pre-LN1 state)
    x~_{i<-j}  = gamma2 * P T_i(x_j) / sigma2_i                    through LN2 (GlobEnc; sigma2_i of the real state)

Because P and the gains are linear, they are folded into W_O once per layer (``operand_weights``), never applied to
n x n x d tensors. Norms of these vectors use Gram matrices over heads (``decomposed_sq_norms``): no heads x n x n x d
tensor is ever built.

Every function here works on a :class:`LayerParts` of one layer ([B, ...] tensors, weights [d, d] and [d]) or of a
stack of K layers at once ([K, B, ...] tensors, weights [K, 1, d, d] and [K, 1, 1, d] that broadcast over the batch):
the methods run all layers in a few batched operations (``layer_groups``; a GPU launches one kernel per operation),
the tests and ALTI's pruned form one layer at a time (``layer_parts``).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from ... import interrupts
from ...adapters import Adapter, Captured
from . import budget as block_budget

NEEDS = frozenset({"attentions", "hidden_states", "values", "ln1", "ln2", "attn_out"})
# the methods that read one layer at a time where the batch's stack of every layer's would not fit (streamed_layers)
STREAMED_NEEDS = frozenset({"layer_parts"})
# DecompX's: every layer's lists, each kept as the forward made it where the batch's stack of every layer's attention
# would exceed the block budget (Adapter.capture's "narrow_layers"; read a layer at a time: ``narrow_take``)
NARROW_NEEDS = frozenset({"narrow_layers"})


def center(v: torch.Tensor) -> torch.Tensor:
    return v - v.mean(dim=-1, keepdim=True)


def ln_sigma(s: torch.Tensor, eps: float) -> torch.Tensor:
    """sigma(s) = sqrt(mean((s - mean s)^2) + eps) (ALTI's reference code drops eps: eps = 0)."""
    # one fused norm of the centred rows (torch.var is 10x slower on CPU)
    return (torch.linalg.vector_norm(center(s), dim=-1).square() / s.shape[-1] + eps).sqrt()


def center_rows(W: torch.Tensor) -> torch.Tensor:
    """P W: centre every column of W [..., d, d'] over the output dimension (so P (W v) = (P W) v)."""
    return W - W.mean(dim=-2, keepdim=True)


# --- every layer's weights, stacked -------------------------------------------------------------------------------
@dataclass
class LayerWeights:
    """The decomposition's weights of every layer stacked [L, ...] in one dtype and device, and the per-kind products
    made from them (``kind_weight``): made once and kept on the adapter while the model's parameters are the same
    tensors, unmodified (``stacked_weights``)."""

    W_O: torch.Tensor  # [L, d, d] output projection (out = concat_h v^h @ W_O^T + b_O)
    b_O: torch.Tensor  # [L, d]
    gamma1: torch.Tensor  # [L, d]
    beta1: torch.Tensor
    gamma2: torch.Tensor
    beta2: torch.Tensor
    eps1: float  # LayerNorm epsilons (the same in every layer)
    eps2: float
    # A norm on the attention output before the residual add (Gemma 2, OLMo 2; compute.adapters.block): its gains
    # [L, d] and epsilon, or None
    gamma_o: torch.Tensor | None = None
    eps_o: float = 0.0
    # The final norm before the head of a pre-LN model (docs/methods.md 6): its gain [d], epsilon and whether it
    # centres (LayerNorm) or not (RMSNorm); None where the model has none
    gamma_f: torch.Tensor | None = None
    eps_f: float = 0.0
    centred_f: bool = True
    derived: dict = field(default_factory=dict)
    serial: int = field(default_factory=itertools.count().__next__)  # tells results of other weights apart

    def kind_weight(self, kind: str) -> torch.Tensor:
        """[L, d, d]: W_O ("n", "res"; gamma_o W_O behind an attention-output RMSNorm), gamma1 P W_O ("resln"),
        gamma2 P gamma1 P W_O ("enc"); pre-LN: "res"'s, the last layer's times the final norm's gamma_f P (gamma_f
        without P for RMSNorm) ("glob"; "final": every layer's times it)."""
        if kind in ("n", "res"):
            if self.gamma_o is None:
                return self.W_O
            if "o" not in self.derived:
                self.derived["o"] = self.gamma_o[:, :, None] * self.W_O
            return self.derived["o"]
        if kind not in self.derived:
            if kind == "resln":
                self.derived[kind] = self.gamma1[:, :, None] * center_rows(self.W_O)
            elif kind == "enc":
                self.derived[kind] = self.gamma2[:, :, None] * center_rows(self.kind_weight("resln"))
            elif kind == "final":
                W = self.kind_weight("res")
                self.derived[kind] = self.gamma_f[:, None] * (center_rows(W) if self.centred_f else W)
            elif kind == "glob":  # the final norm on the last layer's only (not "final" of every layer)
                W = self.kind_weight("res")[-1:]
                top = self.gamma_f[:, None] * (center_rows(W) if self.centred_f else W)
                self.derived[kind] = torch.cat([self.kind_weight("res")[:-1], top])
            else:
                raise ValueError(kind)
        return self.derived[kind]

    def gram_blocks(self, kind: str, H: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The upper block triangle of P = W^T W (``kind_weight``'s W) by block columns: blocks[g] = P[head g's
        rows, heads 0..g] [L, dh, (g + 1) dh], contiguous; and the index [H, H] of pair (h, g) in the heads' triangle
        packed column by column (so G[h, g] = packed[index[h, g]] = packed[index[g, h]]). P is formed in float64 so
        that the head Gram matrices read from it lose nothing to the product, a layer at a time into the blocks: no
        [L, d, d] stack of P beside them (a 7B model's is 2 GB in float32; issue 36)."""
        key = ("gram_blocks", kind, H)
        if key not in self.derived:
            W = self.kind_weight(kind)
            L, d = W.shape[0], W.shape[-1]
            dh = d // H
            blocks = [W.new_empty(L, dh, (g + 1) * dh) for g in range(H)]
            for l, w in enumerate(W):
                P = (w.double().t() @ w.double()).to(W.dtype)
                for g in range(H):
                    blocks[g][l] = P[g * dh:(g + 1) * dh, :(g + 1) * dh]
            h, g = torch.meshgrid(torch.arange(H), torch.arange(H), indexing="ij")
            lo, hi = torch.minimum(h, g), torch.maximum(h, g)
            self.derived[key] = (blocks, (hi * (hi + 1) // 2 + lo).to(W.device))
        return self.derived[key]


def parameters_stamp(model: torch.nn.Module) -> tuple:
    """The identity and version of every parameter: it changes when a weight is replaced or modified in place."""
    return tuple((id(p), p._version) for p in model.parameters())


def kept(adapter: Adapter, key: tuple, build):
    """build(), kept on the adapter under ``key`` while the model's parameters are the same tensors, unmodified."""
    stamp = parameters_stamp(adapter.model)
    cache = adapter.__dict__.setdefault("_stacked_weights", {})
    hit = cache.get(key)
    if hit is None or hit[0] != stamp:
        hit = cache[key] = (stamp, build())
    return hit[1]


def stack_params(tensors, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.stack([t.detach() for t in tensors]).to(device=device, dtype=dtype)


def stacked_weights(adapter: Adapter, dtype: torch.dtype, device: torch.device) -> LayerWeights:
    """Every layer's W_O, b_O and LayerNorm gains and biases [L, ...] in ``dtype`` (kept across batches)."""
    return kept(adapter, ("decomposition", dtype, device), lambda: _stacked_weights(adapter, dtype, device))


def _stacked_weights(adapter: Adapter, dtype: torch.dtype, device: torch.device) -> LayerWeights:
    """From the block's modules (compute.adapters.block). A norm that is absent or has no weight (OLMo 2 has none
    before attention, ModernBERT an identity before its first) gets gain 1 and bias 0; only post-LN blocks, whose
    norms all exist, are read through LN1 and LN2."""
    layers = adapter.layers()
    outs = [adapter.out_proj(layer) for layer in layers]
    ln1s, ln2s = [adapter.ln1(layer) for layer in layers], [adapter.ln2(layer) for layer in layers]
    d = outs[0].weight.shape[0]

    def stack(tensors):
        return stack_params(tensors, dtype, device)

    def gains(modules):
        return stack([adapter.norm_gain(m, d) for m in modules])

    def biases(modules):  # Llama's o_proj and RMSNorm have none
        if all(getattr(m, "bias", None) is None for m in modules):
            return torch.zeros(len(modules), d, dtype=dtype, device=device)
        return stack([m.bias if getattr(m, "bias", None) is not None else outs[0].weight.new_zeros(d)
                      for m in modules])

    def eps(modules):  # LayerNorm's (centred sigma) or RMSNorm's (the final norm of a pre-LN model)
        values = {adapter.norm_eps(m) for m in modules if m is not None and not isinstance(m, torch.nn.Identity)}
        if len(values) > 1:
            raise ValueError(f"the layers' norms have different epsilons {sorted(values)}")
        return values.pop() if values else 0.0

    post = [adapter.attn_out_norm(layer) for layer in layers]
    has_post = post[0] is not None
    final = adapter.final_norm() if adapter.block is not None and adapter.pre_ln else None
    return LayerWeights(W_O=stack([o.weight for o in outs]), b_O=biases(outs),
                        gamma1=gains(ln1s) if ln1s[0] is not None else None, beta1=biases(ln1s),
                        gamma2=gains(ln2s) if ln2s[0] is not None else None, beta2=biases(ln2s), eps1=eps(ln1s),
                        eps2=eps(ln2s), gamma_o=gains(post) if has_post else None, eps_o=eps(post) if has_post else 0.0,
                        gamma_f=None if final is None else adapter.norm_gain(final, d).detach().to(device, dtype),
                        eps_f=eps([final]), centred_f=final is not None and adapter.block.norm == "layernorm")  # OLMo: no nn.LayerNorm


@dataclass
class FeedForward:
    """Every post-LN layer's feed-forward block, FFN(y) = W2 act(W1 y + b1) + b2, stacked [L, ...]."""

    W1: torch.Tensor  # [L, d_ff, d]
    b1: torch.Tensor  # [L, d_ff]
    W2: torch.Tensor  # [L, d, d_ff]
    b2: torch.Tensor  # [L, d]
    act: object  # the activation (the same in every layer)


def stacked_ffn(adapter: Adapter, dtype: torch.dtype, device: torch.device,
                layers: slice | None = None) -> FeedForward:
    """The feed-forward blocks of every layer in ``dtype`` (kept across batches); ``Adapter.ffn_parts`` says which.
    ``layers``: those layers' only, cast now and not kept (a streamed layer's: no float32 copy of every layer's)."""
    def build(chosen=slice(None)):
        parts = [adapter.ffn_parts(layer) for layer in adapter.layers()[chosen]]
        if len({type(act) for _, act, _ in parts}) != 1:
            raise ValueError("the layers' feed-forward activations differ")
        return FeedForward(*(stack_params([part[i].weight if w else part[i].bias for part in parts], dtype, device)
                             for i, w in ((0, True), (0, False), (2, True), (2, False))), act=parts[0][1])

    return kept(adapter, ("ffn", dtype, device), build) if layers is None else build(layers)


# --- the parts of one layer, or of a stack of layers ---------------------------------------------------------------
@dataclass
class LayerParts:
    """The decomposition's tensors of one layer ([B, ...]) or of K layers ([K, B, ...]), batched and padded."""

    A: torch.Tensor  # [*, H, n, n] attention probabilities
    x: torch.Tensor  # [*, n, d]    layer input (residual)
    v: torch.Tensor  # [*, n, H, d_h] value vectors W_V x + b_V
    s: torch.Tensor  # [*, n, d]    real pre-LN1 state
    y: torch.Tensor  # [*, n, d]    real LN1 output
    t: torch.Tensor  # [*, n, d]    real pre-LN2 state
    y2: torch.Tensor  # [*, n, d]   real LN2 output (the layer output)
    o: torch.Tensor | None  # [*, n, d] the attention output before a norm on it (where the block has one), or None
    mask: torch.Tensor  # [B, n] bool, True on the real tokens of these examples
    weights: LayerWeights
    layers: int | slice  # which layers of ``weights``: one (int) or a stack (slice)
    rows: slice = field(default_factory=lambda: slice(None))  # which examples of the batch
    eps_quirk: bool = False  # the reference's sigma without LayerNorm epsilon (eps = 0)
    memo: dict | None = None  # the batch's memo (Captured.memo): results shared by the methods of one batch
    by_kind: dict = field(default_factory=dict, repr=False)  # operand_weights per kind, for this instance
    # [B, n, d] the last layer's output before the final norm of a pre-LN model, which the capture hides (set by
    # compute.methods._internals.pre_ln.with_final_output where these parts hold the last layer; kind "glob")
    out: torch.Tensor | None = None

    @property
    def stacked(self) -> bool:
        return isinstance(self.layers, slice)

    def matrix(self, W: torch.Tensor) -> torch.Tensor:
        """A stacked [L, d, d] weight for these layers: [d, d], or [K, 1, d, d] (broadcast over the batch)."""
        return W[self.layers, None] if self.stacked else W[self.layers]

    def vector(self, b: torch.Tensor) -> torch.Tensor:
        """A stacked [L, d] weight for these layers: [d], or [K, 1, 1, d]."""
        return b[self.layers, None, None] if self.stacked else b[self.layers]

    @functools.cached_property
    def W_O(self) -> torch.Tensor:
        return self.matrix(self.weights.W_O)

    @functools.cached_property
    def b_O(self) -> torch.Tensor:
        return self.vector(self.weights.b_O)

    @functools.cached_property
    def gamma1(self) -> torch.Tensor:
        return self.vector(self.weights.gamma1)

    @functools.cached_property
    def beta1(self) -> torch.Tensor:
        return self.vector(self.weights.beta1)

    @functools.cached_property
    def gamma2(self) -> torch.Tensor:
        return self.vector(self.weights.gamma2)

    @functools.cached_property
    def beta2(self) -> torch.Tensor:
        return self.vector(self.weights.beta2)

    @property
    def eps1(self) -> float:
        return 0.0 if self.eps_quirk else self.weights.eps1

    @property
    def eps2(self) -> float:
        return 0.0 if self.eps_quirk else self.weights.eps2

    def shared(self, key, fn):
        """fn(), shared by the methods of this batch (through the batch's memo)."""
        if self.memo is None:
            return fn()
        key = (*key, _key(self.layers), _key(self.rows), self.eps_quirk, self.weights.serial)
        if key not in self.memo:
            self.memo[key] = fn()
        return self.memo[key]

    @functools.cached_property
    def sigma1(self) -> torch.Tensor:
        """[*, n] LN1's sigma of the real pre-LN1 state (computed when a method needs it)."""
        return ln_sigma(self.s, self.eps1)

    @functools.cached_property
    def sigma2(self) -> torch.Tensor:
        return ln_sigma(self.t, self.eps2)

    @functools.cached_property
    def rho(self) -> torch.Tensor | None:
        """[*, n] the RMS of the real attention output, which the norm on it divides by (None: no such norm)."""
        if self.weights.gamma_o is None:
            return None
        return (self.o.square().mean(-1) + self.weights.eps_o).sqrt()

    @property
    def has_last(self) -> bool:
        """These parts hold the model's last layer."""
        last = self.weights.W_O.shape[0] - 1
        return self.layers.stop == last + 1 if self.stacked else self.layers == last

    @functools.cached_property
    def sigma_f(self) -> torch.Tensor:
        """[B, n] the final norm's sigma (RMSNorm: rms) of the real last layer output ``out``."""
        if self.weights.centred_f:
            return ln_sigma(self.out, self.weights.eps_f)
        return (self.out.square().mean(-1) + self.weights.eps_f).sqrt()

    def final_linear(self, v: torch.Tensor) -> torch.Tensor:
        """gamma_f * P v (RMSNorm: gamma_f * v): the final norm's linear part, without 1/sigma_f."""
        return self.weights.gamma_f * (center(v) if self.weights.centred_f else v)

    def ln1_linear(self, v: torch.Tensor) -> torch.Tensor:
        """gamma1 * P v (the linear part of LN1, without 1/sigma1)."""
        return self.gamma1 * center(v)

    def ln2_linear(self, v: torch.Tensor) -> torch.Tensor:
        return self.gamma2 * center(v)

    @property
    def b_tilde(self) -> torch.Tensor:
        """b~_i = gamma1 * P b_O / sigma1_i + beta1 [*, n, d]: output bias and LN1 beta, assigned to no token."""
        return self.ln1_linear(self.b_O) / self.sigma1[..., None] + self.beta1

    def layer(self, k: int) -> "LayerParts":
        """Layer k of a stack as one layer's parts (views)."""
        assert self.stacked
        return LayerParts(A=self.A[k], x=self.x[k], v=self.v[k], s=self.s[k], y=self.y[k], t=self.t[k],
                          y2=self.y2[k], o=None if self.o is None else self.o[k], mask=self.mask, weights=self.weights, layers=self.layers.start + k, rows=self.rows,
                          eps_quirk=self.eps_quirk, memo=self.memo)

    def project(self, W: torch.Tensor, source_major: bool = False) -> torch.Tensor:
        """U_j^h = W^h v_j^h for an output projection W [*, d, d] split by heads: [*, n, H, d] contiguous, or with
        ``source_major`` [n, N, H, d] contiguous (N = layers x examples flattened: the layout ``SourceBlocks`` reads).
        One batched product over (layer, head) of every example's tokens, [B n, dh] x [dh, d], and one copy into the
        layout asked for."""
        *_, n, H, dh = self.v.shape
        Wh = W.unflatten(-1, (H, dh)).movedim(-2, -3)  # [*, H, d, dh]
        d = Wh.shape[-2]
        shared = self.stacked and W.dim() == 4 and W.shape[1] == 1 or not self.stacked and W.dim() == 2
        if not shared:  # a weight per example (not used by the methods): a broadcast product
            U = torch.matmul(self.v.transpose(-3, -2), Wh.transpose(-1, -2)).transpose(-3, -2)  # [*, n, H, d]
            return U.reshape(-1, n, H, d).transpose(0, 1).contiguous() if source_major else U.contiguous()
        # the examples' rows folded into each head's product (a broadcast matmul would copy W once per example)
        v = self.v if self.stacked else self.v[None]  # [K, B, n, H, dh]
        K, B = v.shape[:2]
        rows = v.permute(0, 3, 1, 2, 4).reshape(K, H, B * n, dh)
        Wt = (Wh[:, 0] if self.stacked else Wh[None]).transpose(-1, -2)  # [K, H, dh, d]
        U = torch.matmul(rows, Wt).view(K, H, B, n, d)
        order = (3, 0, 2, 1, 4) if source_major else (0, 2, 3, 1, 4)  # [n, K, B, H, d] or [K, B, n, H, d]
        U = U.permute(*order).contiguous()
        if source_major:
            return U.view(n, -1, H, d)
        return U if self.stacked else U[0]


def shared_matmul(X: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """X [*, n, a] @ W for a weight shared by the examples: W [a, b] (one layer) or [K, 1, a, b] (a stack, X
    [K, B, n, a]). The examples' rows are folded into each layer's product: a broadcast matmul would copy the
    weights once per example (on the CPU that copy cost more than the product)."""
    if W.dim() == 4 and W.shape[1] == 1 and X.dim() == 4:
        K, B, n, a = X.shape
        return torch.matmul(X.reshape(K, B * n, a), W[:, 0]).view(K, B, n, W.shape[-1])
    return torch.matmul(X, W)


def _key(index):
    return (index.start, index.stop) if isinstance(index, slice) else index


def layer_parts(cap: Captured, adapter: Adapter, l: int, eps_quirk: bool = False) -> LayerParts:
    """Layer ``l`` (0-based) of a captured batch, [B, ...] (views of the stacked capture). On pre-LN models
    (METHODS.md 1.1, pre-LN variant) the values come from LN1(x_j), s = x is LN1's input, and t = r (the residual
    stream after attention) is LN2's input."""
    return _parts(cap, adapter, l, slice(None), eps_quirk)


def layer_stack(cap: Captured, adapter: Adapter, layers: slice = slice(None), rows: slice = slice(None),
                eps_quirk: bool = False) -> LayerParts:
    """The layers ``layers`` of the examples ``rows`` as one stack, [K, B, ...]."""
    start, stop, _ = layers.indices(adapter.n_layers)
    return _parts(cap, adapter, slice(start, stop), rows, eps_quirk)


def _parts(cap: Captured, adapter: Adapter, layers: int | slice, rows: slice, eps_quirk: bool) -> LayerParts:
    def take(name):
        t = cap.stack(name)[layers]
        # the examples are the dimension after the layer's (views; none for the whole batch)
        return t if rows == slice(None) else t[rows] if isinstance(layers, int) else t[:, rows]

    return _parts_of(take, bool(cap.ln1_in), cap.mask if rows == slice(None) else cap.mask[rows], adapter, layers,
                     rows, eps_quirk, cap.memo)


def streamed_layers(cap: Captured, adapter: Adapter, fn, eps_quirk: bool = False,
                    narrow_attention: bool = False) -> None:
    """fn(parts of layer l) for every layer l in turn, as a forward of its own makes the layer (Adapter.each_layer:
    one layer's [B, H, n, n] alive at a time; issue 36), widened to float32 as the capture's stacks are; with
    ``narrow_attention`` the attention as the model made it (a method that reads it only through
    ``gram_quadratic``, which widens a block of queries at a time: no float32 [B, H, n, n]). A capture that kept no
    layer's attention (a batch above the block budget: Adapter.capture's "layer_parts") is read so. No memo: a
    layer's intermediates go with it."""
    def layer(l, one):
        def take(name):
            lst = one.hidden_states[:1] if name == "hidden_states" else getattr(one, name)
            t = lst[0]
            keep = narrow_attention and name == "attentions"
            return t.float() if t.element_size() < 4 and not keep else t

        interrupts.check()  # a stop asked for: between layers
        fn(_parts_of(take, bool(one.ln1_in), cap.mask, adapter, l, slice(None), eps_quirk, None))

    adapter.each_layer(cap, layer)


def streams(cap: Captured) -> bool:
    """Whether the capture kept no layer's decomposition lists: the methods stream them (``streamed_layers``)."""
    return not cap.attentions


def _parts_of(take, has_ln1: bool, mask: torch.Tensor, adapter: Adapter, layers: int | slice, rows: slice,
              eps_quirk: bool, memo: dict | None) -> LayerParts:
    A = take("attentions")
    *_, H, n, _ = A.shape
    v = take("values")
    x = take("hidden_states")
    block = adapter.block
    o = take("attn_out") if block is not None and block.attn_out_captured else None
    if block is not None and block.parallel:  # no module reads the residual stream after attention: x + o
        t = x + o
    else:
        t = take("ln2_in")
    # a block without a norm before attention (OLMo 2) gives its layer input to attention as it is
    s, y = (take("ln1_in"), take("ln1_out")) if has_ln1 else (x, x)
    return LayerParts(A=A, x=x, v=v.unflatten(-1, (H, v.shape[-1] // H)),
                      s=s, y=y, t=t, y2=take("ln2_out"), o=o, mask=mask,
                      weights=stacked_weights(adapter, x.dtype, x.device), layers=layers, rows=rows,
                      eps_quirk=eps_quirk, memo=memo)


def layer_groups(cap: Captured, adapter: Adapter, bytes_per_row: int, budget: int,
                 eps_quirk: bool = False) -> Iterator[LayerParts]:
    """Stacks of layers (and, where one layer of the batch is over ``budget``, of examples) whose working memory,
    ``bytes_per_row`` per (layer, example), fits the budget: in the usual case one stack of every layer."""
    L, B = adapter.n_layers, cap.mask.shape[0]
    rows = max(1, budget // max(bytes_per_row, 1))  # (layer, example) rows per group
    if rows >= B:
        k = min(L, rows // B)
        for l0 in range(0, L, k):
            yield layer_stack(cap, adapter, slice(l0, l0 + k), eps_quirk=eps_quirk)
    else:
        for l0 in range(L):
            for b0 in range(0, B, rows):
                yield layer_stack(cap, adapter, slice(l0, l0 + 1), slice(b0, b0 + rows), eps_quirk=eps_quirk)


def over_layers(cap: Captured, adapter: Adapter, fn, bytes_per_row: int, budget: int, eps_quirk: bool = False):
    """fn(stack) -> [K, B', ...] for every group of ``layer_groups``, put together as [L, B, ...] (no copy when
    there is one group)."""
    out = None
    for p in layer_groups(cap, adapter, bytes_per_row, budget, eps_quirk):
        interrupts.check()  # a stop asked for: between groups of layers
        part = fn(p)
        if out is None and p.layers == slice(0, adapter.n_layers) and p.rows == slice(None):
            return part
        if out is None:
            out = part.new_empty(adapter.n_layers, cap.mask.shape[0], *part.shape[2:])
        out[p.layers, p.rows] = part
    return out


# --- the decomposed vectors, without building them ------------------------------------------------------------------
def operand_weights(p: LayerParts, kind: str):
    """(W [*, d, d], diag [*, n, d] | None, scale [*, n] | None) such that the decomposed vector is
    (sum_h A_ij^h W^h v_j^h + [i=j] diag_i) / scale_i:

        "n"      z_{i<-j}                           (N)
        "res"    z+_{i<-j}                          (N_RES)
        "resln"  T_i(x_j) = gamma1 P z+ / sigma1_i  (N_RESLN, ALTI)
        "enc"    x~_{i<-j} = gamma2 P T / sigma2_i  (N_ENC, GlobEnc)
        "glob"   z+_{i<-j} below the last layer, gamma_f P z+_{i<-j} / sigma_f,i in it (the final norm; RMSNorm
                 without P): pre-LN GlobEnc, docs/methods.md 6.1

    LayerNorm's linear parts are folded into W_O (gamma P W_O, a d x d product per layer, kept across batches)
    rather than applied to the [*, n, H, d] vectors. Computed once per kind for a LayerParts."""
    if kind not in p.by_kind:
        p.by_kind[kind] = _operand_weights(p, kind)
    return p.by_kind[kind]


def _operand_weights(p: LayerParts, kind: str):
    W = p.matrix(p.weights.kind_weight(kind))
    if kind == "n":
        return W, None, p.rho
    if kind == "res":
        # behind an attention-output RMSNorm the vectors are gamma_o z / rho_i (+ x_i): the residual times rho_i
        return W, p.x if p.rho is None else p.x * p.rho[..., None], p.rho
    if kind == "resln":
        return W, p.ln1_linear(p.x), p.sigma1
    if kind == "enc":
        return W, p.ln2_linear(p.ln1_linear(p.x)), p.sigma1 * p.sigma2
    if kind == "glob":
        _, diag, scale = operand_weights(p, "res")
        if not p.has_last:
            return W, diag, scale
        if p.out is None:
            raise ValueError("the last layer's output before the final norm is not set (pre_ln.with_final_output)")
        # the last layer's "res" vectors through the final norm's linear part, divided by its real sigma_f
        top_diag, top_scale = (diag[-1], None if scale is None else scale[-1]) if p.stacked else (diag, scale)
        top_diag = p.final_linear(top_diag)
        top_scale = p.sigma_f if top_scale is None else p.sigma_f * top_scale
        if not p.stacked:
            return W, top_diag, top_scale
        below = p.x.new_ones(p.x.shape[:-1])[:-1] if scale is None else scale[:-1]
        return W, torch.cat([diag[:-1], top_diag[None]]), torch.cat([below, top_scale[None]])
    raise ValueError(kind)


def operands(p: LayerParts, kind: str):
    """(U [*, n, H, d], diag, scale): the projected vectors U_j^h = W^h v_j^h of :func:`operand_weights`."""
    W, diag, scale = operand_weights(p, kind)
    return p.project(W), diag, scale


def decomposed_norms(p: LayerParts, kind: str) -> torch.Tensor:
    """||decomposed vector_{i<-j}||_2 for every i, j [*, n, n] (METHODS.md 10), shared by the methods of one batch
    (N by N and N_FIXEDRES, ...) through the memo."""
    def norms():
        _, _, scale = operand_weights(p, kind)
        q = decomposed_sq_norms(p, kind, scaled=False).sqrt_()
        return q if scale is None else q / scale[..., None]

    return p.shared(("decomposed_norms", kind), norms)


def decomposed_sq_norms(p: LayerParts, kind: str, scaled: bool = True, diagonal: bool = True) -> torch.Tensor:
    """||decomposed vector_{i<-j}||_2^2 [*, n, n] (divided by scale_i^2 unless ``scaled`` is False), clamped at 0.
    Without ``diagonal`` the residual term is left out, so entries i = j are wrong (callers that overwrite them)."""
    W, diag, scale = operand_weights(p, kind)
    G, cross = head_gram(p, kind, diag if diagonal else None)
    q = gram_quadratic(p.A, G, diag if diagonal else None, cross).clamp_min_(0)
    return q / scale[..., None].square() if scaled and scale is not None else q


def head_gram(p: LayerParts, kind: str, diag: torch.Tensor | None = None):
    """G_j[h, g] = <U_j^h, U_j^g> [*, n, H, H] and cross_i[h] = <U_i^h, diag_i> [*, n, H] (or None), U_j^h = W^h v_j^h
    for the operand weight W of ``kind``, without the projected vectors.

    <W^h a, W^g b> = a^T P^{hg} b with P = W^T W (``LayerWeights.gram_blocks``), so for each head g one product of
    every layer's and example's tokens, [N, dh] x [dh, (g + 1) dh], gives P^{hg} v^g for the heads h <= g, and one
    pass contracts it with v^h: the upper triangle, mirrored. Half the arithmetic of projecting the values, and
    no [*, n, H, d] tensor (building and reordering that one cost 3.5x this on the CPU, whose caches it overflows).
    cross: v^h . (W^T diag)^h, one [n, d] x [d, d] product."""
    *lead, n, H, dh = p.v.shape
    v = p.v if p.stacked else p.v[None]  # [K, B, n, H, dh]
    K = v.shape[0]
    blocks, packed_index = p.weights.gram_blocks(kind, H)
    rows = v.permute(3, 0, 1, 2, 4).reshape(H, K, -1, dh).unbind(0)  # per head: [K, N, dh] contiguous
    vt = v.reshape(K, -1, H * dh)  # [K, N, H dh]
    upper = []  # for each head g: <v^h, P^{hg} v^g> of the heads h <= g, [K, N, g + 1]
    for g in range(H):  # H products; one product into a whole [N, H, d] tensor instead cost 3.5x on the CPU
        Pg = blocks[g][p.layers] if p.stacked else blocks[g][p.layers, None]  # [K, dh, (g + 1) dh]
        R = torch.bmm(rows[g], Pg)  # [K, N, (g + 1) dh]
        upper.append(R.mul_(vt[..., :(g + 1) * dh]).view(K, -1, g + 1, dh).sum(-1))
    G = torch.cat(upper, -1)[..., packed_index]  # [K, N, H, H], each pair from its upper-triangle entry
    G = G.view(*lead, n, H, H)
    cross = None
    if diag is not None:
        W = operand_weights(p, kind)[0]
        cross = torch.linalg.vecdot(shared_matmul(diag, W).unflatten(-1, (H, dh)), p.v)  # [*, n, H]
    return G, cross


def gram_quadratic(A: torch.Tensor, G: torch.Tensor, diag: torch.Tensor | None = None,
                   cross: torch.Tensor | None = None) -> torch.Tensor:
    """|| sum_h A_ij^h U_j^h + [i=j] diag_i ||_2^2 for all i, j: [*, n, n], from the head Gram matrices
    G [*, n, H, H] and cross [*, n, H] of ``head_gram`` (METHODS.md 10).

    ||sum_h a_h u^h||^2 = a^T G a: O(n H^2 d + n^2 H^2) time. Per source token j the quadratic forms of all queries
    are one [H, H] x [H, n] product, batched over every source, example and layer; by blocks of queries where the two
    [*, H, n, n] temporaries would exceed the block budget (a streamed layer of a long input: issue 36)."""
    *lead, H, n, _ = A.shape
    per_query = 2 * A[..., :1, :].numel() * A.element_size()  # a query's two temporaries
    k = max(1, block_budget.work_bytes(A.device, block_budget.CPU_STACK_BYTES) // per_query)
    if k >= n:
        Aj = widened(A.movedim(-1, -3), G.dtype).contiguous()  # [*, j, H, i]
        q = torch.matmul(G, Aj).mul_(Aj).sum(-2).transpose(-1, -2)  # [*, i, j]
    else:  # A may be the model's narrower dtype (a streamed layer's: streamed_layers), widened a block at a time
        q = G.new_empty(*lead, n, n)
        for i0 in range(0, n, k):
            Aj = widened(A[..., i0:i0 + k, :].movedim(-1, -3), G.dtype).contiguous()  # [*, j, H, k]
            q[..., i0:i0 + k, :] = torch.matmul(G, Aj).mul_(Aj).sum(-2).transpose(-1, -2)
    if diag is not None:
        a_ii = widened(torch.diagonal(A, dim1=-2, dim2=-1).transpose(-1, -2), G.dtype)  # [*, n, H]
        extra = torch.linalg.vecdot(a_ii, cross).mul_(2).add_(torch.linalg.vecdot(diag, diag))  # [*, n]
        q.diagonal(dim1=-2, dim2=-1).add_(extra)
    return q


def widened(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype`` (itself where it is already)."""
    return t if t.dtype == dtype else t.to(dtype)


def decomposed_inner(p: LayerParts, kind: str, y: torch.Tensor, diagonal: bool = True) -> torch.Tensor:
    """<y_i, decomposed vector_{i<-j}> for every i, j [*, n, n] and vectors y_i [*, n, d], without the vectors
    (``attention_inner``). ``diagonal`` as in decomposed_sq_norms."""
    W, diag, scale = operand_weights(p, kind)
    inner = attention_inner(p, W, y)
    if diagonal and diag is not None:
        inner.diagonal(dim1=-2, dim2=-1).add_(torch.linalg.vecdot(y, diag))
    return inner if scale is None else inner / scale[..., None]


def attention_inner(p: LayerParts, W: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """<y_i, sum_h A_ij^h W^h v_j^h> [*, n, n] (no residual, unscaled): <y_i, W^h v_j^h> = <(W^h)^T y_i, v_j^h>, so one
    [n, d] x [d, d] product and per head an [n, dh] x [dh, n] one (O(n d^2 + n^2 d) instead of the O(n^2 H d) of
    building the vectors); by blocks of queries where the [*, H, n, n] products exceed the block budget (the
    attention may be the model's narrower dtype there: a streamed layer's, multiplied in as it is)."""
    *lead, n, H, dh = p.v.shape
    Yt = shared_matmul(y, W).unflatten(-1, (H, dh)).transpose(-3, -2)  # [*, H, n, dh]: (W^h)^T y_i
    vt = p.v.movedim(-3, -1)
    per_query = p.A[..., :1, :].numel() * Yt.element_size()
    k = max(1, block_budget.work_bytes(Yt.device, block_budget.CPU_STACK_BYTES) // per_query)
    if k >= n:
        S = torch.matmul(Yt, vt)  # [*, H, i, j] = <y_i, U_j^h>
        return S.mul_(p.A).sum(-3)  # sum over heads: [*, i, j]
    out = Yt.new_empty(*lead, n, n)
    for i0 in range(0, n, k):
        S = torch.matmul(Yt[..., i0:i0 + k, :], vt)
        out[..., i0:i0 + k, :] = S.mul_(p.A[..., i0:i0 + k, :]).sum(-3)
    return out


def diagonal_vectors(p: LayerParts, kind: str) -> torch.Tensor:
    """The decomposed vectors of every token to itself, x_{i<-i} [*, n, d] (``own_vectors`` / scale_i)."""
    W, diag, scale = operand_weights(p, kind)
    own = own_vectors(p, W, diag)
    return own if scale is None else own / scale[..., None]


def own_vectors(p: LayerParts, W: torch.Tensor, diag: torch.Tensor | None) -> torch.Tensor:
    """sum_h A_ii^h W^h v_i^h + diag_i [*, n, d] (unscaled) = W (a_ii * v_i) + diag_i: one [n, d] x [d, d] product."""
    a_ii = torch.diagonal(p.A, dim1=-2, dim2=-1).transpose(-1, -2)  # [*, n, H]
    own = shared_matmul((a_ii[..., None] * p.v).flatten(-2), W.transpose(-1, -2))
    return own if diag is None else own + diag


# --- the vectors themselves, a block of source tokens at a time (ALTI's L1 distances, Value Zeroing) ---------------
def attention_vectors(p: LayerParts, rows: slice, U: torch.Tensor, diag: torch.Tensor | None,
                      scale: torch.Tensor | None) -> torch.Tensor:
    """(sum_h A_ij^h U_j^h + [i=j] diag_i) / scale_i for the query rows ``rows`` of one layer: [B, rows, n, d] (tests and
    identities; the methods use the blocks of ``SourceBlocks``)."""
    n = p.A.shape[-1]
    Z = SourceBlocks(p.A, U.transpose(0, 1)).block(slice(0, n)).permute(1, 2, 0, 3)  # [B, i, j, d]
    if diag is not None:
        Z.diagonal(dim1=1, dim2=2).add_(diag.transpose(1, 2))
    Z = Z[:, rows]
    if scale is not None:
        Z = Z / scale[:, rows, None, None]
    return Z


class SourceBlocks:
    """sum_h A_ij^h U_j^h for a block of source tokens j and every query i (unscaled, the residual left out), for a
    batch of N independent problems (examples, or layers x examples flattened).

    For each (j, problem) this is one [n, H] @ [H, d] product, so a block is a single batched matmul with heads
    contracted at once (no heads x n x n x d tensor); blocking over sources keeps M = n large for the BLAS kernel
    (2.7x faster than blocking over queries at n = 512). A and U are laid out source-major once, so that every
    block's operands are contiguous slices."""

    def __init__(self, A: torch.Tensor, U: torch.Tensor):
        """A [N, H, n, n], U [j, N, H, d] source-major (``LayerParts.project(W, source_major=True)``). A's
        source-major layout, in U's dtype, is made whole within the block budget, else a block at a time (no second
        [N, H, n, n] beside a long input's, which may be the model's narrower dtype: streamed_layers)."""
        self.A = A.permute(3, 0, 2, 1)  # [j, N, i, H]
        self.U = U.contiguous()  # [j, N, H, d]
        small = A.numel() * self.U.element_size() <= block_budget.work_bytes(A.device, block_budget.CPU_STACK_BYTES)
        self.whole = self.laid_out(self.A) if small else None

    def laid_out(self, A: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of ``A`` in U's dtype: one pass, widening and laying out at once."""
        return torch.empty(A.shape, dtype=self.U.dtype, device=A.device).copy_(A)

    def block(self, cols: slice, out: torch.Tensor | None = None) -> torch.Tensor:
        """[k, N, n, d] for the sources in ``cols`` (source-major). ``out``: a buffer of at least [k * N, n, d]
        reused across blocks (a fresh block per call cost up to 2x in page faults at n = 512)."""
        n, N, _, H = self.A.shape
        d = self.U.shape[-1]
        k = cols.stop - cols.start
        A = (self.whole[cols] if self.whole is not None else self.laid_out(self.A[cols])).view(k * N, n, H)
        U = self.U[cols].view(k * N, H, d)
        return torch.bmm(A, U, out=None if out is None else out[:k * N]).view(k, N, n, d)


def flat(t: torch.Tensor, trailing: int) -> torch.Tensor:
    """``t`` with every leading dimension but the last ``trailing`` flattened into one (problems of a batch)."""
    return t.reshape(-1, *t.shape[t.dim() - trailing:])


def tokens_per_block(B: int, n: int, d: int, itemsize: int, budget_bytes: int, copies: int = 1) -> int:
    """How many tokens of a block fit: a [B, k, n, d] block and ``copies`` temporaries of its size within the budget."""
    per_row = B * n * d * itemsize * copies
    return max(1, min(n, budget_bytes // max(per_row, 1)))
