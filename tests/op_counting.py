"""ATen operations per batch (each one a kernel launch on a GPU, views aside), counted with a TorchDispatchMode on
the CPU with every block sized as on an 80 GB GPU: every method against the bare model pass it needs, and the budget
it is held to (``Method.op_budget``). A fused custom operator (compute.methods._internals.fused) counts as one: on a
GPU it is one Triton kernel.

Used by tests/test_op_budget.py (the budgets as a test) and benchmarks/op_count.py (the table).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode


# Ops whose result size or value a GPU must send to the host before the next launch: the host waits for the device
# (.item() and bool(tensor) are _local_scalar_dense; a boolean mask index needs a nonzero; .tolist() of a CPU
# tensor reads memory without an op: tests/test_op_budget.py looks for it in the source instead).
SYNCING = frozenset({"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten._unique2",
                     "aten.unique_consecutive", "aten.unique_dim", "aten.bincount", "aten.index(bool)",
                     "aten.index_put(bool)", "aten.index_put_(bool)"})


@dataclass
class OpCount:
    total: int = 0
    views: int = 0  # ops that return a view of an input (no kernel runs)
    by_op: Counter = field(default_factory=Counter)

    @property
    def syncs(self) -> Counter:
        """The ops that make the host wait for a GPU, by name."""
        return Counter({op: k for op, k in self.by_op.items() if op in SYNCING})


class CountOps(TorchDispatchMode):
    """Counts every ATen op dispatched while active (forward and backward alike). ``model``: the syncs inside its own
    forward (Hugging Face's mask checks) are the model's, not the method's: they are counted as "model sync"."""

    def __init__(self, model: torch.nn.Module | None = None):
        super().__init__()
        self.count = OpCount()
        self.model, self.depth, self.handles = model, 0, []

    def __enter__(self):
        if self.model is not None:
            # any module of the model's class: a method's own copy of the model (the LRP family's float64 copy)
            # runs the same forward, with the same mask checks
            kind = type(self.model)
            from torch.nn.modules.module import (register_module_forward_hook,
                                                 register_module_forward_pre_hook)

            def enter(module, *_):
                if isinstance(module, kind):
                    self.depth += 1

            def leave(module, *_):
                if isinstance(module, kind):
                    self.depth -= 1

            self.handles = [register_module_forward_pre_hook(enter),
                            register_module_forward_hook(leave, always_call=True)]
        return super().__enter__()

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        c = self.count
        c.total += 1
        name = str(func.overloadpacket)
        if name in ("aten.index", "aten.index_put", "aten.index_put_") and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ())):
            name += "(bool)"  # a boolean mask index: its output size comes from the device (a nonzero)
        if self.depth and name in SYNCING:
            name = f"model sync {name}"
        c.by_op[name] += 1
        returns = func._schema.returns
        if returns and returns[0].alias_info is not None and not returns[0].alias_info.is_write:
            c.views += 1
        return func(*args, **(kwargs or {}))


def count(fn, model: torch.nn.Module | None = None) -> OpCount:
    with CountOps(model) as mode:
        fn()
    return mode.count


def random_bert(layers: int, hidden: int = 768, heads: int = 12, seed: int = 0):
    """A seeded random BERT classifier of BERT-base's width (the issue's shape), float32, eval mode, and its adapter."""
    from transformers import BertConfig, BertForSequenceClassification

    from compute.adapters import adapter_for

    torch.manual_seed(seed)
    config = BertConfig(hidden_size=hidden, num_attention_heads=heads, intermediate_size=4 * hidden,
                        num_hidden_layers=layers, attn_implementation="eager")
    model = BertForSequenceClassification(config).eval()
    adapter = adapter_for(model)
    adapter.mask_token_id, adapter.sep_token_id = 103, 102
    return model, adapter


