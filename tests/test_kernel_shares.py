"""DecompX's share kernels (compute/kernels/shares.py) against the torch bodies of the custom ops they implement on
CUDA (compute/methods/_internals/fused.py).

The kernels run under Triton's interpreter on CPU tensors. TRITON_INTERPRET must be set before triton.jit wraps the
kernels, and the mode is then fixed for the process: so no kernel runs in the pytest process. This file is also the
worker script: ``python tests/test_kernel_shares.py cases`` (with TRITON_INTERPRET=1) runs every case and prints the
results as JSON; ``... compile`` compiles the kernels for an sm_90 GPU (no GPU needed: the wheel's ptxas) and prints
their register and stack use, since the interpreter compiles nothing. The pytest process itself checks only what
needs no triton.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install triton)")

# name: (R, n, D, dtype, zero rows). Tiles of parts (BLOCK_N): 8 at D = 768 and 16 at D = 384 in float32, 4 at
# D = 768 in float64, so n = 21 and 37 end in a partial tile; D = 40 and 2 are not powers of two.
CASES = {
    "one_part": (3, 1, 32, "float32", (1,)),
    "one_row": (1, 21, 768, "float32", ()),
    "partial_tile_384": (2, 37, 384, "float32", (0,)),
    "partial_tile_768": (3, 21, 768, "float32", (1,)),
    "one_tile_32": (4, 9, 32, "float32", (2, 3)),
    "narrow_40": (2, 13, 40, "float32", ()),
    "two_classes": (3, 6, 2, "float32", (0,)),  # DecompX's head: the logit share, D = classes
    "f64_768": (2, 7, 768, "float64", (0,)),
    "f64_one_part": (2, 1, 32, "float64", ()),
    "f64_narrow": (3, 11, 40, "float64", (2,)),
}
TOL = {"float32": 1e-6, "float64": 1e-12}  # of the largest magnitude of the torch body's result


# ----------------------------------------------------------------------------------------------------------------
# the worker (a subprocess: TRITON_INTERPRET=1 for "cases")

def case_inputs(R, n, D, dtype, zero_rows, seed=0):
    """Seeded parts (rows in ``zero_rows`` all 0: their dots are all 0), a bias vector, a gain for each row."""
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    v = torch.randn(R, n, D, generator=g, dtype=torch.float64).to(dt)
    v[list(zero_rows)] = 0
    c = torch.randn(D, generator=g, dtype=torch.float64).to(dt)
    gain = (torch.rand(R, 1, D, generator=g, dtype=torch.float64) + 0.5).to(dt)
    return v, c, gain


def _compare(out, ref):
    return {"err": (out.double() - ref.double()).abs().max().item(), "scale": ref.abs().max().item(),
            "nan": bool(out.isnan().any()), "dtype": str(out.dtype), "shape": list(out.shape)}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:2])


def run_cases() -> dict:
    import numpy
    import triton

    from compute.kernels import shares
    from compute.methods._internals import fused

    if _version(triton.__version__) < (3, 7) and _version(numpy.__version__) >= (2, 4):
        # seen with triton 3.5.0 and numpy 2.4.6 (3.7.0 and 3.9.0 run them)
        return {"skipped": f"triton {triton.__version__}'s interpreter runs no loop with a runtime bound under numpy "
                           f"{numpy.__version__} (TypeError: only 0-dimensional arrays can be converted to Python "
                           f"scalars)"}
    out = {"available_cpu": shares.available(torch.zeros(1))}
    for name, (R, n, D, dtype, zero_rows) in CASES.items():
        v, c, gain = case_inputs(R, n, D, dtype, zero_rows)
        row = {}
        w = shares.absdot_weights(v, c, split=1)
        row["weights"] = _compare(w, fused._absdot_weights(v, c))
        row["weights_zero_rows"] = w[list(zero_rows)].abs().max().item() if zero_rows else 0.0
        # programs a row: each sums the whole row the same way, so any split gives the same numbers
        splits = (3,) if n < 20 else (2, 3, 64)  # more than one tile of parts: chunks of one, two or all tiles
        row["weights_split_same"] = all(torch.equal(shares.absdot_weights(v, c, split=s), w) for s in splits)

        s_ = v.clone()
        shares.absdot_share_(s_, c)
        ref = v.clone()
        fused._absdot_share_(ref, c)
        row["share"] = _compare(s_, ref)
        row["share_zero_rows_kept"] = torch.equal(s_[list(zero_rows)], v[list(zero_rows)])

        y = shares.ln_share(v, gain, c, split=1)
        row["ln"] = _compare(y, fused._ln_share(v, gain, c))
        row["ln_zero_rows"] = y[list(zero_rows)].abs().max().item() if zero_rows else 0.0
        row["ln_split_same"] = all(torch.equal(shares.ln_share(v, gain, c, split=s), y) for s in splits)
        out[name] = row

    # non-contiguous operands: parts of a transposed tensor (in place: written back through the view), a gain that
    # broadcasts ([D], one for every row) or has strides, a strided bias
    v, c, gain = case_inputs(3, 10, 40, "float32", (1,), seed=1)
    vt = v.transpose(0, 1).contiguous().transpose(0, 1)  # [R, n, D] with the parts outermost
    ref = v.clone()
    fused._absdot_share_(ref, c)
    shares.absdot_share_(vt, c)
    out["share_strided"] = _compare(vt, ref)
    g1 = gain[0, 0]
    out["ln_gain_broadcast"] = _compare(shares.ln_share(v, g1, c), fused._ln_share(v, g1, c))
    vt = v.transpose(0, 1).contiguous().transpose(0, 1)  # afresh: the share above changed the other
    gs = gain.transpose(0, 2).contiguous().transpose(0, 2)
    out["ln_gain_strided"] = _compare(shares.ln_share(vt, gs, c), fused._ln_share(v, gain, c))
    cs = torch.stack([c, c], -1)[:, 0]
    out["weights_strided_c"] = _compare(shares.absdot_weights(vt, cs), fused._absdot_weights(v, c))

    # the CUDA registrations, called on CPU tensors with the interpreter on: the kernel where it runs (the same
    # numbers as the kernel called directly), the torch body otherwise
    v, c, gain = case_inputs(2, 9, 40, "float32", (1,), seed=2)
    s_ = v.clone()
    fused._absdot_share_cuda(s_, c)
    k = v.clone()
    shares.absdot_share_(k, c)
    out["registered_kernel"] = (torch.equal(fused._absdot_weights_cuda(v, c), shares.absdot_weights(v, c))
                                and torch.equal(s_, k)
                                and torch.equal(fused._ln_share_cuda(v, gain, c), shares.ln_share(v, gain, c)))
    h, ch, gh = v.half(), c.half(), gain.half()
    s_ = h.clone()
    fused._absdot_share_cuda(s_, ch)
    ref = h.clone()
    fused._absdot_share_(ref, ch)
    out["registered_half_is_body"] = (torch.equal(fused._absdot_weights_cuda(h, ch), fused._absdot_weights(h, ch))
                                      and torch.equal(s_, ref)
                                      and torch.equal(fused._ln_share_cuda(h, gh, ch), fused._ln_share(h, gh, ch)))
    out["runs"] = {"float32": shares.runs(v, c, gain), "half": shares.runs(h, ch, gh),
                   "mixed": shares.runs(v, c.double()), "c_shape": shares.runs(v, c[:-1]),
                   "gain_per_part": shares.runs(v, c, gain.expand(2, 9, 40)),
                   "too_wide": shares.runs(torch.zeros(1, 1, 8193), torch.zeros(8193)),
                   "widest_f64": shares.runs(torch.zeros(1, 1, 4096, dtype=torch.float64),
                                             torch.zeros(4096, dtype=torch.float64))}
    empty = torch.zeros(0, 3, 40)
    out["empty"] = (list(shares.absdot_weights(empty, c).shape) == [0, 3, 1]
                    and list(shares.ln_share(empty, gain[:0], c).shape) == [0, 3, 40])
    return out


def compile_for_sm90() -> dict:
    """The three kernels compiled for sm_90 in float32 and float64, at BERT-base's width (n = 128, D = 768) and at
    the widest parts taken, with the launch options the wrapper picks: registers and stack bytes (stack > 0:
    spilled registers)."""
    import re

    import triton
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import ASTSource
    except ImportError as e:  # triton's ahead-of-time interfaces, not its stable API
        return {"skipped": f"this triton compiles nothing ahead of time here: {e}"}

    from compute.kernels import shares

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        return {"skipped": f"no cuobjdump in this triton ({cuobjdump})"}
    kernels = shares._kernels()

    def build(fn, consts, dtype, options, ints):
        sig, attrs = {}, {}
        for idx, name in enumerate(fn.arg_names):
            if name in consts:
                sig[name] = "constexpr"
            elif name in ("V", "C", "W", "G", "OUT"):
                sig[name] = "*" + dtype
                attrs[(idx,)] = [["tt.divisibility", 16]]
            else:
                sig[name] = "i32"
                if ints[name] % 16 == 0:  # as a launch specialises it
                    attrs[(idx,)] = [["tt.divisibility", 16]]
        k = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=options)
        path = Path(os.environ["TRITON_CACHE_DIR"]) / "probe.cubin"
        path.write_bytes(k.asm["cubin"])
        usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", str(path)], capture_output=True, text=True,
                               check=True).stdout
        m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
        return {"regs": int(m.group(1)), "stack": int(m.group(2)), "warps": options["num_warps"]}

    out = {}
    for dtype, tdt in (("fp32", torch.float32), ("fp64", torch.float64)):
        widest = shares.MAX_PART_BYTES // tdt.itemsize
        for n, D in ((128, 768), (128, widest)):
            v = torch.empty(1, n, D, dtype=tdt, device="meta")
            block_n, block_d, tiny, options = shares._launch(v)
            ints = {"n": n, "D": D, "stride_gr": D, "stride_gd": 1}
            for name, kernel, extra in (("weights", "weights", {}), ("share", "share", {"LN": False}),
                                        ("ln_share", "share", {"LN": True})):
                consts = {"TINY": tiny, "BLOCK_N": block_n, "BLOCK_D": block_d, **extra}
                if "stride_gd" in kernels[kernel].arg_names:
                    consts["stride_gd"] = 1  # a launch specialises an int argument equal to 1
                out[f"{name} {dtype} D={D}"] = build(kernels[kernel], consts, dtype, options, ints)
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
    if not HAS_TRITON:
        pytest.skip("triton is not installed (pip install triton)")
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
@pytest.mark.parametrize("op", ["weights", "share", "ln"])
@pytest.mark.parametrize("name", list(CASES))
def test_kernel_matches_torch_body(results, name, op):
    R, n, D, dtype, zero_rows = CASES[name]
    r = results[name][op]
    assert r["dtype"] == f"torch.{dtype}" and r["shape"] == [R, n, 1 if op == "weights" else D]
    assert not r["nan"]
    assert r["scale"] > 0
    assert r["err"] <= TOL[dtype] * r["scale"], r


@needs_triton
@pytest.mark.parametrize("name", [k for k, v in CASES.items() if v[4]])
def test_rows_with_all_dots_zero_get_no_share(results, name):
    """A row of zero parts: weights 0 (not 0/0), the bias adds nothing, the LayerNorm share gives 0."""
    r = results[name]
    assert r["weights_zero_rows"] == 0.0
    assert r["share_zero_rows_kept"]
    assert r["ln_zero_rows"] == 0.0


@needs_triton
@pytest.mark.parametrize("name", list(CASES))
def test_programs_a_row_change_no_number(results, name):
    assert results[name]["weights_split_same"]
    assert results[name]["ln_split_same"]


@needs_triton
@pytest.mark.parametrize("key", ["share_strided", "ln_gain_broadcast", "ln_gain_strided", "weights_strided_c"])
def test_strided_and_broadcast_operands(results, key):
    r = results[key]
    assert not r["nan"]
    assert r["err"] <= TOL["float32"] * r["scale"], r


@needs_triton
def test_cuda_registrations_take_the_kernel_where_it_runs(results):
    assert results["available_cpu"] is True
    assert results["registered_kernel"]
    assert results["registered_half_is_body"]
    assert results["runs"] == {"float32": True, "half": False, "mixed": False, "c_shape": False,
                               "gain_per_part": False, "too_wide": False, "widest_f64": True}
    assert results["empty"]


@needs_triton
def test_compiles_for_sm90_without_spills(compiled):
    assert len(compiled) == 12, compiled
    for name, r in compiled.items():
        assert r["stack"] == 0, (name, r)


def test_custom_ops_have_cuda_kernels():
    """The custom ops' CUDA implementations are registered (the op counts count each as one launch)."""
    from compute.methods._internals import fused  # noqa: F401 (registers the ops)

    for op in ("absdot_weights", "absdot_share_", "ln_share"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"attrscope::{op}", "CUDA"), op


