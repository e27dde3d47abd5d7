"""The method interface. One subclass per file; the registry in ``compute.methods`` finds them by name.

A method reads a :class:`~compute.adapters.Captured` batch (padded tensors) and returns padded tensors; the runner
cuts every example to its real length before it is stored. Methods never loop over examples and never assume the
explained position or the class: both come per example from the batch (``cap.explain_pos``) and ``target``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch

from ...adapters import Adapter, Captured
from ...errors import AttrscopeError


# "forward": the batch's captured forward (always run: predictions, internals); "backward": gradients of the
# explained output (the shared gradient pass, integrated gradients); "lrp": every Linear's input and output recorded
# in the gradient pass's forward for the LRP rules.
PASSES = frozenset({"forward", "backward", "lrp"})
# Tasks with a sequence head read at one token (compute.tasks): the methods that decompose its logit or start
# relevance at it are defined for these only.
SEQUENCE_HEAD_TASKS = frozenset({"classification", "regression"})
# Internals only a block description locates (compute.adapters.block): a model without one runs no method needing them.
BLOCK_NEEDS = frozenset({"values", "ln1", "ln2", "attn_out", "layer_parts", "narrow_layers"})


class Same:
    """A memo key that stands for one tensor object (its identity): a batch's results per target are shared by the
    methods that are given the same target tensor, without copying its values to the host (a GPU sync). The key
    holds the tensor, so its identity cannot be reused while the memo keeps the key."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def __hash__(self) -> int:
        return id(self.tensor)

    def __eq__(self, other) -> bool:
        return isinstance(other, Same) and other.tensor is self.tensor


def class_target(cap, c: int) -> torch.Tensor:
    """[B] the class ``c`` for every example of the batch: one tensor per class and batch (cap.memo), so that the
    methods of --target all share their per-class results (``Same``)."""
    return cap.cached(("class_target", c), lambda: torch.full((cap.input_ids.shape[0],), c, dtype=torch.long,
                                                              device=cap.input_ids.device))


@dataclass
class MethodResult:
    scores: torch.Tensor  # [B, n]      final attribution of every token
    layer_scores: torch.Tensor | None = None  # [B, V, n]   per-layer views
    matrices: torch.Tensor | None = None  # [B, L, n, n] per-layer token-to-token matrices (row = query/receiver)
    matrix_rows: bool = False  # matrices holds only the kept rows, [B, L, 1, n] (Captured.kept_row)
    example_values: dict | None = None  # name -> [B] per-example scalars (Method.example_values)


class Shape(NamedTuple):
    """What a method's memory per example depends on: the example's tokens and the model's shape."""

    n: int  # tokens of the example
    layers: int
    heads: int
    d: int  # hidden width
    d_ff: int  # feed-forward width
    itemsize: int = 4  # bytes of the methods' floats (float32)


