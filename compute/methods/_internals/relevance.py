"""Layer-wise relevance propagation with Chefer's rules (METHODS.md 5.1), as closed-form batched tensor operations.

The reference (Transformer-Explainability) re-runs every module's autograd graph in its ``relprop`` and assumes one
example per batch. Every rule is a closed form, so here one pass walks the layers top-down on the whole padded batch:

* Linear, LRP-alpha1-beta0 (bias ignored): Z = X+ W+^T + X- W-^T, S = R / Z, R_in = X+ (S W+) + X- (S W-).
  With Y = X W^T (the module's own output less its bias, recorded in the forward) the identities
  X+W+^T + X-W-^T = (Y + |X| |W|^T) / 2 and X+(SW+) + X-(SW-) = (X (SW) + |X| (S|W|)) / 2 cost one product for Z and
  one (of twice the width) for R_in, instead of four.
* A.V and Q.K^T (LRP-0, each operand gets half): R_A = A (S V^T) / 2, R_V = V (A^T S) / 2; likewise Q and K.
* Residual adds: LRP-0 per operand, then both rescaled with sums over the whole example (all tokens and dims), so
  the example's total is conserved but not the per-token split.
* LayerNorm, GELU/tanh/ReLU, softmax, dropout and the additive attention mask pass relevance through unchanged; the
  fan-out of a hidden state to Q/K/V and the residual sums the relevances.
* Divisions use the reference's safe_divide (denominator + 1e-9, 0 where it is 0).

On a GPU every tensor operation is a kernel launch, and a per-layer loop of many small ones is launch-bound. So
everything that does not depend on the relevance (|X|, every denominator, the heads, Q K^T, the products of the
forms above that fold a factor into the precomputed side) is computed for a group of layers at once, and the
top-down sweep takes about 70 operations per layer, writing into buffers allocated once (benchmarks/op_count.py).
Divisions by a denominator become one division by safe_den(b): b + 1e-9, +inf where b == 0.

Relevance starts as the one-hot vector of the target class at the logits. Pad positions never receive relevance
(attention gives pad keys probability 0 and every other rule acts per token), and the per-example sums of the add
rule are taken over each example alone, so an example's result does not depend on its batch.

Mask-LRP (METHODS.md 6.2): a head mask M [L, H] multiplies, per head, the relevance that leaves the A.V product
(towards A and V, hence to lower layers); the residual branch is untouched. The attention relevance R^{A,l} kept for
the rollout is the layer's unmasked one unless ``rollout_uses_masked``; ``renormalise`` (the paper's variant)
rescales the masked relevance of each layer back to the unmasked total.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from ... import interrupts
from ...adapters import Adapter, Captured
from ...errors import AttrscopeError
from .aggregate import add_identity_row_normalise, valid_block
from .base import Method, MethodResult
from .chefer_decoder_rules import RuleTerm, attention_relevance, unmasked_attention_grad
from .chefer_decoder_rules import unsupported as decoder_unsupported
from .gradients import Explained, GradientPass, cat_terms, gradient_pass, spec_from, wide
from .lrp_record import has_lrp_rules
from .safe_divide import EPS, safe_den, safe_div

# What one group of layers' precomputed tensors may take (about 40 d-vectors per token and two n x n maps per head
# and layer, in the rules' dtype). Short batches take every layer in one group, the fewest kernel launches where
# launches are what costs; where a layer's tensors pass ~1M elements the arithmetic costs more than the launches,
# and one group at a time keeps the peak memory of a batch where the per-layer rules had it (BERT-base, 8 x 128
# tokens, float64: 2.4 GB over the batch's capture, as before the groups).
GROUP_BYTES = 1 << 28


def rule_weights(W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(W, |W|^T, [W, |W|]) of a Linear weight W [out, in]: what ``linear_relprop`` multiplies by."""
    Wa = W.abs()
    return W, Wa.T, torch.cat([W, Wa], dim=1)


