"""Loading a Hugging Face sequence classifier (hub id or local directory) with eager attention, plus its provenance."""

from __future__ import annotations

import os
import pickle
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError

from .adapters import SUPPORTED_MODEL_TYPES, Adapter, adapter_for
from .errors import AttrscopeError, UsageError
from .tasks import TASKS, Task, detect_task, get_task


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    adapter: Adapter
    task: Task  # what the run explains (compute.tasks): --task, or detected from the model's head
    info: dict  # provenance: model_id, revision, tokenizer, attn implementation, dtype, device ...


def resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise UsageError(f"--device '{spec}' is not a device: use auto, cpu, cuda or cuda:K") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise AttrscopeError(f"--device {spec}: CUDA is not available on this machine: use --device cpu or auto")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise AttrscopeError(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) here")
    return dev


def _check_model_type(config, source: str) -> None:
    """Before the weights load: an encoder-decoder is refused (the other families are checked on the model itself by
    compute.adapters.adapter_for: a described block, or the generic adapter's needs)."""
    model_type = getattr(config, "model_type", None)
    if getattr(config, "is_encoder_decoder", False):
        raise AttrscopeError(
            f"unsupported architecture '{model_type}' ({source}): an encoder-decoder model; attrscope explains "
            f"encoders and decoders and describes the blocks of {', '.join(SUPPORTED_MODEL_TYPES)}")


def load_model(spec: str | None, *, device: torch.device, dtype: str = "float32",
               allow_random_head: bool = False, task: str = "auto", task_options: dict | None = None) -> LoadedModel:
    """Load ``spec`` (None: the bundled demo classifier) on ``device`` with the head of ``task`` (auto: detected
    from the checkpoint's config); eval mode, eager attention. A checkpoint whose task head transformers had to
    initialise at random is refused unless ``allow_random_head``."""
    from .demo import DEMO_MODEL_ID, load_demo_model

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                   "float64": torch.float64}[dtype]
    if spec in (None, DEMO_MODEL_ID):
        model, tokenizer, info = load_demo_model()
        task = "classification" if task == "auto" else task
    else:
        model, tokenizer, info, task = _load_hf(spec, allow_random_head, task)
    model = model.to(device=device, dtype=torch_dtype).eval()
    adapter = adapter_for(model, task)
    adapter.mask_token_id = getattr(tokenizer, "mask_token_id", None)
    adapter.sep_token_id = getattr(tokenizer, "sep_token_id", None)
    # [UNK] is in the tokenizer's special list but stands for a word of the text
    unk = getattr(tokenizer, "unk_token_id", None)
    adapter.special_ids = [i for i in getattr(tokenizer, "all_special_ids", []) or [] if i != unk] or None
    impl = getattr(model.config, "_attn_implementation", None)
    if impl not in (None, "eager"):
        raise AttrscopeError(f"model loaded with attention implementation '{impl}': attrscope needs 'eager'")
    info.update(
        attn_implementation="eager",
        model_type=model.config.model_type,
        model_class=type(model).__name__,
        n_layers=adapter.n_layers,
        n_heads=adapter.n_heads,
        hidden_size=int(model.config.hidden_size if hasattr(model.config, "hidden_size") else model.config.dim),
        num_labels=int(model.config.num_labels),
        id2label={int(k): v for k, v in model.config.id2label.items()},
        tokenizer_class=type(tokenizer).__name__,
        dtype=dtype,
        device=str(device),
    )
    info["task"] = task
    return LoadedModel(model=model, tokenizer=tokenizer, adapter=adapter, info=info,
                       task=get_task(task, **(task_options or {})))


def quiet_transformers() -> None:
    """Our own progress bar is the only one: silence transformers' weight-loading bars and advisory warnings."""
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    hub_logging.set_verbosity_error()  # its HTTP retry messages


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub's host resolves and accepts a connection (offline machines fail at once, no retries)."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


# A hub id is "name" or "owner/name"; anything else that names no existing directory is a local path that is missing.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?")


