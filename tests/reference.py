"""Independent float64 reference computations of the method definitions, one example at a time.

Deliberately naive: Hugging Face's own output_attentions/output_hidden_states (no attrscope hooks), explicit full
matrix products, numpy. Used by the tests to check what attr-compute stores.
"""

from __future__ import annotations

import numpy as np
import torch


def forward64(model, input_ids: list[int], token_type_ids: list[int] | None = None):
    """float64 forward of one unpadded example: (logits [C], attentions [L, H, n, n], hidden_states [L+1, n, d])."""
    ids = torch.tensor([input_ids])
    kw = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "output_attentions": True,
          "output_hidden_states": True}
    if token_type_ids is not None and model.config.model_type != "distilbert":
        kw["token_type_ids"] = torch.tensor([token_type_ids])
    with torch.no_grad():
        out = model(**kw)
    att = torch.stack(out.attentions)[:, 0].numpy()
    hs = torch.stack(out.hidden_states)[:, 0].numpy()
    return out.logits[0].numpy(), att, hs


def raw_attention(att, pos=0):
    A = att.mean(axis=1)  # [L, n, n]
    return A[-1, pos], A[:, pos, :], A


def rollout(att, pos=0):
    A = att.mean(axis=1)
    n = A.shape[-1]
    R = np.eye(n)
    views, mats = [], []
    for l in range(A.shape[0]):
        M = A[l] + np.eye(n)
        M = M / M.sum(axis=1, keepdims=True)
        mats.append(M)
        R = M @ R  # later layers on the left
        views.append(R[pos])
    return views[-1], np.stack(views), np.stack(mats)


def norm(hs):
    return np.linalg.norm(hs[0], axis=-1)


def head_logits(model, h: np.ndarray) -> np.ndarray:
    """The model's head applied to each token vector h [n, d] as if it were the pooled token -> [n, C]."""
    m = model
    x = torch.from_numpy(h)
    with torch.no_grad():
        mt = m.config.model_type
        if mt == "bert":
            out = m.classifier(torch.tanh(m.bert.pooler.dense(x)))
        elif mt == "distilbert":
            out = m.classifier(torch.relu(m.pre_classifier(x)))
        elif mt in ("roberta", "electra"):
            head = m.classifier
            act = torch.tanh if mt == "roberta" else torch.nn.functional.gelu
            out = head.out_proj(act(head.dense(x)))
        else:
            raise ValueError(mt)
    return out.numpy()


def logat(model, hs, target):
    views = np.stack([head_logits(model, hs[l])[:, target] for l in range(1, hs.shape[0])])
    return views[-1], views


def normxlogit(model, hs, target):
    nv = norm(hs)
    _, views = logat(model, hs, target)
    views = nv[None] * views
    return views[-1], views


# ------------------------------------------------------------------ decomposition family (METHODS.md 1.1, 2, 3)
def _modules(model, l):
    """(value Linear, out Linear, LN1, LN2, ffn callable) of layer l, by the stock module names."""
    mt = model.config.model_type
    if mt == "distilbert":
        layer = model.distilbert.transformer.layer[l]
        return layer.attention.v_lin, layer.attention.out_lin, layer.sa_layer_norm, layer.output_layer_norm, layer.ffn
    layer = model.base_model.encoder.layer[l]
    return (layer.attention.self.value, layer.attention.output.dense, layer.attention.output.LayerNorm,
            layer.output.LayerNorm, lambda y: layer.output.dense(layer.intermediate(y)))


def _ln(s, ln, quirk=False):
    g, b = ln.weight.detach().numpy(), ln.bias.detach().numpy()
    c = s - s.mean(-1, keepdims=True)
    var = (c ** 2).mean(-1, keepdims=True)
    sigma = np.sqrt(var) if quirk else np.sqrt(var + ln.eps)
    return g * c / sigma + b, sigma[..., 0], g, b


