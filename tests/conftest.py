"""Shared fixtures: tiny seeded models of every supported architecture (never from a hub) and the ../shared assets."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SHARED_MODEL = SHARED / "models" / "minilm-sst2"
SST2_DEV = SHARED / "data" / "sst2" / "dev.tsv"

needs_shared = pytest.mark.skipif(
    not (SHARED_MODEL / "config.json").exists() or not SST2_DEV.exists(),
    reason="../shared (minilm-sst2 model and SST-2 data) is not present")

ARCHS = ("bert", "roberta", "electra", "distilbert")  # post-LN
PRE_LN_ARCHS = ("gpt2", "llama")
WORDS = ("the movie was great but long and boring film good bad not very a i it is this acting plot story "
         "loved hated fun dull [bold] slow").split()


def tiny_config(arch: str, num_labels: int = 2, layers: int = 3):
    from transformers import BertConfig, DistilBertConfig, ElectraConfig, GPT2Config, LlamaConfig, RobertaConfig

    common = dict(vocab_size=120, num_labels=num_labels, attn_implementation="eager")
    if arch == "gpt2":
        return GPT2Config(n_embd=32, n_layer=layers, n_head=4, n_positions=64, pad_token_id=0, bos_token_id=1,
                          eos_token_id=1, **common)
    if arch == "llama":  # grouped-query attention: 4 query heads share 2 value heads
        return LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                           eos_token_id=1, **common)
    if arch == "distilbert":
        return DistilBertConfig(dim=32, n_layers=layers, n_heads=4, hidden_dim=64, max_position_embeddings=64,
                                **common)
    cls = {"bert": BertConfig, "roberta": RobertaConfig, "electra": ElectraConfig}[arch]
    extra = {"embedding_size": 32} if arch == "electra" else {}
    pad = {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2} if arch == "roberta" else {}
    return cls(hidden_size=32, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=64,
               max_position_embeddings=64, type_vocab_size=2 if arch != "roberta" else 1, **extra, **pad, **common)


def tiny_model(arch: str = "bert", seed: int = 0, dtype=torch.float64, num_labels: int = 2, layers: int = 3):
    """A seeded random *ForSequenceClassification in eval mode. Weights are scaled up a little so attention is not
    uniform and LayerNorm gains/biases are not trivial."""
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(tiny_config(arch, num_labels, layers),
                                                            attn_implementation="eager")
    return _spread(model).to(dtype).eval()


def _spread(model):
    """Weights scaled up a little (from the seeded generator) so attention is not uniform and the norms' gains and
    biases are not trivial."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or ".ln_" in name:  # LayerNorm / RMSNorm gains and biases
                p.add_(0.2 * torch.randn_like(p))
            elif p.dim() == 2:
                p.mul_(3.0)
            else:
                p.add_(0.05 * torch.randn_like(p))
    return model


TASK_AUTO_CLASSES = {"classification": "AutoModelForSequenceClassification",
                     "regression": "AutoModelForSequenceClassification", "masked-token": "AutoModelForMaskedLM",
                     "next-token": "AutoModelForCausalLM", "qa": "AutoModelForQuestionAnswering"}


def tiny_task_model(arch: str, task: str, seed: int = 0, dtype=torch.float64, layers: int = 3, num_labels: int = 2):
    """tiny_model with the head of ``task`` (compute.tasks): a 1-output head for regression, a masked or causal LM
    head, a start/end QA head; the same weight scaling."""
    import transformers

    torch.manual_seed(seed)
    config = tiny_config(arch, 1 if task == "regression" else num_labels, layers)
    cls = getattr(transformers, TASK_AUTO_CLASSES[task])
    model = cls.from_config(config, attn_implementation="eager")
    return _spread(model).to(dtype).eval()


# Hugging Face's Llama computes RMSNorm and RoPE in float32 even in a float64 model, so an example inside a padded batch
# and the same example alone differ at float32 rounding (1.5e-7 relative seen with transformers 5.23); every other
# architecture is float64 throughout. Tests that compare a batched result with a one-example pass use these tolerances.
def alone_vs_batch_tol(arch: str, rtol: float, atol: float) -> dict:
    return {"rtol": max(rtol, 1e-6), "atol": max(atol, 1e-7)} if arch == "llama" else {"rtol": rtol, "atol": atol}