def _missing_directory(spec: str) -> bool:
    """Whether ``spec`` is written as a local path (./x, ../x, /x, ~/x, a/b/c) and no such path exists."""
    return not os.path.exists(os.path.expanduser(spec)) and (
        spec.startswith((".", "/", "~")) or not _HUB_ID.fullmatch(spec))


def _load_hf(spec: str, allow_random_head: bool = False, task: str = "auto"):
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    quiet_transformers()
    if _missing_directory(spec):
        raise AttrscopeError(f"model directory '{spec}' does not exist: check the path (a hub id is name or owner/name)")
    spec = os.path.expanduser(spec)
    local = os.path.isdir(spec)
    if os.path.exists(spec) and not local:
        raise AttrscopeError(f"--model '{spec}' is a file: pass the directory that holds config.json")
    if local and not os.path.isfile(os.path.join(spec, "config.json")):
        raise AttrscopeError(
            f"model directory '{spec}' has no config.json: pass a directory written by save_pretrained, or a hub id")
    # A hub id: use the local Hugging Face cache when it has the model, else the hub if it can be reached.
    offline = not local and not _cached(spec) and not _hub_reachable()
    if offline:
        raise AttrscopeError(
            f"cannot load model '{spec}': there is no such local directory, it is not in the local Hugging Face cache "
            "and the hub cannot be reached (offline): pass a local directory with --model")
    try:
        config = AutoConfig.from_pretrained(spec)
    except (OSError, ValueError) as err:
        if local:
            raise AttrscopeError(f"cannot read the model config in '{spec}': {_one_line(err)}") from None
        raise AttrscopeError(
            f"cannot load model '{spec}' from the Hugging Face hub (no such model?): {_one_line(err)}") from None
    _check_model_type(config, spec)
    if task == "auto":
        task = detect_task(config)
    auto_class = getattr(transformers, TASKS[task].auto_class)
    try:
        model, loading = auto_class.from_pretrained(spec, attn_implementation="eager", output_loading_info=True)
        tokenizer = AutoTokenizer.from_pretrained(spec)
    except (OSError, ValueError) as err:
        raise AttrscopeError(f"cannot load model '{spec}': {_one_line(err)}") from None
    except (SafetensorError, pickle.UnpicklingError, RuntimeError, EOFError):
        # a damaged or unsafe weights file: named if it is one of the directory's (else an internal error stays one)
        bad = _bad_weights(spec if local else _hub_snapshot(spec))
        if bad is None:
            raise
        raise bad from None
    needed = _missing_tokenizer_files(spec, type(tokenizer)) if local else None
    if needed is not None:  # transformers then makes a tokenizer of the special tokens alone: every word [UNK]
        raise AttrscopeError(
            f"model directory '{spec}' lacks its tokenizer files (it needs {needed}): every word would be the "
            "unknown token: save the tokenizer into it too (tokenizer.save_pretrained) or copy its files there")
    random_weights = _newly_initialised(loading)
    if random_weights and not allow_random_head:
        raise AttrscopeError(
            f"model '{spec}' has no trained {task} head: {_few(random_weights)} are not in the checkpoint "
            f"and would be initialised at random: pass a model trained for it (a *{TASKS[task].class_suffixes[0]} "
            "checkpoint), the --task its head is for, or --allow-random-head to run it anyway (for testing only)")
    pad_note = None
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        # GPT-2 has no pad token; padding is masked out, and HF's classifier then pools the last non-pad token.
        tokenizer.pad_token = tokenizer.eos_token
        pad_note = "pad token set to the eos token by attrscope"
    if model.config.pad_token_id is None and tokenizer.pad_token_id is not None:
        model.config.pad_token_id = tokenizer.pad_token_id
    info = {
        "pad_token": pad_note,
        "model_id": os.path.abspath(spec) if local else spec,
        "model_source": "local" if local else "hub",
        "revision": getattr(config, "_commit_hash", None),
        "tokenizer": getattr(tokenizer, "name_or_path", spec),
        # --allow-random-head: the weights transformers initialised at random (results change from load to load)
        "random_head": random_weights or None,
    }
    return model, tokenizer, info, task


