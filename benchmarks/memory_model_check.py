"""The measured peak memory of one example per method against compute/memory_model.py's formulas, on a tiny float32
Llama (2 layers, 4 heads, d 32 and d_ff 64 unless --hidden/--d-ff say otherwise) on the CPU with the CPU's chunk
budgets (issue 27 item 6).

    MALLOC_MMAP_THRESHOLD_=65536 python benchmarks/memory_model_check.py --methods raw_attention,rollout,alti,norm,grad_l2 -n 1024,2048,4096
    MALLOC_MMAP_THRESHOLD_=65536 python benchmarks/memory_model_check.py --hidden 1024 --d-ff 2752 -n 256,1024   # the n d terms
    MALLOC_MMAP_THRESHOLD_=65536 python benchmarks/memory_model_check.py --long -n 2048,4096   # issue 36's acceptance
    MALLOC_MMAP_THRESHOLD_=65536 python benchmarks/memory_model_check.py --layers 4 --hidden 256 --heads 8 --d-ff 1024 \
        --methods lrp -n 2048   # a tiny-but-long model (issue 36)
    MALLOC_MMAP_THRESHOLD_=65536 python benchmarks/memory_model_check.py --long --methods lrp,transatt,attnlrp \
        -n 1024 --pass-mb 1   # the checkpointed passes (a pass's memory of 1 MiB) at a length float64 affords

Each row: the peak resident memory of the capture and the method above what the process held before
(compute.memory.peak_bytes, Linux VmHWM) and the model's peak above the weights. Run it with glibc's mmap threshold
fixed (the environment variable above; tests/test_memory_model.py does): with the default, freed large blocks raise
the threshold and later ones come from a heap that keeps earlier pages, and the resident peak undercounts them.

``--long`` (issue 36): the tiny-but-long model (4 layers, d 256, 8 heads, d_ff 1024), each method and length in a
fresh process (``--fresh``), each peak above the bare forward's ("forward": a capture of nothing) against the model's,
and against the bound: twice one layer's float32 [H, n, n] plus what the method keeps (``--matrices cls``).
``--long --all``: every method of the registry; a method and length whose predicted peak exceeds ``--max-gb`` (the
LRP family's float64 pass, DecompX's state budget) is not run ("skipped (predicted X GB)"), nor one that fails
("failed: ..."). The table, then the measured bytes as JSON:

    MALLOC_MMAP_THRESHOLD_=65536 nice python benchmarks/memory_model_check.py --long --all -n 1024,2048
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from compute import memory_model as mm  # noqa: E402

TINY = mm.ModelShape("tiny Llama", layers=2, d=32, heads=4, kv_heads=4, d_ff=64, vocab=100)
LONG = mm.ModelShape("tiny-but-long Llama", layers=4, d=256, heads=8, kv_heads=8, d_ff=1024, vocab=100)
BARE = "forward"  # the bare forward: the capture of nothing
# issue 36's methods: each layer's attention consumed as the forward makes it: the capture's head means (raw
# attention), and the layer-wise products, which read each layer in a forward of their own: of the head means alone
# (rollout, W_FIXEDRES) or of the decomposition's lists
HEAD_MEANS = ("raw_attention",)
HEAD_MEAN_PRODUCTS = ("rollout", "w_fixedres")
LAYER_PARTS = ("norm_n", "norm_fixedres", "norm_res", "norm_resln", "globenc", "w_res", "alti", "alti_l2",
               "alti_logit", "value_zeroing")
STREAMED = HEAD_MEANS + HEAD_MEAN_PRODUCTS + LAYER_PARTS
MMAP_THRESHOLD = 65536  # glibc's, fixed for every measurement (the docstring)
WITHIN = 0.15  # issue 36: each peak above the forward within 15% of the model's


def method_params(name: str, shape: mm.ModelShape) -> dict:
    """The parameters a method cannot run without outside a run: IG's baseline, mask_lrp's head mask (as
    tests/op_counting.py's: every other head kept)."""
    if name.startswith("ig_"):
        return {"baseline": "zero"}
    if name == "mask_lrp":
        return {"head_mask": [[(l + h) % 2 for h in range(shape.heads)] for l in range(shape.layers)]}
    return {}


def predicted(name: str, n: int, shape: mm.ModelShape = TINY) -> int:
    """The model's peak above the weights for the tiny float32 model with the CPU's budgets."""
    run = mm.Run(n, 4, mm.Budgets.cpu())
    return mm.estimate(name, shape, run).peak - mm.weights(shape, run)


def measure(methods: list[str], ns: list[int], shape: mm.ModelShape = TINY) -> dict[str, int]:
    """{"<method> <n>": peak bytes}; "forward" is the bare forward (a capture of nothing)."""
    import torch
    import transformers as T

    from compute.adapters import adapter_for
    from compute.memory import peak_bytes
    from compute.methods import REGISTRY

    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = T.LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.d, intermediate_size=shape.d_ff,
                        num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                        num_key_value_heads=shape.kv_heads, max_position_embeddings=max(ns), pad_token_id=0,
                        num_labels=shape.labels)
    model = T.LlamaForSequenceClassification(cfg)
    model.config._attn_implementation = "eager"
    adapter = adapter_for(model.eval())
    # one pass first, unmeasured: a fresh process's first work also allocates the libraries' own buffers
    with torch.no_grad():
        adapter.model(input_ids=torch.randint(1, shape.vocab, (1, min(ns))))
    out = {}
    for name in methods:
        method = None if name == BARE else REGISTRY[name](**method_params(name, shape))
        for n in ns:
            enc = {"input_ids": torch.randint(1, shape.vocab, (1, n)),
                   "attention_mask": torch.ones(1, n, dtype=torch.long)}

            def work():
                if method is None:
                    adapter.capture(enc, frozenset())
                    return
                cap = adapter.capture(enc, method.needs)
                cap.passes = method.passes
                cap.attention_terms = frozenset(method.attention_terms)  # as the runner declares them
                # as the runner: the forward's output (its KV cache) dropped, --matrices cls (the explained rows)
                cap.output, cap.kept_matrices, cap.kept_row = None, "cls", cap.explain_pos
                method.compute(cap, adapter, torch.zeros(1, dtype=torch.long))

            out[f"{name} {n}"] = peak_bytes(work)
    return out


