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
from ._internals.gradients import GradientMethod, stacked, valid_mean_rows, wide


class AttGrads(GradientMethod):
    name = "attgrads"
    description = "attention weighted by its gradient (last layer, Grad-CAM style; or Grad-SAM over all layers)"
    reference = "Qiang et al. (2022) baselines; Barkan et al. (2021) Grad-SAM; METHODS.md 4.3"
    run_options = (
        Option("attgrads_variant", choices=("ref", "gradsam"), param="variant", passed="set", resume=True,
               help="attgrads: last-layer Grad-CAM style (reference) or Grad-SAM over all layers [default: ref]."),
    )

    def from_grads(self, gp, grads, cap):
        b = torch.arange(cap.mask.shape[0], device=cap.mask.device)
        if self.params.get("variant", "ref") == "gradsam":
            A = stacked([a.detach() for a in gp.attentions])  # [L, B, H, n, n]
            terms = valid_mean_rows(stacked(grads["attentions"]).clamp_min_(0).mul_(A).mean(2).transpose(0, 1),
                                    cap.mask)  # [B, L, n]
            return MethodResult(scores=terms.mean(1) * cap.mask)
        A, G = wide(gp.attentions[-1]), wide(grads["attentions"][-1])
        block = valid_block(torch.ones_like(A[:, 0]), cap.mask)  # [B, n, n] 1 on real (i, j)
        w = (G * block[:, None]).sum((-2, -1)) / block.sum((-2, -1))[:, None]  # [B, H]
        M = (A * w[..., None, None]).mean(1).clamp_min(0)  # [B, n, n]
        big = torch.finfo(M.dtype).max
        lo = torch.where(block > 0, M, big).amin((-2, -1), keepdim=True)
        hi = torch.where(block > 0, M, -big).amax((-2, -1), keepdim=True)
        M = (M - lo) / (hi - lo).clamp_min(torch.finfo(M.dtype).tiny) * block
        row = M[b, cap.explain_pos].clone()
        row[b, cap.explain_pos] = 0
        return MethodResult(scores=row)
