"""The fused ALTI L1 kernel (compute/kernels/alti_l1.py) against a float64 torch oracle that builds every T_ij.

The kernel runs under Triton's interpreter on CPU tensors. TRITON_INTERPRET must be set before triton.jit decorates
the kernel, and once the kernel module is imported its mode is fixed for the process: so the kernel never runs in
the pytest process. This file is also the worker script: ``python tests/test_kernel_alti_l1.py cases`` (with
TRITON_INTERPRET=1) runs every case once and prints the errors as JSON, which one module-scoped fixture collects;
``... compile`` compiles the kernels for an sm_90 GPU (no GPU needed: the wheel's ptxas) and prints their register
and stack use, since the interpreter never compiles anything. The pytest process itself only checks what needs no
triton (import without it, argument checks).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (the gpu or test extra)")

# name: (N, H, n, d, diag, dtype, blocks or None, lengths or None (padding: rows/columns past a length are 0))
CASES = {
    "ragged": (2, 12, 20, 40, True, "float32", None, None),  # n, d past the blocks; H = 12: a padded head chunk
    "ragged_f64": (1, 12, 21, 70, True, "float64", None, None),
    "single_token": (3, 4, 1, 33, True, "float32", None, None),
    "single_token_f64": (2, 4, 1, 33, True, "float64", None, None),
    "one_head": (2, 1, 20, 40, False, "float32", None, None),
    "odd_heads_f64": (2, 5, 18, 48, True, "float64", None, None),
    "many_heads": (1, 40, 9, 32, True, "float32", None, None),  # three head chunks, the last one padded
    "padded": (3, 6, 24, 40, True, "float32", None, (24, 17, 5)),
    "padded_no_diag_f64": (3, 6, 24, 40, False, "float64", None, (24, 1, 9)),
    "wide_blocks": (1, 16, 40, 130, True, "float32", (32, 16, 64, 32), None),  # a GPU-like launch, 32 heads a dot
    "narrow_blocks": (1, 3, 7, 9, True, "float32", (1, 2, 4, 16), None),  # one query per program
}
TOL = {"float32": 1e-6, "float64": 1e-12}  # of max |c|


# ----------------------------------------------------------------------------------------------------------------
# the worker (a subprocess: TRITON_INTERPRET=1 for "cases")

def oracle(A, U, diag, a):
    """sum_k |a_ik| - |a_ik - T_ijk| in float64 from every T_ij (einsum over heads) [N, n, n]."""
    A, U, a = A.double(), U.double(), a.double()
    T = torch.einsum("bhij,bjhk->bijk", A, U)
    if diag is not None:
        i = torch.arange(A.shape[-1])
        T[:, i, i] += diag.double()
    return (a.abs()[:, :, None] - (a[:, :, None] - T).abs()).sum(-1)


def case_inputs(N, H, n, d, diag, dtype, lengths, seed=0):
    """Seeded inputs: attention rows that sum to 1 over the real tokens (0 past a length), value vectors, targets of
    the size the vectors add up to."""
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    scores = torch.randn(N, H, n, n, generator=g, dtype=torch.float64) * 2
    if lengths is not None:
        real = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]  # [N, n]
        scores = scores.masked_fill(~real[:, None, None, :], float("-inf"))
    A = scores.softmax(-1)
    if lengths is not None:
        A = A.masked_fill(~real[:, None, :, None], 0.0)
    U = torch.randn(N, n, H, d, generator=g, dtype=torch.float64) / H ** 0.5
    a = torch.einsum("bhij,bjhk->bik", A, U) + torch.randn(N, n, d, generator=g, dtype=torch.float64)
    D = torch.randn(N, n, d, generator=g, dtype=torch.float64) if diag else None
    return A.to(dt), U.to(dt), None if D is None else D.to(dt), a.to(dt)


def run_cases() -> dict:
    import numpy
    import triton

    from compute.kernels import alti_l1

    if not alti_l1.available("cpu"):
        return {"skipped": f"the kernel does not run with triton {triton.__version__} (at least "
                           f"{'.'.join(map(str, alti_l1.MIN_TRITON))})"}
    if alti_l1.triton_version(triton.__version__) < (3, 7) and alti_l1.triton_version(numpy.__version__) >= (2, 4):
        return {"skipped": f"triton {triton.__version__}'s interpreter runs no loop with a runtime bound under numpy "
                           f"{numpy.__version__} (int() of a 1-element array; fixed in triton 3.7)"}
    out = {"available_cpu": alti_l1.available("cpu"), "available_half": alti_l1.available("cpu", torch.float16)}
    for name, (N, H, n, d, diag, dtype, blocks, lengths) in CASES.items():
        A, U, D, a = case_inputs(N, H, n, d, diag, dtype, lengths)
        c = alti_l1.l1_proximities(A, U, D, a, blocks=None if blocks is None else alti_l1.Blocks(*blocks))
        ref = oracle(A, U, D, a)
        row = {"dtype": str(c.dtype), "shape": list(c.shape), "err": (c.double() - ref).abs().max().item(),
               "scale": ref.abs().max().item()}
        if lengths is not None:  # pairs with a padding token, off the diagonal: exactly 0
            real = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
            pad = ~(real[:, :, None] & real[:, None, :]) & ~torch.eye(n, dtype=torch.bool)
            row["pad_max"] = c[pad].abs().max().item()
        out[name] = row

    # strided inputs: A already source-major (a permuted view, not copied), U a transposed view of [n, N, H, d]
    A, U, D, a = case_inputs(2, 6, 19, 40, True, "float32", None, seed=1)
    A_src = A.permute(0, 3, 2, 1).contiguous().permute(0, 3, 2, 1)
    U_src = U.transpose(0, 1).contiguous().transpose(0, 1)
    c = alti_l1.l1_proximities(A_src, U_src, D, a)
    ref = oracle(A, U, D, a)
    out["strided"] = {"err": (c.double() - ref).abs().max().item(), "scale": ref.abs().max().item()}

    out["project_dense"] = against_dense_path(alti_l1)
    out["autotuned"] = through_autotuner(alti_l1)
    return out


def through_autotuner(alti_l1) -> dict:
    """The GPU branch of ``l1_proximities`` (the autotuner: pruning, key, launch options) run by the interpreter,
    with every candidate timed alike (there are no CUDA events here): the pick, and the result's error."""
    kt = alti_l1._kernels()
    tuned = kt.alti_l1_autotuned
    if not hasattr(tuned, "_do_bench"):  # where this triton's autotuner keeps its benchmarker
        return {"skipped": "this triton's autotuner has no _do_bench to stand in for CUDA timings"}
    saved = tuned._do_bench, kt.INTERPRETED, alti_l1.available
    tuned._do_bench = lambda kernel_call, quantiles: (kernel_call(), [1.0] * len(quantiles))[1]
    kt.INTERPRETED, alti_l1.available = False, lambda *args: True
    try:
        A, U, D, a = case_inputs(1, 12, 40, 40, True, "float32", None, seed=2)
        c = alti_l1.l1_proximities(A, U, D, a)
        config = alti_l1.chosen_config()
    finally:
        tuned._do_bench, kt.INTERPRETED, alti_l1.available = saved
    ref = oracle(A, U, D, a)
    timed = [c.kwargs for c in tuned.configs_timings] if getattr(tuned, "configs_timings", None) else None
    return {"err": (c.double() - ref).abs().max().item(), "scale": ref.abs().max().item(), "config": config,
            "timed": timed}


