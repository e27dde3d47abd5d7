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
