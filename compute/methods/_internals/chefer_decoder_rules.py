"""Chefer's LRP rules on pre-LN and RMSNorm decoder blocks (docs/methods.md 8) as a modified backward pass in
gradient x input form, on top of AttnLRP's rules (attnlrp_rules: norms, activations, the gated product, the
uniform split of A.V and Q.K^T, which is Chefer's half rule in this form; the softmax's plain gradient):

* every Linear (the layers' and the head's): alpha1-beta0, bias ignored; its backward turns the output's relevance
  R_out = y g into the input's gradient R_in / x (the rule's R_in is x times a factor: that factor, 0 where x = 0);
  the head's last Linear starts the relevance at one on the explained logit, minus one on the foil's (the sign of
  its output's gradient: a soft cap or logit scale after the head is elementwise, its identity rule);
* each residual add: LRP-0 per operand, both rescaled per example (Chefer's add rule), as a Function on the
  sublayer's output that also corrects the skip operand's gradient (the skip receives g through the add already);
* a mixture of experts: the routing fixed as in the forward, each chosen expert's weighted output through its own
  rules (alpha1-beta0, the gated product's half), one Function on the experts module's output (_Experts);
* clip_qkv's clamp: the identity rule (the clamped value's relevance over the unclamped projection);
* Mask-LRP's head mask: the gradient of the attention output before the output projection times M[l, h] per query
  head (the relevance leaving A.V towards A and V); the unmasked gradient is kept for the rollout's R^{A,l}.

With ``rows`` (rule_rows) the rules apply to the second half of a doubled batch and the first keeps the plain
gradient: transatt's and mask_lrp's dF/dA in the same pass.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from ...adapters import Adapter
from ...adapters.base import linear_weight, module_at
from ...adapters.block import MLPMaps
from .attnlrp_rules import QK_NAMES, attnlrp_rules, is_experts, no_grad_inside
from .checkpointed import AttentionTerm
from .attnlrp_rules import unsupported as attnlrp_unsupported
from .rule_rows import RuleRows, scale as rows_scale, select
from .safe_divide import EPS
from .widened import cast_weight


LINEARS = (nn.Linear, Conv1D)


def unsupported(adapter: Adapter) -> str | None:
    """Why the rules cannot be placed on the model's modules, or None."""
    why = attnlrp_unsupported(adapter)
    if why is not None:
        return why
    block = adapter.block
    if block.parallel and block.ln2 is None:
        return "its parallel block's one shared norm is not tested under the rules"
    layout = {"has_gate": True, "has_bias": False, "is_transposed": False, "is_concatenated": True,
              "has_post_expert_norm": False}
    if any(is_experts(m) and any(getattr(m, k, v) != v for k, v in layout.items())
           for layer in adapter.layers() for m in layer.modules()):
        return "its experts' weights are not the [gate | up] and down stacks without bias the experts' rule reads"
    if block.ln2 is None or (block.ln1 is None and block.attn_out_norm is None):
        return "its residual adds' skip operands are not located"
    layer = adapter.layers()[0]
    mlp = module_at(layer, block.mlp)
    if (isinstance(mlp, LINEARS) or _adds_residual(mlp)) and not isinstance(block.mlp_maps, MLPMaps):
        return "its MLP's operand of the residual add is no module's output (no MLP maps declared)"
    return None


def qkv_clip(cfg) -> float | None:
    """clip_qkv: the query, key and value projections' outputs clamped to [-clip, clip] (OLMo, OLMoE; MPT's in its
    attention config)."""
    return getattr(cfg, "clip_qkv", None) or getattr(getattr(cfg, "attn_config", None), "clip_qkv", None) or None


def qkv_paths(block) -> list[str]:
    """The query, key and value projections' paths in a layer (a fused one: its one path)."""
    if block.qkv != "separate":
        return [block.value]
    parent, _, name = block.value.rpartition(".")
    return [block.value, *(f"{parent}.{qk}" if parent else qk for qk in QK_NAMES[name])]


def _adds_residual(module: nn.Module) -> bool:
    """The module takes the residual and adds it to its output itself (BLOOM's attention and MLP, MPT's MLP)."""
    return "residual" in inspect.signature(module.forward).parameters