def against_dense_path(alti_l1) -> dict:
    """The kernel fed as ALTI feeds the torch dense form (a tiny BERT's layer parts, the "resln" operands, U from
    ``LayerParts.project``), float64: the largest difference over the layers, and the scale."""
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import random_batch, tiny_model

    from compute.adapters import adapter_for
    from compute.methods._internals import l1_proximity as L1
    from compute.methods._internals.decomposition import NEEDS, layer_parts, operand_weights

    model = tiny_model("bert", layers=2)
    ad = adapter_for(model)
    with torch.no_grad():
        cap = ad.capture(random_batch("bert", [13, 4, 9, 1]), NEEDS)
        err = scale = 0.0
        for layer in range(model.config.num_hidden_layers):
            p = layer_parts(cap, ad, layer)
            W, diag, s = operand_weights(p, "resln")
            a = p.y * s[..., None]
            dense = L1.dense_l1_proximities(p, W, diag, a, 1 << 20)
            c = alti_l1.l1_proximities(p.A, p.project(W), diag, a)
            err = max(err, (c - dense).abs().max().item())
            scale = max(scale, dense.abs().max().item())
        # the whole method through the kernel (every layer stacked: l1_path="kernel") against the dense form
        from compute.methods import get_method

        whole = {path: get_method("alti", l1_path=path).compute(cap, ad, cap.pred) for path in ("dense", "kernel")}
        method_err = max((getattr(whole["kernel"], k) - getattr(whole["dense"], k)).abs().max().item()
                         for k in ("scores", "layer_scores", "matrices"))
    return {"err": err, "scale": scale, "dtype": str(c.dtype), "method_err": method_err}