def _measure_child(conn, name: str, n: int, shape: mm.ModelShape, pass_bytes: int | None) -> None:
    """A forked child's measurement, sent back on ``conn``: its bytes, or its error's first line."""
    import ctypes

    ctypes.CDLL(None).mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD, as MALLOC_MMAP_THRESHOLD_ (the docstring)
    if pass_bytes is not None:  # --pass-mb: the server's children inherit none of the caller's settings
        from compute.methods._internals import gradients

        gradients.IG_CPU_BYTES = pass_bytes
    try:
        conn.send(measure([name], [n], shape))
    except BaseException as err:  # noqa: BLE001 - any failure is the row's, not the table's
        conn.send(f"{type(err).__name__}: {err}".splitlines()[0])


def measure_fresh(methods: list[str], ns: list[int], shape: mm.ModelShape,
                  skip=lambda name, n: False, pass_bytes: int | None = None) -> dict[str, int | str]:
    """``measure`` of each method and length in a process of its own (nothing of another's heap in its peak), but
    those ``skip(name, n)`` says not to run; a process that fails gives its error's line instead of bytes. Each is
    forked from a server process that has imported the libraries and run nothing (their import is most of a fresh
    interpreter's minute on a loaded machine). Not forked from this process: inside a test suite it has run torch
    (a thread pool) and holds a large heap whose free pages a forked child reuses without its peak growing (0.4 MiB
    measured for raw_attention's 12 MiB). ``pass_bytes``: a gradient pass's memory in each child (--pass-mb)."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "transformers", "compute.adapters", "compute.methods"])
    out = {}
    for name in methods:
        for n in ns:
            if skip(name, n):
                continue
            mine, theirs = ctx.Pipe(duplex=False)
            child = ctx.Process(target=_measure_child, args=(theirs, name, n, shape, pass_bytes))
            child.start()
            theirs.close()
            try:
                got = mine.recv()
            except EOFError:  # it died without a word (killed: out of memory)
                got = None
            child.join()
            if isinstance(got, dict):
                out.update(got)
            else:
                out[f"{name} {n}"] = got or f"exit {child.exitcode}"
    return out


def predicted_peak(name: str, n: int, shape: mm.ModelShape) -> int:
    """The model's whole peak of ``name`` (weights included) on the CPU in float32: what --max-gb is held against."""
    return mm.estimate(name, shape, mm.Run(n, 4, mm.Budgets.cpu())).peak


def predicted_above_forward(name: str, n: int, shape: mm.ModelShape) -> int:
    """The model's peak of ``name`` above its bare forward's."""
    run = mm.Run(n, 4, mm.Budgets.cpu())
    return mm.estimate(name, shape, run).peak - mm.bare_forward(shape, run)


def bound(name: str, n: int, shape: mm.ModelShape) -> int:
    """Issue 36's bound on a method's peak above the bare forward: twice one layer's float32 [H, n, n] and what the
    method stores with --matrices cls (its scores, layer views and explained rows, float32)."""
    from compute.methods import REGISTRY

    cls = REGISTRY[name]
    views = shape.layers if cls.has_layer_views else 0
    rows = shape.layers if cls.has_matrices else 0
    return 2 * shape.heads * n * n * mm.F32 + (1 + views + rows) * n * mm.F32