def branches(block, layer: nn.Module) -> tuple[str, str]:
    """The paths of the modules whose outputs are the attention's and the MLP's operands of the residual adds: the
    sublayer's output norm where there is one (Gemma 2, OLMo 2), its last projection where the sublayer adds the
    residual itself or is no module (OPT's fc1, act, fc2 on the layer), else the sublayer."""
    attn_prefix = block.attention + "."
    mlp_norm = next((n for n in block.extra_norms if not n.startswith(attn_prefix)), None)
    attn = block.attn_out_norm or (block.out_proj if _adds_residual(module_at(layer, block.attention))
                                   else block.attention)
    mlp = module_at(layer, block.mlp)
    if mlp_norm is not None:
        return attn, mlp_norm
    if isinstance(mlp, LINEARS):  # the maps' paths from the layer
        return attn, block.mlp_maps.down
    return attn, f"{block.mlp}.{block.mlp_maps.down}" if _adds_residual(mlp) else block.mlp


def _weights(module: nn.Module, dtype: torch.dtype, name: str = "weight",
             expert: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(|W|^T, [W, |W|]) of the module's weight ``name`` in nn.Linear's convention ([out, in]: a Conv1D's transposed;
    an experts module's [E, out, in] stacks, or its ``expert``'s [out, in]) in the pass's ``dtype``, kept on the
    module while it is the same tensor, unmodified; made for the step alone where the pass is wider than the model
    (widened: no wide copy kept; of one expert at a time)."""
    W = getattr(module, name)
    if W.dtype != dtype:
        with torch.no_grad():
            Wl = linear_weight(module) if name == "weight" else W if expert is None else W[expert]
            Wl = Wl.detach().to(dtype)
            Wa = Wl.abs()
            return Wa.T, torch.cat([Wl, Wa], dim=-1)  # [out, in]: an expert's, not the stack
    cache = module.__dict__.setdefault("_alpha_beta_weights", {})
    hit = cache.get(name)
    if hit is None or hit[0] is not W or hit[1] != W._version:
        with torch.no_grad():
            Wl = linear_weight(module).detach() if name == "weight" else W.detach()
            Wa = Wl.abs()
            hit = cache[name] = (W, W._version, Wa.transpose(-1, -2).contiguous(), torch.cat([Wl, Wa], dim=-1))
    return (hit[2], hit[3]) if expert is None else (hit[2][expert], hit[3][expert])


def _alpha_beta_grad(R: torch.Tensor, x: torch.Tensor, Yu: torch.Tensor, WaT: torch.Tensor,
                     W_both: torch.Tensor) -> torch.Tensor:
    """The gradient of x whose product with x is alpha1-beta0's input relevance, from the output's relevance R and
    the unbiased output Yu = x W^T. Z = x+ W+^T + x- W-^T = (Yu + |x| |W|^T) / 2 >= 0, so the rule's division needs
    no sign guard: R / (2 Z + 2 eps) (where Z = 0, every product of that output is 0 and so is what it hands
    down); R_in = x (S W) + |x| (S |W|) (linear_relprop), so the gradient is S W + sign(x) S |W|."""
    S = R / torch.matmul(x.abs(), WaT).add_(Yu).add_(2 * EPS)
    SW = torch.matmul(S, W_both)
    d = x.shape[-1]
    return SW[..., :d].addcmul(torch.sign(x), SW[..., d:])


class _AlphaBeta(torch.autograd.Function):
    """y = the Linear's (or Conv1D's) own output (passed in a box); backward: alpha1-beta0 from R_out = y g (``start``:
    the explained logit's one) to the gradient of x; on the plain rows (``rows``) the module's own gradient."""

    @staticmethod
    def forward(ctx, x, box, start, rows):
        y, module, clip = box
        ctx.save_for_backward(x, y)
        ctx.module, ctx.start, ctx.clip, ctx.rows = module, start, clip, rows
        # clip_qkv (OLMo, OLMoE, MPT): the value the model then clamps in place, clamped here (a new tensor, so the
        # model's clamp leaves it and its gradient as they are): the clamp's identity rule hands the projection
        # R = clamp(y) g, distributed by the unclamped y's contributions
        return y.detach() if clip is None else y.clamp(-clip, clip)

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        b = ctx.module.bias
        # the start: one at the explained logit, minus one at the foil's; the sign of the gradient, which carries
        # the derivative of what follows the head elementwise (a soft cap, a logit scale: the identity rule)
        R = torch.sign(g) if ctx.start else (y if ctx.clip is None else y.clamp(-ctx.clip, ctx.clip)) * g
        Yu = y if b is None else y - cast_weight(b, y.dtype)
        g_in = _alpha_beta_grad(R, x, Yu, *_weights(ctx.module, y.dtype))
        if ctx.rows is not None:  # the plain rows: the module's own gradient (through the model's clamp: 0 outside)
            gp = g if ctx.clip is None else g * ((y >= -ctx.clip) & (y <= ctx.clip))
            gp = torch.matmul(gp, cast_weight(linear_weight(ctx.module), g.dtype))
            g_in = torch.where(ctx.rows.mask(g_in), g_in, gp)
        return g_in, None, None, None


class _Experts(torch.autograd.Function):
    """A mixture of experts' output (the module's own, in a box with the module, the chosen experts [T, k] and their
    routing weights [T, k]); backward, the routing fixed as in the forward: each chosen expert's share of the output
    (its output times its routing weight) through its down projection (alpha1-beta0), the gated product's uniform
    rule and the activation's identity (half to the gate's and half to the up projection's output) and its [gate |
    up] projection (alpha1-beta0) to the gradient of x [T, d]; nothing to the router. The experts' intermediates are
    recomputed, one expert at a time over its tokens, as the eager forward computes them. The plain rows (rule_rows)
    take the module's own backward beside it (select)."""

    @staticmethod
    def forward(ctx, x, box):
        out, module, index, weights = box
        ctx.save_for_backward(x, index, weights)
        ctx.module = module
        return out.detach()

    @staticmethod
    def backward(ctx, g):
        x, index, weights = ctx.saved_tensors
        m = ctx.module
        gx = torch.zeros_like(x)
        for e in range(m.num_experts):
            tok, slot = torch.where(index == e)  # as the eager forward finds them
            if tok.numel() == 0:
                continue
            xe = x[tok]
            gu = torch.matmul(xe, cast_weight(m.gate_up_proj[e], x.dtype).T)
            gate, up = gu.chunk(2, dim=-1)
            h = m.act_fn.forward(gate) * up  # forward: not through the rules' activation hook
            o = torch.matmul(h, cast_weight(m.down_proj[e], x.dtype).T)
            R_h = h * _alpha_beta_grad(o * g[tok] * weights[tok, slot, None].to(g.dtype), h, o,
                                       *_weights(m, x.dtype, "down_proj", e))
            R_gu = (R_h / 2).repeat(1, 2)
            gx.index_add_(0, tok, _alpha_beta_grad(R_gu, xe, gu, *_weights(m, x.dtype, "gate_up_proj", e)))
        return gx, None


