"""--chat-template (--task generate): each prompt becomes a user turn of the tokenizer's chat template with the
assistant's turn opened; the run equals one on the prompts already wrapped by hand; a tokenizer without a template is
refused in one line with nothing written; a template's leading start token is not read twice."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from cli_results import invoke, ok, one_line
from conftest import write_tiny_task_model_dir
from store import open_store

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["the movie was", "i loved it", "a dull plot and"]
# every word of it in the tiny vocabulary (letters and "-", "."): the wrapped prompt has no unknown token
TEMPLATE = ("{% for m in messages %}{{ m['role'] }} - {{ m['content'] }} . {% endfor %}"
            "{% if add_generation_prompt %}assistant -{% endif %}")
RUN = ("--task", "generate", "--max-new-tokens", "3", "--methods", "rollout,grad_l2,alti", "--device", "cpu", "-q")


def wrapped(prompt: str) -> str:
    return f"user - {prompt} . assistant -"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat")
    plain = write_tiny_task_model_dir(root / "plain", "llama", "next-token")
    chat = root / "chat"
    shutil.copytree(plain, chat)
    config = json.loads((chat / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE
    (chat / "tokenizer_config.json").write_text(json.dumps(config))
    return {"plain": plain, "chat": chat}


def write_prompts(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def test_the_template_wraps_each_prompt_as_the_same_run_on_prompts_wrapped_by_hand(models, tmp_path):
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(models["chat"]).chat_template == TEMPLATE  # the template is read back
    chat, by_hand = tmp_path / "chat.h5", tmp_path / "hand.h5"
    ok(invoke("run", write_prompts(tmp_path / "p.jsonl", PROMPTS), "--model", models["chat"], "-o", chat,
              "--chat-template", *RUN))
    ok(invoke("run", write_prompts(tmp_path / "w.jsonl", [wrapped(p) for p in PROMPTS]), "--model", models["plain"],
              "-o", by_hand, *RUN))
    with open_store(str(chat)) as c, open_store(str(by_hand)) as h:
        assert len(c) == len(h) == len(PROMPTS) and sum(c[i].n_steps for i in range(len(PROMPTS))) > 0
        for i, prompt in enumerate(PROMPTS):
            a, b = c[i], h[i]
            assert a.tokens == b.tokens and a.tokens[-2:] == b.tokens[-2:]
            want = ["u", "##s", "##e", "##r", "-", *prompt.split(), ".", "a"]
            assert a.tokens[:len(want)] == want
            assert "[UNK]" not in a.tokens[:a.prompt_len]
            assert a.prompt_len == b.prompt_len and list(a.generated_ids) == list(b.generated_ids)
            assert a.n_steps <= 3 and a.tokens[a.prompt_len:] == a.generated_tokens
            for method in ("rollout", "grad_l2", "alti"):
                np.testing.assert_array_equal(a.step_scores(method), b.step_scores(method))


def test_a_tokenizer_without_a_chat_template_is_refused_in_one_line_and_nothing_is_written(models, tmp_path):
    data = write_prompts(tmp_path / "p.jsonl", PROMPTS)
    before = set(os.listdir(tmp_path))
    line = one_line(invoke("run", data, "--model", models["plain"], "-o", tmp_path / "out.h5", "--chat-template",
                           *RUN), 1)
    assert "has no chat template" in line and "drop --chat-template" in line
    assert set(os.listdir(tmp_path)) == before  # no store, no lock


def test_a_templates_leading_start_token_is_not_read_twice(tmp_path):
    """A tokenizer that puts its start token before every text, with a template that writes it too: the wrapped
    prompt, tokenised, starts with one start token."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece
    from transformers import PreTrainedTokenizerFast

    from compute.tasks.generate import chat_prompt
    from conftest import tiny_vocab

    vocab = {t: i for i, t in enumerate(tiny_vocab())}
    raw = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    raw.normalizer = normalizers.Lowercase()
    raw.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    raw.post_processor = processors.TemplateProcessing(single="[CLS] $A", special_tokens=[("[CLS]", vocab["[CLS]"])])
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", pad_token="[PAD]", bos_token="[CLS]",
                                  eos_token="[SEP]")
    tok.chat_template = "{{ bos_token }}" + TEMPLATE
    text = chat_prompt(tok, "the movie was", "tiny")
    assert text == wrapped("the movie was")
    ids = tok(text)["input_ids"]
    assert ids[0] == vocab["[CLS]"] and vocab["[CLS]"] not in ids[1:]
    # without the start token in the template, nothing is cut
    tok.chat_template = TEMPLATE
    assert chat_prompt(tok, "the movie was", "tiny") == wrapped("the movie was")
