"""AttnLRP's rules (Achtibat et al. 2024) as a modified backward pass in gradient x input form (docs/methods.md 7):
forward hooks on the stock modules that leave every output value as the model computes it and change only the local
Jacobians the backward uses. Applied to the shared gradient pass (compute.methods._internals.gradients) when its
spec says ``rules="attnlrp"``: one forward and one backward, in the model's dtype.

* norms (LayerNorm, RMSNorm, QK-norms, sub-layer output norms): the identity rule, the 1/std (1/rms) factor
  detached (LayerNorm's centring kept, as lxt's LayerNorm keeps the mean in the graph);
* activation modules (SiLU, GELU, tanh, ...): the identity rule, g f(x) / (x + 1e-10);
* Q K^T and A V: the uniform rule, the gradient of the q and k projections' outputs scaled by 1/4, of v by 1/2
  (tensor hooks: the factor commutes with everything linear between a projection and its product);
* a gated MLP's act(gate) * up: the uniform rule, 1/2 at the down projection's input;
* a mixture of experts: 1/4 at the experts' input (the gated product's half times the routing product's half),
  1/2 at the routing weights; Qwen2-MoE's shared expert: 1/2 on its output and on its sigmoid gate (with the
  identity rule on the sigmoid).
Linear layers, residual adds, rotary rotations and the softmax keep their plain gradient (the softmax's AttnLRP
rule is its gradient in this form).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from ...adapters import Adapter
from ...adapters.base import module_at
from .rule_rows import RuleRows, scale as rows_scale, select

EPS = 1e-10  # lxt's stabiliser of the identity rule


def _stable(x: torch.Tensor) -> torch.Tensor:
    """x + EPS, EPS where that is 0 (lxt divides by x + 1e-10 alone)."""
    den = x + EPS
    return den.masked_fill_(den == 0, EPS)


class _Replace(torch.autograd.Function):
    """The value ``box[0]`` (the module's own output) with the backward ``g * factor`` to ``x``: the identity rule
    (factor f(x) / x) and the norms' rule (factor the detached 1/std times the gain, centred for LayerNorm). The value
    is passed in a box, so the output is not one of the Function's inputs (the model may change it in place)."""

    @staticmethod
    def forward(ctx, x, box, centre):
        y, factor = box
        ctx.save_for_backward(factor)
        ctx.centre = centre
        return y.detach()

    @staticmethod
    def backward(ctx, g):
        (factor,) = ctx.saved_tensors
        g = g * factor
        if ctx.centre:  # LayerNorm's centring: its Jacobian P = I - 1/d is symmetric
            g = g - g.mean(-1, keepdim=True)
        return g, None, None


class _Scaled(torch.autograd.Function):
    """x itself (a copy) with its gradient scaled: where the tensor also feeds another branch (the experts' input is
    the router's too), a tensor hook would scale both."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale, None


def norm_kind(module: nn.Module) -> str | None:
    """"layernorm", "rmsnorm" or None, from the module's class (HF names its norms so; OLMo's LayerNorm keeps no
    parameters and is no nn.LayerNorm)."""
    name = type(module).__name__
    if name.endswith("RMSNorm"):
        return "rmsnorm"
    if isinstance(module, nn.LayerNorm) or name.endswith("LayerNorm"):
        return "layernorm"
    return None


ACTIVATIONS = (nn.SiLU, nn.GELU, nn.Tanh, nn.ReLU, nn.Sigmoid, nn.Mish)


def is_activation(module: nn.Module) -> bool:
    """An elementwise activation module: torch's, transformers' own, or a model's GELU class (BLOOM's BloomGelu)."""
    return (isinstance(module, ACTIVATIONS) or type(module).__module__ == "transformers.activations"
            or type(module).__name__.endswith("Gelu"))


def no_grad_inside(module: nn.Module) -> list:
    """Hooks that run the module's own forward without a graph, for a rule whose Function takes the module's input
    and replaces its output and its backward (register them before the rule's hook, which runs with the grad mode
    restored): the module's nodes would never run in the backward, and would keep their saved tensors (a widened
    Linear's float64 weight, a norm's input) as long as the graph, every layer's (checkpointed layers: every
    layer's recomputed ones)."""
    def pre(m, _args):
        m.__dict__.setdefault("_grad_modes", []).append(torch.is_grad_enabled())
        torch.set_grad_enabled(False)

    def post(m, _args, _out):
        torch.set_grad_enabled(m.__dict__["_grad_modes"].pop())

    return [module.register_forward_pre_hook(pre), module.register_forward_hook(post, always_call=True)]