def compile_for_sm90() -> dict:
    """Every autotuner candidate compiled for sm_90 in float32 ("ieee" and "tf32x3") and float64, and the diagonal
    kernel, with the specialisations a BERT-base launch gets (n = 128, H = 12, d = 768, contiguous): registers and
    stack bytes of each (stack > 0: spilled registers)."""
    import re

    import triton
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import ASTSource
    except ImportError as e:  # triton's ahead-of-time interfaces, not its stable API
        return {"skipped": f"this triton compiles nothing ahead of time here: {e}"}

    from compute.kernels import alti_l1

    if alti_l1.triton_version(triton.__version__) < alti_l1.MIN_TRITON:
        return {"skipped": f"triton {triton.__version__} is older than the kernel needs"}
    kt = alti_l1._kernels()
    n, H, d = 128, 12, 768
    values = dict(n=n, H=H, d=d, sAb=n * n * H, sAh=1, sAi=H, sAj=n * H, sUb=n * H * d, sUj=H * d, sUh=d, sUk=1,
                  sDb=n * d, sDi=d, sDk=1, sXb=n * d, sXi=d, sXk=1, sCb=n * n, sCi=n, sCj=1, n_bucket=n)
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        return {"skipped": f"no cuobjdump in this triton ({cuobjdump})"}

    def build(fn, consts, dtype, warps, stages):
        sig, attrs = {}, {}
        consts = dict(consts)
        for idx, name in enumerate(fn.arg_names):
            if name in consts:
                sig[name] = "constexpr"
            elif name in ("A", "U", "D", "X", "C"):
                sig[name] = "*" + dtype
                attrs[(idx,)] = [["tt.divisibility", 16]]
            elif values[name] == 1:  # as a launch specialises an argument equal to 1
                sig[name] = "constexpr"
                consts[name] = 1
            else:
                sig[name] = "i32"
                if values[name] % 16 == 0:
                    attrs[(idx,)] = [["tt.divisibility", 16]]
        k = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                           options=dict(num_warps=warps, num_stages=stages, enable_fp_fusion=True))
        path = Path(os.environ["TRITON_CACHE_DIR"]) / "probe.cubin"
        path.write_bytes(k.asm["cubin"])
        usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", str(path)], capture_output=True, text=True,
                               check=True).stdout
        m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
        return {"regs": int(m.group(1)), "stack": int(m.group(2))}

    out = {}
    for precision, dtype in (("ieee", "fp32"), ("tf32x3", "fp32"), ("ieee", "fp64")):
        for cfg in kt._configs():
            tag = "{BI}x{BJ}x{BK}/{HC}".format(**cfg.kwargs) + f" w{cfg.num_warps} s{cfg.num_stages}"
            out[f"{dtype} {precision} {tag}"] = build(kt.alti_l1_kernel, {**cfg.kwargs, "PRECISION": precision}, dtype,
                                                      cfg.num_warps, cfg.num_stages)
    for dtype in ("fp32", "fp64"):
        out[f"diagonal {dtype}"] = build(kt.diagonal_kernel, {"BI": 16, "BK": 64}, dtype, 4, 1)
    return out


# ----------------------------------------------------------------------------------------------------------------
# the pytest side

def _start(mode: str, tmp: Path, interpret: bool) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["TRITON_CACHE_DIR"] = str(tmp)  # nothing compiled lands in ~/.triton
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    with open(tmp / "stdout", "w") as out, open(tmp / "stderr", "w") as err:  # files: no pipe to fill while waiting
        return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), mode], env=env, stdout=out,
                                stderr=err)