def assert_layer_views_alone_equal_batch(method, adapter, arch: str, scale_floor: float = 0.0,
                                         lengths: tuple[int, ...] = (5, 9, 2), capture=None) -> None:
    """A method's layer views of each example of a padded random batch equal those of the example alone (1e-5 of its
    scale, at least ``scale_floor``), explaining the batch's own predictions; pads get 0 and nothing is NaN.
    ``capture(adapter, batch, needs)``: how the batch is captured (default: the adapter's own capture)."""
    capture = capture or (lambda ad, b, needs: ad.capture(b, needs))
    batch = random_batch(arch, list(lengths))
    with torch.no_grad():
        cap = capture(adapter, batch, frozenset())
    together = method.compute(cap, adapter, cap.pred)
    assert torch.isfinite(together.layer_scores).all()
    for b, n in enumerate(lengths):
        with torch.no_grad():
            alone_cap = capture(adapter, {k: v[b:b + 1, :n] for k, v in batch.items()}, frozenset())
        alone = method.compute(alone_cap, adapter, cap.pred[b:b + 1])
        scale = max(float(alone.layer_scores.abs().max()), scale_floor)
        torch.testing.assert_close(together.layer_scores[b, :, :n], alone.layer_scores[0], rtol=0, atol=1e-5 * scale)
        assert (together.layer_scores[b, :, n:] == 0).all()


MASK_ID = 4  # [MASK] of write_tiny_model_dir's vocabulary; any id works for a random model


def random_batch(arch: str, lengths: list[int], seed: int = 1, vocab: int = 120):
    """Right-padded batch of random ids with the architecture's special tokens at the ends."""
    g = torch.Generator().manual_seed(seed)
    n = max(lengths)
    cls_id, sep_id, pad_id = {"roberta": (0, 2, 1), "gpt2": (None, None, 0), "llama": (None, None, 0)}.get(
        arch, (2, 3, 0))
    ids = torch.full((len(lengths), n), pad_id, dtype=torch.long)
    mask = torch.zeros(len(lengths), n, dtype=torch.long)
    for b, k in enumerate(lengths):
        ids[b, :k] = torch.randint(5, vocab, (k,), generator=g)
        if cls_id is not None:  # the decoders' batches carry no special tokens
            ids[b, 0], ids[b, k - 1] = cls_id, sep_id
        mask[b, :k] = 1
    return {"input_ids": ids, "attention_mask": mask}


TINY_LENGTHS = (7, 4, 9, 1)  # a padded batch: the longest, a short one, and a one-token example


def captured_tiny(arch, num_labels=3, dtype=torch.float64, lengths=TINY_LENGTHS, seed=0):
    """(model, adapter, batch, capture without internals) of a tiny random model: the gradient and LRP tests' start."""
    from compute.adapters import adapter_for

    model = tiny_model(arch, num_labels=num_labels, dtype=dtype, seed=seed)
    ad = adapter_for(model)
    ad.mask_token_id = MASK_ID
    batch = random_batch(arch, list(lengths))
    with torch.no_grad():
        cap = ad.capture(batch, frozenset())
    return model, ad, batch, cap


def write_tiny_model_dir(path: Path, arch: str = "bert", seed: int = 0) -> Path:
    """A saved tiny classifier with a WordPiece tokenizer over WORDS + letters, usable as --model PATH."""
    from transformers import BertTokenizerFast, DistilBertTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += list(dict.fromkeys(WORDS + list(string.ascii_lowercase) + [f"##{c}" for c in string.ascii_lowercase]
                                + list(".,!?'-")))
    assert len(vocab) <= 120
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok_cls = DistilBertTokenizerFast if arch == "distilbert" else BertTokenizerFast
    # the vocabulary itself, not vocab_file (transformers 5 ignores that argument: every word became [UNK])
    tok = tok_cls(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True)
    assert tok.tokenize("the movie") == ["the", "movie"]
    tok.save_pretrained(path)
    model = tiny_model(arch, seed=seed, dtype=torch.float32)
    model.config.id2label = {0: "negative", 1: "positive"}
    model.config.label2id = {"negative": 0, "positive": 1}
    model.save_pretrained(path)
    return path