def layer_terms(model, hs, att, l, quirk=False):
    """One example, layer l, float64: the vectors T_i(x_j) [n, n, d] and x~_{i<-j} [n, n, d], and the real
    y, y2, s, t, sigma1, sigma2, b_O, LN params. Recomputed from the weights, checked against HF's outputs."""
    val, out, ln1, ln2, ffn = _modules(model, l)
    x, A = hs[l], att[l]
    H, n, _ = A.shape
    d = x.shape[-1]
    dh = d // H
    W_V, b_V = val.weight.detach().numpy(), val.bias.detach().numpy()
    W_O, b_O = out.weight.detach().numpy(), out.bias.detach().numpy()
    v = (x @ W_V.T + b_V).reshape(n, H, dh)
    u = np.stack([v[:, h, :] @ W_O[:, h * dh:(h + 1) * dh].T for h in range(H)])  # [H, n, d]
    z = np.matmul(A.transpose(2, 1, 0), u.transpose(1, 0, 2)).transpose(1, 0, 2)  # z_{i<-j} = sum_h A^h_ij u^h_j
    zp = z.copy()
    zp[np.arange(n), np.arange(n)] += x  # z+_{i<-j}
    s = zp.sum(1) + b_O
    y, sigma1, g1, be1 = _ln(s, ln1, quirk)
    with torch.no_grad():
        t = y + ffn(torch.from_numpy(y)).numpy()
    y2, sigma2, g2, be2 = _ln(t, ln2, quirk)
    if not quirk:
        assert np.allclose(y2, hs[l + 1], atol=1e-8), "recomputed layer output differs from HF's"
    P = lambda a: a - a.mean(-1, keepdims=True)  # noqa: E731
    T = g1 * P(zp) / sigma1[:, None, None]
    Xt = g2 * P(T) / sigma2[:, None, None]
    return dict(z=z, zp=zp, T=T, Xt=Xt, y=y, y2=y2, s=s, t=t, sigma1=sigma1, sigma2=sigma2, b_O=b_O,
                g1=g1, be1=be1, g2=g2, be2=be2, A=A)


def _prod_views(mats, pos=0, normalise=True):
    R = np.eye(mats[0].shape[0])
    views = []
    for M in mats:
        R = M @ R
        row = R[pos]
        views.append(row / row.sum() if normalise else row)
    return np.stack(views)


def _rownorm(M):
    return M / M.sum(-1, keepdims=True)


def decomposition_methods(model, hs, att, names, pos=0, quirk=False, row_normalise_resln=False, ln2=False):
    """{name: (final [n], views [L, n], matrices [L, n, n])} of decomposition-family methods, by their definitions."""
    Ds = [layer_terms(model, hs, att, l, quirk=quirk) for l in range(att.shape[0])]
    return {name: _method_from_terms(Ds, name, pos, quirk, row_normalise_resln, ln2) for name in names}


def _method_from_terms(Ds, name, pos, quirk, row_normalise_resln, ln2):
    mats = []
    for D in Ds:
        n = D["A"].shape[-1]
        if name in ("alti", "alti_l2"):
            o = 1 if name == "alti" else 2
            if ln2:
                vecs, y = D["Xt"], D["y2"]
            elif quirk:  # y rebuilt as sum_j T_i(x_j) + b~_i
                b_tilde = D["g1"] * (D["b_O"] - D["b_O"].mean()) / D["sigma1"][:, None] + D["be1"]
                vecs, y = D["T"], D["T"].sum(1) + b_tilde
            else:
                vecs, y = D["T"], D["y"]
            dist = np.linalg.norm(y[:, None, :] - vecs, ord=o, axis=-1)
            c = np.maximum(0, np.linalg.norm(y, ord=o, axis=-1)[:, None] - dist)
            M = _rownorm(c)
        elif name == "norm_n":
            M = np.linalg.norm(D["z"], axis=-1)
        elif name == "norm_res":
            M = np.linalg.norm(D["zp"], axis=-1)
        elif name == "norm_resln":
            M = np.linalg.norm(D["T"], axis=-1)
            M = _rownorm(M) if row_normalise_resln else M
        elif name == "globenc":
            M = np.linalg.norm(D["Xt"], axis=-1)
        elif name == "norm_fixedres":
            M = 0.5 * _rownorm(np.linalg.norm(D["z"], axis=-1)) + 0.5 * np.eye(n)
        elif name == "w_fixedres":
            M = 0.5 * D["A"].mean(0) + 0.5 * np.eye(n)
        elif name == "w_res":
            Xt = D["Xt"]
            own = Xt[np.arange(n), np.arange(n)]
            other = np.array([np.linalg.norm(Xt[i].sum(0) - Xt[i, i]) for i in range(n)])
            r = other / (other + np.linalg.norm(own, axis=-1))
            Ab = D["A"].mean(0)
            off = Ab - np.diag(np.diag(Ab))
            rs = off.sum(-1, keepdims=True)
            off = off / np.where(rs > 0, rs, 1)
            M = r[:, None] * off + np.diag(1 - r)
        else:
            raise ValueError(name)
        mats.append(M)
    views = _prod_views(mats, pos)
    return views[-1], views, np.stack(mats)


