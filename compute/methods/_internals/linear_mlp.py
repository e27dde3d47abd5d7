"""A pre-LN block's MLP as DecompX linearises it (docs/methods.md 6.3), from the block's ``mlp_maps``
(compute.adapters.block): every layer's MLP is

    MLP(u) = W_out (g(u) * (W_in u + b_in)) + b_out

with g(u) [F] one factor per neuron, which DecompX freezes at the real input u_i of each token:

    plain   down(act(up u))             W_in = up, g = act(W_in u + b_in) / (W_in u + b_in) (the zero-origin slope)
    gated   down(act(gate u) * up u)    W_in = up, g = act(gate u + b_gate) (the gate of the real input)
    experts sum_e w_e down_e(act(gate_e u) * up_e u) (+ sigmoid(s u) shared(u)): the chosen experts' and the
            shared expert's up maps side by side, W_in = [up_1; ...; up_E; up_s], g = w_e act(gate_e u) on expert e's
            neurons (0 on the experts not chosen: the routing fixed from the forward), sigmoid(s u) act(gate_s u) on
            the shared expert's.

Layers whose widths differ (a mixture's dense layers) are padded with zero neurons, so that every layer's maps stack
[L, ...] and go through the layers' products at once."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...adapters import Adapter
from ...adapters.base import Sublayer, linear_weight, module_at
from ...adapters.block import Experts, MLPMaps
from .decomposition import kept


def zero_origin_slope(pre: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
    """act(h) / h per neuron: the slope of the line through the origin and (h, act(h)). The reference divides by
    h + 1e-12; here |h| < 1e-12 is replaced by +-1e-12 with h's sign (the reference's form flips sign near -1e-12)."""
    eps = 1e-12
    den = torch.where(pre.abs() < eps, torch.where(pre < 0, -eps, eps), pre)
    return post / den


@dataclass
class LinearMLP:
    """Every layer's MLP maps stacked [L, ...] (W_gate, b_gate: the gate of gated MLPs, None for plain ones)."""

    W_in: torch.Tensor  # [L, F, d]
    b_in: torch.Tensor  # [L, F]
    W_out: torch.Tensor  # [L, d, F]
    b_out: torch.Tensor  # [L, d]
    W_gate: torch.Tensor | None
    b_gate: torch.Tensor | None
    act: object
    # per layer of a mixture: (router, experts E, neurons per expert, shared gate or None), None for a dense layer
    routing: list


def _maps(mlp: torch.nn.Module, maps: MLPMaps):
    """(up W, up b, gate W or None, gate b, down W, down b, act) of one dense MLP module, in nn.Linear's convention; a
    ``Sublayer`` (OPT's, BLOOM's, MPT's, Granite's step) names its maps from its root, its output scale in down's."""
    scale = 1.0
    if isinstance(mlp, Sublayer):
        mlp, scale = mlp.root, mlp.scale
    up, down = module_at(mlp, maps.up), module_at(mlp, maps.down)
    W_up, b_up = linear_weight(up), up.bias
    if b_up is None:
        b_up = W_up.new_zeros(W_up.shape[0])
    W_gate = b_gate = None
    if maps.fused:  # [gate | up] halves of one projection
        (W_gate, W_up), (b_gate, b_up) = W_up.chunk(2), b_up.chunk(2)
    elif maps.gate is not None:
        gate = module_at(mlp, maps.gate)
        W_gate, b_gate = linear_weight(gate), gate.bias
        if b_gate is None:
            b_gate = W_gate.new_zeros(W_gate.shape[0])
    W_down = linear_weight(down)
    b_down = down.bias if down.bias is not None else W_down.new_zeros(W_down.shape[0])
    if scale != 1:
        W_down, b_down = scale * W_down, scale * b_down
    return W_up, b_up, W_gate, b_gate, W_down, b_down, getattr(mlp, maps.act)


