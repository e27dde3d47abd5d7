"""Architecture adapters: read a model's per-layer internals with forward hooks on the stock Hugging Face modules.

One file per family declares its block (``block.Block``: where the modules are and how they combine) and its heads;
``base.Adapter`` derives the structure and the capture from the block. A checkpoint of another family runs through
``generic.GenericAdapter`` (the methods that need no block description). Nothing is copied or patched from the
modelling files.
"""

from __future__ import annotations

from torch import nn

from ..errors import AttrscopeError
from .base import NEEDS, STACKED, Adapter, Captured, last_real_token, module_at
from .bert import BertAdapter
from .block import Block
from .bloom import BloomAdapter
from .cohere import CohereAdapter
from .deberta_v2 import DebertaV2Adapter
from .distilbert import DistilBertAdapter
from .falcon import FalconAdapter
from .gemma import GemmaAdapter
from .gemma2 import Gemma2Adapter
from .gemma3 import Gemma3Adapter
from .generic import GenericAdapter, generic_structure
from .gpt2 import GPT2Adapter
from .gpt_bigcode import GPTBigCodeAdapter
from .gpt_neox import GPTNeoXAdapter
from .gptj import GPTJAdapter
from .granite import GraniteAdapter
from .llama import LlamaAdapter
from .mistral import MistralAdapter
from .mixtral import MixtralAdapter
from .modernbert import ModernBertAdapter
from .mpt import MptAdapter
from .olmo import OlmoAdapter
from .olmo2 import Olmo2Adapter
from .olmoe import OlmoeAdapter
from .opt import OPTAdapter
from .phi import PhiAdapter
from .phi3 import Phi3Adapter
from .qwen2 import Qwen2Adapter
from .qwen2_moe import Qwen2MoeAdapter, Qwen3MoeAdapter
from .qwen3 import Qwen3Adapter
from .stablelm import StableLmAdapter
from .starcoder2 import Starcoder2Adapter

ADAPTERS: tuple[type[Adapter], ...] = (BertAdapter, DistilBertAdapter, GPT2Adapter, LlamaAdapter, Qwen2Adapter,
                                       Qwen3Adapter, MistralAdapter, GemmaAdapter, Gemma2Adapter, Phi3Adapter,
                                       GPTNeoXAdapter, Olmo2Adapter, ModernBertAdapter, DebertaV2Adapter,
                                       Gemma3Adapter, OlmoAdapter, Starcoder2Adapter, MixtralAdapter, Qwen2MoeAdapter,
                                       Qwen3MoeAdapter, StableLmAdapter, PhiAdapter, GPTBigCodeAdapter, OPTAdapter,
                                       GPTJAdapter, CohereAdapter, GraniteAdapter, OlmoeAdapter, BloomAdapter,
                                       FalconAdapter, MptAdapter)
# The families with a block description (every method defined for the block runs); any other checkpoint, or one of
# these in a configuration its family's file does not describe (Adapter.describes), runs the methods that need none
# (GenericAdapter).
SUPPORTED_MODEL_TYPES = tuple(t for a in ADAPTERS for t in a.model_types)


def adapter_for(model: nn.Module, task: str = "classification") -> Adapter:
    """The adapter of ``model``'s family, for the head ``task`` (compute.tasks) names."""
    from ..tasks import get_task

    model_type = getattr(model.config, "model_type", "?")
    explained = get_task(task)
    explained.check_model(model)
    task = explained.explained_task  # what the methods explain per output (a generation's steps: next-token)
    for cls in ADAPTERS:
        if model_type in cls.model_types and cls.describes(model):
            return cls(model, task)
    missing = generic_structure(model)
    if missing is not None:
        raise AttrscopeError(f"unsupported architecture '{model_type}': {missing}; attrscope describes the blocks of "
                             f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    return GenericAdapter(model, task)


__all__ = ["ADAPTERS", "NEEDS", "STACKED", "SUPPORTED_MODEL_TYPES", "Adapter", "Block", "Captured", "adapter_for",
           "last_real_token", "module_at"]
