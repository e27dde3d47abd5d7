"""--batch-size auto consults the memory model (compute/memory_model.py, issue 36 point 5) before anything runs: one
example that does not fit is refused in one line naming the method and the longest input that fits, and no batch
larger than the model lets fit is tried. No GPU here: a fake 80 GB card (tests/test_run_overlap.py's FakeGPU) and the
CPU's --batch-memory-mb."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from compute import memory_model as mm
from compute.errors import AttrscopeError
from compute.run import auto_batch
from test_run_overlap import FakeGPU, FakeMethod

CARD = 80 * mm.GB
LLAMA = mm.LLAMA2_7B


def room_of(card: int, shape=LLAMA, itemsize: int = 2) -> int:
    return card - mm.weights(shape, mm.Run(0, itemsize))


def test_one_example_that_does_not_fit_is_refused_naming_the_method_and_the_longest_input_that_fits():
    """Llama-2-7B in bfloat16 at 8,192 tokens on 80 GB: the doc's table says decompx fits up to 4,400 tokens (at
    4,096 every method now fits: issue 36), norm, rollout (streamed head means) and grad_l2 (its gradient pass
    checkpointed, its attention SDPA's) fit; the refusal names decompx and 4,400, and only the methods that do not
    fit."""
    with pytest.raises(AttrscopeError) as err:
        auto_batch.modelled_size(["norm", "rollout", "decompx", "grad_l2"], LLAMA, 8192, 2, room_of(CARD),
                                 mm.Budgets.gpu(CARD), 1024)
    line = str(err.value)
    assert "\n" not in line
    need = mm.estimate("decompx", LLAMA, mm.Run(8192, 2, mm.Budgets.gpu(CARD))).peak - mm.weights(LLAMA, mm.Run(0))
    assert line == (f"--batch-size auto: decompx needs about {need / 2**30:.1f} GiB for one example of 8192 tokens, "
                    f"beyond the {room_of(CARD) / 2**30:.1f} GiB free (the memory model, docs/scaling.md): the longest "
                    "input that fits is about 4400 tokens; lower --max-length to 4400, or leave out decompx")
    assert mm.longest_fitting("decompx", LLAMA, CARD) == 4400  # the same boundary as the table's (1,760 before)
    # issue 36: checkpointed (2,400 before), its layers' attention SDPA's (10,720 with the eager one)
    assert mm.longest_fitting("grad_l2", LLAMA, CARD) == 17120
    # none fits at all: no length to lower to (on 24 GB lrp now reaches 1,968 tokens: one layer widened at a time,
    # the layers checkpointed)
    assert mm.longest_fitting("lrp", LLAMA, 24 * mm.GB) == 1968
    with pytest.raises(AttrscopeError, match="about 0 tokens; run on a device with more memory, or leave out lrp"):
        auto_batch.modelled_size(["lrp"], LLAMA, 4096, 2, room_of(16 * mm.GB), mm.Budgets.gpu(16 * mm.GB), 8)


def test_the_modelled_batch_is_the_largest_whose_every_method_fits():
    budgets, n = mm.Budgets.gpu(CARD), 512
    methods = ["norm", "rollout", "grad_l2"]
    most = auto_batch.modelled_size(methods, LLAMA, n, 2, room_of(CARD), budgets, 1024)
    run = mm.Run(n, 2, budgets)
    parts = {name: mm.per_batch(name, LLAMA, run) for name in methods}
    for name, (fixed, each) in parts.items():
        # batch 1 is the estimate; the LRP family's float64 casts of the weights do not grow with the batch
        assert fixed + each == mm.estimate(name, LLAMA, run).peak - mm.weights(LLAMA, run)
        assert fixed + most * each <= room_of(CARD)
    assert parts["norm"][0] == 0
    fixed, each = mm.per_batch("lrp", LLAMA, mm.Run(256, 2, budgets))
    assert fixed >= mm.float64_casts(LLAMA) and fixed + each == mm.estimate("lrp", LLAMA, mm.Run(256, 2, budgets)).peak \
        - mm.weights(LLAMA, run)
    assert any(fixed + (most + 1) * each > room_of(CARD) for fixed, each in parts.values())
    assert 1 < most < 1024
    assert auto_batch.modelled_size(methods, LLAMA, n, 2, room_of(CARD), budgets, 2) == 2  # the run's own cap
    # a method without a formula (a test's own) is left to the trials
    assert auto_batch.modelled_size(["made_up"], LLAMA, 4096, 2, 1, budgets, 7) == 7


def fake_llama_on_cuda(n_longest: int, others: tuple[int, ...] = (100, 50)):
    """A stand-in LoadedModel with Llama-2-7B's config in bfloat16 on a 'cuda' device, and its tokenized rows (the
    longest second, among ``others``)."""
    from compute.run.batches import Tokenized

    lengths = [others[0], n_longest, *others[1:]]
    tok = Tokenized([[1] * n for n in lengths], None, None, [[0] * n for n in lengths], lengths)
    config = SimpleNamespace(hidden_size=LLAMA.d, intermediate_size=LLAMA.d_ff, vocab_size=LLAMA.vocab,
                             model_type="llama")
    param = SimpleNamespace(device=torch.device("cuda"), dtype=torch.bfloat16)
    adapter = SimpleNamespace(n_layers=LLAMA.layers, n_heads=LLAMA.heads, n_kv_heads=LLAMA.kv_heads, decoder=True,
                              block=SimpleNamespace(mlp_kind="gated"))
    lm = SimpleNamespace(model=SimpleNamespace(parameters=lambda: iter([param]), config=config),
                         tokenizer=SimpleNamespace(pad_token_id=0), adapter=adapter)
    return lm, tok


def test_the_model_shape_of_a_loaded_model_is_its_config():
    lm, _ = fake_llama_on_cuda(10)
    assert auto_batch.model_shape(lm, 2) == mm.ModelShape("llama", layers=32, d=4096, heads=32, kv_heads=32,
                                                          d_ff=11008, vocab=32000)


def patch_launch(monkeypatch, gpu):
    """auto_batch's batches run on ``gpu`` (tests/test_run_overlap.py's FakeGPU) instead of a model."""
    monkeypatch.setattr(auto_batch, "encode", lambda tok, rows, pad_id, device: list(rows))

    def fake_launch(lm, methods, rows, task_rows, target_mode, num_labels, keep, timings, lengths, parts, probe,
                    first_part_only, heads="none"):
        gpu.run(len(rows), parts, probe)
        return SimpleNamespace(result=lambda: None)

    monkeypatch.setattr(auto_batch, "launch_batch", fake_launch)


@pytest.mark.parametrize("n,refused", [(18000, True), (16000, False)])
def test_auto_on_a_fake_80_gb_card_asks_the_memory_model_before_any_trial(monkeypatch, n, refused):
    """alti on Llama-2-7B (its layers streamed, its attention kept narrow): 18,000 tokens refused before any batch
    runs (the longest that fits: the table's 17,120); 16,000 tokens: the model lets one example fit, so one trial
    batch of one runs and no larger one."""
    from compute.tasks import TaskRows

    lm, tok = fake_llama_on_cuda(n)
    gpu = FakeGPU(CARD, {"forward": (0, 0, 0), "alti": (0, 0, 0)}, base=mm.weights(LLAMA, mm.Run(0)), n=n)
    patch_launch(monkeypatch, gpu)

    def auto():
        return auto_batch.auto_batching(lm, {"alti": FakeMethod()}, tok, TaskRows.plain([0] * 3), "predicted", 2,
                                        "cls", 8192, None, memory=gpu)

    if refused:
        free = (CARD - mm.weights(LLAMA, mm.Run(0))) / 2**30
        with pytest.raises(AttrscopeError, match=f"alti needs about .* tokens, beyond the {free:.1f} GiB free on "
                                                 "cuda .* the longest input that fits is about 17120 tokens; lower "
                                                 "--max-length to 17120"):
            auto()
        assert gpu.runs == []
    else:
        got = auto()
        assert [size for size, _ in gpu.runs] == [1] and (got.size, got.tokens) == (1, n)
        assert got.how.endswith("; at most 1 by the memory model")


@pytest.mark.parametrize("matrices", ["cls", "all"])
def test_auto_asks_the_memory_model_for_the_runs_matrices(monkeypatch, matrices):
    """norm_n streams its layers on Llama-2-7B at 4,096 tokens: under --matrices all it keeps every layer's [n, n]
    (the memory model's kept_views), so fewer examples fit than under cls (9 against 17 on 80 GB; 6 against 9
    while per_batch counted its float32 weight stacks once per example). The batch auto chooses is the memory
    model's for the run's --matrices, not for the default cls."""
    from compute.tasks import TaskRows

    n, methods = 4096, {"norm_n": FakeMethod()}
    lm, tok = fake_llama_on_cuda(n, others=(100,) * 19)
    budgets = mm.Budgets.gpu(CARD)
    parts = {m: mm.per_batch("norm_n", LLAMA, mm.Run(n, 2, budgets, m)) for m in ("cls", "all")}
    most = {m: (room_of(CARD) - fixed) // each for m, (fixed, each) in parts.items()}
    assert (most["cls"], most["all"]) == (17, 9)
    gpu = FakeGPU(CARD, {"forward": (0, 0, 0), "norm_n": (0, 0, 0)}, base=mm.weights(LLAMA, mm.Run(0)), n=n)
    patch_launch(monkeypatch, gpu)
    got = auto_batch.auto_batching(lm, methods, tok, TaskRows.plain([0] * len(tok)), "predicted", 2, matrices, 8192,
                                   None, memory=gpu)
    # the trials of one and two, then the confirming batch: no batch beyond the model's size for these matrices
    assert [size for size, _ in gpu.runs] == [1, 2, most[matrices]]
    assert (got.size, got.tokens) == (most[matrices], most[matrices] * n)
    assert got.how.endswith(f"; at most {most[matrices]} by the memory model")
    assert auto_batch.modelled_size(list(methods), LLAMA, n, 2, room_of(CARD), budgets, 20,
                                    matrices=matrices) == most[matrices]