# ------------------------------------------------------------------ pre-LN (GPT-2) decomposition (METHODS.md 1.1, 9)
def gpt2_layer_terms(model, hs, att, l):
    """One example, GPT-2 layer l, float64, from the weights: z_{i<-j}, z+_{i<-j} and r (residual after attention).
    Conv1D computes x @ W + b with W [in, out]."""
    block = model.transformer.h[l]
    x, A = hs[l], att[l]
    H, n, _ = A.shape
    d = x.shape[-1]
    dh = d // H
    ln1 = block.ln_1
    g, b = ln1.weight.detach().numpy(), ln1.bias.detach().numpy()
    c = x - x.mean(-1, keepdims=True)
    xn = g * c / np.sqrt((c ** 2).mean(-1, keepdims=True) + ln1.eps) + b
    Wqkv, bqkv = block.attn.c_attn.weight.detach().numpy(), block.attn.c_attn.bias.detach().numpy()
    v = (xn @ Wqkv + bqkv)[:, 2 * d:].reshape(n, H, dh)
    Wp, bp = block.attn.c_proj.weight.detach().numpy(), block.attn.c_proj.bias.detach().numpy()
    u = np.stack([v[:, h, :] @ Wp[h * dh:(h + 1) * dh, :] for h in range(H)])  # [H, n, d]
    z = np.matmul(A.transpose(2, 1, 0), u.transpose(1, 0, 2)).transpose(1, 0, 2)
    zp = z.copy()
    zp[np.arange(n), np.arange(n)] += x
    r = zp.sum(1) + bp
    with torch.no_grad():
        out = r + block.mlp(block.ln_2(torch.from_numpy(r))).numpy()
    if l + 1 < len(model.transformer.h):  # the last hidden state is ln_f's output
        assert np.allclose(out, hs[l + 1], atol=1e-8), "recomputed block output differs from HF's"
    return dict(z=z, zp=zp, r=r, A=A)


