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

Relevance starts as the one-hot vector of the target class at the logits. Pad positions never receive relevance
(attention gives pad keys probability 0 and every other rule acts per token), and the per-example sums of the add
rule are taken over each example alone, so an example's result does not depend on its batch.

Mask-LRP (METHODS.md 6.2): a head mask M [L, H] multiplies, per head, the relevance that leaves the A.V product
(towards A and V, hence to lower layers); the residual branch is untouched. The attention relevance R^{A,l} kept for
the rollout is the layer's unmasked one unless ``rollout_uses_masked``; ``renormalise`` (the paper's variant)
rescales the masked relevance of each layer back to the unmasked total.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import interrupts
from ...adapters import Adapter, Captured
from ...errors import AttrscopeError
from .aggregate import add_identity_row_normalise, rows_of_products, valid_block
from .base import Method, MethodResult
from .gradients import Explained, GradientPass, gradient_pass, spec_from, wide
from .lrp_record import has_lrp_rules

EPS = 1e-9


def safe_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The reference's safe_divide: a / (b + 1e-9), and 0 where b == 0 (a denominator that rounds to 0, b = -1e-9,
    becomes 1e-9). Scalar fills and in-place steps: this runs on every [B, n, d] tensor of every layer."""
    den = b + EPS
    den.masked_fill_(den == 0, EPS)
    return torch.where(b != 0, torch.div(a, den, out=den), 0.0)


def rule_weights(W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(W, |W|^T, [W, |W|]) of a Linear weight W [out, in]: what ``linear_relprop`` multiplies by."""
    Wa = W.abs()
    return W, Wa.T, torch.cat([W, Wa], dim=1)


def adapter_rule_weights(adapter: Adapter, key: str, mods: list, cast=wide) -> tuple[torch.Tensor, torch.Tensor,
                                                                                     torch.Tensor]:
    """``rule_weights`` of the Linear modules ``mods`` stacked by output rows (Q, K and V share one rule), kept on the
    adapter while the modules' weights are the same tensors, unmodified: rebuilt per batch they cost a pass over
    3 x the weights per Linear, as much as the rule's elementwise work on a batch of short sentences."""
    cache = adapter.__dict__.setdefault("_lrp_rule_weights", {})
    weights = tuple(m.weight for m in mods)
    stamp = tuple(w._version for w in weights)
    key = (key, cast(weights[0][:0]).dtype)
    hit = cache.get(key)
    if hit is None or hit[1] != stamp or any(a is not b for a, b in zip(hit[0], weights)):
        W = torch.cat([cast(w) for w in weights]) if len(weights) > 1 else cast(weights[0])
        hit = cache[key] = (weights, stamp, rule_weights(W.detach()))
    return hit[2]


def linear_relprop(R: torch.Tensor, X: torch.Tensor, W, Y: torch.Tensor) -> torch.Tensor:
    """alpha1-beta0 rule through y = X W^T (+ b, ignored). R [..., out], X [..., in], W [out, in] (or its
    ``rule_weights``), Y = X W^T."""
    Xa = X.abs()
    _, WaT, W_both = rule_weights(W) if isinstance(W, torch.Tensor) else W
    Z = torch.matmul(Xa, WaT).add_(Y).div_(2)
    S = safe_div(R, Z)
    SW = S @ W_both  # [..., 2 in]: S W and S |W| in one product
    d_in = X.shape[-1]
    return (X * SW[..., :d_in]).addcmul_(Xa, SW[..., d_in:]).div_(2)


