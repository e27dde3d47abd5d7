"""Decoding continuations for --task generate (compute/generation.py): greedy decoding is the model's argmax chain,
each example's continuation (greedy or sampled with a seed) does not depend on the batch it is decoded in (left
padding), decoding stops at EOS (not kept) or at the room the model's length leaves."""

from __future__ import annotations

import pytest
import torch

from compute.adapters import adapter_for
from compute.generation import Decoding, decode
from conftest import tiny_task_model

PROMPTS = [[5, 9, 30, 7], [44], [8, 8, 61, 3, 99, 12, 40], [17, 2]]


def argmax_chain(model, prompt: list[int], n: int, stop=frozenset()) -> list[int]:
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            tok = int(model(input_ids=torch.as_tensor([ids])).logits[0, -1].argmax())
            if tok in stop:
                break
            ids.append(tok)
            out.append(tok)
    return out


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_greedy_is_the_argmax_chain_of_each_prompt_alone(arch):
    model = tiny_task_model(arch, "next-token", seed=3)
    ad = adapter_for(model, "next-token")
    got = decode(ad, PROMPTS, list(range(4)), [50] * 4, Decoding(6), frozenset(), 0)
    assert got == [argmax_chain(model, p, 6) for p in PROMPTS]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_continuation_does_not_depend_on_its_batch(arch):
    model = tiny_task_model(arch, "next-token", seed=3)
    ad = adapter_for(model, "next-token")
    for decoding in (Decoding(5), Decoding(5, do_sample=True, seed=11)):
        batch = decode(ad, PROMPTS, [10, 11, 12, 13], [50] * 4, decoding, frozenset(), 0)
        alone = [decode(ad, [p], [k], [50], decoding, frozenset(), 0)[0] for p, k in zip(PROMPTS, [10, 11, 12, 13])]
        assert batch == alone and all(len(c) == 5 for c in batch)
    sampled = decode(ad, PROMPTS, [10, 11, 12, 13], [50] * 4, Decoding(5, True, 11), frozenset(), 0)
    assert sampled == decode(ad, PROMPTS[::-1], [13, 12, 11, 10], [50] * 4, Decoding(5, True, 11),
                             frozenset(), 0)[::-1]
    assert sampled != decode(ad, PROMPTS, [10, 11, 12, 13], [50] * 4, Decoding(5, True, 12), frozenset(), 0)
    assert sampled != decode(ad, PROMPTS, [10, 11, 12, 13], [50] * 4, Decoding(5), frozenset(), 0)


def test_decoding_stops_at_eos_and_at_the_room_left():
    model = tiny_task_model("llama", "next-token", seed=3)
    ad = adapter_for(model, "next-token")
    chains = [argmax_chain(model, p, 6) for p in PROMPTS]
    stop = frozenset({chains[0][0], chains[2][3]})  # the first example stops at once
    got = decode(ad, PROMPTS, list(range(4)), [50, 2, 50, 50], Decoding(6), stop, 0)
    assert got[0] == [] and got[2] == chains[2][:3]
    assert got == [argmax_chain(model, p, k, stop) for p, k in zip(PROMPTS, [6, 2, 6, 6])]
    assert len(got[1]) <= 2 and sum(map(len, got)) > 3
    assert decode(ad, PROMPTS, list(range(4)), [0] * 4, Decoding(6), frozenset(), 0) == [[]] * 4