def llama_layer_terms(model, hs, att, l):
    """As gpt2_layer_terms for a Llama layer: values of the shared key/value head repeated for each query head,
    o_proj without bias."""
    layer = model.model.layers[l]
    x, A = hs[l], att[l]
    H, n, _ = A.shape
    with torch.no_grad():  # HF's RMSNorm runs in float32 even in a float64 model: use the module itself
        xn = layer.input_layernorm(torch.from_numpy(x)).numpy()
    Wv = layer.self_attn.v_proj.weight.detach().numpy()  # [kv * dh, d]
    Wo = layer.self_attn.o_proj.weight.detach().numpy()  # [d, H * dh]
    dh = Wo.shape[1] // H
    kv = Wv.shape[0] // dh
    v = (xn @ Wv.T).reshape(n, kv, dh)
    u = np.stack([v[:, h // (H // kv), :] @ Wo[:, h * dh:(h + 1) * dh].T for h in range(H)])  # [H, n, d]
    z = np.matmul(A.transpose(2, 1, 0), u.transpose(1, 0, 2)).transpose(1, 0, 2)
    zp = z.copy()
    zp[np.arange(n), np.arange(n)] += x
    r = zp.sum(1)
    with torch.no_grad():
        out = r + layer.mlp(layer.post_attention_layernorm(torch.from_numpy(r))).numpy()
    if l + 1 < len(model.model.layers):  # the last hidden state is the final norm's output
        assert np.allclose(out, hs[l + 1], atol=1e-8), "recomputed block output differs from HF's"
    return dict(z=z, zp=zp, r=r, A=A)


def gpt2_methods(model, hs, att, names, pos):
    """{name: (final, views, matrices)} of the pre-LN decomposition methods (GPT-2 or Llama), by their definitions."""
    terms = llama_layer_terms if model.config.model_type == "llama" else gpt2_layer_terms
    Ds = [terms(model, hs, att, l) for l in range(att.shape[0])]
    out = {}
    for name in names:
        mats = []
        for D in Ds:
            n = D["A"].shape[-1]
            if name in ("alti", "alti_l2"):
                o = 1 if name == "alti" else 2
                dist = np.linalg.norm(D["r"][:, None, :] - D["zp"], ord=o, axis=-1)
                M = _rownorm(np.maximum(0, np.linalg.norm(D["r"], ord=o, axis=-1)[:, None] - dist))
            elif name == "norm_n":
                M = np.linalg.norm(D["z"], axis=-1)
            elif name == "norm_res":
                M = np.linalg.norm(D["zp"], axis=-1)
            elif name == "norm_fixedres":
                M = 0.5 * _rownorm(np.linalg.norm(D["z"], axis=-1)) + 0.5 * np.eye(n)
            else:
                raise ValueError(name)
            mats.append(M)
        views = _prod_views(mats, pos)
        out[name] = (views[-1], views, np.stack(mats))
    return out


# ------------------------------------------------------------------ gradient family (METHODS.md 2.4, 4.2)
# The explained function F: the pre-softmax logit of the target class as a function of X, the embedding-module output
# [1, n, d] (word + position + type embeddings after the embedding LayerNorm) of one unpadded BERT example. F is
# evaluated by calling the submodules directly: the encoder with no attention mask (an unpadded example's extended
# mask is all zeros), then the pooler and the classifier (dropout is inactive in eval mode).
def bert_embedding_output(model, input_ids: list[int], token_type_ids: list[int] | None = None) -> torch.Tensor:
    """X = model.bert.embeddings(ids, types) of one example: [1, n, d] (no graph)."""
    ids = torch.tensor([input_ids])
    types = torch.zeros_like(ids) if token_type_ids is None else torch.tensor([token_type_ids])
    with torch.no_grad():
        return model.bert.embeddings(input_ids=ids, token_type_ids=types)


def bert_logit(model, X: torch.Tensor, target: int) -> torch.Tensor:
    """F(X): the target's logit at embedding-module output X [1, n, d] (a scalar, with X's graph)."""
    h = model.bert.encoder(X).last_hidden_state
    return model.classifier(model.bert.pooler(h))[0, target]


def bert_logit_grad(model, X: torch.Tensor, target: int) -> tuple[float, np.ndarray]:
    """(F(X), dF/dX [n, d]) by torch.autograd.grad."""
    X = X.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        F = bert_logit(model, X, target)
        (g,) = torch.autograd.grad(F, X)
    return float(F.detach()), g[0].numpy()


def mask_baseline_ids(input_ids: list[int], mask_token_id: int, keep_ids) -> list[int]:
    """The same sequence with every token not in ``keep_ids`` ([CLS], [SEP]) replaced by [MASK]."""
    keep = set(keep_ids)
    return [t if t in keep else mask_token_id for t in input_ids]


def gradient_methods(model, input_ids: list[int], target: int, mask_token_id: int, keep_ids, steps: int,
                     token_type_ids: list[int] | None = None) -> dict:
    """{grad_l2, gxi_l2, gxi_mean, ig_l2, ig_mean: [n]; ig_delta, F = F(X), F_baseline = F(X'): float; grad: dF/dX
    [n, d]} of one example (METHODS.md 2.4): w.r.t. the embedding-module output, the target's logit, the [MASK]
    baseline X' (tokens in ``keep_ids`` kept), Gauss-Legendre IG on [0, 1] evaluated one node at a time."""
    X = bert_embedding_output(model, input_ids, token_type_ids)
    F, g = bert_logit_grad(model, X, target)
    x = X[0].numpy()
    out = {}
    a = np.linalg.norm(g, axis=-1)
    out["grad_l2"] = a / a.sum()
    out["gxi_l2"] = np.linalg.norm(x * g, axis=-1)
    out["gxi_mean"] = np.abs(x * g).mean(-1)

    Xb = bert_embedding_output(model, mask_baseline_ids(input_ids, mask_token_id, keep_ids), token_type_ids)
    xb = Xb[0].numpy()
    nodes, weights = np.polynomial.legendre.leggauss(steps)
    avg = np.zeros_like(x)
    for node, weight in zip(nodes, weights):
        alpha, w = (node + 1) / 2, weight / 2
        _, gk = bert_logit_grad(model, Xb + alpha * (X - Xb), target)
        avg += w * gk
    ig = (x - xb) * avg  # [n, d]
    out["ig_l2"] = np.linalg.norm(ig, axis=-1)
    out["ig_mean"] = np.abs(ig).mean(-1)
    with torch.no_grad():
        Fb = float(bert_logit(model, Xb, target))
    out["ig_delta"] = float(ig.sum()) - (F - Fb)
    out["F"], out["F_baseline"], out["grad"] = F, Fb, g
    return out


def cat_attcat(model, input_ids: list[int], target: int, token_type_ids: list[int] | None = None) -> dict:
    """{cat, attcat: (final [n], layer terms [L, n]); logits [C]; grad_h0: dF/dh^0 [n, d]} of one example (METHODS.md
    4.2, REF layers = the inputs h^0..h^{L-1}; alpha^l_j = attention token j receives, mean over heads then query
    rows): one eager forward of the whole model with HF's output_hidden_states/output_attentions, one autograd.grad
    of the target logit w.r.t. hidden_states[:L]. No special-token masking, all-ones attention mask."""
    ids = torch.tensor([input_ids])
    types = torch.zeros_like(ids) if token_type_ids is None else torch.tensor([token_type_ids])
    with torch.enable_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=types,
                    output_hidden_states=True, output_attentions=True)
        L = len(out.attentions)
        hs = out.hidden_states[:L]
        grads = torch.autograd.grad(out.logits[0, target], hs)
    cat_l = np.stack([(gl[0] * hl[0]).sum(-1).detach().numpy() for gl, hl in zip(grads, hs)])  # [L, n]
    alpha = np.stack([a[0].detach().numpy().mean(0).mean(0) for a in out.attentions])  # heads, then query rows
    att_l = cat_l * alpha
    return {"cat": (cat_l.sum(0), cat_l), "attcat": (att_l.sum(0), att_l), "logits": out.logits[0].detach().numpy(),
            "grad_h0": grads[0][0].numpy()}


# ---------------------------------------------------------------------------------------------------------------
# LRP (Chefer's rules, METHODS.md 5.1), Mask-LRP (6.2-6.3), GAE (5.2): one example, activations recomputed from the
# weights (checked against HF's hidden states), every rule in its textbook form (four products for a Linear).
def _np(t):
    return t.detach().numpy()


def _sdiv(a, b):
    den = b + 1e-9
    den = np.where(den == 0, 1e-9, den)
    return np.where(b != 0, a / den, 0.0)


def _lin_rel(R, X, W):
    """alpha1-beta0: Z = X+ W+^T + X- W-^T, R_in = X+ (S W+) + X- (S W-)."""
    Xp, Xn, Wp, Wn = np.maximum(X, 0), np.minimum(X, 0), np.maximum(W, 0), np.minimum(W, 0)
    S = _sdiv(R, Xp @ Wp.T + Xn @ Wn.T)
    return Xp * (S @ Wp) + Xn * (S @ Wn)


def _add_rel(R, a_in, b_in):
    S = _sdiv(R, a_in + b_in)
    a, b = a_in * S, b_in * S
    both = abs(a.sum()) + abs(b.sum())
    a = a * _sdiv(_sdiv(abs(a.sum()), both) * R.sum(), a.sum())
    b = b * _sdiv(_sdiv(abs(b.sum()), both) * R.sum(), b.sum())
    return a, b


def _lrp_modules(model, l):
    if model.config.model_type == "distilbert":
        L = model.distilbert.transformer.layer[l]
        at = L.attention
        return dict(q=at.q_lin, k=at.k_lin, v=at.v_lin, o=at.out_lin, ln1=L.sa_layer_norm, f1=L.ffn.lin1,
                    act=L.ffn.activation, f2=L.ffn.lin2, ln2=L.output_layer_norm)
    L = model.base_model.encoder.layer[l]
    return dict(q=L.attention.self.query, k=L.attention.self.key, v=L.attention.self.value, o=L.attention.output.dense,
                ln1=L.attention.output.LayerNorm, f1=L.intermediate.dense, act=L.intermediate.intermediate_act_fn,
                f2=L.output.dense, ln2=L.output.LayerNorm)


def _head_modules(model):
    mt = model.config.model_type
    if mt == "bert":
        return model.bert.pooler.dense, torch.tanh, model.classifier
    if mt == "distilbert":
        return model.pre_classifier, torch.relu, model.classifier
    act = torch.tanh if mt != "electra" else model.classifier.activation
    return model.classifier.dense, act, model.classifier.out_proj


def lrp_reference(model, input_ids: list[int], target: int, head_mask=None, rollout_uses_masked=False,
                  renormalise=False, token_type_ids=None) -> dict:
    """{"input": R at the encoder input [n, d], "inputs": [L, n] per-layer input sums, "RA": [L, H, n, n],
    "grads": dF/dA [L, H, n, n] (autograd through HF), "att": A [L, H, n, n]}."""
    ids = torch.tensor([input_ids])
    kw = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "output_attentions": True,
          "output_hidden_states": True}
    if token_type_ids is not None and model.config.model_type != "distilbert":
        kw["token_type_ids"] = torch.tensor([token_type_ids])
    with torch.enable_grad():
        out = model(**kw)
        grads = torch.autograd.grad(out.logits[0, target], out.attentions)
    att = np.stack([_np(a[0]) for a in out.attentions])
    hs = [_np(h[0]) for h in out.hidden_states]
    Lnum, H, n, _ = att.shape
    W = lambda m: _np(m.weight)  # noqa: E731
    B = lambda m: _np(m.bias)  # noqa: E731
    acts = []
    with torch.no_grad():
        for l in range(Lnum):
            m = _lrp_modules(model, l)
            x = hs[l]
            q, k, v = (x @ W(m[r]).T + B(m[r]) for r in ("q", "k", "v"))
            dh = x.shape[1] // H
            Qh, Kh, Vh = (t.reshape(n, H, dh).transpose(1, 0, 2) for t in (q, k, v))
            S = Qh @ Kh.transpose(0, 2, 1) / np.sqrt(dh)
            A = np.exp(S - S.max(-1, keepdims=True))
            A = A / A.sum(-1, keepdims=True)
            assert np.allclose(A, att[l], atol=1e-10)
            ctx = (A @ Vh).transpose(1, 0, 2).reshape(n, -1)
            o = ctx @ W(m["o"]).T + B(m["o"])
            y = _np(m["ln1"](torch.from_numpy(o + x)))
            f1 = y @ W(m["f1"]).T + B(m["f1"])
            hh = _np(m["act"](torch.from_numpy(f1)))
            f2 = hh @ W(m["f2"]).T + B(m["f2"])
            xo = _np(m["ln2"](torch.from_numpy(f2 + y)))
            assert np.allclose(xo, hs[l + 1], atol=1e-10), "recomputed layer output differs from HF's"
            acts.append(dict(x=x, Qh=Qh, Kh=Kh, Vh=Vh, A=A, ctx=ctx, o=o, y=y, hh=hh, f2=f2, m=m))
        dense, act, clf = _head_modules(model)
        pooled_in = hs[-1][0]
        pooled = _np(act(torch.from_numpy(pooled_in @ W(dense).T + B(dense))))
    R = np.zeros(clf.weight.shape[0])
    R[target] = 1.0
    R = _lin_rel(R[None], pooled[None], W(clf))
    R = _lin_rel(R, pooled_in[None], W(dense))[0]
    Rout = np.zeros_like(hs[-1])
    Rout[0] = pooled_in * _sdiv(R, pooled_in)
    RA, inputs = [None] * Lnum, [None] * Lnum
    for l in range(Lnum - 1, -1, -1):
        a = acts[l]
        m = a["m"]
        Rf, Ry_res = _add_rel(Rout, a["f2"], a["y"])
        Ry = _lin_rel(_lin_rel(Rf, a["hh"], W(m["f2"])), a["y"], W(m["f1"]))
        Ry = a["y"] * (_sdiv(Ry, a["y"]) + _sdiv(Ry_res, a["y"]))
        Ro, Rx_res = _add_rel(Ry, a["o"], a["x"])
        Rctx = _lin_rel(Ro, a["ctx"], W(m["o"])).reshape(n, H, -1).transpose(1, 0, 2)  # [H, n, dh]
        Sc = _sdiv(Rctx, a["A"] @ a["Vh"])
        R_A = a["A"] * (Sc @ a["Vh"].transpose(0, 2, 1)) / 2
        R_V = a["Vh"] * (a["A"].transpose(0, 2, 1) @ Sc) / 2
        scale = np.ones(H) if head_mask is None else np.asarray(head_mask[l], dtype=float)
        if head_mask is not None and renormalise:
            scale = scale * _sdiv(Rctx.sum(), (Rctx.sum((1, 2)) * scale).sum())
        R_Ad, R_V = R_A * scale[:, None, None], R_V * scale[:, None, None]
        RA[l] = R_Ad if rollout_uses_masked else R_A
        S1 = _sdiv(R_Ad, a["Qh"] @ a["Kh"].transpose(0, 2, 1))
        R_Q = a["Qh"] * (S1 @ a["Kh"]) / 2
        R_K = a["Kh"] * (S1.transpose(0, 2, 1) @ a["Qh"]) / 2
        merge = lambda t: t.transpose(1, 0, 2).reshape(n, -1)  # noqa: E731
        x = a["x"]
        Rq = _lin_rel(merge(R_Q), x, W(m["q"]))
        Rk = _lin_rel(merge(R_K), x, W(m["k"]))
        Rv = _lin_rel(merge(R_V), x, W(m["v"]))
        Rout = x * (_sdiv(Rq + Rk + Rv, x) + _sdiv(Rx_res, x))
        inputs[l] = Rout.sum(-1)
    return {"input": Rout, "inputs": np.stack(inputs), "RA": np.stack(RA),
            "grads": np.stack([_np(g[0]) for g in grads]), "att": att}


def _roll_views(maps, pos=0, zero_self=True):
    n = maps.shape[-1]
    R = np.eye(n)
    views = []
    for M in maps:
        M = M + np.eye(n)
        R = (M / M.sum(-1, keepdims=True)) @ R
        row = R[pos].copy()
        if zero_self:
            row[pos] = 0
        views.append(row)
    return np.stack(views)


def lrp_methods(ref: dict, pos: int = 0) -> dict:
    """{name: (final [n], views [V, n], matrices or None)} for lrp, partial_lrp, transatt (or mask_lrp, given the
    masked propagation's ref) and gae, by their definitions."""
    out = {}
    views = ref["inputs"].copy()
    views[:, pos] = 0
    out["lrp"] = (views[0], views, None)
    P = np.maximum(ref["RA"], 0).mean(1)  # [L, n, n]
    pv = P[:, pos, :].copy()
    pv[:, pos] = 0
    out["partial_lrp"] = (pv[-1], pv, P)
    T = np.maximum(ref["grads"] * ref["RA"], 0).mean(1)
    tv = _roll_views(T, pos)
    out["transatt"] = (tv[-1], tv, T)
    G = np.maximum(ref["grads"] * ref["att"], 0).mean(1)
    n = G.shape[-1]
    R = np.eye(n)
    gv = []
    for M in G:
        R = R + M @ R
        gv.append(R[pos].copy())
    gv = np.stack(gv)
    out["gae"] = (gv[-1], gv, G)
    return out


def gae_reference(model, input_ids: list[int], target: int) -> tuple[np.ndarray, np.ndarray]:
    """GAE (Chefer 2021b) of one example from HF's own attentions and autograd: (final [n], views [L, n])."""
    ids = torch.tensor([input_ids])
    with torch.enable_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True)
        grads = torch.autograd.grad(out.logits[0, target], out.attentions)
    n = ids.shape[1]
    R = np.eye(n)
    views = []
    for A, G in zip(out.attentions, grads):
        M = np.maximum(_np(G[0]) * _np(A[0]), 0).mean(0)
        R = R + M @ R
        views.append(R[0].copy())
    return views[-1], np.stack(views)


