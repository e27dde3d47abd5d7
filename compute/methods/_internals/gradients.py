"""Gradients of the explained output, shared by the gradient methods of one batch (METHODS.md 1.3, 2.4, 4, 14.4).

The explained function F maps X, the embedding-module output [B, n, d] (word + position + type embeddings after the
embedding LayerNorm; ``gradient_input="token-embedding"``: the token embeddings alone, inseq's and Captum's input), to
one output per example: the pre-softmax logit of the target class (default) or its softmax
probability (ALTI's Captum wrapper). X enters the real model through a forward hook that replaces the embedding
module's output, so position and type embeddings and the embedding LayerNorm are applied exactly once. With
``double_embedding`` (the reference code's quirk, METHODS.md 14.4) X is fed to ``inputs_embeds`` instead and the
model adds them a second time. The token embeddings replace the token-embedding module's output instead (what
``inputs_embeds`` does), and the model adds positions and types once.

One forward pass (with grad) per batch and spec; one backward per target: the selected outputs of all examples are
summed, and since examples never interact, each example's gradient is its own. A generation's steps (many outputs
per sequence, ``Outputs.of_steps``) share the forward too: one backward per step index, every example's step t at
once (the model is causal: the output at a step's position sees its prefix only, as the prefix's own pass does).
Integrated gradients runs that forward in segments of columns through the model's key-value cache (``StepForward``),
so that each step index's backward walks only the columns up to its furthest position, not every column. The input
gradients do not: on the tiny Llama (100 prompts x 16 steps, batches of 32 sequences) their backward is mostly the
cost of launching its operations, which each segment adds to (grad_l2 and gxi_mean took 1.25-1.34 s against 1.00-1.24
s unsegmented; integrated gradients' passes of ~250 path rows 23.0 s against 26.7 s).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import ClassVar, NamedTuple

import numpy as np
import torch

from ... import interrupts
from ...generation import cache_argument, returned_cache
from ...adapters import Adapter, Captured
from ...errors import AttrscopeError
from ...options import Option
from .base import Method, MethodResult, Same, class_target
from .budget import work_bytes
from .attnlrp_rules import attnlrp_rules
from .chefer_decoder_rules import RuleOperands, chefer_decoder_rules
from .rule_rows import RuleRows
from .widened import widened
from .checkpointed import (HEADS_IMPL, AttentionTerm, HeadChunks, TermHooks, head_chunk_budget, heads_per_chunk,
                           layer_checkpoints, supports_head_chunks, supports_sdpa)
from .lrp_record import LRPRecord, has_lrp_rules, lrp_hooks
from ...tasks.readout import Readout, explained


@dataclass(frozen=True)
class Explained:
    """How F is evaluated."""

    output: str = "logit"  # "logit" (pre-softmax) | "prob" (softmax probability)
    double_embedding: bool = False  # REF quirk: X through inputs_embeds (embeddings added twice)
    mask_specials: bool = False  # AttCAT REF: special tokens masked as keys in the explanation pass
    mask_sep: bool = False  # Mask-LRP REF: [SEP] masked as a key in the explanation pass (METHODS.md 6.5)
    # "model" | "float64": run the pass in float64 (the LRP rules: see GradientPass) | "float32": the model as it is
    # when float32 or wider, else in float32 (a half-precision model's LRP rules, --lrp-dtype auto)
    dtype: str = "model"
    # "gradient": the plain backward | "attnlrp": AttnLRP's rules on the backward (attnlrp_rules; docs/methods.md 7)
    rules: str = "gradient"
    # "chefer_decoder" only: Mask-LRP's head mask M [L][H] on the relevance leaving A.V (None: all heads kept)
    head_mask: tuple | None = None
    # X: "embedding-output" (the embedding module's output) | "token-embedding" (get_input_embeddings()(ids), fed as
    # inputs_embeds: inseq's and Captum's input; the same on a model whose embedding module is the token embedding)
    gradient_input: str = "embedding-output"
    # "chefer_decoder" only: the batch doubled, its first half with the plain gradient (rule_rows): transatt's dF/dA
    plain_rows: bool = False


def wide(t: torch.Tensor) -> torch.Tensor:
    """Methods compute in float32 at least (half-precision models), float64 stays float64 (tests)."""
    return t.float() if t.element_size() < 4 else t


def spec_from(params: dict) -> Explained:
    if params.get("double_embedding") and params.get("gradient_input") == "token-embedding":
        raise AttrscopeError("--gradient-input token-embedding feeds the token embeddings as inputs_embeds, where the "
                             "preset's double-embedding quirk feeds the embedding output: drop one")
    return Explained(output=params.get("output", "logit"), double_embedding=bool(params.get("double_embedding")),
                     mask_specials=bool(params.get("mask_specials")), mask_sep=bool(params.get("mask_sep")),
                     dtype=params.get("dtype", "model"), rules=params.get("rules", "gradient"),
                     gradient_input=params.get("gradient_input", "embedding-output"))


GRADIENT_INPUT = Option(
    "gradient_input", "embedding-output", choices=("embedding-output", "token-embedding"), show_default=True,
    param="gradient_input", resume=True,
    help="Gradient methods (grad_l2, gxi_*, ig_*): differentiate at the embedding module's output (token + position "
         "(+ type) embeddings, after BERT's embedding LayerNorm) or at the token embeddings fed as inputs_embeds "
         "(inseq's and Captum's input).")


def token_input(spec: Explained) -> bool:
    """X is the token embeddings, fed through inputs_embeds."""
    return spec.gradient_input == "token-embedding"


def kept_keys(mask: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:
    """[B, n] attention mask of the real tokens with ``drop`` masked as keys. A row that would keep none (a sequence
    of special tokens only, [CLS] [SEP]) keeps them all: with every key masked the softmax would spread over the pad
    positions too, and the result would depend on the batch."""
    keep = mask & ~drop
    return torch.where(keep.any(-1, keepdim=True), keep, mask)


def model_inputs(cap: Captured, spec: Explained, repeat: int = 1) -> dict:
    """The batch's forward inputs, with specials masked as keys if asked, each example repeated ``repeat`` times
    (consecutive rows)."""
    inputs = dict(cap.inputs)
    if spec.mask_specials or spec.mask_sep:
        keep = kept_keys(cap.mask, cap.special if spec.mask_specials else cap.sep)
        inputs["attention_mask"] = keep.to(cap.inputs["attention_mask"].dtype)
    if repeat > 1:
        inputs = {k: v.repeat_interleave(repeat, dim=0) for k, v in inputs.items()}
    return inputs


class _Stop(Exception):
    pass


def embedding_output(adapter: Adapter, inputs: dict) -> torch.Tensor:
    """The embedding module's output for ``inputs`` (the model is stopped right after it)."""
    box = []

    def hook(_m, _inp, out):
        box.append(out[0] if isinstance(out, tuple) else out)
        raise _Stop

    h = adapter.embeddings().register_forward_hook(hook)
    try:
        with torch.no_grad():
            adapter.model(**inputs)
    except _Stop:
        pass
    finally:
        h.remove()
    return box[0]


