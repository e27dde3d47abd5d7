"""Step-by-step generation attribution by the peer, inseq 0.7.1, on tiny random decoders: the numbers
tests/test_generate_inseq.py holds attrscope's `--task generate` to (issue 37).

inseq 0.7.1 pins CUDA wheels and is tested under transformers 4.x, so this script runs in an environment of its own,
never the project's:

    python -m venv /work/venv-inseq
    /work/venv-inseq/bin/pip install torch==2.13.0
    /work/venv-inseq/bin/pip install --no-deps inseq==0.7.1
    /work/venv-inseq/bin/pip install transformers==4.57.6 captum jaxtyping "typeguard<=2.13.3" matplotlib tqdm \
        treescope rich protobuf sentencepiece pytest
    /work/venv-inseq/bin/python benchmarks/inseq_reference.py --write-checkpoints

(pytest only because tests/conftest.py, whose tiny configs, weight spreading and word-level tokenizer this script
reuses, imports it.)

With --write-checkpoints it first saves the tiny seeded causal LMs (tests/conftest.py's Llama and GPT-2, 2 layers,
float32 safetensors; its decoder tokenizer without word pieces, the vocabulary cut to it) under tests/fixtures/inseq/<family>/, so that both environments load the
very same weights. One change to the weights: the [UNK] row of the token embedding is zeroed, because inseq's
integrated gradients start from the [UNK] token's embedding, so that its baseline is attrscope's zero baseline on
Llama (no position embedding). On GPT-2 inseq's baseline is zero *token* embeddings with the position embeddings
kept (inseq attributes the token embedding, `inputs_embeds`), while attrscope's `--ig-baseline zero` zeroes the
embedding module's output (token + position): the saliency is the same, gradient x input and IG are not.

Then, in float64, for each of 12 fixed prompts: the greedy continuation of up to MAX_NEW tokens (Hugging Face's
generate, stopping at the tokenizer's EOS, [SEP], which the checkpoint's config names), and inseq's attribution of it, teacher forced on that continuation, one prompt at a time,
the attributed function being the target token's logit (`attributed_fn="logit"`; inseq's default is the
probability, attrscope explains the logit), for saliency, input_x_gradient and integrated_gradients (50 steps,
Gauss-Legendre: captum's default, as attrscope's). Each gives per step t the raw attribution of every earlier
token, [positions, steps, hidden]; the fixture keeps its L2 norm, its sum and the sum of its absolute values over the
hidden dimension (the latter the aggregation of attrscope's *_mean methods, a mean |.|: the test divides), and writes
tests/fixtures/inseq/inseq_generate.json with the versions and this command line.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "inseq"
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from lxt_reference import TORCHVISION_NOTE  # noqa: E402,F401 - the same torchvision stub before transformers

import transformers  # noqa: E402

FAMILIES = ("llama", "gpt2")
MAX_NEW = 6
LAYERS = 2
METHODS = ("saliency", "input_x_gradient", "integrated_gradients")
PROMPTS = [
    "the movie was great",
    "it is a slow film",
    "i loved the story",
    "the plot was dull and long",
    "this story is not good",
    "a bad movie",
    "i hated it",
    "the film is fun but very long",
    "acting good plot bad",
    "it was boring",
    "this is a great story",
    "not a fun film",
]


def write_tokenizer(path: Path):
    """tests/conftest.py's decoder tokenizer without its word pieces (##x) and "[bold]": every token sequence the model generates
    then decodes to a text that tokenises back to it, which inseq needs (it takes the continuation as text)."""
    from conftest import tiny_vocab
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import WordPiece

    words = [w for w in tiny_vocab() if not w.startswith("##") and w != "[bold]"]  # "[bold]" splits at "["
    vocab = {t: i for i, t in enumerate(words)}
    raw = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    raw.normalizer = normalizers.Lowercase()
    raw.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    raw.decoder = decoders.WordPiece()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", pad_token="[PAD]",
                                               eos_token="[SEP]")
    tok.save_pretrained(path)
    return tok


def write_checkpoints() -> None:
    """conftest's seeded tiny causal LMs with the vocabulary cut to the tokenizer's (no id without a token), the
    [UNK] embedding zeroed (inseq's IG baseline) and the tokenizer's EOS as the model's."""
    from conftest import tiny_task_model

    for family in FAMILIES:
        path = FIXTURES / family
        tok = write_tokenizer(path)
        model = tiny_task_model(family, "next-token", dtype=torch.float32, layers=LAYERS)
        model.resize_token_embeddings(len(tok), mean_resizing=False)
        with torch.no_grad():
            model.get_input_embeddings().weight[tok.unk_token_id].zero_()
        for config in (model.config, model.generation_config):
            config.eos_token_id, config.pad_token_id = tok.eos_token_id, tok.pad_token_id
        model.save_pretrained(path)


def greedy(model, tok, prompt: str) -> list[int]:
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def attribute(model, tok, method: str, prompt: str, continuation: list[int]) -> torch.Tensor:
    """inseq's raw attribution [positions, steps, hidden] of the prompt + continuation, teacher forced."""
    import inseq

    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    full = tok.decode(ids + continuation)
    if tok(full, add_special_tokens=False)["input_ids"] != ids + continuation:
        raise SystemExit(f"{prompt!r}: the continuation does not re-tokenise to itself; pick another prompt")
    inseq_model = inseq.load_model(model, method, tokenizer=tok)
    # captum's IG quadrature defaults to Gauss-Legendre (inseq's own `method` argument is the attribution method)
    args = {"n_steps": 50} if method == "integrated_gradients" else {}
    out = inseq_model.attribute(tok.decode(ids), generated_texts=full, attributed_fn="logit",
                                skip_special_tokens=False, show_progress=False, **args)
    attr = out.sequence_attributions[0].target_attributions  # [positions, steps, hidden], NaN after each step
    return attr[:len(ids) + len(continuation)]


def main(argv=None) -> None:
    import inseq

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-checkpoints", action="store_true")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    if args.write_checkpoints:
        write_checkpoints()
    doc = {"versions": {"inseq": inseq.__version__ if hasattr(inseq, "__version__") else "0.7.1",
                        "transformers": transformers.__version__, "torch": torch.__version__,
                        "python": platform.python_version()},
           "command": " ".join(["python", *sys.argv]), "torchvision_note": TORCHVISION_NOTE,
           "max_new_tokens": MAX_NEW, "attributed_fn": "logit", "ig": {"n_steps": 50, "method": "gausslegendre"},
           "models": {}}
    for family in FAMILIES:
        path = FIXTURES / family
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64,
                                                                  attn_implementation="eager").eval()
        tok = transformers.AutoTokenizer.from_pretrained(path)
        entry = {"prompts": [], "prompt_ids": [], "continuations": [], "methods": {m: [] for m in METHODS}}
        for prompt in PROMPTS:
            cont = greedy(model, tok, prompt)
            entry["prompts"].append(prompt)
            entry["prompt_ids"].append(tok(prompt, add_special_tokens=False)["input_ids"])
            entry["continuations"].append(cont)
            for method in METHODS:
                attr = attribute(model, tok, method, prompt, cont).double()
                n0 = len(entry["prompt_ids"][-1])
                steps = []
                for t in range(len(cont)):  # step t explains token n0 + t from the n0 + t tokens before it
                    a = attr[:n0 + t, t]
                    steps.append({"l2": torch.linalg.vector_norm(a, dim=-1).tolist(), "sum": a.sum(-1).tolist(),
                                  "abs_sum": a.abs().sum(-1).tolist()})
                entry["methods"][method].append(steps)
        doc["models"][family] = entry
        print(f"{family}: {len(PROMPTS)} prompts x {MAX_NEW} steps x {len(METHODS)} methods", flush=True)
    (FIXTURES / "inseq_generate.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