def random_llama(layers: int, hidden: int = 96, heads: int = 12, seed: int = 0):
    """A seeded random Llama classifier (pre-LN, RMSNorm, grouped-query attention, gated MLP), float32, eval mode, and
    its adapter: the pre-LN forms of the methods (docs/methods.md 6)."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from compute.adapters import adapter_for

    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=heads // 3,
                         intermediate_size=4 * hidden, num_hidden_layers=layers, vocab_size=30522, pad_token_id=0,
                         attn_implementation="eager")
    model = LlamaForSequenceClassification(config).eval()
    return model, adapter_for(model)


def random_batch(batch: int, tokens: int, seed: int = 1) -> dict:
    """Random ids with [CLS] ... [SEP], the second example shorter (a padded batch)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 30000, (batch, tokens), generator=g)
    mask = torch.ones_like(ids)
    for b in range(batch):
        k = tokens - 3 * b
        ids[b, 0], ids[b, k - 1] = 101, 102
        ids[b, k:], mask[b, k:] = 0, 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def bare_counts(model, batch: dict) -> dict[str, OpCount]:
    """The bare forward (no hooks, no grad) and the bare forward + backward from the input embeddings."""
    inputs = {k: v for k, v in batch.items() if k != "input_ids"}

    def forward():
        with torch.no_grad():
            model(**batch)

    def forward_backward():
        E = model.get_input_embeddings()(batch["input_ids"]).detach().requires_grad_(True)
        logits = model(inputs_embeds=E, **inputs).logits
        torch.autograd.grad(logits.gather(1, logits.argmax(-1, keepdim=True)).sum(), E)

    forward(), forward_backward()  # warm-up: lazily made state is not the batch's
    return {"forward": count(forward), "backward": count(forward_backward)}


@dataclass
class Row:
    method: str
    count: OpCount
    base: str  # "forward" | "backward" (fwd + bwd)
    ratio: float
    budget: float


def method_params(name: str, adapter) -> dict:
    if name == "mask_lrp":  # every other head kept (the cost does not depend on the mask)
        return {"head_mask": [[(l + h) % 2 for h in range(adapter.n_heads)] for l in range(adapter.n_layers)]}
    if name.startswith("ig_"):
        return {"steps": 16}
    return {}


# Blocks are sized as on this GPU (compute.methods._internals.budget): the counts are the kernels a GPU launches.
GPU_BYTES = 80 << 30


def method_count(name: str, model, adapter, batch: dict, **params) -> OpCount:
    """Ops of one method on a captured batch, its blocks sized as on an 80 GB GPU (the capture forward itself not
    counted: its hooks add no ops); ``params`` beside method_params's (a dtype)."""
    from compute.methods import get_method
    from compute.methods._internals.budget import sized_as_gpu

    method = get_method(name, **method_params(name, adapter), **params)
    cap = adapter.capture(batch, method.needs)
    target = cap.pred

    def run():
        cap.memo.clear()
        with torch.no_grad():
            method.compute(cap, adapter, target)

    with sized_as_gpu(GPU_BYTES):
        run()  # warm-up: weight caches (kept across batches) are not the batch's
        return count(run, model)


def count_table(layers: int, hidden: int = 768, heads: int = 12, batch: int = 2, tokens: int = 24,
                methods: str = "all", family: str = "bert") -> tuple[list[Row], dict[str, OpCount]]:
    """The table for a random BERT, or Llama (``family``: pre-LN, RMSNorm, grouped-query attention, gated MLP; the
    methods defined there)."""
    from compute.errors import AttrscopeError
    from compute.methods import REGISTRY, get_method, parse_methods

    model, adapter = (random_bert if family == "bert" else random_llama)(layers, hidden, heads)
    inputs = random_batch(batch, tokens)
    if family != "bert":
        inputs.pop("token_type_ids")
    bare = bare_counts(model, inputs)
    rows = []
    for name in parse_methods(methods):
        cls = REGISTRY[name]
        try:
            get_method(name, **method_params(name, adapter)).check_architecture(adapter)
        except AttrscopeError:
            continue  # not defined for the family
        base = cls.op_base()
        c = method_count(name, model, adapter, inputs)
        rows.append(Row(name, c, base, c.total / bare[base].total, cls.op_budget))
    return rows, bare