def long_table(got: dict, methods: list[str], ns: list[int], shape: mm.ModelShape, max_bytes: int) -> str:
    """--long's table: each method's measured peak above the bare forward's (``got``: measure_fresh's) against the
    model's and against issue 36's bound; a method and length predicted beyond ``max_bytes`` is skipped, one whose
    measurement failed says so."""
    lines = ["| method | n | measured MiB above the bare forward | memory model MiB | ratio | bound MiB | within 15% "
             "| within the bound |", "|---|---|---|---|---|---|---|---|"]
    for name in methods:
        if name == BARE:
            continue
        for n in ns:
            whole = predicted_peak(name, n, shape)
            if whole > max_bytes:
                lines.append(f"| {name} | {n} | skipped (predicted {whole / mm.GB:.1f} GB) | | | | | |")
                continue
            m, fwd = got[f"{name} {n}"], got[f"{BARE} {n}"]
            if isinstance(m, str) or isinstance(fwd, str):
                lines.append(f"| {name} | {n} | failed: {m if isinstance(m, str) else fwd} | | | | | |")
                continue
            above, p, b = m - fwd, predicted_above_forward(name, n, shape), bound(name, n, shape)
            ratio = f"{above / p:.2f}" if p > 0 else "-"
            lines.append(f"| {name} | {n} | {above / 2**20:.1f} | {p / 2**20:.1f} | {ratio} | {b / 2**20:.1f} "
                         f"| {'yes' if abs(above - p) <= WITHIN * p else 'no'} | {'yes' if above <= b else 'no'} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default=None, help="comma-separated methods [raw_attention,rollout,alti,norm,grad_l2; "
                    "with --long: forward and the streamed methods]")
    ap.add_argument("-n", default="1024,2048,4096", help="comma-separated token counts")
    ap.add_argument("--layers", type=int, default=TINY.layers, help="layers [2]")
    ap.add_argument("--heads", type=int, default=TINY.heads, help="heads (as many key/value heads) [4]")
    ap.add_argument("--hidden", type=int, default=TINY.d, help="d [32]")
    ap.add_argument("--d-ff", type=int, default=TINY.d_ff, help="the feed-forward width [64]")
    ap.add_argument("--long", action="store_true", help="the tiny-but-long model, fresh processes, above the forward")
    ap.add_argument("--all", action="store_true", help="with --long: every method of the registry")
    ap.add_argument("--max-gb", type=float, default=3.0,
                    help="with --long: skip a method and length whose predicted peak exceeds this [3]")
    ap.add_argument("--fresh", action="store_true", help="each method and length in a process of its own")
    ap.add_argument("--json", action="store_true", help="print the measured bytes as JSON only")
    ap.add_argument("--pass-mb", type=int, help="a gradient pass's memory on the CPU (gradients.IG_CPU_BYTES, in "
                    "MiB) for the measurement and the model alike: small, the checkpointed passes at short lengths")
    a = ap.parse_args()
    if a.all and (not a.long or a.methods):
        ap.error("--all goes with --long and without --methods")
    if a.pass_mb is not None:
        from compute.methods._internals import gradients

        gradients.IG_CPU_BYTES = a.pass_mb << 20  # the model's figures and measure()'s; measure_fresh passes it on
    ns = [int(x) for x in a.n.split(",")]
    shape = LONG if a.long else replace(TINY, layers=a.layers, heads=a.heads, kv_heads=a.heads, d=a.hidden,
                                        d_ff=a.d_ff)
    if a.all:
        from compute.methods import REGISTRY

        methods = [BARE, *REGISTRY]
    else:
        default = ",".join((BARE, *STREAMED)) if a.long else "raw_attention,rollout,alti,norm,grad_l2"
        methods = (a.methods or default).split(",")
    if a.long and BARE not in methods:
        methods.insert(0, BARE)
    max_bytes = int(a.max_gb * mm.GB)
    if a.long:
        got = measure_fresh(methods, ns, shape,
                            lambda name, n: name != BARE and predicted_peak(name, n, shape) > max_bytes,
                            pass_bytes=None if a.pass_mb is None else a.pass_mb << 20)
    else:
        got = (measure_fresh(methods, ns, shape, pass_bytes=None if a.pass_mb is None else a.pass_mb << 20)
               if a.fresh else measure(methods, ns, shape))
    if a.json:
        print(json.dumps(got))
        return
    if not a.long:
        print("| method | n | measured MiB | predicted MiB | measured / predicted |\n|---|---|---|---|---|")
        for name in methods:
            for n in ns:
                m, p = got[f"{name} {n}"], predicted(name, n, shape)
                print(f"| {name} | {n} | {m / 2**20:.0f} | {p / 2**20:.0f} | {m / p:.2f} |")
        return
    fwd = {n: got[f"{BARE} {n}"] for n in ns}
    print("The bare forward's peak: " + ", ".join(f"{v / 2**20:.0f} MiB at {n}" if isinstance(v, int) else
                                                 f"failed at {n}: {v}" for n, v in fwd.items()))
    print()
    print(long_table(got, methods, ns, shape, max_bytes))
    print()
    print(json.dumps(got))


if __name__ == "__main__":
    main()
