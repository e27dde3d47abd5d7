"""Chefer's LRP rules on pre-LN and RMSNorm decoder blocks (docs/methods.md 8) as a modified backward pass in
gradient x input form, on top of AttnLRP's rules (attnlrp_rules: norms, activations, the gated product, the
uniform split of A.V and Q.K^T, which is Chefer's half rule in this form; the softmax's plain gradient):

* every Linear (the layers' and the head's): alpha1-beta0, bias ignored; its backward turns the output's relevance
  R_out = y g into the input's gradient R_in / x (the rule's R_in is x times a factor: that factor, 0 where x = 0);
  the head's last Linear starts the relevance at the selected output's gradient itself (one-hot, minus the foil);
* each residual add: LRP-0 per operand, both rescaled per example (Chefer's add rule), as a Function on the
  sublayer's output that also corrects the skip operand's gradient (the skip receives g through the add already);
* Mask-LRP's head mask: the gradient of the attention output before the output projection times M[l, h] per query
  head (the relevance leaving A.V towards A and V); the unmasked gradient is kept for the rollout's R^{A,l}.

With ``rows`` (rule_rows) the rules apply to the second half of a doubled batch and the first keeps the plain
gradient: transatt's and mask_lrp's dF/dA in the same pass.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from ...adapters import Adapter
from ...adapters.base import module_at
from .attnlrp_rules import attnlrp_rules
from .attnlrp_rules import unsupported as attnlrp_unsupported
from .rule_rows import RuleRows, scale as rows_scale
from .safe_divide import EPS
from .widened import cast_weight


def unsupported(adapter: Adapter) -> str | None:
    """Why the rules cannot be placed on the model's modules, or None."""
    why = attnlrp_unsupported(adapter)
    if why is not None:
        return why
    block = adapter.block
    if block.parallel and block.ln2 is None:
        return "its parallel block's one shared norm is not tested under the rules"
    if block.mlp_kind == "moe":
        return "its mixture-of-experts MLP's routed sum is not written as a hook"
    if any(type(m).__name__ == "Conv1D" for m in adapter.layers()[0].modules()):
        return "its projections are Conv1D modules, which the alpha1-beta0 hook does not read"
    # tested fused layouts (tests/test_method_lrp_decoder): Phi-3's and GPT-BigCode's, GPT-NeoX's per head
    if block.qkv not in ("separate", "concat_gqa") and not (block.qkv == "per_head" and block.parallel):
        return "its fused query/key/value layout is not tested under the rules"
    if block.ln2 is None or (block.ln1 is None and block.attn_out_norm is None):
        return "its residual adds' skip operands are not located"
    if isinstance(module_at(adapter.layers()[0], block.mlp), nn.Linear):
        return "its MLP is not one module, so the MLP's residual add is not located"
    cfg = adapter.config
    if getattr(cfg, "clip_qkv", None) is not None:
        return "its clip_qkv changes the projections' outputs in place"
    if getattr(cfg, "residual_multiplier", 1.0) != 1.0:
        return "its residual multiplier scales the branch between the sublayer and the add"
    return None