def _finish(proc: subprocess.Popen, mode: str, tmp: Path) -> dict:
    try:
        proc.wait(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    out, err = (tmp / "stdout").read_text(), (tmp / "stderr").read_text()
    assert proc.returncode == 0, f"worker {mode} failed:\n{out[-3000:]}\n{err[-6000:]}"
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    """Both workers, started together (the interpreter and the compiler each keep a core busy)."""
    tmp = {"cases": tmp_path_factory.mktemp("triton-interpret"), "compile": tmp_path_factory.mktemp("triton-sm90")}
    procs = {mode: _start(mode, tmp[mode], interpret=mode == "cases") for mode in tmp}
    try:
        return {mode: _finish(proc, mode, tmp[mode]) for mode, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def results(workers):
    if "skipped" in workers["cases"]:
        pytest.skip(workers["cases"]["skipped"])
    return workers["cases"]


@pytest.fixture(scope="module")
def compiled(workers):
    if "skipped" in workers["compile"]:
        pytest.skip(workers["compile"]["skipped"])
    return workers["compile"]


@needs_triton
@pytest.mark.parametrize("name", list(CASES))
def test_kernel_matches_oracle(results, name):
    r = results[name]
    dtype = CASES[name][5]
    assert r["dtype"] == f"torch.{dtype}"
    assert r["scale"] > 0
    assert r["err"] <= TOL[dtype] * r["scale"], r
    if "pad_max" in r:
        assert r["pad_max"] == 0.0, r


@needs_triton
def test_strided_inputs(results):
    r = results["strided"]
    assert r["err"] <= TOL["float32"] * r["scale"], r


@needs_triton
def test_same_as_dense_path_on_a_model(results):
    """What the main ALTI path computes, from the same operands (float64, the dense form materialises T)."""
    r = results["project_dense"]
    assert r["dtype"] == "torch.float64"
    assert r["err"] <= TOL["float64"] * r["scale"], r
    assert r["method_err"] <= 1e-12, r  # ALTI's scores, views and matrices (rows sum to 1) through l1_path="kernel"


@needs_triton
def test_autotuned_launch(results):
    """The autotuner's candidates for n = 40, d = 40: none with query blocks past 64; the pick runs and is right."""
    r = results["autotuned"]
    if "skipped" in r:
        pytest.skip(r["skipped"])
    assert r["err"] <= TOL["float32"] * r["scale"], r
    assert r["config"] is not None and r["config"]["BI"] <= 64, r
    if r["timed"] is not None:
        assert r["timed"] and all(c["BI"] <= 64 and c["BK"] <= 64 for c in r["timed"]), r


@needs_triton
def test_available_under_interpreter(results):
    assert results["available_cpu"] is True
    assert results["available_half"] is False


@needs_triton
def test_compiles_for_sm90(compiled):
    """Every candidate compiles (a candidate that does not would stop the autotuner), and each group has one that
    spills no registers (with triton 3.6 to 3.9 none spills; 3.5 spills a few)."""
    for group in ("fp32 ieee", "fp32 tf32x3", "fp64 ieee", "diagonal fp32", "diagonal fp64"):
        members = {k: v for k, v in compiled.items() if k.startswith(group)}
        assert members, group
        assert any(v["stack"] == 0 for v in members.values()), members


def test_imports_and_refuses_without_triton(monkeypatch):
    """compute imports without triton; the kernel is then unavailable and says so."""
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton raises ImportError, find_spec gives None
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from compute.kernels import alti_l1

    assert "compute.kernels._alti_l1_triton" not in sys.modules
    assert not alti_l1.available("cpu")
    assert not alti_l1.available("cuda")
    A, U, D, a = case_inputs(1, 2, 3, 4, True, "float32", None)
    with pytest.raises(RuntimeError, match="cannot run"):
        alti_l1.l1_proximities(A, U, D, a)


def test_argument_checks():
    """Checked before triton is needed."""
    from compute.kernels import alti_l1

    A, U, D, a = case_inputs(2, 3, 5, 8, True, "float32", None)
    with pytest.raises(ValueError, match="shapes"):
        alti_l1.l1_proximities(A, U[:, :4], D, a)
    with pytest.raises(ValueError, match="shapes"):
        alti_l1.l1_proximities(A, U, D[:, :, :7], a)
    with pytest.raises(TypeError, match="float32 or float64"):
        alti_l1.l1_proximities(A.half(), U.half(), D.half(), a.half())
    with pytest.raises(TypeError, match="float32 or float64"):
        alti_l1.l1_proximities(A, U.double(), D, a)
    with pytest.raises(ValueError, match="precision"):
        alti_l1.l1_proximities(A, U, D, a, precision="tf32")
    with pytest.raises(ValueError, match="powers of two"):
        alti_l1.l1_proximities(A, U, D, a, blocks=alti_l1.Blocks(16, 12, 32))
    with pytest.raises(ValueError, match="heads at least 16"):
        alti_l1.l1_proximities(A, U, D, a, blocks=alti_l1.Blocks(16, 16, 32, 8))
    assert not alti_l1.available("cpu", torch.bfloat16)


if __name__ == "__main__":
    print(json.dumps({"cases": run_cases, "compile": compile_for_sm90}[sys.argv[1]]()))