def test_imports_without_triton():
    """fused and shares import without importing triton; without triton the kernels are unavailable and the CUDA
    registrations fall back on the torch bodies."""
    code = ("import sys\n"
            "import compute.methods._internals.fused as fused, compute.kernels.shares as shares\n"
            "assert 'triton' not in sys.modules, 'imported triton'\n"
            "sys.modules['triton'] = None\n"  # import triton fails, find_spec gives None
            "import torch\n"
            "v, c, g = torch.randn(2, 5, 8), torch.randn(8), torch.rand(2, 1, 8)\n"
            "assert not shares.available(v) and not shares.runs(v, c)\n"
            "assert torch.equal(fused._ln_share_cuda(v, g, c), fused._ln_share(v, g, c))\n"
            "assert torch.equal(fused._absdot_weights_cuda(v, c), fused._absdot_weights(v, c))\n"
            "try:\n"
            "    shares.absdot_weights(v, c)\n"
            "except RuntimeError as e:\n"
            "    assert 'cannot run' in str(e)\n"
            "else:\n"
            "    raise AssertionError('ran without triton')\n")
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO)] + ([os.environ["PYTHONPATH"]] if "PYTHONPATH" in os.environ
                                                       else []))}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


if __name__ == "__main__":
    print(json.dumps({"cases": run_cases, "compile": compile_for_sm90}[sys.argv[1]]()))
