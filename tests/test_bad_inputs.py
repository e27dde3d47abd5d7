"""Inputs that used to give a garbage store or an internal error (issue 34): a model directory without its
tokenizer files, a tokenizer that reads the data as unknown tokens, damaged or unsafe weights files, control
characters in a text."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cli_results import invoke, ok, one_line
from store import open_store

pytestmark = pytest.mark.usefixtures("one_thread")

RUN = ("--methods", "raw_attention", "--device", "cpu", "-q")


def write_rows(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t, "label": i % 2}) + "\n" for i, t in enumerate(texts)))
    return path


def left_behind(directory: Path, before: set[str]) -> set[str]:
    """Files the run left in ``directory`` besides ``before`` (a store, a copy, a lock)."""
    return set(os.listdir(directory)) - before


# --- point 1: the tokenizer -------------------------------------------------------------------------------------


def test_a_model_directory_without_its_tokenizer_files_is_refused(tiny_model_dirs, tmp_path):
    """config.json, model.safetensors and special_tokens_map.json only: transformers makes a tokenizer of the
    special tokens alone (every word [UNK], every example the same prediction); refused at load, nothing written."""
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_model_dirs["bert"] / name, model / name)
    (model / "special_tokens_map.json").write_text(json.dumps(
        {"unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
         "mask_token": "[MASK]"}))
    data = write_rows(tmp_path / "d.jsonl", ["the movie was great", "a boring film"])
    before = set(os.listdir(tmp_path))
    line = one_line(invoke("run", data, "--model", model, "-o", tmp_path / "out.h5", *RUN))
    assert f"model directory '{model}' lacks its tokenizer files (it needs tokenizer.json, or vocab.txt)" in line, line
    assert "tokenizer.save_pretrained" in line, line
    assert left_behind(tmp_path, before) == set()


def test_the_tokenizer_files_check_accepts_every_kind_of_saved_tokenizer(tmp_path):
    """tokenizer.json alone, or the class's own vocabulary files (vocab.txt; vocab.json with merges.txt), or none
    for a class that reads none."""
    from transformers import BertTokenizer, CanineTokenizer, GPT2Tokenizer

    from compute.models import _missing_tokenizer_files

    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    assert _missing_tokenizer_files(str(bert), BertTokenizer) is None
    (bert / "vocab.txt").unlink()
    (bert / "tokenizer.json").write_text("{}")
    assert _missing_tokenizer_files(str(bert), BertTokenizer) is None
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "vocab.json").write_text("{}")
    assert _missing_tokenizer_files(str(gpt2), GPT2Tokenizer) == "tokenizer.json, or vocab.json and merges.txt"
    (tmp_path / "empty").mkdir()
    assert _missing_tokenizer_files(str(tmp_path / "empty"), CanineTokenizer) is None  # reads characters: no file
    assert _missing_tokenizer_files(str(tmp_path / "empty"), BertTokenizer) == "tokenizer.json, or vocab.txt"
    (gpt2 / "merges.txt").write_text("")
    assert _missing_tokenizer_files(str(gpt2), GPT2Tokenizer) is None
    (gpt2 / "vocab.json").unlink()
    assert _missing_tokenizer_files(str(gpt2), GPT2Tokenizer) == "tokenizer.json, or vocab.json and merges.txt"


GREEK = ["η ταινία ήταν υπέροχη", "μια βαρετή ταινία", "καλή ταινία", "the movie"]


def test_data_the_tokenizer_reads_as_unknown_tokens_is_refused(tiny_model_dirs, tmp_path):
    """Words of a script the vocabulary lacks are all [UNK]: 9 of the first examples' 11 text tokens; refused
    before the store opens; --max-unknown-share 1 runs it anyway."""
    data = write_rows(tmp_path / "d.jsonl", GREEK)
    before = set(os.listdir(tmp_path))
    out = tmp_path / "out.h5"
    line = one_line(invoke("run", data, "--model", tiny_model_dirs["bert"], "-o", out, *RUN))
    assert "9 of the 11 tokens (82%) of the first 4 examples' texts are the unknown token '[UNK]'" in line, line
    assert "--max-unknown-share 1" in line and "(at most 0.5)" in line, line
    assert left_behind(tmp_path, before) == set()
    # a threshold above the share, or 1 (off), runs it
    ok(invoke("run", data, "--model", tiny_model_dirs["bert"], "-o", out, *RUN, "--max-unknown-share", "0.9"))
    with open_store(out) as s:
        assert len(s) == 4
        assert s[0].tokens == ["[CLS]", "[UNK]", "[UNK]", "[UNK]", "[UNK]", "[SEP]"]
        assert s.config["config"]["max_unknown_share"] == 0.9


def test_the_unknown_share_is_counted_on_the_first_examples_only(tiny_model_dirs, tmp_path):
    from compute.data import Record
    from compute.models import load_model
    from compute.options import UNKNOWN_SAMPLE
    from compute.run.load import unknown_share_error

    lm = load_model(str(tiny_model_dirs["bert"]), device=torch.device("cpu"))
    known = [Record(row=i, id=str(i), text="the movie", pair=None, label=0) for i in range(UNKNOWN_SAMPLE)]
    unknown = [Record(row=i, id=str(i), text="ταινία ταινία", pair="ταινία", label=0) for i in range(UNKNOWN_SAMPLE)]
    assert unknown_share_error(lm.tokenizer, known + unknown, 0.5, 64) is None  # the unknown ones come after
    err = unknown_share_error(lm.tokenizer, unknown[:2] + known[:2], 0.5, 64)  # a pair's tokens count too
    assert err is not None and "6 of the 10 tokens (60%) of the first 4 examples' texts" in str(err), str(err)
    assert unknown_share_error(lm.tokenizer, unknown[:2] + known[:2], 0.6, 64) is None  # 60% is not over 0.6
    assert unknown_share_error(lm.tokenizer, unknown, 1.0, 64) is None  # 1: never refused
    assert unknown_share_error(lm.tokenizer, [], 0.5, 64) is None


def test_a_tokenizer_without_an_unknown_token_is_never_refused(tmp_path):
    """Byte-level BPE has a token for every byte and no unknown token: the check does not apply."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from compute.data import Record
    from compute.run.load import unknown_share_error

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(["the movie was great"] * 3, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")
    assert tok.unk_token_id is None
    records = [Record(row=i, id=str(i), text=t, pair=None, label=0) for i, t in enumerate(GREEK)]
    assert unknown_share_error(tok, records, 0.0, 64) is None


@pytest.mark.parametrize("value", ["-0.1", "1.5"])
def test_max_unknown_share_outside_0_1_is_a_usage_error(tiny_model_dirs, tmp_path, value):
    data = write_rows(tmp_path / "d.jsonl", ["the movie"])
    line = one_line(invoke("run", data, "--model", tiny_model_dirs["bert"], "-o", tmp_path / "o.h5", *RUN,
                           "--max-unknown-share", value), code=2)
    assert "--max-unknown-share must be between 0 and 1" in line, line


# --- point 6: weights files -------------------------------------------------------------------------------------

RAN = Path(os.environ.get("TMPDIR", "/tmp")) / f"attrscope-test-pickle-ran-{os.getpid()}"


def mark_ran(path: str) -> int:
    """What the unsafe pickle would call if it were run: leaves a file behind (harmless)."""
    Path(path).write_text("ran")
    return 0


class Calls:
    """A pickle that calls ``fn(*args)`` when it is loaded."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def copy_without_weights(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    (dst / "model.safetensors").unlink()
    return dst


def weights_line(model: Path, tmp_path: Path) -> str:
    data = write_rows(tmp_path / "d.jsonl", ["the movie was great"])
    before = set(os.listdir(tmp_path))
    line = one_line(invoke("run", data, "--model", model, "-o", tmp_path / "out.h5", *RUN))
    assert left_behind(tmp_path, before) == set()
    assert "weights_only=False" not in line and "\n" not in line, line
    assert "attrscope loads only safetensors files or weights-only pickles" in line, line
    return line


def test_a_truncated_safetensors_file_is_one_line(tiny_model_dirs, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dirs["bert"], model)
    weights = model / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    line = weights_line(model, tmp_path)
    assert f"weights file '{weights}' is damaged (cut short, or not a safetensors file:" in line, line


def test_a_truncated_weights_pickle_is_one_line(tiny_model_dirs, tmp_path):
    from safetensors.torch import load_file

    model = copy_without_weights(tiny_model_dirs["bert"], tmp_path / "model")
    weights = model / "pytorch_model.bin"
    torch.save(load_file(tiny_model_dirs["bert"] / "model.safetensors"), weights)
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    line = weights_line(model, tmp_path)
    assert f"weights file '{weights}' is damaged (cut short, or not a weights pickle:" in line, line


@pytest.mark.parametrize("call", ["system", "mark_ran"])
def test_a_pickle_that_would_run_code_is_refused_without_running_it(tiny_model_dirs, tmp_path, call):
    """A pytorch_model.bin whose pickle calls a function on load (os.system, or this module's mark_ran): refused
    by torch's weights-only unpickler, named, and never run."""
    model = copy_without_weights(tiny_model_dirs["bert"], tmp_path / "model")
    weights = model / "pytorch_model.bin"
    payload = Calls(os.system, "true") if call == "system" else Calls(mark_ran, str(RAN))
    torch.save({"bert.embeddings.word_embeddings.weight": payload}, weights)
    RAN.unlink(missing_ok=True)
    line = weights_line(model, tmp_path)
    assert not RAN.exists()
    called = f"{os.system.__module__}.system" if call == "system" else f"{__name__}.mark_ran"
    assert (f"weights file '{weights}' is a pickle that would call {called} when loaded, not only weights: "
            "refused, nothing in it was run") in line, line


def test_a_hub_model_s_unsafe_pickle_is_named_in_the_cache(tiny_model_dirs, tmp_path):
    """A hub id read from the local Hugging Face cache (offline): the cached file is named. A process of its own: the
    cache's place is read when huggingface_hub is imported."""
    snapshot = tmp_path / "hub" / "models--someone--unsafe" / "snapshots" / "abc123"
    model = copy_without_weights(tiny_model_dirs["bert"], snapshot)
    (tmp_path / "hub" / "models--someone--unsafe" / "refs").mkdir()
    (tmp_path / "hub" / "models--someone--unsafe" / "refs" / "main").write_text("abc123")
    torch.save({"w": Calls(os.system, "true")}, model / "pytorch_model.bin")
    data = write_rows(tmp_path / "d.jsonl", ["the movie"])
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    res = subprocess.run([sys.executable, "-m", "compute.cli", "run", str(data), "--model", "someone/unsafe",
                          "-o", str(tmp_path / "out.h5"), *RUN], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 1 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith(f"attr-compute: error: weights file '{model / 'pytorch_model.bin'}' is a pickle "
                                 f"that would call {os.system.__module__}.system when loaded"), res.stderr
    assert not (tmp_path / "out.h5").exists()


# --- point 8: control characters in a text ----------------------------------------------------------------------


def test_control_characters_in_a_text_are_spaces(tmp_path):
    """C0 (but tab, newline, carriage return: whitespace already), DEL and C1 become spaces, one for one, so that
    the tokenizer separates the words around them (BERT's drops them, fusing 'nul\\x00inside' into one word) and
    character offsets (evidence, answers) stay where they were."""
    from compute.data import load_dataset

    controls = "".join(chr(c) for c in (*range(0x20), *range(0x7f, 0xa0)) if chr(c) not in "\t\n\r")
    texts = ["nul\x00inside", "a\x0bb\x0cc\x1fd\x7fe\x85f\x9fg", "tab\tnew\nline\rcr", "x" + controls + "y"]
    rows = [{"text": t, "pair": t[::-1], "label": 0, "evidence": [[0, 3]]} for t in texts]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = load_dataset(str(path), pair_column="pair", evidence_column="evidence").records
    cleaned = ["nul inside", "a b c d e f g", "tab\tnew\nline\rcr", "x" + " " * len(controls) + "y"]
    assert [r.text for r in records] == cleaned
    assert [r.pair for r in records] == [t[::-1] for t in cleaned]
    assert [r.evidence for r in records] == [((0, 0, 3),)] * 4


def test_a_qa_answer_with_a_control_character_is_cleaned_as_its_context(tmp_path):
    from compute.data import load_dataset

    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"question": "who\x00won", "context": "the x\x00y team won",
                                "answers": {"text": ["x\x00y"], "answer_start": [4]}}) + "\n")
    (r,) = load_dataset(str(path), task="qa").records
    assert (r.text, r.pair, r.answer, r.evidence) == ("who won", "the x y team won", "x y", ((1, 4, 7),))


def test_a_nul_byte_does_not_fuse_words_in_the_store(tiny_model_dirs, tmp_path):
    """The store records the cleaned text; its tokens and their spans are those of that text."""
    data = write_rows(tmp_path / "d.jsonl", ["nul\x00inside", "the\x1fmovie"])
    out = tmp_path / "out.h5"
    ok(invoke("run", data, "--model", tiny_model_dirs["bert"], "-o", out, *RUN))
    with open_store(out) as s:
        nul, movie = s[0], s[1]
        assert nul.text == "nul inside" and movie.text == "the movie"
        assert nul.tokens == ["[CLS]", "n", "##u", "##l", "i", "##n", "##s", "##i", "##d", "##e", "[SEP]"]
        assert movie.tokens == ["[CLS]", "the", "movie", "[SEP]"]
        assert nul.spans.tolist() == [[-1, -1], [0, 1], [1, 2], [2, 3], [4, 5], [5, 6], [6, 7], [7, 8], [8, 9],
                                      [9, 10], [-1, -1]]
        assert movie.spans.tolist() == [[-1, -1], [0, 3], [4, 9], [-1, -1]]