def _norm_hook(adapter: Adapter, kind: str, rows: RuleRows | None):
    def hook(module, inp, out):
        x = inp[0]
        with torch.no_grad():
            xf = x if x.element_size() >= 4 else x.float()
            centred = xf - xf.mean(-1, keepdim=True) if kind == "layernorm" else xf
            inv = torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + adapter.norm_eps(module))
            gain = adapter.norm_gain(module, x.shape[-1]) if kind == "rmsnorm" else getattr(module, "weight", None)
            factor = (inv if gain is None else inv * gain).to(x.dtype)
        return select(rows, out, _Replace.apply(x, (out, factor), kind == "layernorm"))
    return hook


def _identity_hook(rows: RuleRows | None):
    def hook(module, inp, out):
        x = inp[0]
        with torch.no_grad():
            factor = out / _stable(x)
        return select(rows, out, _Replace.apply(x, (out, factor), False))
    return hook


def _sigmoid_gate_hook(rows: RuleRows | None):
    """The shared expert's gate z: sigmoid(z) multiplies the expert's output. The identity rule on the sigmoid and
    the product's half, as a factor on z's gradient that undoes the sigmoid's own derivative (0 where it is 0)."""
    def hook(module, inp, out):
        with torch.no_grad():
            s = torch.sigmoid(out)
            slope = s * (1 - s)
            factor = torch.where(slope > 0, 0.5 * s / _stable(out) / slope.masked_fill(slope == 0, 1), 0)
        return select(rows, out, _Replace.apply(out, (out, factor), False))
    return hook


def _grad_scale_hook(scale, rows: RuleRows | None):
    """A forward hook scaling the gradient of the module's output by ``scale`` (a number, or one per column)."""
    def hook(module, inp, out):
        t = out[0] if isinstance(out, tuple) else out
        if t.requires_grad:
            s = rows_scale(rows, scale(t) if callable(scale) else scale, t)
            t.register_hook(lambda g: g * s)
    return hook


def _input_scale_pre_hook(scale, rows: RuleRows | None):
    def hook(module, args):
        x = args[0]
        if x.requires_grad:
            s = rows_scale(rows, scale, x)
            x.register_hook(lambda g: g * s)
    return hook


def _experts_pre_hook(rows: RuleRows | None):
    """An experts module's (hidden_states, top_k_index, top_k_weights): the expert paths 1/4, the routing weights 1/2
    (the router reads the same hidden states: scaled on a copy)."""
    def hook(module, args, kwargs):
        names = ("hidden_states", "top_k_index", "top_k_weights")
        vals = dict(zip(names, args), **kwargs)
        for name, s in (("hidden_states", 0.25), ("top_k_weights", 0.5)):
            vals[name] = _Scaled.apply(vals[name], rows_scale(rows, s, vals[name]))
        return (), vals
    return hook


# a separate value projection's name -> its query and key projections'
QK_NAMES = {"v_proj": ("q_proj", "k_proj"), "value": ("query", "key"), "v_lin": ("q_lin", "k_lin")}


def unsupported(adapter: Adapter) -> str | None:
    """Why the rules cannot be placed on the model's modules, or None."""
    block = adapter.block
    if block is None:
        return "it has no block description (its query, key and value projections are not located)"
    if block.positions == "relative":
        return "its attention scores carry relative-position products that no hook reaches"
    if block.qkv == "separate":
        parent, _, name = block.value.rpartition(".")
        if name not in QK_NAMES:
            return f"its query and key projections beside '{block.value}' are not known"
    return None