def token_embedding(adapter: Adapter, ids: torch.Tensor) -> torch.Tensor:
    """The token embeddings of ``ids`` (what a model takes as inputs_embeds)."""
    with torch.no_grad():
        return adapter.model.get_input_embeddings()(ids)


def input_at(adapter: Adapter, inputs: dict, spec: Explained) -> torch.Tensor:
    """X at the data: the embedding-module output or, with ``gradient_input="token-embedding"``, the token
    embeddings."""
    return token_embedding(adapter, inputs["input_ids"]) if token_input(spec) else embedding_output(adapter, inputs)


def select(logits: torch.Tensor, target: torch.Tensor, output: str, foil: torch.Tensor | None = None) -> torch.Tensor:
    """F for every row: the target's logit or softmax probability [R] (less the foil's, where one is given), in
    float32 at least (a half-precision model's softmax and its backward run in float32; the gradient reaches the
    model's logits in its dtype). A one-output head (regression) has no softmax: "prob" explains the value."""
    logits = wide(logits)
    out = torch.softmax(logits, dim=-1) if output == "prob" and logits.shape[-1] > 1 else logits
    return explained(out, target, foil)


# float16 keeps 11 bits down to 6.1e-5 and nothing under 6e-8, while the gradients of a logit reach 1e-8 (about a
# tenth of MiniLM's hidden-state gradients are under 6.1e-5): the backward of a float16 model starts from F times
# this power of two (loss scaling), which moves them into float16's normal range; the largest seen are about 3, far
# from 65504 / 2**12 = 16. A backward that overflows anyway is run again at a sixteenth of the scale.
FLOAT16_GRAD_SCALE = 2.0 ** 12


def output_grads(y: torch.Tensor, wrt: list[torch.Tensor], *, retain_graph: bool = False,
                 hooks: TermHooks | None = None) -> list[torch.Tensor | None]:
    """dy/dt for every t in ``wrt`` (None where y does not depend on t). A float16 graph (``wrt[0]``'s dtype) is
    differentiated at y * scale and its gradients are returned in float32 divided by the scale (exact: a power of
    two); other dtypes are differentiated as they are. ``hooks``: the checkpointed pass's, told each try's scale."""
    if wrt[0].dtype != torch.float16:
        return list(torch.autograd.grad(y, wrt, retain_graph=retain_graph, allow_unused=True))
    scale = FLOAT16_GRAD_SCALE
    while True:
        if hooks is not None:
            hooks.scale = scale
        g = torch.autograd.grad(y * scale, wrt, retain_graph=True if scale > 1 else retain_graph, allow_unused=True)
        if scale == 1 or all(t is None or bool(torch.isfinite(t).all()) for t in g):
            return [None if t is None else t.float() / scale for t in g]
        scale = max(scale / 16, 1.0)


def forward_at(adapter: Adapter, inputs: dict, X: torch.Tensor, spec: Explained, internals: Captured | None = None,
               grad: bool = True, *, readout=None, pos: torch.Tensor | None = None,
               needs: frozenset[str] = frozenset({"hidden_states", "attentions"})):
    """The output vector [R, C] of the model at embedding-space input X [R, n, d], read by the task's ``readout``
    at positions ``pos`` [R] (default: the classification logits); with ``grad`` the graph follows X. With
    ``internals``, the ``needs`` of the layers (inputs and outputs, attention probabilities) are recorded into it."""
    handles = []
    if spec.double_embedding:
        call = {k: v for k, v in inputs.items() if k != "input_ids"}
        call["inputs_embeds"] = X
    else:
        # the token embeddings replaced rather than passed as inputs_embeds (the same function): a sequence
        # classifier finds its last real token in input_ids, and inputs_embeds would hide the padding from it
        call = inputs
        module = adapter.model.get_input_embeddings() if token_input(spec) else adapter.embeddings()
        handles.append(module.register_forward_hook(lambda _m, _i, _o: X))
    try:
        ctx = adapter.hooks(internals, needs) if internals else nullcontext()
        with ctx, torch.set_grad_enabled(grad):
            out = adapter.model(**call)
            return out.logits if readout is None else readout(out, pos)
    finally:
        for h in handles:
            h.remove()


def whole_output(out, _pos):
    """A readout that keeps the model's whole output (the caller reads several positions off it)."""
    return out


class OutputGroup(NamedTuple):
    """The explained outputs of one backward pass: at most one per sequence of the batch ([B] each)."""

    pos: torch.Tensor  # its position (a language model's head)
    target: torch.Tensor
    foil: torch.Tensor | None  # -1: none
    row: torch.Tensor  # its row of the results (R: the sequence has no output in this group)
    has: torch.Tensor | None  # bool, the sequences with an output here (None: all)


