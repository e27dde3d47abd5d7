"""IG_l2 (METHODS.md 2.4): integrated gradients on the embedding-module output, L2 norm over the hidden dims.
The completeness delta sum IG - (F(x) - F(x')) is stored per example ("ig_delta")."""

from __future__ import annotations

import torch

from ..options import Option, at_least
from ._internals.gradients import GRADIENT_INPUT, IntegratedGradientsMethod


class IGL2(IntegratedGradientsMethod):
    name = "ig_l2"
    description = "integrated gradients from a [MASK] baseline, L2 norm over each token's embedding dims"
    reference = "Sundararajan et al. (2017); Ferrando et al. (2022) baselines; METHODS.md 2.4"
    run_options = (
        Option("ig_steps", type=int, metavar="M", param="steps", passed="given", resume=True, check=at_least(1),
               help="Integrated gradients: quadrature steps [default: 50, or the preset's]."),
        Option("ig_rule", choices=("gausslegendre", "riemann"), param="rule", passed="given", resume=True,
               help="Integrated gradients: quadrature rule [default: gausslegendre]."),
        Option("ig_baseline", choices=("mask", "zero"), param="baseline", passed="given", resume=True,
               help="Integrated gradients: [MASK]-sequence or zero baseline [default: mask, or the preset's]."),
        GRADIENT_INPUT,
        Option("ig_memory_mb", type=int, metavar="MB", param="memory_mb", resume=True, check=at_least(1),
               help="Integrated gradients: memory for the (example, step) rows of one forward/backward "
                    "[default: 1024 on the CPU, 1/8 of the GPU's memory on a GPU]."),
    )

    def aggregate(self, attr):
        return torch.linalg.vector_norm(attr, dim=-1)