def _fused_scale(adapter: Adapter):
    """A fused projection's per-column factor: v columns 1/2, q and k 1/4 (made once per width, dtype, device)."""
    from ...adapters.base import Adapter as Base

    cache = {}

    def scale(t):
        key = (t.shape[-1], t.dtype, t.device)
        if key not in cache:
            width = t.shape[-1]
            # the base layout (OLMo's override clamps the values as attention reads them: not indices)
            v_cols = Base.value_of(adapter, torch.arange(width, dtype=torch.float64)).long()
            s = torch.full((width,), 0.25, dtype=t.dtype, device=t.device)
            s[v_cols.to(t.device)] = 0.5
            cache[key] = s
        return cache[key]
    return scale


def is_experts(module: nn.Module) -> bool:
    """A mixture of experts' experts module (HF's ``...Experts``: the chosen experts' weighted outputs)."""
    return type(module).__name__.endswith("Experts")


@contextmanager
def attnlrp_rules(adapter: Adapter, routing: str = "attnlrp", rows: RuleRows | None = None):
    """The rules' hooks on the model's modules for the forward passes run inside (``unsupported`` must be None).
    ``routing``: "attnlrp", the rules of the mixture's products above; "fixed", none on the routed experts and the
    shared expert's gate (the caller's rules hold the routing as in the forward: chefer_decoder_rules). ``rows``: on
    those rows of the batch only, the others keep the plain gradient (rule_rows)."""
    block, handles = adapter.block, []
    try:
        embedding = set(adapter.embeddings().modules())
        # routing "fixed": the caller recomputes the experts' insides without hooks, and the module's own backward
        # (the plain rows') must stay plain: an expert's activation sees gathered tokens, which are no rows
        skipped = embedding | ({sub for m in adapter.model.modules() if is_experts(m) for sub in m.modules()}
                               if routing == "fixed" else set())
        for m in adapter.model.modules():
            if m in skipped:
                continue
            kind = norm_kind(m)
            if (kind is not None or is_activation(m)) and rows is None:  # no plain rows read the module's graph
                handles += no_grad_inside(m)
            if kind is not None:
                handles.append(m.register_forward_hook(_norm_hook(adapter, kind, rows)))
            elif is_activation(m):
                handles.append(m.register_forward_hook(_identity_hook(rows)))
        fused = None if block.qkv == "separate" else _fused_scale(adapter)
        for layer in adapter.layers():
            value = module_at(layer, block.value)
            if fused is not None:
                handles.append(value.register_forward_hook(_grad_scale_hook(fused, rows)))
            else:
                parent, _, name = block.value.rpartition(".")
                handles.append(value.register_forward_hook(_grad_scale_hook(0.5, rows)))
                for qk in QK_NAMES[name]:
                    mod = module_at(layer, f"{parent}.{qk}" if parent else qk)
                    handles.append(mod.register_forward_hook(_grad_scale_hook(0.25, rows)))
            mlp = module_at(layer, block.mlp)
            gated = [mlp] if block.mlp_kind == "gated" else []
            if block.mlp_kind == "moe":
                shared, shared_gate = getattr(mlp, "shared_expert", None), getattr(mlp, "shared_expert_gate", None)
                if shared is not None:
                    gated.append(shared)
                if routing == "attnlrp":
                    for m in mlp.modules():
                        if is_experts(m):
                            handles.append(m.register_forward_pre_hook(_experts_pre_hook(rows), with_kwargs=True))
                    if shared is not None:
                        handles.append(shared.register_forward_hook(_grad_scale_hook(0.5, rows)))
                    if shared_gate is not None:
                        handles.append(shared_gate.register_forward_hook(_sigmoid_gate_hook(rows)))
                if not any(is_experts(m) for m in mlp.modules()) and hasattr(mlp, "down_proj"):
                    gated.append(mlp)  # a dense layer of a mixture of experts (Qwen2-MoE's mlp_only_layers)
            for g in gated:
                down = [c for c in g.children() if isinstance(c, nn.Linear)][-1]  # down_proj, ModernBERT's Wo
                handles.append(down.register_forward_pre_hook(_input_scale_pre_hook(0.5, rows)))
        yield
    finally:
        for h in handles:
            h.remove()