class Outputs(NamedTuple):
    """The R outputs explained on a batch of B sequences, each a row of the results: a batch's one per sequence, or
    a generation's steps (compute/run/steps.py), grouped by step index so that one backward per group serves every
    sequence (examples never interact)."""

    readout: Readout
    groups: tuple[OutputGroup, ...]
    example: torch.Tensor | None  # [R] each row's sequence (None: row b is sequence b)
    rows: int
    reach: list[int] | None = None  # per group, the columns its outputs need (a generation's steps: Steps.reach)

    @classmethod
    def of_batch(cls, cap: Captured, target: torch.Tensor) -> "Outputs":
        B = target.shape[0]
        rows = torch.arange(B, device=target.device)
        return cls(cap.readout, (OutputGroup(cap.explain_pos, target, cap.foil, rows, None),), None, B)

    @classmethod
    def of_steps(cls, steps, readout: Readout, foil: torch.Tensor | None) -> "Outputs":
        """A batch of generations' steps (``steps``: compute.run.steps.Steps), each explaining its generated token
        less ``foil`` [R] (None: no contrast)."""
        R = steps.example.shape[0]
        padded = lambda t: torch.cat([t, t.new_zeros(1)])  # noqa: E731 - a last entry for the rows of no step
        target, foil = padded(steps.target), None if foil is None else padded(foil)
        groups = []
        for t in range(max(steps.counts, default=0)):
            row = steps.row_grid[:, t]
            groups.append(OutputGroup(steps.grid[:, t], target[row], None if foil is None else foil[row], row,
                                      row < R))
        return cls(readout, tuple(groups), steps.example, R, steps.reach)


def shares_forward(spec: Explained) -> bool:
    """Outputs of one sequence can share its forward pass: the plain gradient of the model as it is, the batch's
    own inputs (no doubled batch, no keys masked per explanation, no double embedding)."""
    return (spec.rules == "gradient" and spec.dtype == "model" and not spec.plain_rows and not spec.double_embedding
            and not spec.mask_specials and not spec.mask_sep)


class Segments(NamedTuple):
    """A generation's forward in segments of columns (``StepForward``)."""

    bounds: list[int]  # each segment's end column
    last: list[int]  # per group of outputs, the segment of its furthest position


def segment_bounds(outputs: Outputs) -> Segments | None:
    """The segments of a generation's forward, from the columns each group's output needs (its furthest position +
    1); None: one forward over every column (a batch's one output per sequence, a readout not at a position)."""
    if outputs.reach is None or not outputs.groups or not outputs.readout.at_position:
        return None
    need = outputs.reach  # from the host's step lists: no wait for the device
    bounds = cut_columns(sorted(set(need)))
    return Segments(bounds, [int(np.searchsorted(bounds, k)) for k in need])


def cut_columns(needs: list[int]) -> list[int]:
    """Segment ends for these sorted column needs: the first need (the prompt up to the earliest step's position,
    which every backward walks), then every k-th need and the last, k = ceil(sqrt(needs)): each segment is one more
    pass of the layers over a few columns (the tiny Llama, 256 rows of 46 columns, 16 steps: segments of 2-4 steps
    ran the forward and its 16 backwards about 1.8x faster than the whole forward, and than segments of 1)."""
    k = max(1, int(np.ceil(np.sqrt(len(needs)))))
    return sorted(set(needs[::k]) | {needs[-1]})


class StepForward:
    """The model's forward at X [R, n, d] for a group of outputs, read per group (``read``). With ``bounds`` it runs
    in segments of columns [0, b0), [b0, b1), ... through the model's key-value cache (each segment's queries see
    the earlier ones' keys, as in one forward: the model is causal), and a group's output is read off the segments
    up to the one holding its furthest position, so that its backward walks no later column; the columns after the
    last bound are not run. Without, one forward over every column (the model's output read as it is)."""

    def __init__(self, adapter: Adapter, inputs: dict, X: torch.Tensor, spec: Explained, readout: Readout,
                 segments: Segments | None):
        self.readout, self.segments = readout, segments
        if segments is None:
            self.out = forward_at(adapter, inputs, X, spec, readout=whole_output)
            return
        key, cache, start, self.parts = cache_argument(adapter.model), None, 0, []
        for end in segments.bounds:
            part = {k: v[:, :end] if k == "attention_mask" else v[:, start:end] for k, v in inputs.items()}
            with torch.enable_grad():  # the slice of X on the graph
                x = X[:, start:end]
            out = forward_at(adapter, {**part, key: cache, "use_cache": True}, x, spec, readout=whole_output)
            cache = returned_cache(out)
            self.parts.append(getattr(out, readout.field))
            start = end
        self.starts = [0, *segments.bounds[:-1]]

    def read(self, k: int, pos: torch.Tensor) -> torch.Tensor:
        """Group ``k``'s outputs [R, C] at positions ``pos`` [R] (a row without an output in the group: position 0,
        as Steps.grid pads)."""
        if self.segments is None:
            return self.readout(self.out, pos)
        last = self.segments.last[k]
        rows = torch.arange(pos.shape[0], device=pos.device)
        got = None
        for start, part in zip(self.starts[:last + 1], self.parts[:last + 1]):
            at = part[rows, (pos - start).clamp(0, part.shape[1] - 1)]
            got = at if got is None else torch.where((pos >= start)[:, None], at, got)
        return got


class InputGradients(NamedTuple):
    """X at the data and dF/dX for every output row ([R, n, d] each), as GradientMethod.from_grads reads them."""

    X: torch.Tensor
    grads: dict


