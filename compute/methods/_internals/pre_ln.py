"""A pre-LN block's steps around attention as the model computes them (docs/methods.md section 6), from its block
description (compute.adapters.block): the norm on the attention output, and the MLP step after the mixing,

    h_i  = x_i + N_o(o_i)                 o_i the attention output (b_O included); N_o the identity where absent
    x'_i = h_i + N_p(MLP(N2(u_i)))        u = h (sequential) or x (parallel); N2 absent where the MLP reads u itself

each a call of the block's own modules (the model's arithmetic, its dtype, a mixture of experts' routing), so that a
method can re-run what follows attention on changed states (Value Zeroing) or rebuild a state the capture does not
hold (the last layer's output, which the final norm hides)."""

from __future__ import annotations

import torch
from torch import nn

from ...adapters import Adapter
from ...errors import AttrscopeError
from .decomposition import LayerParts


def _call(module: nn.Module, u: torch.Tensor) -> torch.Tensor:
    dtype = next(module.parameters(), u).dtype
    out = module(u.to(dtype))
    return (out if torch.is_tensor(out) else out[0]).to(u.dtype)  # an MoE block returns (output, router logits)


def mlp_output_norm(adapter: Adapter, layer: nn.Module) -> nn.Module | None:
    """The norm on the MLP's output (Gemma 2, OLMo 2: blocks whose norms sit on the sublayers' outputs), or None.
    The block declares it among ``extra_norms``, beside the QK-norms, which sit inside the attention module."""
    block = adapter.block
    if block.norms not in ("sandwich", "output"):
        return None
    names = [name for name in block.extra_norms if not name.startswith(block.attention + ".")]
    if len(names) != 1:
        raise AttrscopeError(f"the '{adapter.config.model_type}' block description names {len(names)} norms on its "
                             "MLP's output (compute/adapters/): declare exactly one in extra_norms")
    from ...adapters.base import module_at

    return module_at(layer, names[0])


def check_known(adapter: Adapter, method: str) -> None:
    """One line where the block's MLP step is not described."""
    layer = adapter.layers()[0]
    if adapter.mlp(layer) is None:
        raise AttrscopeError(f"method '{method}' does not know the MLP of '{adapter.config.model_type}' models "
                             "(compute/adapters/)")
    mlp_output_norm(adapter, layer)


def check_final_norm(adapter: Adapter, method: str) -> None:
    """One line where a pre-LN model has no final norm described (the methods that read the final representation)."""
    check_known(adapter, method)
    if adapter.final_norm() is None:
        raise AttrscopeError(f"method '{method}' reads the final norm before the head, which the "
                             f"'{adapter.config.model_type}' block description does not name (compute/adapters/)")


class BlockSteps:
    """The steps of layer ``l`` (0-based) of a pre-LN model."""

    def __init__(self, adapter: Adapter, l: int):
        block = adapter.block
        layer = adapter.layers()[l]
        self.parallel = block.parallel
        self.attn_norm = adapter.attn_out_norm(layer)
        self.mlp_norm = None if block.ln2 == block.mlp else adapter.ln2(layer)  # OLMo 2: the MLP reads u itself
        self.mlp = adapter.mlp(layer)
        self.out_norm = mlp_output_norm(adapter, layer)

    def residual(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """h = x + N_o(o)."""
        return x + (o if self.attn_norm is None else _call(self.attn_norm, o))

    def mlp_step(self, u: torch.Tensor) -> torch.Tensor:
        """N_p(MLP(N2(u))) for states u [..., n, d] (u = h, or x for a parallel block)."""
        lead = u.shape[:-2]
        y = u.reshape(-1, *u.shape[-2:])
        if self.mlp_norm is not None:
            y = _call(self.mlp_norm, y)
        y = _call(self.mlp, y)
        if self.out_norm is not None:
            y = _call(self.out_norm, y)
        return y.view(*lead, *y.shape[-2:])


def with_final_output(p: LayerParts, adapter: Adapter) -> LayerParts:
    """``p`` with ``out`` set where it holds the model's last layer: that layer's real output before the final norm,
    h + its MLP step (the capture's last hidden state is the final norm's output)."""
    if p.has_last:
        x, t = (p.x[-1], p.t[-1]) if p.stacked else (p.x, p.t)
        steps = BlockSteps(adapter, adapter.n_layers - 1)
        p.out = t + steps.mlp_step(x if steps.parallel else t)
    return p