def _layer(mlp: torch.nn.Module, maps: MLPMaps | Experts):
    """One layer's maps side by side ((W_in, b_in, W_gate, b_gate, W_out, b_out), act, routing)."""
    if not isinstance(maps, Experts) or not hasattr(mlp, maps.router):
        *ws, act = _maps(mlp, maps.dense if isinstance(maps, Experts) else maps)
        return ws, act, None
    experts = module_at(mlp, maps.experts)
    gate_up, down = experts.gate_up_proj, experts.down_proj  # [E, 2F, d], [E, d, F]
    E, F2, d = gate_up.shape
    W_gate, W_up = gate_up[:, :F2 // 2].reshape(-1, d), gate_up[:, F2 // 2:].reshape(-1, d)
    W_down = down.permute(1, 0, 2).reshape(d, -1)
    parts = [(W_up, W_up.new_zeros(len(W_up)), W_gate, W_gate.new_zeros(len(W_gate)), W_down, W_down.new_zeros(d))]
    shared = None
    if maps.shared is not None:
        *ws, shared_act = _maps(module_at(mlp, maps.shared), maps.dense)
        if type(shared_act) is not type(experts.act_fn):
            raise ValueError("the shared expert's activation differs from the experts'")
        parts.append(ws)
        shared = module_at(mlp, maps.shared_gate)
    W_in, b_in, W_g, b_g, W_out, b_out = zip(*parts)
    out = [torch.cat(W_in), torch.cat(b_in), torch.cat(W_g), torch.cat(b_g), torch.cat(W_out, 1), sum(b_out)]
    return out, experts.act_fn, (module_at(mlp, maps.router), E, F2 // 2, shared)


def linear_mlps(adapter: Adapter, dtype: torch.dtype, device: torch.device, only: slice | None = None) -> LinearMLP:
    """Every layer's maps in ``dtype`` (kept across batches while the model's parameters are unchanged); ``only``:
    those layers' only, cast afresh (a layer's maps when it is used: nothing kept)."""
    def build():
        maps = adapter.block.mlp_maps
        layers = [_layer(adapter.mlp(layer), maps) for layer in adapter.layers()[only or slice(None)]]
        if len({type(act) for _, act, _ in layers}) != 1:
            raise ValueError("the layers' MLP activations differ")
        gated = {ws[2] is not None for ws, _, _ in layers}
        if len(gated) != 1:
            raise ValueError("the layers' MLPs are not all gated or all plain")
        width = max(ws[0].shape[0] for ws, _, _ in layers)

        def stack(i, pad_dim):  # the i-th map of every layer, zero neurons up to the widest layer's
            out = []
            for ws, _, _ in layers:
                t = ws[i].detach().to(device, dtype)
                extra = width - t.shape[pad_dim]
                if extra:
                    t = torch.cat([t, t.new_zeros(*t.shape[:pad_dim], extra, *t.shape[pad_dim + 1:])], pad_dim)
                out.append(t)
            return torch.stack(out)

        W_gate, b_gate = (stack(2, 0), stack(3, 0)) if gated.pop() else (None, None)
        return LinearMLP(W_in=stack(0, 0), b_in=stack(1, 0), W_out=stack(4, 1),
                         b_out=torch.stack([ws[5].detach().to(device, dtype) for ws, _, _ in layers]),
                         W_gate=W_gate, b_gate=b_gate, act=layers[0][1], routing=[r for _, _, r in layers])

    return build() if only is not None else kept(adapter, ("linear_mlp", dtype, device), build)


def factors(mlp: LinearMLP, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(g [L, N, F], W_in u + b_in [L, N, F]) for the real MLP inputs u [L, N, d] of every layer: the frozen factor
    of every neuron and the up map's output, so that W_out (g * up) + b_out is the real MLP output."""
    up = torch.baddbmm(mlp.b_in[:, None], u, mlp.W_in.transpose(1, 2))
    if mlp.W_gate is None:
        return zero_origin_slope(up, mlp.act(up)), up
    g = mlp.act(torch.baddbmm(mlp.b_gate[:, None], u, mlp.W_gate.transpose(1, 2)))
    if any(r is not None for r in mlp.routing):
        g = g * torch.stack([_routing(r, u[l], g.shape[-1]) for l, r in enumerate(mlp.routing)])
    return g, up


def _routing(routing, u: torch.Tensor, width: int) -> torch.Tensor:
    """[N, F] the routing of one layer's real inputs u [N, d] per neuron: the chosen experts' weights as the router
    gives them (0 on the others), the shared expert's sigmoid gate; 1 on a dense layer's neurons, 0 on padding."""
    if routing is None:
        return u.new_ones(1, width)
    router, E, Fe, shared = routing
    dtype = next(router.parameters()).dtype
    _, weights, chosen = router(u.to(dtype))
    w = u.new_zeros(u.shape[0], E).scatter_(1, chosen, weights.to(u.dtype)).repeat_interleave(Fe, 1)
    rest = width - E * Fe  # the shared expert's neurons (and any padding, whose maps are 0)
    if not rest:
        return w
    if shared is None:
        return torch.cat([w, w.new_zeros(len(w), rest)], 1)
    return torch.cat([w, torch.sigmoid(F.linear(u, shared.weight.to(u.dtype))).expand(-1, rest)], 1)