class _AddRule(torch.autograd.Function):
    """The branch's value; backward: Chefer's add rule for (scale branch + skip), the skip's share less the g it gets
    through the add itself. LRP-0 gives the operands a g and b g; rescaled per example, operand o's factor is
    |sum o g| / (|sum a g| + |sum b g|) * sum (a + b) g / sum o g = sign(sum o g) (A + B) / (|A| + |B|). The
    branch's gradient here is ``scale`` times the add's (Granite's residual multiplier between them); ``batch``:
    the examples, where the operands are [B n, d] (OPT's MLP); ``rows``: the plain rows' factor 1 (the skip's
    correction 0)."""

    @staticmethod
    def forward(ctx, branch, how, *skips):  # a parallel block's add has two skips: the stream and the attention output
        ctx.save_for_backward(branch, *skips)
        ctx.scale, ctx.batch, ctx.rows = how
        return branch.clone()

    @staticmethod
    def backward(ctx, g):
        branch, *skips = ctx.saved_tensors
        ge = g if g.dim() == 3 else g.view(ctx.batch, -1, g.shape[-1])
        ops = torch.stack([branch, *skips])
        ops = ops if ops.dim() == 4 else ops.view(len(ops), *ge.shape)
        ab = (ops * ge).sum((2, 3), keepdim=True)  # [k, B, 1, 1]: sum o g per operand
        gs = ge
        if ctx.scale != 1:  # the skips' operand gradient is the add's: g / scale
            gs = ge / ctx.scale
            ab[1:] /= ctx.scale
        s = ab.sign().mul_(ab.sum(0) / ab.abs().sum(0).clamp_min_(torch.finfo(g.dtype).tiny))
        if ctx.rows is not None:  # the plain rows: factor 1 (the skip's correction 0)
            s = torch.where(ctx.rows.mask(ge), s, 1)
        s_a, *s_skips = s.unbind(0)
        back = (lambda t: t) if ge is g else (lambda t: t.view_as(g))
        return back(ge * s_a), None, *(back(gs * s_o.sub_(1)) for s_o in s_skips)


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


