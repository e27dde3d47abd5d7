"""AttGrads (METHODS.md 4.3, 14.12).

``variant="ref"`` (default, AttCAT's ``attn_gradcam``, Grad-CAM style on the last layer): per head
w_h = mean_{i,j} dF/dA^{L,h}_ij over the real block; map = (mean_h A^{L,h} w_h)^+, min-max normalised over the
real block; the explained ([CLS]) row, with its own entry set to 0.
``variant="gradsam"`` (Grad-SAM as the AttCAT paper cites it): mean over layers, heads and real query rows of
A ⊙ ReLU(dF/dA)."""

from __future__ import annotations

import torch

from ..options import Option
from ._internals.aggregate import valid_block
from ._internals.base import MethodResult
from ._internals.checkpointed import AttentionTerm
from ._internals.gradients import GradientMethod, valid_mean_rows


def gradcam_heads(A, dA, cap):
    """The reference variant's sum over the heads given of the last layer's A^h w_h ([1, B, h, n, n] -> [1, B, n, n]),
    w_h the mean of dF/dA^h over the real block."""
    A, G = A[0], dA[0]
    block = valid_block(torch.ones_like(A[:, 0]), cap.mask)  # [B, n, n] 1 on real (i, j)
    w = (G * block[:, None]).sum((-2, -1)) / block.sum((-2, -1))[:, None]  # [B, h]
    return (A * w[..., None, None]).sum(1)[None]


def gradcam_row(mean, cap):
    """The reference variant of M = mean_h A^h w_h ([1, B, n, n]): the explained row [1, B, n]."""
    b = torch.arange(cap.mask.shape[0], device=cap.mask.device)
    block = valid_block(torch.ones_like(mean[0]), cap.mask)
    M = mean[0].clamp_min(0)  # [B, n, n]
    big = torch.finfo(M.dtype).max
    lo = torch.where(block > 0, M, big).amin((-2, -1), keepdim=True)
    hi = torch.where(block > 0, M, -big).amax((-2, -1), keepdim=True)
    M = (M - lo) / (hi - lo).clamp_min(torch.finfo(M.dtype).tiny) * block
    row = M[b, cap.explain_pos].clone()
    row[b, cap.explain_pos] = 0
    return row[None]


def gradsam_rows(A, dA, cap):
    """Grad-SAM's layer terms: A * ReLU(dF/dA), summed over the heads given (the term's mean divides), mean over the
    real query rows [K, B, n]."""
    return valid_mean_rows(dA.clamp_min(0).mul_(A).sum(2).transpose(0, 1), cap.mask).transpose(0, 1)


GRADCAM = AttentionTerm("attgrads", heads=gradcam_heads, finish=gradcam_row, last=True)
GRADSAM = AttentionTerm("attgrads_gradsam", heads=gradsam_rows)


class AttGrads(GradientMethod):
    name = "attgrads"
    description = "attention weighted by its gradient (last layer, Grad-CAM style; or Grad-SAM over all layers)"
    reference = "Qiang et al. (2022) baselines; Barkan et al. (2021) Grad-SAM; METHODS.md 4.3"
    run_options = (
        Option("attgrads_variant", choices=("ref", "gradsam"), param="variant", passed="set", resume=True,
               help="attgrads: last-layer Grad-CAM style (reference) or Grad-SAM over all layers [default: ref]."),
    )

    def __init__(self, **params):
        super().__init__(**params)
        self.gradsam = self.params.get("variant", "ref") == "gradsam"
        self.attention_terms = (GRADSAM if self.gradsam else GRADCAM,)

    def from_grads(self, gp, grads, cap):
        if self.gradsam:
            terms = gp.term(grads, GRADSAM)  # [L, B, n]
            return MethodResult(scores=terms.mean(0) * cap.mask)
        return MethodResult(scores=gp.term(grads, GRADCAM)[0])