class Method:
    name: ClassVar[str]
    description: ClassVar[str]
    reference: ClassVar[str]  # paper / METHODS.md section
    signed: ClassVar[bool] = False  # scores can be negative (diverging colour scale)
    class_specific: ClassVar[bool] = False  # result depends on the target class
    needs: ClassVar[frozenset[str]] = frozenset()  # internals to capture (compute.adapters.NEEDS)
    has_layer_views: ClassVar[bool] = False
    has_matrices: ClassVar[bool] = False
    pre_ln_ok: ClassVar[bool] = True  # defined on pre-LN architectures (METHODS.md section 9)
    example_values: ClassVar[tuple[str, ...]] = ()  # per-example scalars stored beside the scores
    # Passes over the model the method reads (PASSES); the runner gives the batch's union to the shared gradient
    # pass, which records the LRP tensors only when some method of the batch declares "lrp".
    passes: ClassVar[frozenset[str]] = frozenset({"forward"})
    # What it keeps of the attentions and their gradients (checkpointed.AttentionTerm), read off the gradient pass;
    # the runner gives the batch's union to it (a checkpointed pass reduces them in its backward hooks)
    attention_terms: ClassVar[tuple] = ()
    run_options: ClassVar[tuple] = ()  # compute.options.Option: the run options it reads (the CLI, resume, provenance)
    # The tasks (compute.tasks) it is defined for; None: every task (methods that read only the explained row, or
    # the gradient of the explained output, whatever head produced it).
    tasks: ClassVar[frozenset[str] | None] = None
    # ATen ops per batch allowed (each a kernel launch on a GPU), as a multiple of the bare model pass the method
    # needs (``op_base``): work vectorised across layers and heads, never a loop of small launches per layer and head
    # (benchmarks/op_count.py, tests/test_op_budget.py).
    op_budget: ClassVar[float] = 0.5
    # How the method's work on one example grows with its length n: as n**cost_exponent. The runner runs a method
    # above 1 on length-homogeneous parts of each batch (compute/run/parts.py), so that padding adds at most 15% to
    # its sum of n**cost_exponent; 1 (linear, or dominated by the model's own passes): the whole batch at once.
    cost_exponent: ClassVar[int] = 1

    @classmethod
    def memory_per_example(cls, shape: Shape, params: dict) -> int:
        """Bytes each further example of ``shape.n`` tokens adds to the method's peak memory at large batches that
        trial batches of one or two examples do not show: a buffer its chunk budget (``params``, e.g. memory_mb)
        bounds only down to one block, whose block then grows with the batch. --batch-size auto on CUDA
        (compute/run/auto_batch.py) plans with the larger of this and the slope it measures; 0: the measured slope
        holds (memory linear in the batch, or bounded by the budget)."""
        return 0

    @classmethod
    def op_base(cls) -> str:
        """The bare pass the ops are counted against: "forward", or "backward" (forward + backward) for the
        methods that run their own gradient or relevance pass."""
        return "backward" if cls.passes & {"backward", "lrp"} else "forward"

    def __init__(self, **params):
        self.params = params

    def run_notes(self) -> list[str]:
        """What the method has to say once the run's examples are done (one line each; the runner shows them)."""
        return []

    def check_architecture(self, adapter: Adapter) -> None:
        """One-line error where the method is not defined for the model's architecture (never a silent answer)."""
        if adapter.block is None and self.needs & BLOCK_NEEDS:
            raise AttrscopeError(
                f"method '{self.name}' needs the value vectors and norms of a described block, and "
                f"'{adapter.config.model_type}' has no block description (compute/adapters/): use a gradient or "
                "attention method (grads, ig_l2, raw_attention, rollout, gae, attcat)")
        if adapter.pre_ln and not self.pre_ln_ok:
            raise AttrscopeError(
                f"method '{self.name}' is not defined for the pre-LN architecture '{adapter.config.model_type}' "
                "(METHODS.md section 9): use alti, alti_l2, the norm family, globenc, w_res, value_zeroing, or a "
                "gradient, attention or logit method")

    def check_task(self, task: str) -> None:
        """One-line error where the method is not defined for the run's task, naming those that are."""
        if self.tasks is not None and task not in self.tasks:
            from .. import REGISTRY  # the registry imports every method, this base among them

            defined = [name for name, m in REGISTRY.items() if m.tasks is None or task in m.tasks]
            raise AttrscopeError(f"method '{self.name}' is not defined for --task {task}: the methods defined for it "
                                 f"are {', '.join(defined)}")

    def n_layer_views(self, adapter: Adapter) -> int:
        return adapter.n_layers if self.has_layer_views else 0

    def compute(self, cap: Captured, adapter: Adapter, target: torch.Tensor) -> MethodResult:
        """``target`` [B]: class explained for each example (ignored by class-independent methods)."""
        raise NotImplementedError

    def compute_rows(self, cap: Captured, adapter: Adapter, steps, rows) -> MethodResult:
        """The method's results for the steps of a batch of generations (compute/run/steps.py): one row per step
        (scores [R, n], layer_scores [R, V, n], example_values [R]) and a class-independent method's matrices of
        the pass ([B, L, n, n], or None). ``cap`` is the one pass over the B sequences, ``steps.grid`` [B, S] the
        positions explained, ``steps.target`` [R] the tokens, ``rows()`` the step rows' capture (made once per
        batch, set to explain each step's token less its foil). By default the method runs on the step rows; a
        method whose result is a row of per-pass matrices, or whose steps can share the pass (the input gradients,
        integrated gradients), overrides this to serve every step off the one pass."""
        res = self.compute(rows(), adapter, steps.target if self.class_specific else None)
        return MethodResult(scores=res.scores, layer_scores=res.layer_scores, example_values=res.example_values)

    def compute_classes(self, cap: Captured, adapter: Adapter, num_classes: int) -> torch.Tensor:
        """Scores for every class [B, C, n] (``--target all``). Methods with a cheaper joint form override this."""
        return torch.stack([self.compute(cap, adapter, class_target(cap, c)).scores for c in range(num_classes)], dim=1)