def tiny_vocab() -> list[str]:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += list(dict.fromkeys(WORDS + list(string.ascii_lowercase) + [f"##{c}" for c in string.ascii_lowercase]
                                + list(".,!?'-")))
    assert len(vocab) <= 120
    return vocab


def write_tiny_task_model_dir(path: Path, arch: str, task: str, seed: int = 0) -> Path:
    """A saved tiny model with the head of ``task`` and a word-level tokenizer over tiny_vocab(): BERT's (with [CLS]
    and [SEP]) for encoders, one that adds no special tokens for the decoders (a causal LM reads the prefix as is)."""
    write_tiny_tokenizer(path, decoder=arch in PRE_LN_ARCHS)
    model = tiny_task_model(arch, task, seed=seed, dtype=torch.float32)
    model.save_pretrained(path)
    return path


def write_tiny_tokenizer(path: Path, decoder: bool) -> None:
    """A word-level tokenizer over tiny_vocab() saved in ``path``: BERT's (with [CLS] and [SEP]), or for a decoder
    one that adds no special tokens."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import WordPiece
    from transformers import BertTokenizerFast, PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    vocab = {t: i for i, t in enumerate(tiny_vocab())}
    if decoder:
        raw = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
        raw.normalizer = normalizers.Lowercase()
        raw.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        raw.decoder = decoders.WordPiece()
        tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", pad_token="[PAD]", eos_token="[SEP]")
    else:
        tok = BertTokenizerFast(vocab=vocab, do_lower_case=True)
    tok.save_pretrained(path)


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {arch: write_tiny_model_dir(root / arch, arch) for arch in ("bert", "distilbert")}


@pytest.fixture(scope="session")
def shared_dev_store(tmp_path_factory):
    """The acceptance run on the shared model over all of SST-2 dev (computed once per session)."""
    if not (SHARED_MODEL / "config.json").exists() or not SST2_DEV.exists():
        pytest.skip("../shared is not present")
    from compute.runner import RunConfig, run

    out = tmp_path_factory.mktemp("shared") / "run.h5"
    run(RunConfig(dataset=str(SST2_DEV), model=str(SHARED_MODEL),
                  methods="raw_attention,rollout,norm,logat,normxlogit", matrices="all", output=str(out)))
    return out


@torch.no_grad()
def assert_batch_invariant(arch: str, name: str, lengths=(5, 12, 3, 9), params: dict | None = None,
                           declared: bool = False) -> None:
    """Each example of a padded float32 batch agrees with the same example computed alone, to 1e-5 (relative to the
    larger of 1 and its magnitude), for scores, layer views, matrices and per-example values. ``declared``: the
    captures carry the method's passes and attention terms, as a run's do."""
    from compute.adapters import adapter_for
    from compute.methods import get_method

    model = tiny_model(arch, dtype=torch.float32)
    ad = adapter_for(model)
    ad.mask_token_id = MASK_ID
    batch = random_batch(arch, list(lengths))
    if name == "mask_lrp" and not params:  # it needs a head mask: every other head
        params = {"head_mask": [[(l + h) % 2 for h in range(ad.n_heads)] for l in range(ad.n_layers)]}
    m = get_method(name, **(params or {}))
    def capture(enc):
        cap = ad.capture(enc, m.needs)
        if declared:
            cap.passes, cap.attention_terms = m.passes, frozenset(m.attention_terms)
        return cap

    cap = capture(batch)
    together = m.compute(cap, ad, cap.pred)
    for b, n in enumerate(lengths):
        cap1 = capture({k: v[b:b + 1, :n] for k, v in batch.items()})
        assert int(cap1.pred) == int(cap.pred[b])
        alone = m.compute(cap1, ad, cap1.pred)
        for field in ("scores", "layer_scores", "matrices"):
            x, y = getattr(together, field), getattr(alone, field)
            if x is None:
                assert y is None
                continue
            x = x[b][..., :n, :n] if field == "matrices" else x[b][..., :n]
            scale = max(float(y.abs().max()), 1.0)
            torch.testing.assert_close(x, y[0], rtol=1e-5, atol=1e-5 * scale)
        for key, v in (together.example_values or {}).items():
            torch.testing.assert_close(v[b], alone.example_values[key][0], rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def one_thread():
    """The tiny models are fastest on one thread, and the machine is shared (modules that run attr-compute)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