def adapter_rule_weights(adapter: Adapter, key: str, mods: list, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """``rule_weights`` in ``dtype`` of the Linear modules ``mods`` stacked by output rows, kept on the adapter while
    the modules' weights are the same tensors, unmodified (the head's rules)."""
    cache = adapter.__dict__.setdefault("_lrp_rule_weights", {})
    weights = tuple(m.weight for m in mods)
    stamp = tuple(w._version for w in weights)
    key = (key, dtype)
    hit = cache.get(key)
    if hit is None or hit[1] != stamp or any(a is not b for a, b in zip(hit[0], weights)):
        with torch.no_grad():
            W = torch.cat([w.to(dtype) for w in weights]) if len(weights) > 1 else weights[0].to(dtype)
        hit = cache[key] = (weights, stamp, rule_weights(W.detach()))
    return hit[2]


def linear_relprop(R: torch.Tensor, X: torch.Tensor, W, Y: torch.Tensor) -> torch.Tensor:
    """alpha1-beta0 rule through y = X W^T (+ b, ignored). R [..., out], X [..., in], W [out, in] (or its
    ``rule_weights``), Y = X W^T. With Z = (Y + |X| |W|^T) / 2, S = R / Z and R_in = (X (SW) + |X| (S|W|)) / 2, the
    two halves cancel exactly (powers of 2): S/2 = R / (Y + |X||W|^T + 2 eps) and R_in = X (S/2 W) + |X| (S/2 |W|)."""
    Xa = X.abs()
    _, WaT, W_both = rule_weights(W) if isinstance(W, torch.Tensor) else W
    S = R / safe_den(torch.matmul(Xa, WaT).add_(Y), 2 * EPS, inplace=True)
    SW = S @ W_both  # [..., 2 in]: S W and S |W| in one product
    d_in = X.shape[-1]
    return (X * SW[..., :d_in]).addcmul_(Xa, SW[..., d_in:])


@dataclass
class _Weights:
    """One rule's weights for every layer: |W|^T stacked [L, in, out] (Z for a group of layers in one product), the
    per-layer [W, |W|] [out, 2 in] (the sweep's products) and the bias stacked [L, 1, out] (None: no bias)."""

    WaT: torch.Tensor
    W_both: tuple
    bias: torch.Tensor | None


def layer_weights(adapter: Adapter, role: str, dtype: torch.dtype) -> _Weights:
    """The rule weights of ``role`` (f1, f2, o, or qkv: Q, K and V stacked by output rows, one rule for the three)
    in every layer, in the rules' dtype, kept on the adapter while the modules' parameters are the same tensors,
    unmodified: rebuilt per batch they would cost a pass over 3 x the weights."""
    cache = adapter.__dict__.setdefault("_lrp_layer_weights", {})
    roles = ("q", "k", "v") if role == "qkv" else (role,)
    mods = [[adapter.lrp_linears(layer)[r] for r in roles] for layer in adapter.layers()]
    params = [p for ms in mods for m in ms for p in (m.weight, m.bias) if p is not None]
    stamp = tuple((id(p), p._version) for p in params)
    hit = cache.get((role, dtype))
    if hit is None or hit[0] != stamp or any(a is not b for a, b in zip(hit[1], params)):
        with torch.no_grad():
            W = torch.stack([torch.cat([m.weight for m in ms]) for ms in mods]).to(dtype)  # [L, out, in]
            Wa = W.abs()
            bias = None if mods[0][0].bias is None else torch.stack(
                [torch.cat([m.bias for m in ms]) for ms in mods]).to(dtype)[:, None]
            w = _Weights(Wa.transpose(1, 2).contiguous(), torch.cat([W, Wa], dim=2).unbind(0), bias)
        hit = cache[(role, dtype)] = (stamp, params, w)
    return hit[2]


# ----------------------------------------------------------------------------------------------------------------
def decoder_rules(adapter: Adapter) -> bool:
    """The decoder rule set (chefer_decoder_rules, docs/methods.md 8) applies: a pre-LN block it is written for."""
    return adapter.block is not None and adapter.block.pre_ln and decoder_unsupported(adapter) is None


def decoder_relevance(cap: Captured, adapter: Adapter, spec: Explained, target: torch.Tensor, head_mask=None,
                      rollout_uses_masked: bool = False, renormalise: bool = False,
                      plain: bool = False, terms: tuple = ()) -> Relevance:
    """The propagation on a pre-LN decoder (``head_mask``: the host's [L][H]), read off one gradient pass with the
    rules' backward: the relevance of a state is the state times its modified gradient; R^{A,l} = A (dF/dA) / 2, the
    half of A.V's relevance that goes to A (with a head mask: unmasked unless ``rollout_uses_masked``, from the
    unmasked gradient of A.V's output). ``plain``: the plain dF/dA too (``attention_grad``), from the plain half of
    a doubled batch in the same pass (rule_rows); a batch whose pass is doubled already reads it from that one.
    A checkpointed pass keeps no layer's attention: ``terms`` (RuleTerms) are reduced a layer at a time in its
    backward (``maps``), and ``attention`` is None."""
    if renormalise:
        raise AttrscopeError("method 'mask_lrp': --mask-renormalise is not defined on pre-LN decoder blocks; drop it")
    # the host's mask (the method's parameter), hashable: the pass is memoised by its spec
    mask = None if head_mask is None else tuple(tuple(row) for row in np.asarray(head_mask, dtype=np.float64))
    spec = replace(spec, rules="chefer_decoder", head_mask=mask)
    # a batch that declares a backward (transatt, mask_lrp; or a gradient method beside) takes the doubled pass for
    # the whole family, so that its methods share one pass
    doubled = replace(spec, plain_rows=True)
    declared = cap.passes is not None and "backward" in cap.passes
    if plain or declared or ("gradient_pass", doubled) in cap.memo:
        spec = doubled
    gp = gradient_pass(cap, adapter, spec)
    g = gp.grads(target, terms)
    B = cap.input_ids.shape[0]
    rule = slice(B, None) if spec.plain_rows else slice(None)  # the rules' rows of the pass
    with torch.no_grad():
        inputs = cat_terms(gp, g, "inputs")[rule].transpose(0, 1)  # [L, B, n]
        if gp.checkpointed:  # no layer's dF/dh kept (nor read: ``input`` is no method's)
            return Relevance(input=None, inputs=inputs, attention=None,
                             maps={t.name: g["terms"][t.name] for t in terms})
        input_rel = gp.hidden_states[0].detach()[rule] * g["hidden"][0][rule]
        A = torch.stack([a.detach()[rule] for a in gp.attentions])  # [L, B, H, n, n]: the rules' rows only
        gA_all = torch.stack(g["attentions"])  # [L, B (2B), H, n, n]
        if mask is not None and not rollout_uses_masked:  # every layer at once
            kept = [gp.kept[li] for li in range(A.shape[0])]
            gA = unmasked_attention_grad(adapter, torch.stack([k["g_ctx"][-1] for k in kept])[:, rule],
                                         torch.stack([k["v"].detach() for k in kept])[:, rule])
        else:
            gA = gA_all[:, rule]
        return Relevance(input=input_rel, inputs=inputs, attention=attention_relevance(A, gA),
                         attention_grad=gA_all[:, :B] if spec.plain_rows else None)


def check_lrp(adapter: Adapter, method: str) -> None:
    """The rules (Chefer et al.) are defined for post-LN encoders whose LayerNorms and softmax attention over absolute
    positions they pass relevance through, with a known head: BERT, RoBERTa, XLM-R, CamemBERT, ELECTRA, DistilBERT."""
    if adapter.block is not None and adapter.block.pre_ln:
        why = decoder_unsupported(adapter)
        if why is not None:
            raise AttrscopeError(f"method '{method}' has no LRP rule set for the '{adapter.config.model_type}' "
                                 f"architecture: {why}; choose gae or a gradient method")
        return
    if not has_lrp_rules(adapter):
        block = adapter.block
        why = ("it has no block description" if block is None
               else "its norms sit before the sublayers (pre-LN), where the rules' LayerNorm step is undefined"
               if block.pre_ln else "its attention scores carry relative-position terms the rules do not pass"
               if block.positions == "relative" else "no rule set is written for its head")
        raise AttrscopeError(
            f"method '{method}' has no LRP rule set for the '{adapter.config.model_type}' architecture: {why}; the "
            "rules are defined for BERT, RoBERTa, XLM-R, CamemBERT, ELECTRA and DistilBERT: choose gae or a gradient "
            "method")


@dataclass
class Relevance:
    """Result of one propagation. ``inputs`` [L, B, n]: relevance at the input of layer l+1 summed over d (row l:
    [B, n]); ``input``: at the encoder input [B, n, d]; ``attention`` [L, B, H, n, n]: R^{A,l+1} (the half of the A.V
    relevance that goes to A, per head, as kept for the rollout)."""

    input: torch.Tensor | None  # None: a decoder's checkpointed pass's
    inputs: torch.Tensor
    attention: torch.Tensor | None  # None: a checkpointed pass's (its terms' ``maps`` instead)
    attention_grad: torch.Tensor | None = None  # [L, B, H, n, n] the plain dF/dA, where the pass carried it
    maps: dict | None = None  # a checkpointed pass's RuleTerms, each [L, B, ...], reduced a layer at a time

    def map(self, term: RuleTerm, grad: torch.Tensor | None = None) -> torch.Tensor:
        """``term`` of R^{A,l} and the plain dF/dA (``grad``: the caller's, where the pass carried none) [L, B, ...]:
        the checkpointed pass's, reduced in its backward, or of every layer's stacks at once."""
        if self.maps is not None:
            return self.maps[term.name]
        return term.reduce(self.attention, self.attention_grad if grad is None else grad, None)


# What the methods keep of R^{A,l} (and the plain dF/dA): per layer, the positive part per head and the head mean
# (partial_lrp), of dF/dA times R^{A,l} (transatt, mask_lrp: ``masked``, the masked R^{A,l})
RELEVANCE_MAPS = RuleTerm("lrp_relevance_maps", lambda R, G, cap: positive_head_mean(R))
WEIGHTED_MAPS = {masked: RuleTerm("lrp_weighted_maps" + "_masked" * masked,
                                  lambda R, G, cap: positive_head_mean(G.to(R.dtype) * R), masked=masked)
                 for masked in (False, True)}


def start_relevance(target: torch.Tensor, foil: torch.Tensor | None, channel: int | None, width: int,
                    dtype: torch.dtype) -> torch.Tensor:
    """[B, width] relevance at the head's output: one-hot at the explained output's entry (the target class or word;
    a QA head's start or end channel), less one-hot at the foil word where one is given (a contrast). Scattered, not
    one_hot: that checks the indices' range on the host (a device sync)."""
    R = torch.zeros(target.shape[0], width, dtype=dtype, device=target.device)
    index = target[:, None] if channel is None else torch.full_like(target[:, None], channel)
    R.scatter_(1, index, 1.0)
    if foil is not None:  # added, not written: a foil equal to the target leaves 1 - 1 = 0
        R.scatter_add_(1, foil.clamp_min(0)[:, None], -(foil >= 0).to(dtype)[:, None])
    return R


# The output channel of a QA head (start_logits / end_logits) a readout reads; other heads index by the target.
QA_CHANNELS = {"start_logits": 0, "end_logits": 1}


def _head_relevance(gp: GradientPass, target, pos, foil, channel, cast, dtype) -> torch.Tensor:
    """[B, d] relevance at the explained row of the last hidden state: the head's Linears (alpha-beta) top-down,
    activations and LayerNorms passing relevance unchanged (a sequence head reads the row alone; a language-model or
    QA head runs on every token: its row at the explained position is the one that produced the explained output)."""
    adapter, rec = gp.adapter, gp.lrp
    last = gp.hidden_states[-1]
    b = torch.arange(last.shape[0], device=last.device)
    R = None
    head = adapter.lrp_head()
    for k in range(len(head) - 1, -1, -1):
        mod, (x, y) = head[k], rec.head[k]
        x = cast(x)
        if x.dim() == 3:
            x = x[b, pos]
            y = torch.nn.functional.linear(x, cast(mod.weight), None if mod.bias is None else cast(mod.bias))
        else:
            y = cast(y)
        if R is None:
            R = start_relevance(target, foil, channel, y.shape[-1], y.dtype)
        R = linear_relprop(R, x, adapter_rule_weights(adapter, f"head.{k + 1}", [mod], dtype), _unbiased(mod, y, cast))
    top = cast(last[b, pos])
    return top * safe_div(R, top)


class _Group:
    """Everything the rules of a group of consecutive layers need that does not depend on the relevance, computed for
    the group at once (batched over layers) before the top-down sweep reaches it; per-layer lists (index i: layer
    ``lis[i]``) are views of the batched tensors. Shapes: T = B n tokens, d hidden, G layers.

    The alpha1-beta0 rules keep their denominator Z' = Y + |X||W|^T = 2 Z (+ 2 eps: ``linear_relprop``) and
    XX = [X, |X|], so that a rule is S = R / den', SW = S [W, |W|] and R_in = the sum of the two halves of XX * SW.
    Whatever multiplies or divides a rule's result elementwise next is folded into its XX (the next rule's 1 / den',
    the fan-out's X / X, A.V's 1 / (2 ctx)), and the add rules' 1 / (a + b) into their operands, so that a factor of
    the same values costs no operation per layer (the results move by rounding only)."""

    def __init__(self, gp, lis: range, cast, dtype, shape, masked_v: torch.Tensor | None, renormalise: bool):
        adapter, rec = gp.adapter, gp.lrp
        B, n, d, H = shape
        G, T, dh = len(lis), B * n, d // H
        lo, hi = lis.start, lis.stop
        layers = [rec.layers[l] for l in lis]

        def stacked(pairs):  # [G * k, B, n, width] of the recorded (role, 0 = input | 1 = output) tensors
            return cast(torch.stack([layer[role][io] for layer in layers for role, io in pairs]))

        def halves(XX, by):  # XX [G, T, 2 w] times a [G, T, w] factor, in both halves: per layer [T, 2, w]
            return XX.view(G, T, 2, -1).mul_(by[:, :, None]).unbind(0)

        # the two residual adds' operands side by side: [G, 2, T, d], (FFN out, y) and (attention out, x)
        ab2 = stacked((("f2", 1), ("f1", 0))).view(G, 2, T, d)
        ab1 = stacked((("o", 1), ("q", 0))).view(G, 2, T, d)
        y2f, y = ab2.unbind(1)
        yo, x = ab1.unbind(1)
        ctx = stacked((("o", 0),)).view(G, T, d)
        h = stacked((("f2", 0),)).view(G, T, -1)
        y1f = stacked((("f1", 1),)).view(G, T, -1)
        # Q, K, V (with bias) as the fused rule's output [G, T, 3 d]: one concatenation, viewed layer-first
        qkv = cast(torch.cat([layer[r][1] for layer in layers for r in ("q", "k", "v")], dim=-1))
        qkv = qkv.view(B, n, G, 3 * d).permute(2, 0, 1, 3).view(G, T, 3 * d)

        c_y = y / safe_den(y)  # the fan-out rule's X / X: R_y = (R_ffn + R_res) * c_y
        c_x = x / safe_den(x)
        self.c_y, self.c_x = c_y.unbind(0), c_x.unbind(0)

        def rule(role, X, Y):
            """(den', XX, [W, |W|] per layer) of ``role`` for the group: den' = safe_den(Y - b + |X||W|^T, 2 eps)."""
            w = layer_weights(adapter, role, dtype)
            Xa = X.abs()
            Yu = Y if w.bias is None else Y - w.bias[lo:hi]
            den = safe_den(torch.bmm(Xa, w.WaT[lo:hi]).add_(Yu), 2 * EPS, inplace=True)
            return den, torch.cat([X, Xa], dim=-1), w.W_both[lo:hi]

        den_f2, XX_h, self.W_f2 = rule("f2", h, y2f)
        den_f1, XX_y, self.W_f1 = rule("f1", y, y1f)
        den_o, XX_o, self.W_o = rule("o", ctx, yo)
        den_qkv, XX_x, self.W_qkv = rule("qkv", x, qkv)
        self.den_f2, self.den_o = den_f2.unbind(0), den_o.unbind(0)
        self.XX_h = halves(XX_h, 1 / den_f1)  # the f2 rule gives S'_f1 = R_h / den'_f1
        self.XX_y = halves(XX_y, c_y)  # the f1 rule gives R_ffn * c_y
        self.XX_x = halves(XX_x, c_x)  # the Q/K/V rule gives R_att * c_x
        # A.V's LRP-0 divides the o rule's input relevance R_ctx by ctx and halves it: the o rule gives S_ctx / 2
        self.XX_o = XX_o.view(G, T, 2, d).unbind(0) if renormalise else None  # R_ctx itself (its per-head sums)
        self.CC = halves(XX_o.clone() if renormalise else XX_o, 1 / (2 * safe_den(ctx)))
        # the add rules' S = R / (a + b) times each operand: [a, b] / (a + b) times R
        self.ab2 = ab2.div_(safe_den(ab2.sum(1), inplace=True)[:, None]).unbind(0)
        self.ab1 = ab1.div_(safe_den(ab1.sum(1), inplace=True)[:, None]).unbind(0)

        # heads, contiguous [3, G * B * H, n, d_h]: Q, K, V
        heads = qkv.view(G, B, n, 3, H, dh).permute(3, 0, 1, 4, 2, 5).contiguous().view(3, G * B * H, n, dh)
        Q, K, V = heads.unbind(0)
        self.Q, self.K = Q.view(G, B * H, n, dh).unbind(0), K.view(G, B * H, n, dh).unbind(0)
        self.Vt = V.view(G, B * H, n, dh).transpose(2, 3).unbind(0)
        self.den_qk = safe_den(torch.bmm(Q, K.transpose(1, 2)), inplace=True).view(G, B, H, n, n).unbind(0)
        # the fused rule's S' = R_qkv / den' per role, with R_Q = Q (S1 K) / 2, R_K = K (S1^T Q) / 2 and
        # R_V = V (A^T S_ctx) / 2 (m: the head mask's column of V): S'_Q = (S1 K) * Q / (2 den'_q), ...
        scale = torch.full((G, 1, 3, H, 1), 0.5, dtype=dtype, device=qkv.device)
        scale[:, :, 2] = 1.0 if masked_v is None else masked_v[lo:hi, None, :, None]
        over = (qkv.view(G, T, 3, H, dh) * scale).div_(den_qkv.view(G, T, 3, H, dh))
        q_o, k_o, v_o = over.view(G, B, n, 3, H, dh).permute(3, 0, 1, 4, 2, 5).unbind(0)  # [G, B, H, n, d_h]
        self.Qo, self.Ko, self.Vo = q_o.unbind(0), k_o.unbind(0), v_o.unbind(0)


def _groups(L: int, B: int, n: int, d: int, H: int, itemsize: int) -> list[range]:
    """Consecutive layer ranges, top first, each within GROUP_BYTES of precomputed tensors."""
    per_layer = itemsize * (40 * B * n * d + 2 * B * H * n * n)
    size = max(1, min(L, GROUP_BYTES // max(per_layer, 1)))
    return [range(max(0, hi - size), hi) for hi in range(L, 0, -size)]


def _rescale_(sums: torch.Tensor, ab: torch.Tensor) -> None:
    """The add rule's rescaling, in place on ab [2, B, n d] (a S, b S) from ``sums`` [3, B, n d] (a S, b S, R): each
    operand times safe_div(safe_div(|sum a S|, |sum a S| + |sum b S|) * sum R, sum a S), per example. The outer masks
    are dropped where they cannot act: |s| / (|s| + |t| + eps) is 0 when both are, and so is the numerator where the
    sum it is divided by is 0."""
    s_ab, r = sums.sum(-1, keepdim=True).split([2, 1])  # [2, B, 1], [1, B, 1]
    frac = s_ab.abs()
    frac.div_(frac.sum(0).add_(EPS)).mul_(r)
    den = s_ab + EPS
    den.masked_fill_(den == 0, EPS)
    ab.mul_(frac.div_(den))


@torch.no_grad()  # the rules write into views of buffers: no graph, whoever calls
def propagate(gp: GradientPass, target: torch.Tensor, pos: torch.Tensor, head_mask: torch.Tensor | None = None, *,
              rollout_uses_masked: bool = False, renormalise: bool = False, foil: torch.Tensor | None = None,
              channel: int | None = None, rules_dtype: torch.dtype | None = None) -> Relevance:
    """Relevance from the one-hot target logit (less the foil's; or a QA head's ``channel`` at the explained
    position) down to the encoder input, for the batch recorded in ``gp`` (in the pass's dtype: float64 for --lrp-dtype
    float64 and mixed). ``rules_dtype``: the rules' precision (None: the pass's own, at least float32);
    mixed runs them in float32 on the float64 pass's activations.

    One step per layer, top-down, of a few large operations each: what does not depend on the relevance (|X|, the
    denominators, the heads, Q K^T) is computed before, for a group of layers at once (_Group), and the per-layer
    steps write into buffers allocated once, viewed as each step needs them (every operation is a kernel launch on a
    GPU, a view too)."""
    adapter = gp.adapter
    last = gp.hidden_states[-1]
    dtype = rules_dtype or (last.dtype if last.element_size() >= 4 else torch.float32)

    def cast(t):
        return t if t.dtype == dtype else t.to(dtype)

    H, L = adapter.n_heads, adapter.n_layers
    B, n, d = last.shape
    T, dh, dev = B * n, d // H, last.device
    d_ffn = gp.lrp.layers[0]["f1"][1].shape[-1]
    b = torch.arange(B, device=dev)

    def empty(*size):
        return torch.empty(size, dtype=dtype, device=dev)

    # the add rules' [a S, b S, R]: two for the output sublayer's, in turn (a layer writes its input relevance into
    # the other one's R), one for the attention sublayer's; each with its views
    out_bufs, att_buf = empty(2, 3, T, d), empty(3, T, d)
    bufs = [(buf.unbind(0), buf[:2], buf.view(3, B, n * d), buf[:2].view(2, B, n * d))
            for buf in (*out_bufs.unbind(0), att_buf)]
    # the products' results: [T, 2 d_ffn] (f2), [T, 2 d] (f1, o, Q/K/V in turn), [B H, n, n] (S V^T, then S1),
    # [B H, n, d_h] (S1 K, S1^T Q) and [B H, d_h, n] (S^T A), each with the views the next step reads
    SW_ffn, SW_d = empty(T, 2, d_ffn), empty(T, 2, d)
    SW_ffn_2d, SW_d_2d, SW_d_heads = SW_ffn.view(T, 2 * d_ffn), SW_d.view(T, 2 * d), SW_d.view(B, n, 2, H, dh)
    P_nn, P_nd, P_dn = empty(B * H, n, n), empty(B * H, n, dh), empty(B * H, dh, n)
    P_nn4, P_nn_T, P_nd4 = P_nn.view(B, H, n, n), P_nn.transpose(1, 2), P_nd.view(B, H, n, dh)
    P_dn4_T = P_dn.view(B, H, dh, n).transpose(2, 3)
    # the fused Q/K/V rule's S' [T, 3 d] token-major, with head-major views of its parts; S_ctx / 2 head-major
    # [B H, n, d_h] with its token-major view
    S_qkv = empty(T, 3 * d)
    S_q, S_k, S_v = S_qkv.view(B, n, 3, H, dh).permute(2, 0, 3, 1, 4).unbind(0)  # [B, H, n, d_h] each
    S_ctx = empty(B * H, n, dh)
    S_ctx_tm, S_ctx_T = S_ctx.view(B, H, n, dh).transpose(1, 2), S_ctx.transpose(1, 2)
    attention, inputs = empty(L, B, H, n, n), empty(L, T)
    att_l, inputs_l = attention.unbind(0), inputs.unbind(0)

    R_top = bufs[(L - 1) % 2][0][2]
    R_top.zero_()
    R_top.view(B, n, d)[b, pos] = _head_relevance(gp, target, pos, foil, channel, cast, dtype)

    mask = None if head_mask is None else head_mask.to(dtype)  # [L, H]
    fold_mask = mask is not None and not renormalise  # a fixed per-head factor: folded into the precomputed V part
    if fold_mask:  # [B, H, 1, 1] per layer
        mask_bh = mask[:, None, :, None, None].expand(L, B, H, 1, 1).unbind(0)
    shape = (B, n, d, H)
    for lis in _groups(L, B, n, d, H, torch.finfo(dtype).bits // 8):
        g = _Group(gp, lis, cast, dtype, shape, mask if fold_mask else None, renormalise)
        for li in reversed(lis):
            interrupts.check()  # a stop asked for: between layers
            i = li - lis.start
            (a_S, b_S, R), ab, sums, ab_ex = bufs[li % 2]
            (a1_S, b1_S, R_y), ab1, sums1, ab1_ex = bufs[2]

            # output sublayer: LN2 (identity) <- add(FFN out, y) ; FFN: f2 <- activation (identity) <- f1
            torch.mul(g.ab2[i], R, out=ab)  # [a, b] / (a + b) * R
            _rescale_(sums, ab_ex)
            torch.mm(a_S.div_(g.den_f2[i]), g.W_f2[i], out=SW_ffn_2d)
            torch.mm(SW_ffn.mul_(g.XX_h[i]).sum(1), g.W_f1[i], out=SW_d_2d)  # S'_f1 [W, |W|]
            torch.sum(SW_d.mul_(g.XX_y[i]), 1, out=R_y)
            R_y.addcmul_(b_S, g.c_y[i])  # the fan-out of y: both branches' sum, times y / y

            # attention sublayer: LN1 (identity) <- add(attention out, x) ; o <- A.V <- (softmax identity) Q.K^T
            torch.mul(g.ab1[i], R_y, out=ab1)
            _rescale_(sums1, ab1_ex)
            torch.mm(a1_S.div_(g.den_o[i]), g.W_o[i], out=SW_d_2d)
            if renormalise:
                R_ctx = (SW_d * g.XX_o[i]).view(B, n, 2, H, dh).sum(2)  # [B, n, H, d_h]
            SW_d.mul_(g.CC[i])
            torch.sum(SW_d_heads, 2, out=S_ctx_tm)  # S_ctx / 2 = R_ctx / (2 ctx), head-major
            A = cast(gp.attentions[li])  # [B, H, n, n]
            torch.bmm(S_ctx, g.Vt[i], out=P_nn)
            R_A = torch.mul(A, P_nn4, out=att_l[li])  # A (S V^T) / 2
            torch.bmm(S_ctx_T, A.view(B * H, n, n), out=P_dn)  # (A^T S)^T / 2
            R_V = P_dn4_T  # times V below
            if mask is None:
                R_A_down = R_A
            elif fold_mask:
                R_A_down = R_A * mask_bh[li]
            else:  # the paper's variant: the kept heads carry the layer's whole context relevance
                scale = mask[li][None, :].expand(B, H)
                heads_sum = R_ctx.sum((1, 3))  # [B, H]
                scale = scale * safe_div(heads_sum.sum(-1), (heads_sum * scale).sum(-1))[:, None]
                R_A_down = R_A * scale[..., None, None]
                R_V = R_V * scale[..., None, None]
            if rollout_uses_masked and R_A_down is not R_A:
                att_l[li].copy_(R_A_down)
            torch.mul(R_V, g.Vo[i], out=S_v)
            torch.div(R_A_down, g.den_qk[i], out=P_nn4)  # S1 (the reference ignores the 1/sqrt(d_h) scaling)
            torch.bmm(P_nn, g.K[i], out=P_nd)
            torch.mul(P_nd4, g.Qo[i], out=S_q)
            torch.bmm(P_nn_T, g.Q[i], out=P_nd)
            torch.mul(P_nd4, g.Ko[i], out=S_k)

            # Q, K, V share the layer input: one fused rule over [W_q; W_k; W_v] sums the three relevances (the clone)
            torch.mm(S_qkv, g.W_qkv[i], out=SW_d_2d)
            R_in = bufs[(li - 1) % 2][0][2]
            torch.sum(SW_d.mul_(g.XX_x[i]), 1, out=R_in)
            R_in.addcmul_(b1_S, g.c_x[i])  # the fan-out of x
            torch.sum(R_in, -1, out=inputs_l[li])
    return Relevance(input=R_in.view(B, n, d), inputs=inputs.view(L, B, n), attention=attention)


def _unbiased(mod, y: torch.Tensor, cast=wide) -> torch.Tensor:
    """A Linear's recorded output less its bias: Y = X W^T, what the alpha1-beta0 rule's Z is built from."""
    return y - cast(mod.bias) if mod.bias is not None else y


def _tensor_key(t: torch.Tensor | None):
    """A memo key for a tensor that needs no device sync: the object and its version counter (an in-place change is a
    new key). The memo entry keeps the tensor, so its id is not reused while the entry lives."""
    return None if t is None else (id(t), t._version)


def relevance(cap: Captured, adapter: Adapter, spec: Explained, target: torch.Tensor, head_mask=None,
              **options) -> Relevance:
    """The batch's propagation for (spec, target, mask, options), shared by the LRP methods of one batch that pass
    the same target tensor (the runner passes one per batch; compute_classes one per class)."""
    gp = gradient_pass(cap, adapter, spec, lrp=True)
    key = ("relevance", spec, _tensor_key(target), _tensor_key(head_mask), tuple(sorted(options.items())))
    hit = cap.memo.get(key)
    if hit is None:
        with torch.no_grad():
            rel = propagate(gp, target, cap.explain_pos, head_mask, foil=cap.foil,
                            channel=QA_CHANNELS.get(cap.readout.field), **options)
        hit = cap.memo[key] = (rel, target, head_mask)
    return hit[0]


# ----------------------------------------------------------------------------------------------------------------
class RelevanceMethod(Method):
    """Base of the methods read off one relevance propagation (lrp, partial_lrp, transatt, mask_lrp). Parameters:
    the Explained ones (mask_sep: Mask-LRP's [SEP]-masked explanation pass) and dtype, the precision (--lrp-dtype):
    "float64" (forward, backward and rules in float64: GradientPass), "mixed" (forward and backward in
    float64, rules in float32: the poles of the rules' divisions sit in the activations, so their precision is what the
    result needs), "model" (everything in the model's dtype, the reference), "float32" (the model's dtype where it
    is float32 or wider, else the model cast to float32: auto's choice for transatt and mask_lrp before issue 26,
    named in the params of the stores it wrote), "auto" (``auto_dtype``: the stored params say which one ran).
    Class-specific: relevance starts at the target's one-hot logit."""

    class_specific = True
    needs = frozenset()  # the methods run their own forward (and backward, for the gradient-weighted ones)
    passes = frozenset({"forward", "lrp"})
    op_budget = 2.0  # of a bare forward + backward: the pass and one top-down sweep of the rules
    # the rules start at the head's explained output: a sequence head, a masked LM's vocabulary head, a QA head, a
    # decoder's causal-LM head at the next-token position (docs/methods.md 8)
    tasks = frozenset({"classification", "regression", "masked-token", "qa", "next-token"})
    pre_ln_ok = False  # not on every pre-LN block: where a decoder rule set is written (check_lrp decides)
    # "auto": float64 for all four. Neither float32 nor float32 rules on a float64 forward ("mixed") reproduce the
    # float64 numbers to 1e-3 of the scale with a mean Spearman of 0.9999 on both the shared model and a random
    # BERT-base (docs/benchmarks.md, LRP precision: benchmarks/lrp_precision.py); float64 is cheap on Hopper GPUs,
    # and one precision lets the batch's LRP methods share one gradient pass and one propagation.
    auto_dtype = "float64"

    def __init__(self, **params):
        params = {"dtype": "auto", **params}
        if params["dtype"] == "auto":
            params["dtype"] = self.auto_dtype
        super().__init__(**params)
        pass_dtype = {"model": "model", "float32": "float32"}.get(self.params["dtype"], "float64")  # mixed: float64
        self.spec = spec_from({**self.params, "dtype": pass_dtype})

    def rules_dtype(self, adapter: Adapter) -> torch.dtype | None:
        """The rules' precision: float32 (at least the model's) under "mixed", else the pass's own (None)."""
        if self.params["dtype"] != "mixed":
            return None
        dtype = next(adapter.model.parameters()).dtype
        return torch.float32 if torch.finfo(dtype).bits < 32 else dtype

    def check_architecture(self, adapter):
        check_lrp(adapter, self.name)

    def head_mask(self, cap: Captured) -> torch.Tensor | None:
        return None

    def options(self) -> dict:
        return {}

    def from_relevance(self, rel: Relevance, gp: GradientPass, target: torch.Tensor, cap: Captured) -> MethodResult:
        raise NotImplementedError

    def compute(self, cap, adapter, target):
        self.check_architecture(adapter)
        if decoder_rules(adapter):
            host_mask = None if self.head_mask(cap) is None else self.params["head_mask"]
            rel = decoder_relevance(cap, adapter, self.spec, target, host_mask, plain="backward" in self.passes,
                                    terms=self.attention_terms, **self.options())
            with torch.no_grad():  # the plain dF/dA (transatt) is the relevance's: no gradient pass of its own
                return self.from_relevance(rel, None, target, cap)
        rel = relevance(cap, adapter, self.spec, target, self.head_mask(cap), rules_dtype=self.rules_dtype(adapter),
                        **self.options())
        gp = gradient_pass(cap, adapter, self.spec, lrp=True)
        with torch.no_grad():
            return self.from_relevance(rel, gp, target, cap)

    def compute_classes(self, cap, adapter, num_classes):
        """Every class's scores [B, C, n], the class targets shared by the batch's LRP methods (cap.memo): the
        propagation is memoised per target tensor, so the methods share one per class."""
        B = cap.input_ids.shape[0]
        targets = cap.cached(("class_targets", num_classes), lambda: [
            torch.full((B,), c, dtype=torch.long, device=cap.input_ids.device) for c in range(num_classes)])
        return torch.stack([self.compute(cap, adapter, t).scores for t in targets], dim=1)


def positive_head_mean(M: torch.Tensor) -> torch.Tensor:
    """mean_h (M^h)^+ : [..., H, n, n] -> [..., n, n] (the positive part taken per head, then the head mean)."""
    return M.clamp_min(0).mean(-3)


def zero_self(rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Set each example's explained-token entry to 0 in [B, n] or [B, V, n] rows (Chefer/AttCAT/Mask-LRP [CLS,CLS] := 0)."""
    rows = rows.clone()
    b = torch.arange(rows.shape[0], device=rows.device)
    if rows.dim() == 2:
        rows[b, pos] = 0
    else:
        rows[b, :, pos] = 0
    return rows


def gradient_weighted_rollout(mats, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """ROLL (METHODS.md 1.2) of per-layer maps (a list of L [B, n, n], or [B, L, n, n]), start layer 1: rows ``pos``
    of every prefix product of (M + I) / rowsum, with the explained token's own entry set to 0. [B, L, n]."""
    M = mats if isinstance(mats, torch.Tensor) else torch.stack(list(mats), dim=1)
    return zero_self(rows_of_prefix_products(add_identity_row_normalise(valid_block(M, mask)), pos), pos)


def rows_of_prefix_products(steps: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """aggregate.rows_of_products of stacked steps [B, L, n, n] (later layers on the left), one batched product per
    layer: V (rows 0..L-1 together) <- V M^k + E_k, where E_k holds row ``pos`` of M^k in row k, top-down. Row l
    starts at step k = l as e_pos^T M^l (exactly E_l's row) and rows below k are 0 until then (0 M = 0), so row l
    ends as e_pos^T M^{l+1} ... M^1. [B, L, n]."""
    B, L, n, _ = steps.shape
    b, k = torch.arange(B, device=steps.device), torch.arange(L, device=steps.device)
    E = steps.new_zeros(L, B, L, n)
    E[k[:, None], b[None, :], k[:, None]] = steps[b, :, pos].transpose(0, 1)  # [L, B, n]: row pos of every step
    E, M = E.unbind(0), steps.unbind(1)
    V = E[L - 1]
    for j in range(L - 2, -1, -1):
        V = torch.baddbmm(E[j], V, M[j])
    return V
