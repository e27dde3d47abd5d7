"""Any other Hugging Face checkpoint: its layers and attention modules read from the model class's own record of
them (transformers' ``_can_record_outputs``), no block description. It runs the methods that need only the
embeddings, the layers' outputs, the attention probabilities and the head's output (the gradient family, IG, raw
attention, rollout, GAE, CAT/AttCAT); the decomposition methods are refused, naming the missing description."""

from __future__ import annotations

from torch import nn

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

    def layers(self):
        return [m for m in self.model.base_model.modules() if isinstance(m, self._layer_cls)]

    def embeddings(self):
        return self.model.get_input_embeddings()

    def attention_probs_module(self, layer):
        return next(m for m in layer.modules() if isinstance(m, self._att_cls))

    def final_norm(self):
        """The base model itself: its output's first part is the last hidden state (after any final norm)."""
        return self.model.base_model

    def ln1(self, layer):
        return None

    def ln2(self, layer):
        return None

    def _head(self, h):
        head = getattr(self.model, "score", None)
        if head is None:
            from ..errors import AttrscopeError

            raise AttrscopeError(f"no per-token head is known for '{self.config.model_type}' models")
        return head(h)
