"""ALTI (Ferrando et al. 2022; METHODS.md 2.2-2.3): Aggregation of Layer-wise Token-to-token Interactions.

Per layer: T_i(x_j) = gamma1 * P z+_{i<-j} / sigma1_i (the LN1-linearised contribution of token j to the
attention-block output y_i), d_ij = ||y_i - T_i(x_j)||_1, c_ij = max(0, ||y_i||_1 - d_ij), C_ij = c_ij / sum_k c_ik.
Final = row of the explained token in C^L ... C^1 (no identity: the residual is inside T_i(x_i)).

Options: ``ln2`` (ALTI+LN2, the reference's "ours2": vectors taken through LN2, distances to the real LN2 output),
``eps_quirk`` (the reference's sigma without LayerNorm epsilon, y rebuilt from the contributions; --preset alti),
``pairwise_eps`` (the reference's distance is F.pairwise_distance, which adds 1e-6 to every component of T - y;
--preset alti; L1 only),
``memory_mb`` (the blocks of the L1 proximities fit this budget),
``l1_path`` ("auto": on a GPU the fused Triton kernel where it runs, on the CPU the dense vectors or their exact
pruning, whichever is cheaper for the batch; "dense", "pruned", "kernel": one of them; ``_internals/l1_proximity.py``).
"""

from __future__ import annotations

import torch

from ..errors import AttrscopeError
from ..options import Option, at_least
from ._internals.aggregate import valid_pairs
from ._internals.budget import work_bytes
from ._internals.decomposition import LayerParts, operand_weights
from ._internals.l1_proximity import PATHS, l1_proximities
from ._internals.layerwise import LayerwiseProduct, row_normalise


CPU_BLOCK_BYTES = 8 << 20  # the dense form's blocks of source tokens stay in cache (measured on the 2-core CPU)


class Alti(LayerwiseProduct):
    name = "alti"
    description = "ALTI: L1 proximity of each token's LN1-linearised contribution, rolled out over layers"
    reference = "Ferrando, Gallego, Costa-jussa (2022), EMNLP; METHODS.md 2.2-2.3"
    row_stochastic = True
    # a streamed layer's attention kept in the model's dtype: the proximities widen a block of sources at a time
    narrow_attention = True
    cost_exponent = 2  # [n, n, d] transformed vectors and their distances
    run_options = (
        Option("alti_ln2", False, type=bool, param="ln2", passed="set", resume=True,
               help="ALTI+LN2: alti and alti_l2 measure through LN2 (METHODS.md 2.2)."),
        Option("memory_mb", type=int, metavar="MB", param="memory_mb", resume=True, check=at_least(1),
               help="Memory budget of ALTI's blocks (the dense form's source tokens, the pruned form's chunks) "
                    "[default: 8 on the CPU, 1/64 of the GPU's memory on a GPU]."),
    )

    @classmethod
    def memory_per_example(cls, shape, params):
        # the dense form's source-token blocks at one token per block: a [B, 1, n, d] block and its difference
        return shape.n * 2 * shape.d * shape.itemsize

    def __init__(self, ln2: bool = False, eps_quirk: bool = False, memory_mb: int | None = None, l1_path: str = "auto",
                 **params):
        if l1_path not in PATHS:
            raise ValueError(f"l1_path must be one of {PATHS}, not {l1_path!r}")
        super().__init__(ln2=ln2, eps_quirk=eps_quirk, memory_mb=memory_mb, l1_path=l1_path, **params)
        self.eps_quirk = eps_quirk

    def check_architecture(self, adapter) -> None:
        super().check_architecture(adapter)
        if adapter.pre_ln and self.params["ln2"]:
            raise AttrscopeError(f"--alti-ln2 is not defined for the pre-LN architecture '{adapter.config.model_type}' "
                                 "(LN2 is not on its residual path): drop --alti-ln2")

    def contributions(self, p: LayerParts, pre_ln: bool) -> tuple[str, torch.Tensor]:
        """(kind of decomposed vector for ``operands``, the vectors y_i they are compared with [*, n, d])."""
        if pre_ln:
            # Pre-LN (METHODS.md 1.1, 9): T_i(x_j) = sum_h A u_j + [i=j] x_i with values from LN1(x_j), no LN on T,
            # compared with the residual stream r_i = sum_j T_i(x_j) + b_O (LN2's input).
            return "res", p.t
        if self.params["ln2"]:
            # ALTI+LN2: vectors gamma2 P T_ij / sigma2_i (N_ENC's) against the real LN2 output (the FFN effect included).
            return "enc", p.y2
        if self.params["eps_quirk"]:
            # rebuilt as sum_j T_i(x_j) + b~_i, which is LN1 with the quirk's sigma
            return "resln", p.ln1_linear(p.s) / p.sigma1[..., None] + p.beta1
        return "resln", p.y  # the real LN1 output (equal to the rebuilt one with the exact epsilon)

    def stack_matrices(self, p: LayerParts, adapter) -> torch.Tensor:
        """C^l [*, n, n]: rows sum to 1 on real tokens; pad rows and columns are 0."""
        kind, y = self.contributions(p, adapter.pre_ln)
        c = self.proximities(p, kind, y)
        return row_normalise(valid_pairs(c.clamp_min_(0), p.mask))

    def proximities(self, p: LayerParts, kind: str, y: torch.Tensor) -> torch.Tensor:
        """||y_i||_1 - ||y_i - T_ij||_1 for every i, j [*, n, n], T_ij = (sum_h A_ij^h U_j^h + [i=j] diag_i) / scale_i.

        Worked with Z = scale_i T_ij against ys = scale_i y_i (no division over n^2 d numbers); the positive scale is
        divided out at the end. The L1 norm has no Gram-matrix shortcut: ``l1_proximity`` builds the vectors or
        prunes them exactly, whichever is cheaper."""
        W, diag, scale = operand_weights(p, kind)
        ys = y if scale is None else y * scale[..., None]
        # the reference's |T - y + eps| per component (times scale_i, as Z is) is |a - T| with a = ys - eps:
        # sum |ys| - |a - T| = (||ys||_1 - ||a||_1) + sum |a| - |a - T|
        eps = float(self.params.get("pairwise_eps", 0.0))
        a = ys - (eps if scale is None else eps * scale[..., None]) if eps else ys
        budget = work_bytes(a.device, CPU_BLOCK_BYTES, self.params["memory_mb"])
        c = l1_proximities(p, W, diag, a, budget, self.params["l1_path"])
        if eps:
            c += (ys.abs().sum(-1) - a.abs().sum(-1))[..., None]
        return c if scale is None else c / scale[..., None]