TOKENIZER_FILE = "tokenizer.json"  # the fast tokenizer's one file, which every tokenizer class reads


def _missing_tokenizer_files(directory: str, tokenizer_class: type) -> str | None:
    """None when ``directory`` holds a tokenizer: tokenizer.json, or every vocabulary file of ``tokenizer_class``
    (vocab.txt; vocab.json and merges.txt; a sentencepiece model), or the class reads none (bytes or characters,
    ByT5, CANINE); else what it needs, for the message."""
    files = list((getattr(tokenizer_class, "vocab_files_names", None) or {}).values())
    if not files or os.path.isfile(os.path.join(directory, TOKENIZER_FILE)):
        return None
    own = [f for f in files if f != TOKENIZER_FILE]
    if own and all(os.path.isfile(os.path.join(directory, f)) for f in own):
        return None
    return TOKENIZER_FILE + (f", or {' and '.join(own)}" if own else "")


WEIGHTS_RULE = "attrscope loads only safetensors files or weights-only pickles"


def _hub_snapshot(spec: str) -> str | None:
    """The local directory of a hub model's downloaded files (None: not downloaded)."""
    from transformers.utils import cached_file

    try:
        config = cached_file(spec, "config.json", local_files_only=True)
    except (OSError, ValueError):
        return None
    return os.path.dirname(config) if config else None


def _bad_weights(directory: str | None) -> AttrscopeError | None:
    """The error for the first of the directory's weights files that does not load as safetensors or as a
    weights-only pickle (transformers reads the safetensors files when there are any), else None. A pickle is read
    by torch's weights-only unpickler onto the meta device: nothing in it is run, no tensor is read."""
    from safetensors import safe_open

    if directory is None:
        return None
    here = Path(directory)
    files = sorted(here.glob("model*.safetensors")) or sorted(here.glob("pytorch_model*.bin"))
    for path in files:
        try:
            if path.suffix == ".safetensors":
                with safe_open(path, framework="pt"):  # the header, checked against the file's size
                    pass
            else:
                torch.load(path, map_location="meta", weights_only=True)
        except pickle.UnpicklingError as err:
            called = re.search(r"GLOBAL (\S+)", str(err))
            if called is None:  # not a refused global: a damaged pickle
                return _damaged(path, "a weights pickle", err)
            return AttrscopeError(
                f"weights file '{path}' is a pickle that would call {called.group(1)} when loaded, not only "
                f"weights: refused, nothing in it was run; {WEIGHTS_RULE}: convert a checkpoint you trust to "
                "safetensors (save_pretrained), or use the model's safetensors release")
        except (SafetensorError, RuntimeError, EOFError, OSError, ValueError) as err:
            return _damaged(path, "a safetensors file" if path.suffix == ".safetensors" else "a weights pickle", err)
    return None


def _damaged(path: Path, kind: str, err: Exception) -> AttrscopeError:
    reason = _one_line(err).split(". ")[0][:120]  # torch's advice after the first sentence is not for the user
    return AttrscopeError(f"weights file '{path}' is damaged (cut short, or not {kind}: {reason}); "
                          f"{WEIGHTS_RULE}: save or download the model again")


def _newly_initialised(loading: dict) -> list[str]:
    """Weights transformers initialised at random: missing from the checkpoint, or there with another shape."""
    missing = list(loading.get("missing_keys") or [])
    mismatched = [m[0] if isinstance(m, (tuple, list)) else m for m in loading.get("mismatched_keys") or []]
    return sorted(set(missing) | set(mismatched))


def _few(names: list[str], show: int = 3) -> str:
    """'a, b, c and 4 more'."""
    head = ", ".join(names[:show])
    return head if len(names) <= show else f"{head} and {len(names) - show} more"


def _cached(spec: str) -> bool:
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(spec, local_files_only=True)
        return True
    except (OSError, ValueError):
        return False


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())[:300]