def positional_statistics(model, tokenizer, texts, exclude_self=True) -> tuple[np.ndarray, int]:
    """Mask-LRP's positional statistic by its definition, one example at a time: (freq_max [L, H], n_queries), with
    freq = (queries whose argmax key is at offset o) / (all queries), maximised over o (o != 0 if exclude_self)."""
    counts, total = {}, 0
    for t in texts:
        enc = tokenizer(t, return_tensors="pt")
        with torch.no_grad():
            att = torch.stack(model(**enc, output_attentions=True).attentions)[:, 0]  # [L, H, n, n]
        n = att.shape[-1]
        off = (att.argmax(-1) - torch.arange(n)).numpy()
        total += n
        for o in np.unique(off):
            counts[int(o)] = counts.get(int(o), 0) + (off == o).sum(-1)
    freq_max = np.zeros(att.shape[:2])
    for o, c in counts.items():
        if not (exclude_self and o == 0):
            freq_max = np.maximum(freq_max, c / total)
    return freq_max, total


# ---------------------------------------------------------------------------------------------------------------
# Comprehensiveness / sufficiency, the ALTI reference procedure (METHODS.md 8.1), one example and one perturbed
# input at a time through plain transformers.
def alti_comp_suff(model, token_ids: list[int], scores, pred: int) -> tuple[float, float]:
    import math

    n = len(token_ids)
    # dense ranks, then positions by rank descending with ties in position order (a stable sort)
    uniq = sorted(set(float(x) for x in scores))
    dense = [uniq.index(float(x)) + 1 for x in scores]
    order = sorted(range(n), key=lambda k: dense[k], reverse=True)
    order.remove(0)
    order.remove(n - 1)
    m = len(order)
    levels = [0] + [math.ceil(m * b) for b in (0.01, 0.05, 0.1, 0.2, 0.5)]

    def prob(kept):
        ids = [token_ids[0]] + [token_ids[k] for k in range(n) if k in kept] + [token_ids[-1]]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].double()
        return float(torch.softmax(logits, -1)[pred])

    comp, suff = [], []
    lo, hi = 1.0, 0.0
    for j in levels:
        p = prob(set(order[j:]))
        if p <= lo:
            lo = p
        comp.append(lo)
        p = prob(set(order[:j]))
        if p > hi:
            hi = p
        suff.append(hi)
    fx = comp[0]
    return (sum(fx - c for c in comp[1:]) / 6, sum(fx - s for s in suff[1:]) / 6)
