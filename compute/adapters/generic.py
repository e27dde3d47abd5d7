"""Any other Hugging Face checkpoint: its layers and attention modules read from the model class's own record of
them (transformers' ``_can_record_outputs``), no block description. It runs the methods that need only the
embeddings, the layers' outputs, the attention probabilities and the head's output (the gradient family, IG, raw
attention, rollout, GAE, CAT/AttCAT); the decomposition methods are refused, naming the missing description.
LogAt and NormXLogit run where the task's head is one linear map of the last hidden state (after the final norm the
model applies itself): a decoder classifier's ``score``, a causal LM's output embeddings (scaled and capped as its
config says), checked once against the model's own output."""

from __future__ import annotations

import functools

import torch
from torch import nn

from ..errors import AttrscopeError
from .base import Adapter


def recorded(model: nn.Module, key: str):
    """The module class (and output index) the model class records for ``key`` ("hidden_states", "attentions")."""
    spec = (getattr(type(model), "_can_record_outputs", None) or {}).get(key)
    if spec is None:
        for cls in type(model).__mro__:
            spec = (getattr(cls, "_can_record_outputs", None) or {}).get(key)
            if spec is not None:
                break
    if spec is None:
        return None, None
    if isinstance(spec, type):
        return spec, 1 if key == "attentions" else 0
    return getattr(spec, "target_class", None), getattr(spec, "index", 1 if key == "attentions" else 0)


def generic_structure(model: nn.Module) -> str | None:
    """None where the model can be run generically, else what is missing (one phrase)."""
    if getattr(model.config, "is_encoder_decoder", False):
        return "an encoder-decoder model (attrscope explains encoders and decoders)"
    layer_cls, _ = recorded(model.base_model, "hidden_states")
    att_cls, index = recorded(model.base_model, "attentions")
    if layer_cls is None or att_cls is None or index != 1:
        return "its model class records no layer and attention modules (transformers' _can_record_outputs)"
    if model.get_input_embeddings() is None:
        return "no input embeddings"
    return None


class GenericAdapter(Adapter):
    family = "generic"

    def __init__(self, model, task="classification"):
        super().__init__(model, task)
        self.pre_ln = True  # no LayerNorm on the residual path is assumed (the post-LN methods are refused)
        self._layer_cls, _ = recorded(model.base_model, "hidden_states")
        self._att_cls, _ = recorded(model.base_model, "attentions")
        self._probe  # now, before any capture's hooks are registered (its forward would fill them)

    def layers(self):
        """The layer modules, each once (a layer shared across depths, ALBERT's, is one module called at each)."""
        return [m for m in self.model.base_model.modules() if isinstance(m, self._layer_cls)]

    @functools.cached_property
    def _probe(self) -> tuple[int, nn.Module, torch.Tensor, object]:
        """One forward of a short input: the number of layer calls, the outermost module holding the layers that
        the model calls (the base model, or OPT's decoder, which its heads call directly) with its output's first
        part (the last hidden state, after any final norm), and the model's output."""
        first = self.layers()[0]
        chain, mod = [], self.model.base_model
        while mod is not first:
            chain.append(mod)
            mod = next(c for c in mod.children() if any(m is first for m in c.modules()))
        ids = (torch.arange(1, 6) % self.config.vocab_size)[None].to(self.model.get_input_embeddings().weight.device)
        calls, kept = [], {}
        handles = [layer.register_forward_hook(lambda *_: calls.append(1)) for layer in self.layers()]

        def keep(i):
            def hook(_m, _inp, out):  # returns None: the output is kept, not replaced
                kept.setdefault(i, out if torch.is_tensor(out) else out[0])
            return hook

        handles += [m.register_forward_hook(keep(i)) for i, m in enumerate(chain)]
        try:
            with torch.no_grad():
                out = self.model(input_ids=ids, attention_mask=torch.ones_like(ids))
        finally:
            for h in handles:
                h.remove()
        outer = min(kept)
        return len(calls), chain[outer], kept[outer], out

    @property
    def n_layers(self) -> int:
        """The layers' calls in one forward: the depth (a shared layer counts at each depth it is applied)."""
        return self._probe[0]

    def embeddings(self):
        return self.model.get_input_embeddings()

    def attention_probs_module(self, layer):
        return next(m for m in layer.modules() if isinstance(m, self._att_cls))

    def final_norm(self):
        """The outermost module holding the layers that the model calls: its output's first part is the last hidden
        state (after any final norm)."""
        return self._probe[1]

    def ln1(self, layer):
        return None

    def ln2(self, layer):
        return None

    def _linear_head(self) -> nn.Linear | None:
        """The task's head as one linear map of the last hidden state, or None where it is not one."""
        if self.task == "next-token":
            head = self.model.get_output_embeddings()
        elif self.task in ("classification", "regression"):
            head = getattr(self.model, "score", None)
        else:
            head = None
        return head if isinstance(head, nn.Linear) else None

    @functools.cached_property
    def _head_refusal(self) -> str | None:
        """None where the task's head applied to the last hidden state gives the model's own output on a short
        input (so that a transform after the head that attrscope does not know is never read silently), else why
        not (one line)."""
        kind = self.config.model_type
        head = self._linear_head()
        if head is None:
            return (f"no per-token {self.task} head is known for '{kind}' models (attrscope reads a causal LM's output "
                    "embeddings or a decoder classifier's linear score)")
        _, _, h, out = self._probe
        out = out.logits
        with torch.no_grad():
            if self.task == "next-token":
                word = out[0, -1].argmax()[None]
                got, want = self.head_logit(h, word)[0], out[0, :, word[0]]
            else:
                got, want = self._head(h[:, -1]), out
        tol = 1e-4 if got.element_size() >= 4 else 2e-2
        if not torch.allclose(got.float(), want.float(), rtol=tol, atol=tol * (1 + float(want.abs().max()))):
            return (f"the {self.task} head of '{kind}' models is not one linear map of the last hidden state as "
                    "attrscope reads it (the model transforms its output further)")
        return None

    def check_head(self):
        if self._head_refusal is not None:
            raise AttrscopeError(self._head_refusal)

    def _head(self, h):
        return self.model.score(h)

    def lm_head_parts(self):
        head = self._linear_head() if self.task == "next-token" else None
        if head is None:
            raise AttrscopeError(f"no language-model head is known for '{self.config.model_type}' models (attrscope "
                                 "reads a causal LM's output embeddings)")
        return None, None, None, head  # on the last hidden state, after the model's final norm