def _weights(module: nn.Module, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(|W|^T, [W, |W|]) of a Linear in the pass's ``dtype``, kept on the module while its weight is the same tensor,
    unmodified; made for the step alone where the pass is wider than the model (widened: no wide copy kept)."""
    W = module.weight
    if W.dtype != dtype:
        with torch.no_grad():
            W = W.to(dtype)
            Wa = W.abs()
            return Wa.T, torch.cat([W, Wa], dim=1)
    hit = module.__dict__.get("_alpha_beta_weights")
    if hit is None or hit[0] is not W or hit[1] != W._version:
        with torch.no_grad():
            Wa = W.detach().abs()
            hit = module.__dict__["_alpha_beta_weights"] = (W, W._version, Wa.T.contiguous(),
                                                               torch.cat([W.detach(), Wa], dim=1))
    return hit[2], hit[3]


class _AlphaBeta(torch.autograd.Function):
    """y = the Linear's own output (passed in a box); backward: alpha1-beta0 from R_out = y g (``start``: R_out = g)
    to the gradient of x. Z = x+ W+^T + x- W-^T = (y - b + |x| |W|^T) / 2 >= 0, so the rule's division needs no
    sign guard: R / (2 Z + 2 eps) (where Z = 0, every product of that output is 0 and so is what it hands down)."""

    @staticmethod
    def forward(ctx, x, box, start, rows):
        y, module = box
        ctx.save_for_backward(x, y)
        ctx.module, ctx.start, ctx.rows = module, start, rows
        return y.detach()

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        b = ctx.module.bias
        WaT, W_both = _weights(ctx.module, y.dtype)
        R = g if ctx.start else y * g
        Yu = y if b is None else y - cast_weight(b, y.dtype)
        S = R / torch.matmul(x.abs(), WaT).add_(Yu).add_(2 * EPS)
        # R_in = x (S W) + |x| (S |W|) (linear_relprop): the gradient is S W + sign(x) S |W|
        SW = torch.matmul(S, W_both)
        d = x.shape[-1]
        g_in = SW[..., :d].addcmul(torch.sign(x), SW[..., d:])
        if ctx.rows is not None:  # the plain rows: the Linear's own gradient
            g_in = torch.where(ctx.rows.mask(g.dim()), g_in, torch.matmul(g, cast_weight(ctx.module.weight, g.dtype)))
        return g_in, None, None, None


class _AddRule(torch.autograd.Function):
    """The branch's value; backward: Chefer's add rule for (branch + skip), the skip's share less the g it gets
    through the add itself. LRP-0 gives the operands a g and b g; rescaled per example, operand o's factor is
    |sum o g| / (|sum a g| + |sum b g|) * sum (a + b) g / sum o g = sign(sum o g) (A + B) / (|A| + |B|)."""

    @staticmethod
    def forward(ctx, rows, branch, *skips):  # a parallel block's add has two skips: the stream and the attention output
        ctx.save_for_backward(branch, *skips)
        ctx.rows = rows
        return branch.clone()

    @staticmethod
    def backward(ctx, g):
        branch, *skips = ctx.saved_tensors
        dims = tuple(range(2, g.dim() + 1))
        ab = (torch.stack([branch, *skips]) * g).sum(dims, keepdim=True)  # [k, B, 1, 1]: sum o g per operand
        s = ab.sign().mul_(ab.sum(0) / ab.abs().sum(0).clamp_min_(torch.finfo(g.dtype).tiny))
        if ctx.rows is not None:  # the plain rows: factor 1 (the skip's correction 0)
            s = torch.where(ctx.rows.mask(g.dim()), s, 1)
        s_a, *s_skips = s.unbind(0)
        return None, g * s_a, *(g * s_o.sub_(1) for s_o in s_skips)


class _HeadMask(torch.autograd.Function):
    """x itself; backward: g times the per-column mask, the unmasked g kept in ``slot``."""

    @staticmethod
    def forward(ctx, x, cols, slot):
        ctx.cols, ctx.slot = cols, slot
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        ctx.slot.append(g)
        return g * ctx.cols.to(g.device, g.dtype), None, None


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _with_first(out, t):
    return (t, *out[1:]) if isinstance(out, tuple) else t


@contextmanager
def chefer_decoder_rules(adapter: Adapter, head_mask: tuple | None = None, kept: dict | None = None,
                         rows: RuleRows | None = None):
    """The rules' hooks (``unsupported`` must be None). ``head_mask``: M [L][H] (Mask-LRP); ``kept`` receives per
    layer the value projection's output ("v") and the unmasked gradient of the attention output ("g_ctx"); ``rows``:
    the rules on those rows of the batch only."""
    block, handles = adapter.block, []
    layers = list(adapter.layers())
    in_layers = {m for layer in layers for m in layer.modules()}
    embedding = set(adapter.embeddings().modules())

    def alpha_beta(start):
        def hook(module, inp, out):
            return _AlphaBeta.apply(inp[0], (out, module), start, rows)
        return hook

    def skip_pre_hook(slot, key):
        def hook(module, args, kwargs):  # the attention takes the stream by keyword where no norm precedes it
            slot[key] = args[0] if args else kwargs["hidden_states"]
        return hook

    def add_hook(slot, keys):
        def hook(module, inp, out):
            return _with_first(out, _AddRule.apply(rows, _first(out), *(slot[k] for k in keys)))
        return hook

    def keep_out_hook(slot, key):
        def hook(module, inp, out):
            slot[key] = _first(out)
        return hook

    def mask_pre_hook(cols, slot):
        def hook(module, args):
            return (_HeadMask.apply(args[0], rows_scale(rows, cols, args[0]), slot), *args[1:])
        return hook

    def keep_hook(slot):
        def hook(module, inp, out):
            slot["v"] = _first(out)
        return hook

    try:
        # the Linears' hooks first: AttnLRP's gradient scaling of a projection's output attaches to what they return
        heads = [m for m in adapter.model.modules()
                 if isinstance(m, nn.Linear) and m not in in_layers and m not in embedding]
        for i, m in enumerate(heads):  # the last one outputs the explained logits
            handles.append(m.register_forward_hook(alpha_beta(i == len(heads) - 1)))
        for layer in layers:
            for m in layer.modules():
                if isinstance(m, nn.Linear):
                    handles.append(m.register_forward_hook(alpha_beta(False)))
        with attnlrp_rules(adapter, rows):
            for li, layer in enumerate(layers):
                slot: dict = {}
                attn_prefix = block.attention + "."
                mlp_out = next((n for n in block.extra_norms if not n.startswith(attn_prefix)), block.mlp)
                # the skip operand: the input of the norm before the sublayer, or of the sublayer itself where its
                # norm sits after it (OLMo 2: the add's other operand is that norm's output)
                if block.parallel:  # x + Attn(LN1 x) + MLP(LN2 x): the add rule over three operands, on the MLP's
                    handles.append(module_at(layer, block.ln1).register_forward_pre_hook(skip_pre_hook(slot, "x"),
                                                                                          with_kwargs=True))
                    handles.append(module_at(layer, block.attention).register_forward_hook(keep_out_hook(slot, "a")))
                    handles.append(module_at(layer, mlp_out).register_forward_hook(add_hook(slot, ("a", "x"))))
                for skip_of, branch, key in (() if block.parallel else (
                        (block.ln1 or block.attention, block.attn_out_norm or block.attention, "attn"),
                        (block.ln2, mlp_out, "mlp"))):
                    handles.append(module_at(layer, skip_of).register_forward_pre_hook(skip_pre_hook(slot, key),
                                                                                       with_kwargs=True))
                    handles.append(module_at(layer, branch).register_forward_hook(add_hook(slot, (key,))))
                if head_mask is not None:
                    out_proj = module_at(layer, block.out_proj)
                    dh = out_proj.in_features // adapter.n_heads
                    cols = torch.tensor(head_mask[li], dtype=torch.float64).repeat_interleave(dh)
                    layer_kept = kept.setdefault(li, {"g_ctx": []}) if kept is not None else {"g_ctx": []}
                    handles.append(out_proj.register_forward_pre_hook(mask_pre_hook(cols, layer_kept["g_ctx"])))
                    handles.append(module_at(layer, block.value).register_forward_hook(keep_hook(layer_kept)))
            yield
    finally:
        for h in handles:
            h.remove()