def input_gradients(cap: Captured, adapter: Adapter, spec: Explained, outputs: Outputs) -> InputGradients:
    """dF/dX of every output of ``outputs`` off one forward of the batch's sequences: one backward per group."""
    inputs = model_inputs(cap, spec)
    E = input_at(adapter, inputs, spec)
    X = E.detach().requires_grad_(True)
    out = forward_at(adapter, inputs, X, spec, readout=whole_output)
    G = torch.zeros((outputs.rows + 1, *X.shape[1:]), dtype=torch.float32 if X.element_size() < 4 else X.dtype,
                    device=X.device)
    last = len(outputs.groups) - 1
    for k, grp in enumerate(outputs.groups):
        with torch.enable_grad():
            f = select(outputs.readout(out, grp.pos), grp.target, spec.output, grp.foil)
            (g,) = output_grads((f if grp.has is None else torch.where(grp.has, f, 0.0)).sum(), [X],
                                retain_graph=k < last)
        G.index_add_(0, grp.row, wide(g))  # each row once (the last, of no step, collects the rest)
    E = E if outputs.example is None else E[outputs.example]
    return InputGradients(X=E, grads={"X": G[:outputs.rows]})


class GradientPass:
    """One forward of F at X = E with every layer's input/output and attention kept, and gradients of the
    selected output with respect to all of them, per target (the graph is kept for further targets)."""

    def __init__(self, cap: Captured, adapter: Adapter, spec: Explained, record_lrp: bool = True):
        # "float64" (the LRP family), "float32" (a half-precision model's): the pass in that dtype. The decoder rules
        # cast one layer at a time (widened: no wide copy of a 7B model); Chefer's closed-form rules (post-LN
        # encoders) keep every layer's wide weights stacked anyway (relevance.layer_weights), so they run on a wide
        # copy, made once, which costs no casts per batch
        wide = {"float64": torch.float64, "float32": torch.float32}.get(spec.dtype)
        if wide is not None and spec.rules != "chefer_decoder":
            adapter, wide = adapter.twin(wide), None
        self.adapter, self.spec = adapter, spec  # the adapter the pass ran on (a wide copy: post-LN LRP)
        inputs = model_inputs(cap, spec)
        # a doubled batch: rows B.. run the rules, rows ..B the plain gradient (every tensor of the pass is [2B, ...])
        self.rows = RuleRows(cap.input_ids.shape[0], cap.input_ids.device) if spec.plain_rows else None
        twice = (lambda t: t if t is None else torch.cat([t, t])) if spec.plain_rows else (lambda t: t)
        inputs = {k: twice(v) for k, v in inputs.items()}
        with widened(adapter, wide) if wide is not None else nullcontext():
            E = input_at(adapter, inputs, spec)
        self.X = E.detach().requires_grad_(True)
        self.internals = Captured(input_ids=twice(cap.input_ids), mask=twice(cap.mask), lengths=twice(cap.lengths),
                                  explain_pos=twice(cap.explain_pos), logits=None)
        # Every Linear's input and output too, for the LRP rules (_internals.relevance), where a rule set exists and
        # ``record_lrp``: references to tensors the backward keeps anyway, bar two [B, n, d] per layer.
        self.records_lrp = record_lrp
        self.lrp = LRPRecord() if record_lrp and has_lrp_rules(adapter) else None
        # per layer: the value projection's output and the unmasked gradient of the attention output (chefer_decoder)
        self.kept: dict = {}
        # the rules' hooks, for the forward and (checkpointed) again for the backward's recomputations
        self._rules = lambda: (
            attnlrp_rules(adapter) if spec.rules == "attnlrp" else
            chefer_decoder_rules(adapter, spec.head_mask, self.kept if spec.head_mask else None, self.rows)
            if spec.rules == "chefer_decoder" else nullcontext())
        # Every layer checkpointed (checkpointed.py) where the plain pass's activations (the pass's rows, in its
        # dtype) would exceed the pass's memory (the plain pass below it: one backward through the kept graph, the
        # op budgets): the plain gradient of the model as it is, and the decoders' rules (the rules' hooks placed
        # again for the recomputations); not the post-LN encoders' LRP records, which read every layer's tensors
        n = cap.input_ids.shape[1]
        self.checkpointed = ((spec.rules in ("attnlrp", "chefer_decoder")
                              or (spec.rules == "gradient" and spec.dtype == "model" and not spec.plain_rows))
                             and self.lrp is None and checkpoints(adapter, E.shape[0], n, E.element_size(),
                                                                  pass_bytes(E.device)))
        # the batch's terms of this pass's kind (the gradient family's, the decoder rules' RuleTerms)
        self.batch_terms = tuple(sorted((t for t in cap.attention_terms or () if t.rules == spec.rules),
                                        key=lambda t: t.name))
        # a plain gradient pass whose batch declares no attention terms of its kind (the runner declares every
        # method's) reads only dF/dX and dF/dh: its checkpointed layers run the SDPA attention (no [B, H, n, n];
        # undeclared, a term may be asked later)
        self.sdpa = (self.checkpointed and spec.rules == "gradient" and cap.attention_terms is not None
                     and not self.batch_terms and supports_sdpa(adapter))
        # the plain gradient's terms (each a mean over the heads) with the attention a chunk of heads at a time, as
        # many as the block budget holds (HeadChunks: no [B, H, n, n] where one head a chunk), where the model's
        # attention goes through transformers' attention interface; else the eager recomputation (TermHooks)
        self.heads = None
        if (self.checkpointed and spec.rules == "gradient" and not self.sdpa and supports_head_chunks(adapter)
                and all(t.heads is not None for t in self.batch_terms)):
            self.heads = heads_per_chunk(adapter.n_heads, E.shape[0], n, head_chunk_budget(E.device))
        self._hooks = None
        if self.checkpointed:
            calls = [0] * adapter.n_layers
            operands = (RuleOperands(adapter, self.rows.half if self.rows else None, self.kept)
                        if spec.rules == "chefer_decoder" else None)
            self._hooks = (HeadChunks(adapter, self.internals, calls, self.heads) if self.heads
                           else TermHooks(adapter, self.internals, calls, operands))
            impl = HEADS_IMPL if self.heads else None
            with (widened(adapter, wide) if wide is not None else nullcontext(lambda _layer: nullcontext())
                  ) as layer_cast, self._rules():
                with layer_checkpoints(adapter, calls, self.sdpa, layer_cast, impl), self._hooks.hooked():
                    self.logits = forward_at(adapter, inputs, self.X, spec, self.internals, readout=cap.readout,
                                             pos=self.internals.explain_pos, needs=frozenset({"hidden_states"}))
        else:
            with (widened(adapter, wide) if wide is not None else nullcontext(),
                  lrp_hooks(adapter, self.lrp) if self.lrp is not None else nullcontext(), self._rules()):
                self.logits = forward_at(adapter, inputs, self.X, spec, self.internals, readout=cap.readout,
                                         pos=self.internals.explain_pos)
        self.foil = twice(cap.foil)
        self._twice = twice
        self._grads: dict[tuple, dict] = {}

    @property
    def hidden_states(self) -> list[torch.Tensor]:
        """h^0..h^L (h^0 = the embedding-module output seen by layer 1)."""
        return self.internals.hidden_states

    @property
    def attentions(self) -> list[torch.Tensor]:
        return self.internals.attentions

    def grads(self, target: torch.Tensor, terms: tuple[AttentionTerm, ...] = ()) -> dict:
        """{"X": dF/dX [B, n, d], "hidden": [dF/dh^l], "attentions": [dF/dA^l] (the plain pass's), "terms": {name:
        what ``terms`` keep of A and dF/dA}} for the target class of each example. The checkpointed pass reduces
        the batch's terms (cap.attention_terms) in its first backward, a term asked for later in one more."""
        key = Same(target)
        g = self._grads.get(key)
        if g is None:
            hs = self.hidden_states
            # the rules' checkpointed pass keeps no layer's dF/dh: <dF/dh^l, h^l> of the layers' inputs, reduced in
            # tensor hooks as the backward makes each ("inputs" [B, L, n]: cat_terms'), is all its methods read
            inputs, handles = [None] * (len(hs) - 1), []
            if self.checkpointed and self.spec.rules != "gradient":
                handles = [h.register_hook(_input_term(inputs, l, h)) for l, h in enumerate(hs[:-1])]
                hs = []
            att = [] if self.checkpointed else self.attentions
            wrt = [self.X, *hs, *att]
            try:
                gl, computed = self._backward(target, wrt, tuple(dict.fromkeys(self.batch_terms + tuple(terms))))
            finally:
                for h in handles:
                    h.remove()
            gl = [torch.zeros_like(t) if gi is None else gi for gi, t in zip(gl, wrt)]
            g = self._grads[key] = {"X": gl[0], "hidden": gl[1:1 + len(hs)], "attentions": gl[1 + len(hs):],
                                    "terms": computed}
            if handles:
                g["inputs"] = torch.stack(inputs, dim=1)
        missing = tuple(t for t in terms if t.name not in g["terms"])
        if missing:
            g["terms"].update(self._backward(target, [self.X], missing)[1] if self.checkpointed
                              else self._plain_terms(g, missing))
        return g

    def _backward(self, target: torch.Tensor, wrt: list[torch.Tensor], terms: tuple[AttentionTerm, ...]):
        """(the gradients of F w.r.t. ``wrt``, {name: term}): the checkpointed pass's terms reduced in its hooks."""
        with torch.enable_grad():
            y = select(self.logits, self._twice(target), self.spec.output, self.foil).sum()
            if not self.checkpointed:
                return output_grads(y, wrt, retain_graph=True), {}
            if self.sdpa and terms:
                raise RuntimeError(f"attention terms {', '.join(t.name for t in terms)} asked of a gradient pass run "
                                   "with the SDPA attention: declare them in cap.attention_terms before the pass")
            if self.heads and any(t.heads is None for t in terms):
                raise RuntimeError(f"attention terms {', '.join(t.name for t in terms if t.heads is None)} are no "
                                   "mean over the heads, asked of a pass run a chunk of heads at a time: declare them "
                                   "in cap.attention_terms before the pass")
            with self._rules(), self._hooks.hooked():
                return self._hooks.run(terms, lambda: output_grads(y, wrt, retain_graph=True, hooks=self._hooks))

    def term(self, g: dict, term: AttentionTerm) -> torch.Tensor:
        """``term`` of the gradients ``g`` (grads' dict, or one with the plain pass's "attentions")."""
        terms = g.setdefault("terms", {})
        if term.name not in terms:  # the plain pass's (a checkpointed one reduced its terms in the backward)
            terms.update(self._plain_terms(g, (term,)))
        return terms[term.name]

    def _plain_terms(self, g: dict, terms: tuple[AttentionTerm, ...]) -> dict:
        """``terms`` of the plain pass's attentions and gradients: every layer's reduced at once."""
        out, every, every_grad = {}, None, None
        for t in terms:
            if t.last:
                A, G = wide(self.attentions[-1].detach())[None], wide(g["attentions"][-1])[None]
            else:
                if every is None:
                    every = stacked([a.detach() for a in self.attentions])
                if every_grad is None and t.grad:
                    every_grad = stacked(g["attentions"])
                A, G = every, every_grad
            out[t.name] = t.reduce(A, G, self.internals)
        return out