def add_relprop(R: torch.Tensor, a_in: torch.Tensor, b_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add z = a + b [B, n, d]: LRP-0 per operand, then the reference's rescaling with per-example sums."""
    S = safe_div(R, a_in + b_in)
    a, b = a_in * S, b_in * S
    a_sum, b_sum, r_sum = a.sum((1, 2)), b.sum((1, 2)), R.sum((1, 2))
    both = a_sum.abs() + b_sum.abs()
    a_fact = safe_div(a_sum.abs(), both) * r_sum
    b_fact = safe_div(b_sum.abs(), both) * r_sum
    return a * safe_div(a_fact, a_sum)[:, None, None], b * safe_div(b_fact, b_sum)[:, None, None]


def clone_relprop(X: torch.Tensor, *Rs: torch.Tensor) -> torch.Tensor:
    """Fan-out of X to several branches: the reference's X * sum_k R_k / X (the sum, except where X is ~0); each
    safe_div(R_k, X), with the denominator and its zero mask built once."""
    den = X + EPS
    den.masked_fill_(den == 0, EPS)
    nonzero = X != 0
    return X * sum(torch.where(nonzero, R / den, 0.0) for R in Rs)


def _heads(t: torch.Tensor, H: int) -> torch.Tensor:
    B, n, d = t.shape
    return t.view(B, n, H, d // H).transpose(1, 2)  # [B, H, n, d_h]


def _merge(t: torch.Tensor) -> torch.Tensor:
    B, H, n, dh = t.shape
    return t.transpose(1, 2).reshape(B, n, H * dh)


# ----------------------------------------------------------------------------------------------------------------
def check_lrp(adapter: Adapter, method: str) -> None:
    if not has_lrp_rules(adapter):
        raise AttrscopeError(
            f"method '{method}' has no LRP rule set for the '{adapter.config.model_type}' architecture yet: use it with "
            "a BERT, RoBERTa, ELECTRA or DistilBERT classifier, or choose gae or a gradient method")


@dataclass
class Relevance:
    """Result of one propagation. ``inputs[l]``: relevance at the input of layer l+1 [B, n, d] summed over d
    ([B, n]); ``input``: at the encoder input [B, n, d]; ``attention[l]``: R^{A,l+1} [B, H, n, n] (the half of the
    A.V relevance that goes to A, per head, as kept for the rollout)."""

    input: torch.Tensor
    inputs: list[torch.Tensor]
    attention: list[torch.Tensor]


def start_relevance(target: torch.Tensor, foil: torch.Tensor | None, channel: int | None, width: int,
                    dtype: torch.dtype) -> torch.Tensor:
    """[B, width] relevance at the head's output: one-hot at the explained output's entry (the target class or word;
    a QA head's start or end channel), less one-hot at the foil word where one is given (a contrast)."""
    index = target if channel is None else torch.full_like(target, channel)
    R = torch.nn.functional.one_hot(index, width).to(dtype)
    if foil is not None:
        has = (foil >= 0).to(dtype)[:, None]
        R = R - has * torch.nn.functional.one_hot(foil.clamp_min(0), width).to(dtype)
    return R


# The output channel of a QA head (start_logits / end_logits) a readout reads; other heads index by the target.
QA_CHANNELS = {"start_logits": 0, "end_logits": 1}


def propagate(gp: GradientPass, target: torch.Tensor, pos: torch.Tensor, head_mask: torch.Tensor | None = None, *,
              rollout_uses_masked: bool = False, renormalise: bool = False, foil: torch.Tensor | None = None,
              channel: int | None = None, rules_dtype: torch.dtype | None = None) -> Relevance:
    """Relevance from the one-hot target logit (less the foil's; or a QA head's ``channel`` at the explained
    position) down to the encoder input, for the batch recorded in ``gp`` (on the model gp ran: the float64 twin for
    --lrp-dtype float64 and mixed). ``rules_dtype``: the rules' precision (None: the pass's own, at least float32);
    mixed runs them in float32 on the float64 pass's activations."""
    adapter, rec = gp.adapter, gp.lrp
    cast = wide if rules_dtype is None else (lambda t: t.to(rules_dtype))
    H = adapter.n_heads
    layers = adapter.layers()

    # head: its Linears (alpha-beta) top-down, activations and LayerNorms passing relevance unchanged, on the
    # explained row (a sequence head reads it alone; a language-model or QA head runs on every token: its row
    # at the explained position is the one that produced the explained output)
    last = cast(gp.hidden_states[-1].detach())
    b = torch.arange(last.shape[0], device=last.device)
    R = None
    head = adapter.lrp_head()
    for k in range(len(head) - 1, -1, -1):
        mod, (x, y) = head[k], rec.head[k]
        x = cast(x.detach())
        if x.dim() == 3:
            x = x[b, pos]
            y = torch.nn.functional.linear(x, cast(mod.weight), None if mod.bias is None else cast(mod.bias))
        else:
            y = cast(y.detach())
        if R is None:
            R = start_relevance(target, foil, channel, y.shape[-1], y.dtype)
        R = linear_relprop(R, x, adapter_rule_weights(adapter, f"head.{k + 1}", [mod], cast), _unbiased(mod, y, cast))
    R_out = torch.zeros_like(last)
    R_out[b, pos] = last[b, pos] * safe_div(R, last[b, pos])

    inputs, attention = [None] * len(layers), [None] * len(layers)
    for li in range(len(layers) - 1, -1, -1):
        interrupts.check()  # a stop asked for: between layers
        lin = adapter.lrp_linears(layers[li])

        def weights(*roles, li=li, lin=lin):
            return adapter_rule_weights(adapter, f"{li}.{''.join(roles)}", [lin[r] for r in roles], cast)

        io = {k: (cast(i.detach()), cast(o.detach())) for k, (i, o) in rec.layers[li].items()}
        A = cast(gp.attentions[li].detach())
        x, yq = io["q"]
        yk, yv = io["k"][1], io["v"][1]
        ctx, yo = io["o"]
        y, y1f = io["f1"]
        h, y2f = io["f2"]

        # output sublayer: LN2 (identity) <- add(FFN out, y) ; FFN: f2 <- activation (identity) <- f1
        R_f, R_y_res = add_relprop(R_out, y2f, y)
        R_h = linear_relprop(R_f, h, weights("f2"), _unbiased(lin["f2"], y2f, cast))
        R_y_ffn = linear_relprop(R_h, y, weights("f1"), _unbiased(lin["f1"], y1f, cast))
        R_y = clone_relprop(y, R_y_ffn, R_y_res)

        # attention sublayer: LN1 (identity) <- add(attention out, x) ; o <- A.V <- (softmax identity) Q.K^T
        R_o, R_x_res = add_relprop(R_y, yo, x)
        R_ctx = _heads(linear_relprop(R_o, ctx, weights("o"), _unbiased(lin["o"], yo, cast)), H)
        V, Q, K = _heads(yv, H), _heads(yq, H), _heads(yk, H)
        S = safe_div(R_ctx, _heads(ctx, H))
        R_A = A * (S @ V.transpose(-1, -2)) / 2
        R_V = V * (A.transpose(-1, -2) @ S) / 2
        if head_mask is not None:
            scale = head_mask[li].to(R_A.dtype)[None, :].expand(R_A.shape[0], H)  # [B, H]
            if renormalise:  # the paper's variant: the kept heads carry the layer's whole context relevance
                kept = (R_ctx.sum((2, 3)) * scale).sum(-1)
                scale = scale * safe_div(R_ctx.sum((1, 2, 3)), kept)[:, None]
            R_A_down = R_A * scale[..., None, None]
            R_V = R_V * scale[..., None, None]
        else:
            R_A_down = R_A
        attention[li] = R_A_down if rollout_uses_masked else R_A
        S1 = safe_div(R_A_down, Q @ K.transpose(-1, -2))  # the reference ignores the 1/sqrt(d_h) scaling
        R_Q = Q * (S1 @ K) / 2
        R_K = K * (S1.transpose(-1, -2) @ Q) / 2

        # Q, K, V share the layer input: one fused rule over [W_q; W_k; W_v] sums the three relevances (the clone)
        W_qkv = weights("q", "k", "v")
        Y_qkv = torch.cat([_unbiased(lin[r], y_r, cast) for r, y_r in (("q", yq), ("k", yk), ("v", yv))], dim=-1)
        R_x_att = linear_relprop(torch.cat([_merge(R_Q), _merge(R_K), _merge(R_V)], dim=-1), x, W_qkv, Y_qkv)
        R_out = clone_relprop(x, R_x_att, R_x_res)
        inputs[li] = R_out.sum(-1)
    return Relevance(input=R_out, inputs=inputs, attention=attention)


def _unbiased(mod, y: torch.Tensor, cast=wide) -> torch.Tensor:
    """A Linear's recorded output less its bias: Y = X W^T, what the alpha1-beta0 rule's Z is built from."""
    return y - cast(mod.bias) if mod.bias is not None else y


def relevance(cap: Captured, adapter: Adapter, spec: Explained, target: torch.Tensor, head_mask=None,
              **options) -> Relevance:
    """The batch's propagation for (spec, target, mask, options), shared by the LRP methods of one batch."""
    gp = gradient_pass(cap, adapter, spec, lrp=True)
    mask_key = None if head_mask is None else tuple(map(tuple, head_mask.tolist()))
    key = ("relevance", spec, tuple(target.tolist()), mask_key, tuple(sorted(options.items())))
    with torch.no_grad():
        return cap.cached(key, lambda: propagate(gp, target, cap.explain_pos, head_mask, foil=cap.foil,
                                                 channel=QA_CHANNELS.get(cap.readout.field), **options))


# ----------------------------------------------------------------------------------------------------------------
class RelevanceMethod(Method):
    """Base of the methods read off one relevance propagation (lrp, partial_lrp, transatt, mask_lrp). Parameters:
    the Explained ones (mask_sep: Mask-LRP's [SEP]-masked explanation pass) and dtype, the precision (--lrp-dtype):
    "float64" (forward, backward and rules on the model's float64 twin), "mixed" (forward and backward on the twin,
    rules in float32: the poles of the rules' divisions sit in the activations, so their precision is what the
    result needs), "model" (everything in the model's dtype, the reference), "float32" (the model's dtype where it
    is float32 or wider, else a float32 copy of the model: the rules never run a half-precision forward), "auto"
    (``auto_dtype``: the stored params say which one ran). Class-specific: relevance starts at the target's one-hot logit."""

    class_specific = True
    needs = frozenset()  # the methods run their own forward (and backward, for the gradient-weighted ones)
    passes = frozenset({"forward", "lrp"})
    op_budget = 2.0  # of a bare forward + backward: the pass and one top-down sweep of the rules
    # the rules start at the head's explained output: a sequence head, a masked LM's vocabulary head, a QA head
    # (the decoders' next-token task has no rule set: pre-LN, METHODS.md section 9)
    tasks = frozenset({"classification", "regression", "masked-token", "qa"})
    pre_ln_ok = False
    # "auto": the rolled-out methods (transatt, mask_lrp) agree with float64 to a Spearman of 0.9998 in the model's
    # dtype on the shared model; lrp's input relevance and partial_lrp's lower layers do not (README): float64
    auto_dtype = "float32"  # the model's dtype where it is float32 or wider; a half-precision model's float32 copy

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
        return wide(torch.empty(0, dtype=next(adapter.model.parameters()).dtype)).dtype

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
        rel = relevance(cap, adapter, self.spec, target, self.head_mask(cap), rules_dtype=self.rules_dtype(adapter),
                        **self.options())
        gp = gradient_pass(cap, adapter, self.spec, lrp=True)
        with torch.no_grad():
            return self.from_relevance(rel, gp, target, cap)


def positive_head_mean(M: torch.Tensor) -> torch.Tensor:
    """mean_h (M^h)^+ : [B, H, n, n] -> [B, n, n] (the positive part taken per head, then the head mean)."""
    return M.clamp_min(0).mean(1)


def zero_self(rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Set each example's explained-token entry to 0 in [B, n] or [B, V, n] rows (Chefer/AttCAT/Mask-LRP [CLS,CLS] := 0)."""
    rows = rows.clone()
    b = torch.arange(rows.shape[0], device=rows.device)
    if rows.dim() == 2:
        rows[b, pos] = 0
    else:
        rows[b, :, pos] = 0
    return rows


def gradient_weighted_rollout(mats: list[torch.Tensor], mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """ROLL (METHODS.md 1.2) of per-layer [B, n, n] maps, start layer 1: rows ``pos`` of every prefix product of
    (M + I) / rowsum, with the explained token's own entry set to 0. [B, L, n]."""
    steps = [add_identity_row_normalise(valid_block(M, mask)) for M in mats]
    return zero_self(rows_of_products(steps, pos), pos)
