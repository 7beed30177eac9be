"""Operand precision of contractions: numpy emulation, Triton branches in the interpreter, peaks,
simulated prices and bounds per precision.

The Triton interpreter computes ``ieee``, ``tf32x3``, ``tf32`` (as exact fp32) and ``fp16`` dots as a
GPU would; its bf16 arithmetic truncates and its fp8 products are not exact, so the bf16 and fp8
branches are checked here by their source and by the numpy emulation, and on a GPU by the ``gpu``
tests (``lumc.compiler.core.measure`` checks every config there).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from lumc.backends import devices
from lumc.backends.precision import FP8_MAX, dot_rounding, round_operand
from lumc.backends.reference import ReferenceExecutor
from lumc.backends.simulator import config_bound, simulate_kernel_time
from lumc.backends.triton import configs
from lumc.backends.triton.launch import TritonKernel
from lumc.ir import dtypes as dt
from triton_cases import matmul_kernel

RNG = np.random.default_rng(7)


def test_bf16_fp16_rounding_is_round_to_nearest_even():
    x = RNG.standard_normal(1000).astype(np.float32) * 100
    np.testing.assert_array_equal(round_operand(x, "bf16"),
                                  x.astype(ml_dtypes.bfloat16).astype(np.float32))
    np.testing.assert_array_equal(round_operand(x, "fp16"), x.astype(np.float16).astype(np.float32))
    assert round_operand(np.float32([1e6]), "fp16")[0] == np.inf   # fp16 overflows to inf


def test_tf32_keeps_ten_mantissa_bits():
    x = RNG.standard_normal(1000).astype(np.float32)
    r = round_operand(x, "tf32")
    assert np.all(r.view(np.uint32) & 0x1FFF == 0)
    assert np.all(np.abs(r - x) <= np.abs(x) * 2.0 ** -10)
    np.testing.assert_array_equal(round_operand(x, "tf32x3"), x)   # 3xTF32 is emulated as fp32


@pytest.mark.parametrize("k,bk", [(70, 32), (64, 64), (5, 32), (129, 16)])
def test_fp8_block_scales(k, bk):
    x = RNG.standard_normal((6, k)).astype(np.float32) * np.float32(RNG.uniform(0.01, 50))
    x[2] = 0.0                                   # an all-zero row stays zero (scale 1)
    r = round_operand(x, "fp8", (1,), bk)
    assert np.all(r[2] == 0)
    for j in range(0, k, bk):
        blk, rb = x[:, j:j + bk], r[:, j:j + bk]
        amax = np.abs(blk).max(axis=1, keepdims=True)
        scale = np.where(amax > 0, amax / FP8_MAX, 1.0).astype(np.float32)
        # every value is an e4m3 value times its slice's scale, the slice's amax kept exactly
        q = (rb / scale).astype(np.float32)
        np.testing.assert_allclose(q, q.astype(ml_dtypes.float8_e4m3fn).astype(np.float32),
                                   rtol=1e-6, atol=1e-30)
        np.testing.assert_allclose(np.abs(rb).max(axis=1, keepdims=True), amax, rtol=1e-6)
    # e4m3 has 3 mantissa bits: relative error per element at most 2^-4 of its slice's amax
    assert np.all(np.abs(r - x) <= np.abs(x).max() * 2.0 ** -4 + 1e-30)


def test_fp8_scales_follow_the_reduced_axes():
    x = RNG.standard_normal((40, 3)).astype(np.float32)
    a = round_operand(x, "fp8", (0,), 32)        # K is axis 0: columns are scaled separately
    b = round_operand(x.T.copy(), "fp8", (1,), 32).T
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("p", ["ieee", "tf32x3", "tf32", "fp16", "bf16", "fp8"])
@pytest.mark.parametrize("mkn", [(1, 7, 127), (37, 45, 130), (127, 33, 1023)])
def test_interpreter_dot_matches_its_emulation(mkn, p):
    k = matmul_kernel(*mkn, dt.f32)
    tk = TritonKernel(k)
    ins = [RNG.standard_normal(n.shape).astype(np.float32) for n in k.inputs]
    cfg = configs.make(4, 2, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=8, PRECISION=p)
    got = tk(*ins, config=cfg)[0].numpy()
    feed = {n.arg.name: v for n, v in zip(k.inputs, ins)}
    # the interpreter's tf32 is exact fp32: compare it with the exact meaning
    hook = dot_rounding(cfg.kwargs()) if p != "tf32" else None
    ref = next(iter(ReferenceExecutor(k.meaning, dot_operands=hook)(feed).values()))
    exact = next(iter(ReferenceExecutor(k.meaning, "float64")(feed).values()))
    scale = np.abs(exact).max()
    assert np.abs(got - ref).max() / scale < 2e-6
    if p in ("fp16", "bf16", "fp8"):   # and the precision really is lower than fp32's
        assert np.abs(ref - exact).max() / scale > 1e-5


def test_every_precision_is_a_constexpr_branch_of_one_module():
    tk = TritonKernel(matmul_kernel(64, 64, 64, dt.f32))
    src = tk.source
    assert "PRECISION: tl.constexpr" in src
    assert "input_precision=PRECISION" in src and "tl.float8e4nv" in src and "tl.bfloat16" in src
    d = tk.default_config()
    assert d["PRECISION"] == "tf32x3"                      # fp32 on tensor cores by default
    tk16 = TritonKernel(matmul_kernel(64, 64, 64, dt.f16))
    assert tk16.default_config()["PRECISION"] == "fp16" and "input_precision" not in tk16.source


def test_dot_peaks_and_policy_bound():
    h = devices.H200
    assert h.dot_peak("tf32x3") == pytest.approx(h.tensor_flops["f32"] / 3)
    assert h.dot_peak("ieee") == h.vector_flops["f32"]
    assert h.dot_peak("fp8") == pytest.approx(2 * h.dot_peak("bf16"), rel=1e-3)
    assert h.dot_peak("bf16") == pytest.approx(2 * h.dot_peak("tf32"), rel=1e-3)
    # the fp32 bound is the 3xTF32 rate, not plain TF32 (the 7x-optimistic bound of round 1)
    assert h.as_ceilings()["tensor_flops"]["f32"] == pytest.approx(494.7e12 / 3)
    import dataclasses
    fp8 = dataclasses.replace(h, dot_precisions={"f32": ("fp8", "bf16")})
    assert fp8.as_ceilings()["tensor_flops"]["f32"] == h.dot_peak("fp8")


def test_simulated_time_follows_the_emitted_precision():
    k = matmul_kernel(4096, 4096, 4096, dt.f32)
    base = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, GROUP_M=8, num_warps=8, num_stages=3)
    t = {p: simulate_kernel_time(k, {**base, "PRECISION": p}, devices.H200)
         for p in ("ieee", "tf32x3", "tf32", "bf16", "fp8")}
    assert t["ieee"] > t["tf32x3"] > t["tf32"] > t["bf16"]
    # fp8 scales its operand tiles on CUDA cores at every K step: a longer BLOCK_K amortizes it
    fp8_128 = simulate_kernel_time(k, {**base, "BLOCK_K": 64, "num_stages": 2, "PRECISION": "fp8"},
                                   devices.H200)
    assert fp8_128 < t["fp8"]
    assert t["fp8"] > 2 * 4096 ** 3 / devices.H200.dot_peak("fp8")
    # an FFMA GEMM cannot beat the CUDA-core roofline: 2*4096^3 / 66.9e12 = 2.05 ms
    assert t["ieee"] >= 2 * 4096 ** 3 / 66.9e12
    for p, v in t.items():
        assert config_bound(k, {**base, "PRECISION": p}, devices.H200) <= v, p


@pytest.mark.parametrize("d", [dt.f16], ids=str)
def test_fused_fp16_values_keep_their_rounding_where_observed(d):
    """A value the model types fp16 is rounded to fp16 before a comparison reads it, even inside one
    fused kernel: ``(a / b) < c`` and ``sum(x) == s`` compare the rounded quotient and sum, as
    the reference (numpy in fp16) does; computing them in fp32 and comparing unrounded changes
    results (an Inductor bug class). Inputs are built so that rounding decides many comparisons."""
    from lumc.ir.graph import Graph, input_node
    from lumc.ir.tensor import Tensor
    from lumc.ir.kernels import Kernel
    from lumc.backends.triton.launch import to_numpy
    n = 4096
    rng = np.random.default_rng(11)
    a = rng.integers(1, 2048, n).astype(np.float16)
    b = rng.integers(1, 64, n).astype(np.float16)
    q32 = a.astype(np.float32) / b.astype(np.float32)
    c = q32.astype(np.float16)      # c == round(a/b): an unrounded quotient misjudges about half
    xa, xb, xc = (Tensor(input_node(k, (n,), d)) for k in ("in0", "in1", "in2"))
    y = (xa / xb) < xc
    k = Kernel("pointwise", Graph({"in0": xa.node, "in1": xb.node, "in2": xc.node},
                                  {"out0": y.node}))
    ref = ReferenceExecutor(k.meaning)({"in0": a, "in1": b, "in2": c})["out0"]
    np.testing.assert_array_equal(ref, (a / b) < c)                    # numpy's fp16 semantics
    assert ((q32 < c.astype(np.float32)) != ref).sum() > n // 10        # rounding decides these
    got = to_numpy(TritonKernel(k)(a, b, c)[0])
    np.testing.assert_array_equal(got, ref)


def test_fused_fp16_sum_is_rounded_before_it_is_compared():
    from lumc.ir.graph import Graph, input_node
    from lumc.ir.tensor import Tensor
    from lumc.ir.kernels import Kernel
    from lumc.backends.triton.launch import to_numpy
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((512, 33)) * 8).astype(np.float16)
    s32 = x.astype(np.float32).sum(-1, keepdims=True)            # fp32 accumulation, as DESIGN says
    s = s32.astype(np.float16)
    xt, st = Tensor(input_node("in0", x.shape, dt.f16)), Tensor(input_node("in1", s.shape, dt.f16))
    y = xt.sum(-1, keepdims=True) < st
    k = Kernel("reduction", Graph({"in0": xt.node, "in1": st.node}, {"out0": y.node}),
               (("axes", (1,)), ("reduce", "sum")))
    ref = ReferenceExecutor(k.meaning)({"in0": x, "in1": s})["out0"]
    assert not ref.any()                                 # the rounded sum never exceeds itself
    assert (s32 < s.astype(np.float32)).sum() > 50       # unrounded, many rows would compare true
    got = to_numpy(TritonKernel(k)(x, s)[0])
    np.testing.assert_array_equal(got, ref)


def test_fp8_below_a_warpgroup_tile_is_priced_as_fp16():
    """Triton runs fp8 dots on fp8 tensor cores (QGMMA) only at warpgroup tiles; smaller tiles
    convert e4m3 to fp16 (HMMA), so the simulator and the bound must not price them at fp8."""
    from lumc.backends.simulator import dot_peak, warpgroup_mma
    small = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "PRECISION": "fp8"}
    big = {**small, "BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8}
    assert not warpgroup_mma(small) and warpgroup_mma(big)
    assert dot_peak(devices.H200, small, "f32") == devices.H200.dot_peak("fp16") * 2 / 3
    assert dot_peak(devices.H200, big, "f32") == devices.H200.dot_peak("fp8")


def test_warpgroup_mma_follows_tritons_rule_not_warps_per_row():
    """Triton lowers a dot to wgmma when num_warps % 4 == 0 and BLOCK_M % 64 == 0 (the warps of a
    warpgroup tile N): the SASS of an fp8 matmul at BLOCK_M=64, BLOCK_N=32, 8 warps (chosen by
    ``--precision fp8`` for a 256x512x1024 MLP) is QGMMA, so it is priced at the fp8 peak, not at
    fp16 (the old rule asked BLOCK_M >= 16 * num_warps); BLOCK_M 16/32 and 3 warps stay mma.sync."""
    from lumc.backends.simulator import dot_peak, warpgroup_mma
    cfg = {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 8, "PRECISION": "fp8"}
    assert warpgroup_mma(cfg)
    assert dot_peak(devices.H200, cfg, "f32") == devices.H200.dot_peak("fp8") == 1978.9e12
    for bm, w in ((16, 4), (32, 4), (32, 8), (64, 2)):
        assert not warpgroup_mma({**cfg, "BLOCK_M": bm, "num_warps": w}), (bm, w)
    assert warpgroup_mma({**cfg, "BLOCK_M": 128, "num_warps": 16})


def test_mma_sync_tiles_are_priced_at_two_thirds_of_the_wgmma_peak():
    """Below a warpgroup tile Triton emits per-warp ``mma.sync`` (SASS HMMA: the conv chosen at
    ``--precision tf32``, BLOCK_M=32, 8 warps, runs HMMA.1688.F32.TF32), which reaches about 2/3 of
    Hopper's tensor peak (FlashAttention-3, arXiv:2407.08608); the dense peaks are wgmma figures.
    Every tensor precision pays it, and the simulated time follows; ieee (FFMA) does not."""
    from lumc.backends.simulator import dot_peak
    dev = devices.H200
    small = {"BLOCK_M": 32, "BLOCK_N": 128, "BLOCK_K": 32, "num_warps": 8}
    big = {**small, "BLOCK_M": 64}
    for prec in ("tf32", "tf32x3", "bf16", "fp16"):
        assert dot_peak(dev, {**big, "PRECISION": prec}, "f32") == dev.dot_peak(prec)
        assert dot_peak(dev, {**small, "PRECISION": prec}, "f32") == \
            pytest.approx(dev.dot_peak(prec) * 2 / 3, rel=1e-12)
    assert dot_peak(dev, small, "bf16") == pytest.approx(989.4e12 * 2 / 3, rel=1e-12)
    assert dot_peak(dev, {**small, "PRECISION": "ieee"}, "f32") == pytest.approx(66.9e12)
    assert dot_peak(dev, {**small, "PRECISION": "tf32"}, "f32") == pytest.approx(494.7e12 * 2 / 3)


def test_contraction_dims_see_through_a_weight_prologue():
    """A weight stored in bf16 (``Cast``) or int8 (``Cast(q) * scale``) is still the contraction's
    N-side operand: the simulator must not take its dims for batch dims (that priced a 128x384x1152
    bf16 GEMM at 10x its time)."""
    from lumc.backends.simulator import contraction_dims
    from lumc.ir.graph import Graph, input_node
    from lumc.ir.kernels import Kernel
    from lumc.ir.tensor import Tensor
    x = Tensor(input_node("in0", (128, 384), dt.f32))
    for w in (Tensor(input_node("in1", (384, 1152), dt.bf16)).cast(dt.f32),
              Tensor(input_node("in1", (384, 1152), dt.i8)).cast(dt.f32)
              * Tensor(input_node("in2", (1, 1152), dt.f32)).expand((384, 1152))):
        ins = {"in0": x.node, "in1": next(n for n in Graph({}, {"w": w.node}).nodes()
                                          if n.op == "Input" and n.arg.name == "in1")}
        if w.node.op == "Mul":
            ins["in2"] = next(n for n in Graph({}, {"w": w.node}).nodes()
                              if n.op == "Input" and n.arg.name == "in2")
        k = Kernel("matmul", Graph(ins, {"out0": (x @ w).node}))
        c = contraction_dims(k)
        assert (c.batch, c.m, c.n, c.k) == (1, 128, 1152, 384)


def test_split_tf32_keeps_inf_where_its_small_parts_are_nan():
    """fp32 contractions default to ``tf32x3`` (Triton's F32DotTC pass: ``a = big + small``, three
    TF32 MMAs). For ``a = inf`` the small part ``inf - inf`` is NaN, which a plain sum of the three
    products would carry into the output where IEEE (and eager PyTorch's fp32 GEMM) gives inf.
    Triton >= 3.6 (the GPU image's) sums the two small products apart and replaces a NaN there by
    0 before the big product (``arith.cmpf uno`` + ``select`` in the TTGIR), so an inf operand
    still gives inf and a NaN operand NaN (through the big product). lumc relies on that: this
    compiles lumc's fp32 matmul for cuda:90 and finds the mask in front of the big product."""
    import json
    import os
    import subprocess
    import sys
    from lumc.backends.triton.aot import _job
    from lumc.compiler.runtime.extern import config_from_dict
    tk = TritonKernel(matmul_kernel(64, 64, 64, dt.f32))
    cfg = config_from_dict({**dict(tk.default_config().blocks), "BLOCK_M": 64, "BLOCK_N": 64,
                            "BLOCK_K": 32, "num_warps": 4, "num_stages": 3, "PRECISION": "tf32x3"})
    job = _job(tk.rendered, cfg)
    # compiled in a child without the interpreter (this process's @triton.jit interprets)
    code = (
        "import importlib.util, json, sys, triton\n"
        "from triton.backends.compiler import GPUTarget\n"
        "from triton.compiler import ASTSource\n"
        "job = json.loads(sys.argv[1])\n"
        "spec = importlib.util.spec_from_file_location('lumc_tf32x3_case', job['path'])\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "src = ASTSource(getattr(mod, job['names'][0]), signature=job['signature'],\n"
        "                constexprs=job['constexprs'])\n"
        "ck = triton.compile(src, target=GPUTarget('cuda', 90, 32),\n"
        "                    options={'num_warps': 4, 'num_stages': 3})\n"
        "print(ck.asm['ttgir'])\n")
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    ttgir = subprocess.run([sys.executable, "-c", code, json.dumps(job)], env=env, check=True,
                           capture_output=True, text=True, timeout=300).stdout
    lines = [ln for ln in ttgir.splitlines() if "warp_group_dot " in ln or "tt.dot " in ln
             or "cmpf uno" in ln]
    dots = [i for i, ln in enumerate(lines) if "cmpf" not in ln]
    masks = [i for i, ln in enumerate(lines) if "cmpf uno" in ln]
    assert len(dots) == 3 and len(masks) == 1, lines       # three TF32 products, one NaN mask
    assert dots[1] < masks[0] < dots[2], lines             # between the small sums and the big


def _tiny_rows(m: int, k: int) -> np.ndarray:
    """Rows of 0, of subnormals (amax / 448 underflows to 0), and one of normal values."""
    x = np.zeros((m, k), np.float32)
    x[1, ::3] = np.float32(7e-45)                     # 5 ulps of the smallest subnormal
    x[2, 1::2] = -np.float32(3e-40)
    x[3] = RNG.standard_normal(k).astype(np.float32)
    return x


def test_fp8_scale_of_a_subnormal_or_zero_slice_is_not_zero():
    """``amax / 448`` of a slice of subnormals is 0 in fp32, and ``x / 0`` made the slice's zeros
    NaN (0 / 0): an activation with a few denormals turned a whole matmul row into NaN."""
    x = _tiny_rows(4, 40)
    r = round_operand(x, "fp8", (1,), 32)
    assert not np.isnan(r).any(), r
    assert np.all(r[0] == 0) and np.all(r[x == 0] == 0)          # zeros quantize to zeros
    np.testing.assert_allclose(r[1:3], x[1:3], rtol=0, atol=1e-40)   # tiny values stay tiny
    assert np.all(np.sign(r) * np.sign(x) >= 0)


def test_fp8_kernel_and_extern_on_subnormal_activations_match_the_emulation():
    """The Triton fp8 branch (interpreted) and the cuBLAS form's torch quantizer (on the CPU) use
    the same scale floor as the emulation: no NaN, the exact product's values."""
    import torch
    from lumc.compiler.runtime.extern import _fp8_scaled
    m, k, n = 4, 40, 33
    k_ = matmul_kernel(m, k, n, dt.f32)
    a, b = _tiny_rows(m, k), RNG.standard_normal((k, n)).astype(np.float32)
    cfg = configs.make(4, 2, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=8, PRECISION="fp8")
    got = TritonKernel(k_)(a, b, config=cfg)[0].numpy()
    feed = {nd.arg.name: v for nd, v in zip(k_.inputs, (a, b))}
    ref = next(iter(ReferenceExecutor(k_.meaning, dot_operands=dot_rounding(cfg.kwargs()))(
        feed).values()))
    ext = _fp8_scaled("ab,bc->ac", torch.tensor(a), torch.tensor(b)).numpy()
    exact = a.astype(np.float64) @ b.astype(np.float64)
    for what, y in (("triton", got), ("emulation", ref), ("extern", ext)):
        assert not np.isnan(y).any(), (what, y)
        assert np.all(y[0] == 0), what
        np.testing.assert_allclose(y[:3], exact[:3], rtol=0, atol=1e-38, err_msg=what)
    assert np.abs(got - ref).max() / np.abs(exact).max() < 2e-6      # the normal row too
