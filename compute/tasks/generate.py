"""generate: a causal language model's continuation of a prompt, explained step by step. Each generated token is a
next-token output (its logit at the position before it, minus a foil's where the run contrasts): the methods and the
adapter see the task next-token (``explained_task``), run on every step at once (compute/run/steps.py)."""

from __future__ import annotations

from ..errors import AttrscopeError
from .base import Task, TaskRows


class Generate(Task):
    name = "generate"
    description = "a causal LM's continuation, step by step: each generated token's logit (minus the foil's)"
    auto_class = "AutoModelForCausalLM"
    class_suffixes = ("ForCausalLM", "LMHeadModel")
    target_modes = ("predicted",)  # the generated (or given) token of each step
    explains_as = "next-token"

    def check_model(self, model) -> None:
        super().check_model(model)
        if not getattr(model.config, "is_decoder", True) or getattr(model.config, "is_encoder_decoder", False):
            raise AttrscopeError(f"--task generate needs a causal language model, and {type(model).__name__} is "
                                 f"'{model.config.model_type}' without causal attention: pass a decoder checkpoint")

    def labels(self, id2label):
        return {0: "target", 1: "foil"}

    def prepare(self, lm, records, tok):
        """Per example: ``position`` the prompt's last position; ``info`` the forced continuation's tokens
        ("continuation") and the foils' ("foils") where the data gives them, each checked to tokenise as itself
        after the prompt. A prompt must leave room for a token within the model's length."""
        rows = TaskRows.plain([-1] * len(records))
        limit = self.options.get("max_length")
        for i, (r, ids) in enumerate(zip(records, tok.input_ids)):
            where = f"example '{r.id}'"
            if limit is not None and tok.n_orig[i] >= limit:
                raise AttrscopeError(f"{where}: its prompt is {tok.n_orig[i]} tokens, at or over the model's length "
                                     f"({limit}), so no token can follow it: shorten the prompt (or raise "
                                     "--max-length where the model allows)")
            rows.position[i] = len(ids) - 1
            info = {}
            if r.target is not None:
                info["continuation"] = continuation_tokens(lm.tokenizer, r.text, r.target, where, "continuation")
                if limit is not None and len(ids) + len(info["continuation"]) > limit:
                    raise AttrscopeError(f"{where}: its prompt and continuation are {len(ids)} + "
                                         f"{len(info['continuation'])} tokens, over the model's length ({limit}): "
                                         "shorten them")
            if r.foil is not None:
                info["foils"] = continuation_tokens(lm.tokenizer, r.text, r.foil, where, "contrast text")
                if len(info["foils"]) != len(info.get("continuation", ())):
                    raise AttrscopeError(f"{where}: the contrast text is {len(info['foils'])} tokens and the "
                                         f"continuation {len(info.get('continuation', ()))}: give one foil token "
                                         "per continuation token")
            rows.info[i] = info
        return rows


def continuation_tokens(tokenizer, prompt: str, text: str, where: str, what: str) -> list[int]:
    """The tokens of ``text`` as they follow ``prompt``: those of prompt + text after the prompt's own. Refused
    where the two do not split there (a token spans the boundary) or the tokens do not read back as ``text``: the
    methods would explain tokens that are not the ones given."""
    alone = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    whole = tokenizer(prompt + text, add_special_tokens=False)["input_ids"]
    cut = next((k for k, (a, b) in enumerate(zip(alone, whole)) if a != b), min(len(alone), len(whole)))
    if cut < len(alone):
        raise AttrscopeError(f"{where}: the {what} {text[:40]!r} does not tokenise apart from the prompt: the "
                             f"prompt's token {cut} ({tokenizer.convert_ids_to_tokens([alone[cut]])[0]!r}) merges "
                             "with its start; begin it with a space or end the prompt with one")
    ids = whole[len(alone):]
    back = tokenizer.decode(ids)
    if not ids or back.strip() != text.strip():
        at = next((k for k, (a, b) in enumerate(zip(back.strip(), text.strip())) if a != b),
                  min(len(back.strip()), len(text.strip())))
        raise AttrscopeError(f"{where}: the {what} {text[:40]!r} does not re-tokenise to itself: its tokens read "
                             f"back as {back[:40]!r}, differing at character {at}; write it as the tokenizer "
                             "writes it (its normalisation: case, spaces, unknown characters)")
    return ids


def chat_prompt(tokenizer, prompt: str, model: str | None) -> str:
    """``prompt`` as a user turn of the tokenizer's chat template, the assistant's turn opened. The tokenizer adds
    its own start token when the text is tokenised, so a template's leading one is left out (not read twice)."""
    if not getattr(tokenizer, "chat_template", None):
        raise AttrscopeError(f"--chat-template: the tokenizer of '{model}' has no chat template: drop --chat-template "
                             "(the prompts are then read as they are)")
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
    bos = tokenizer.bos_token
    adds_bos = bos is not None and tokenizer("x")["input_ids"][:1] == [tokenizer.bos_token_id]
    return text[len(bos):] if adds_bos and text.startswith(bos) else text