@dataclass(frozen=True)
class RuleTerm(AttentionTerm):
    """What a method keeps of R^{A,l} (``attention_relevance`` on the rules' rows; with a head mask the unmasked
    one unless ``masked``) and the plain dF/dA (a doubled pass's plain rows, else None): ``reduce(R, G, cap)`` maps
    K layers' [K, B, H, n, n] to [K, ...] (the checkpointed pass's hooks, a layer at a time: RuleOperands)."""

    rules: str = "chefer_decoder"
    masked: bool = False


def attention_relevance(A: torch.Tensor, gA: torch.Tensor) -> torch.Tensor:
    """R^{A,l} = A (dF/dA) / 2: the half of A.V's relevance that goes to A (the uniform rule), in place on A."""
    return A.mul_(gA).div_(2)


def unmasked_attention_grad(adapter: Adapter, g_ctx: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The rules' dF/dA without the head mask, [K, B, H, n, n], from the unmasked gradient of the attention output
    ``g_ctx`` [K, B, n, H d_h] and the value projection's output ``v`` [K, B, n, *] (separate or fused)."""
    K, B, n = g_ctx.shape[:3]
    H = adapter.n_heads
    g_ctx = g_ctx.view(K, B, n, H, -1).transpose(2, 3)  # [K, B, H, n, dh]
    return g_ctx @ adapter.value_of(v).view(K, B, n, H, -1).permute(0, 1, 3, 4, 2)


class RuleOperands:
    """The checkpointed pass's operands of the RuleTerms (checkpointed.TermHooks), a layer at a time from the
    recomputed A and the gradient dF/dA the backward reaches it with [1, B or 2B, H, n, n]: R^{A,l} of the rules' rows
    (the second half of a doubled batch: ``half``) and the plain rows' dF/dA. With a head mask, the unmasked R^{A,l}
    reads the layer's kept unmasked gradient of the attention output and recomputed value output (``kept``); the
    forward's value outputs are dropped as each layer's forward ends (only the recomputation's are read)."""

    def __init__(self, adapter: Adapter, half: int | None, kept: dict):
        self.adapter, self.half, self.kept = adapter, half, kept
        self._layer, self._R = None, {}

    def forward(self, l: int) -> None:
        self.kept.get(l, {}).pop("v", None)

    def __call__(self, l: int, A: torch.Tensor, dA: torch.Tensor, term: RuleTerm):
        rule = slice(self.half, None) if self.half is not None else slice(None)
        if self._layer != l:  # the layer above is done: its kept tensors dropped
            if self._layer in self.kept:
                self.kept[self._layer].pop("v", None)
                self.kept[self._layer]["g_ctx"].clear()
            self._layer, self._R = l, {}
        masked = term.masked or l not in self.kept
        if masked not in self._R:
            if masked:
                gA = dA[:, rule]
            else:
                k = self.kept[l]
                gA = unmasked_attention_grad(self.adapter, k["g_ctx"].pop()[None, rule], k.pop("v").detach()[None, rule])
            self._R[masked] = attention_relevance(A[:, rule].clone(), gA)
        return self._R[masked], None if self.half is None else dA[:, :self.half]


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

    def experts_hook(module, args, kwargs, out):
        vals = dict(zip(("hidden_states", "top_k_index", "top_k_weights"), args), **kwargs)
        return select(rows, out, _Experts.apply(vals["hidden_states"], (out, module, vals["top_k_index"],
                                                                        vals["top_k_weights"].detach())))

    def alpha_beta(start, clip=None):
        def hook(module, inp, out):
            return _AlphaBeta.apply(inp[0], (out, module, clip), start, rows)
        return hook

    def skip_pre_hook(slot, key):
        def hook(module, args, kwargs):  # the attention takes the stream by keyword where no norm precedes it
            t = slot[key] = args[0] if args else kwargs["hidden_states"]
            if t.dim() == 3:  # the examples (the first skip read: OPT's MLP reads the stream as [B n, d])
                slot["B"] = t.shape[0]
        return hook

    scale = float(getattr(adapter.config, "residual_multiplier", 1.0))  # Granite's, on both sublayers' outputs

    def add_hook(slot, keys):
        def hook(module, inp, out):
            # the skips popped: kept, a recomputation's stream would hold its layer's graph (softmax, A.V's A)
            # until the rules' hooks are removed, every layer's at once by the backward's end
            skips = (slot.pop(k) for k in keys)
            return _with_first(out, _AddRule.apply(_first(out), (scale, slot["B"], rows), *skips))
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
                 if isinstance(m, LINEARS) and m not in in_layers and m not in embedding]
        # alpha1-beta0's Function gives every row its gradient (the plain rows' too): no graph of the Linears' own
        for i, m in enumerate(heads):  # the last one outputs the explained logits
            handles += no_grad_inside(m)
            handles.append(m.register_forward_hook(alpha_beta(i == len(heads) - 1)))
        clip = qkv_clip(adapter.config)
        for layer in layers:
            clipped = {module_at(layer, path) for path in qkv_paths(block)} if clip else set()
            for m in layer.modules():
                if isinstance(m, LINEARS):
                    handles += no_grad_inside(m)
                    handles.append(m.register_forward_hook(alpha_beta(False, clip if m in clipped else None)))
                elif is_experts(m):
                    handles.append(m.register_forward_hook(experts_hook, with_kwargs=True))
            shared_gate = getattr(module_at(layer, block.mlp), "shared_expert_gate", None)
            if block.mlp_kind == "moe" and shared_gate is not None:  # a routing weight too: fixed
                handles.append(shared_gate.register_forward_hook(lambda _m, _i, out: select(rows, out, out.detach())))
        with attnlrp_rules(adapter, routing="fixed", rows=rows):
            for li, layer in enumerate(layers):
                slot: dict = {}
                attn_branch, mlp_out = branches(block, layer)
                # the skip operand: the input of the norm before the sublayer, or of the sublayer itself where its
                # norm sits after it (OLMo 2: the add's other operand is that norm's output)
                if block.parallel:  # x + Attn(LN1 x) + MLP(LN2 x): the add rule over three operands, on the MLP's
                    handles.append(module_at(layer, block.ln1).register_forward_pre_hook(skip_pre_hook(slot, "x"),
                                                                                          with_kwargs=True))
                    handles.append(module_at(layer, block.attention).register_forward_hook(keep_out_hook(slot, "a")))
                    handles.append(module_at(layer, mlp_out).register_forward_hook(add_hook(slot, ("a", "x"))))
                for skip_of, branch, key in (() if block.parallel else (
                        (block.ln1 or block.attention, attn_branch, "attn"),
                        (block.ln2, mlp_out, "mlp"))):
                    handles.append(module_at(layer, skip_of).register_forward_pre_hook(skip_pre_hook(slot, key),
                                                                                       with_kwargs=True))
                    handles.append(module_at(layer, branch).register_forward_hook(add_hook(slot, (key,))))
                if head_mask is not None:
                    out_proj = module_at(layer, block.out_proj)
                    dh = linear_weight(out_proj).shape[1] // adapter.n_heads
                    cols = torch.tensor(head_mask[li], dtype=torch.float64).repeat_interleave(dh)
                    layer_kept = kept.setdefault(li, {"g_ctx": []}) if kept is not None else {"g_ctx": []}
                    # before the projection's own forward runs without a graph (no_grad_inside)
                    handles.append(out_proj.register_forward_pre_hook(mask_pre_hook(cols, layer_kept["g_ctx"]),
                                                                      prepend=True))
                    handles.append(module_at(layer, block.value).register_forward_hook(keep_hook(layer_kept)))
            yield
    finally:
        for h in handles:
            h.remove()

