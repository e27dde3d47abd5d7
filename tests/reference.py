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