def gradient_pass(cap: Captured, adapter: Adapter, spec: Explained, lrp: bool = False) -> GradientPass:
    """The batch's gradient pass for ``spec``, shared by every gradient method of the batch (cap.memo). It records
    the LRP tensors when a method of the batch declares the "lrp" pass (cap.passes; undeclared: recorded) or the
    caller asks (``lrp``: a pass memoised without them, for a batch that declared no LRP method, is run again)."""
    if spec.dtype == "float32" and next(adapter.model.parameters()).element_size() >= 4:
        spec = replace(spec, dtype="model")  # the model itself: the pass is shared with the gradient methods
    key = ("gradient_pass", spec)
    gp = cap.memo.get(key)
    if gp is None or (lrp and not gp.records_lrp):
        record = (lrp or cap.passes is None or "lrp" in cap.passes) and spec.rules == "gradient"
        gp = cap.memo[key] = GradientPass(cap, adapter, spec, record_lrp=record)
    return gp


# ----------------------------------------------------------------------------------------------------------------
def quadrature(steps: int, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """Nodes alpha_k in [0, 1] and weights w_k of the path integral: Gauss-Legendre (Captum's default, the reference
    code's) or the right Riemann sum alpha_k = k/m, w_k = 1/m (the IG paper's)."""
    if rule == "gausslegendre":
        x, w = np.polynomial.legendre.leggauss(steps)
        return (x + 1) / 2, w / 2
    if rule == "riemann":
        return np.arange(1, steps + 1) / steps, np.full(steps, 1.0 / steps)
    raise ValueError(rule)


def ig_baseline(cap: Captured, adapter: Adapter, spec: Explained, E: torch.Tensor, kind: str) -> torch.Tensor:
    """Baseline in X space: "mask" = X of the same sequence with every non-special token replaced by [MASK] (the
    embedding-module output: same positions and types; the token embeddings: [MASK]'s); "zero" = zeros. Pad rows
    equal E's (they carry no attribution)."""
    if kind == "zero":
        B0 = torch.zeros_like(E)
    elif kind == "mask":
        if adapter.mask_token_id is None:
            raise AttrscopeError("integrated gradients' [MASK] baseline needs a tokenizer with a mask token: "
                                 "pass --ig-baseline zero")
        ids = torch.where(cap.special | ~cap.mask, cap.input_ids, torch.full_like(cap.input_ids, adapter.mask_token_id))
        B0 = input_at(adapter, {**model_inputs(cap, spec), "input_ids": ids}, spec)
    else:
        raise ValueError(kind)
    return torch.where(cap.mask[..., None], B0, E)


# A gradient pass's memory on the CPU (on a GPU an eighth of its memory: budget.work_bytes): integrated gradients'
# rows of one forward/backward, and where a pass's layers are checkpointed (``checkpoints``)
IG_CPU_BYTES = 1 << 30


def pass_bytes(device: torch.device, given_mb: int | None = None) -> int:
    """The memory of one forward/backward on ``device`` (``given_mb``: --ig-memory-mb)."""
    return work_bytes(device, IG_CPU_BYTES, given_mb, gpu_share=8)


def row_bytes(adapter: Adapter, n: int, itemsize: int, checkpointed: bool = False, sdpa: bool = False) -> int:
    """A rough count of what one row of a forward keeps for its backward: every layer's (about 16 d-vectors and 3
    attention maps per token), or checkpointed every layer's input and one layer's (``sdpa``: the mask's [n, n]
    instead of the maps)."""
    d = int(adapter.config.hidden_size)  # DistilBERT and GPT-2 configs map it to dim / n_embd
    layer = n * (16 * d + (n if sdpa else 3 * adapter.n_heads * n)) * itemsize
    return adapter.n_layers * n * d * itemsize + layer if checkpointed else adapter.n_layers * layer


def checkpoints(adapter: Adapter, rows: int, n: int, itemsize: int, memory_bytes: int) -> bool:
    """Whether a pass of ``rows`` rows checkpoints its layers (checkpointed.py): where the plain pass would keep more
    than ``memory_bytes`` (compute.memory_model holds the same rule)."""
    return rows * row_bytes(adapter, n, itemsize) > memory_bytes


def rows_per_pass(adapter: Adapter, n: int, itemsize: int, memory_bytes: int, checkpointed: bool = False,
                  sdpa: bool = False) -> int:
    """Interpolation rows (example x step) per forward/backward within ``memory_bytes``."""
    return max(1, int(memory_bytes // max(row_bytes(adapter, n, itemsize, checkpointed, sdpa), 1)))


# On the CPU a pass runs fastest with one layer's tensors of its rows (the attention maps above all) in the processor's
# cache: with more rows each costs up to twice as much (the tiny Llama at 56 tokens, 16 backwards a pass: 1,664 rows
# a pass 17-19 CPU s, 128-512 rows 10-13 s). Integrated gradients' CPU passes are capped there, below the memory.
CPU_CACHE_BYTES = 64 << 20


def cpu_cache_rows(adapter: Adapter, n: int, itemsize: int) -> int:
    """Rows per pass on the CPU whose one layer (row_bytes over the layers) keeps within CPU_CACHE_BYTES."""
    return max(1, CPU_CACHE_BYTES // max(row_bytes(adapter, n, itemsize) // adapter.n_layers, 1))


def integrated_gradients(cap: Captured, adapter: Adapter, spec: Explained, target: torch.Tensor | None, *, steps: int,
                         rule: str, baseline: str, memory_bytes: int, outputs: Outputs | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """IG_jk = (X_jk - X'_jk) * sum_k w_k dF/dX_jk at X' + alpha_k (X - X'): [R, n, d], the completeness delta
    sum_jk IG_jk - (F(X) - F(X')) per output row [R] (Captum's convergence delta) and F(X) - F(X') [R]. The outputs:
    each example's ``target`` (R = B), or ``outputs`` (a generation's steps, many per sequence).

    All (example, step) rows are stacked, with one row more per example at each end of the path (X and X', whose
    outputs F give the delta; no gradient is taken of them), and run in chunks of ``rows_per_pass`` (one forward per
    chunk and one backward per group of outputs: usually one of each); a row only ever sees its own example."""
    outputs = outputs or Outputs.of_batch(cap, target)
    inputs = model_inputs(cap, spec)
    E = input_at(adapter, inputs, spec)
    X0 = ig_baseline(cap, adapter, spec, E, baseline)
    alphas, weights = quadrature(steps, rule)
    B, n, d = E.shape
    R = outputs.rows
    # The path points, the weighted sum of the steps' gradients and the attribution in float32 at least: a
    # half-precision model only runs the forward and backward at each point (bfloat16 would round the quadrature
    # nodes to 3 digits, and the sum of 50 steps would lose the small ones). torch.lerp gives the ends exactly.
    E_w, X0_w = wide(E), wide(X0)
    alpha = torch.as_tensor(np.concatenate([alphas, [1.0, 0.0]]), dtype=E_w.dtype, device=E.device)
    weight = torch.as_tensor(np.concatenate([weights, [0.0, 0.0]]), dtype=E_w.dtype, device=E.device)
    m = steps + 2  # rows per example: the steps, then X, then X'
    total = E_w.new_zeros((R + 1, n, d))  # a last row for the path rows of sequences without an output in a group
    ends = torch.empty(R * 2 + 1, dtype=E_w.dtype, device=E.device)  # F(X), F(X') per output; a slot for the rest
    P = B * m
    ex_of = torch.arange(P, device=E.device) // m  # path row r = (example r // m, point r % m)
    point_of = torch.arange(P, device=E.device) % m
    # every layer checkpointed where not even one row's plain pass fits the memory, its attention SDPA's (IG reads
    # only dF/dX)
    ckpt = checkpoints(adapter, 1, n, E.element_size(), memory_bytes)
    sdpa = ckpt and supports_sdpa(adapter)
    chunk = rows_per_pass(adapter, n, E.element_size(), memory_bytes, ckpt, sdpa)
    if E.device.type == "cpu":
        chunk = min(chunk, cpu_cache_rows(adapter, n, E.element_size()))
    last = len(outputs.groups) - 1
    # a generation's steps: the forward in segments (StepForward, the module's note), where the layers are not
    # checkpointed
    segments = None if ckpt else segment_bounds(outputs)
    for r0 in range(0, P, chunk):
        interrupts.check()  # a stop asked for: between chunks, never inside the backward
        ex, pt = ex_of[r0:r0 + chunk], point_of[r0:r0 + chunk]
        rows_in = {k: v[ex] for k, v in inputs.items()}
        X = torch.lerp(X0_w[ex], E_w[ex], alpha[pt, None, None]).to(E.dtype).requires_grad_(True)
        with torch.enable_grad(), layer_checkpoints(adapter, sdpa=sdpa) if ckpt else nullcontext():
            out = StepForward(adapter, rows_in, X, spec, outputs.readout, segments)
        for k, grp in enumerate(outputs.groups):
            has = None if grp.has is None else grp.has[ex]
            with torch.enable_grad():
                f = select(out.read(k, grp.pos[ex]), grp.target[ex], spec.output, foil_rows(grp.foil, ex))
                # the end points' outputs are kept; their gradients (weight 0) are not asked for
                on = pt < steps if has is None else (pt < steps) & has
                (g,) = output_grads((f * on).sum(), [X], retain_graph=k < last)
            row = grp.row[ex]
            total.index_add_(0, row, wide(g) * weight[pt, None, None])
            # the end points' outputs into their slots (no boolean indexing: it would wait for the device)
            end = pt >= steps if has is None else (pt >= steps) & has
            ends.index_put_((torch.where(end, row * 2 + pt - steps, R * 2),), wide(f.detach()))
        del out
    if outputs.example is not None:
        E_w, X0_w = E_w[outputs.example], X0_w[outputs.example]
    attr = (E_w - X0_w) * total[:R]
    f_x, f_x0 = ends[:-1].view(R, 2).unbind(1)
    delta = wide(attr).sum(dim=(1, 2)) - (f_x - f_x0)
    return attr, delta, f_x - f_x0


def foil_rows(foil: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    return None if foil is None else foil[rows]


def valid_mean_rows(M: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the real query rows i of M [B, ..., n, n] -> [B, ..., n] (pad rows excluded)."""
    m = mask.to(M.dtype)
    shape = (m.shape[0],) + (1,) * (M.dim() - 3) + (m.shape[1], 1)
    return (M * m.view(shape)).sum(-2) / m.sum(-1).clamp_min(1).view((m.shape[0],) + (1,) * (M.dim() - 2))


def stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Per-layer tensors [B, ...] as one [L, B, ...] in float32 at least: one copy for every layer."""
    return wide(torch.cat(tensors).view(len(tensors), *tensors[0].shape))


def _input_term(inputs: list, l: int, h: torch.Tensor):
    """A tensor hook that keeps <dF/dh^l, h^l> [B, n] of layer l's input in ``inputs[l]`` (cat_terms' values)."""
    def hook(g):
        inputs[l] = torch.linalg.vecdot(wide(g), wide(h.detach()))
    return hook


def cat_terms(gp, grads, layers: str) -> torch.Tensor:
    """CAT^l_j (cat and attcat) = <dF/dh^l_j, h^l_j> for every layer [B, L, n] (of the layers' inputs: reduced in
    the backward by the rules' checkpointed pass)."""
    if layers == "inputs" and "inputs" in grads:
        return grads["inputs"]
    L = gp.adapter.n_layers
    idx = slice(0, L) if layers == "inputs" else slice(1, L + 1)
    h = [t.detach() for t in gp.hidden_states[idx]]
    return torch.linalg.vecdot(stacked(grads["hidden"][idx]), stacked(h)).transpose(0, 1)


class GradientMethod(Method):
    """Base of the methods read off one gradient pass. Parameters (METHODS.md 14.4, 14.9): output ("logit" |
    "prob"), double_embedding, mask_specials; they select the explained function and are recorded in the store.
    Method.compute_classes needs no override: the pass is memoised per batch and its gradients per target, so
    --target all costs one forward and one backward per class."""

    class_specific = True
    needs = frozenset()  # the method runs its own forward + backward
    passes = frozenset({"forward", "backward"})
    op_budget = 1.2  # of a bare forward + backward

    def __init__(self, **params):
        super().__init__(**params)
        self.spec = spec_from(self.params)

    # from_grads reads gp.X and grads["X"] only: a generation's steps share one forward (input_gradients)
    input_only: ClassVar[bool] = False

    def from_grads(self, gp: GradientPass, grads: dict, cap: Captured) -> MethodResult:
        raise NotImplementedError

    def compute(self, cap, adapter, target):
        self.check_architecture(adapter)
        gp = gradient_pass(cap, adapter, self.spec)
        grads = gp.grads(target, self.attention_terms)
        with torch.no_grad():
            return self.from_grads(gp, grads, cap)

    def compute_rows(self, cap, adapter, steps, rows):
        if not (self.input_only and shares_forward(self.spec)):
            return super().compute_rows(cap, adapter, steps, rows)
        self.check_architecture(adapter)
        r = rows()
        ig = cap.cached(("input_gradients", self.spec),
                        lambda: input_gradients(cap, adapter, self.spec, Outputs.of_steps(steps, r.readout, r.foil)))
        with torch.no_grad():
            return self.from_grads(ig, ig.grads, r)


MOE_DELTA_WARN = 0.05  # the median relative completeness delta above which a routed model's run is warned


class IntegratedGradientsMethod(Method):
    """Base of ig_l2 / ig_mean. Parameters: steps (50), rule ("gausslegendre" | "riemann"), baseline ("mask" |
    "zero"), memory_mb (rows per forward/backward), and the Explained parameters. Both methods of a run share one
    integration per target (cap.memo)."""

    class_specific = True
    needs = frozenset()
    passes = frozenset({"forward", "backward"})
    example_values = ("ig_delta",)
    op_budget = 1.2  # of one bare forward + backward: every (example, step) row in one pass where memory allows

    def __init__(self, **params):
        params = {"steps": 50, "rule": "gausslegendre", "baseline": "mask", "memory_mb": None, **params}
        super().__init__(**params)
        self.spec = spec_from(self.params)

    def check_architecture(self, adapter):
        super().check_architecture(adapter)
        if self.params["baseline"] == "mask" and adapter.mask_token_id is None:
            raise AttrscopeError(f"method '{self.name}': the [MASK] baseline needs a tokenizer with a mask token, "
                                 f"which this '{adapter.config.model_type}' model lacks: pass --ig-baseline zero")

    def aggregate(self, attr: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _key(self, *what):
        p = self.params
        return ("ig", self.spec, p["steps"], p["rule"], p["baseline"], p["memory_mb"], *what)

    def _integrate(self, cap, adapter, target):
        p = self.params
        every = cap.memo.get(self._key("every class"))
        if every is not None:  # --target all integrated every class: each example's row of its target's class
            b = torch.arange(target.shape[0], device=target.device)
            return tuple(t[target, b] for t in every)
        budget = pass_bytes(target.device, p["memory_mb"])
        return cap.cached(self._key(Same(target)), lambda: integrated_gradients(
            cap, adapter, self.spec, target, steps=p["steps"], rule=p["rule"], baseline=p["baseline"],
            memory_bytes=budget))

    def compute_classes(self, cap, adapter, num_classes):
        """Every class integrated (one integration per class, shared by ig_l2 and ig_mean): [B, C, n]."""
        self.check_architecture(adapter)

        def every():
            per = [self._integrate(cap, adapter, class_target(cap, c)) for c in range(num_classes)]
            return tuple(torch.stack(t) for t in zip(*per))  # attr [C, B, n, d], delta and F(X) - F(X') [C, B]

        attr = cap.cached(self._key("every class"), every)[0]
        return self.aggregate(wide(attr)).mul_(cap.mask).transpose(0, 1)

    def compute(self, cap, adapter, target):
        self.check_architecture(adapter)
        return self._result(*self._integrate(cap, adapter, target), cap.mask, adapter)

    def compute_rows(self, cap, adapter, steps, rows):
        """A generation's steps: the path's forward over the batch's sequences, shared by every step."""
        if not shares_forward(self.spec):
            return super().compute_rows(cap, adapter, steps, rows)
        self.check_architecture(adapter)
        p, r = self.params, rows()
        budget = work_bytes(cap.mask.device, IG_CPU_BYTES, p["memory_mb"], gpu_share=8)
        found = cap.cached(self._key("steps"), lambda: integrated_gradients(
            cap, adapter, self.spec, None, steps=p["steps"], rule=p["rule"], baseline=p["baseline"],
            memory_bytes=budget, outputs=Outputs.of_steps(steps, r.readout, r.foil)))
        return self._result(*found, r.mask, adapter)

    def _result(self, attr, delta, gap, mask, adapter) -> MethodResult:
        if adapter.routed:  # kept on the device (no wait per batch) for run_notes
            self.__dict__.setdefault("_relative_deltas", []).append(delta.abs() / gap.abs().clamp_min(1e-12))
        return MethodResult(scores=self.aggregate(wide(attr)) * mask, example_values={"ig_delta": delta})

    def run_notes(self):
        """On a mixture of experts, where the median |ig_delta| / |F(x) - F(x')| of the run's examples exceeds 5%:
        the cause (docs/methods.md section 5)."""
        ratios = self.__dict__.pop("_relative_deltas", None)
        if not ratios:
            return []
        median = float(torch.cat(ratios).double().quantile(0.5))  # once per run, after its last batch
        if median <= MOE_DELTA_WARN:
            return []
        return [f"integrated gradients: the median |ig_delta| / |F(x) - F(x')| is {median:.1%} (over {MOE_DELTA_WARN:.0%}): "
                "the model routes each token to experts and the routing switches along the path from the baseline, "
                "where F jumps; more --ig-steps do not close it"]
