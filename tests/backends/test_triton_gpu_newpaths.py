"""GPU-only checks (``-m gpu``) of paths the CPU cannot run for real: split-K kernels compiled for
the device, cuDNN convolutions (``IMPL=cudnn``) at IEEE fp32 and TF32, and the precompile queue
warming Triton's cache so a config's first launch loads a cubin instead of compiling.
Skipped where CUDA is not available."""
from __future__ import annotations

import time

import numpy as np
import pytest

from lumc.backends.reference import ReferenceExecutor
from lumc.backends.triton import configs
from lumc.ir import dtypes as dt
from lumc.ir.library.conv import conv
from triton_cases import check, make_kernel

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("d", [dt.bf16, dt.f16, dt.f32], ids=str)
@pytest.mark.parametrize("sk", [1, 4, 16])
def test_splitk_on_the_device(d, sk):
    k = make_kernel("matmul", lambda a, b, c: ((a @ b) + c).maximum(0.0),
                    [((37, 2400), d), ((2400, 45), d), ((45,), d)])
    prec = {"bf16": "bf16", "f16": "fp16", "f32": "ieee"}[d.name]
    check(k, config=configs.make(4, 3, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=8,
                                 SPLIT_K=sk, PRECISION=prec))


@pytest.mark.parametrize("prec,tol", [("ieee", 1e-5), ("tf32", 5e-3), ("bf16", 3e-2)])
def test_cudnn_convolution_on_the_device(prec, tol):
    import torch
    from lumc.compiler.core.measure import max_rel_error
    from lumc.compiler.runtime.extern import ExternKernel
    k = make_kernel("matmul", lambda x, w, b: conv(x, w, b, pads=[1, 2, 1, 2], strides=[2, 1],
                                                   group=2),
                    [((2, 8, 33, 31), dt.f32), ((12, 4, 3, 3), dt.f32), ((12,), dt.f32)])
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal(n.shape).astype(np.float32) for n in k.inputs]
    ref = ReferenceExecutor(k.meaning, "float64")({f"in{i}": x for i, x in enumerate(ins)})["out0"]
    ek = ExternKernel(k, "cudnn")
    (out,) = ek(*[torch.from_numpy(x).cuda() for x in ins],
                config={"IMPL": "cudnn", "PRECISION": prec})
    assert out.is_cuda
    assert max_rel_error(out.cpu().numpy(), ref) < tol


def test_a_precompiled_config_launches_without_compiling():
    from lumc.backends.triton.launch import TritonKernel
    from lumc.compiler.runtime.precompile import Precompiler
    n = 96 + 16 * (int(time.time()) % 997)      # a shape no earlier run compiled
    k = make_kernel("matmul", lambda a, b: a @ b, [((128, 256), dt.f16), ((256, n), dt.f16)])
    tk = TritonKernel(k)
    cfg = configs.with_precision(configs.make(4, 3, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8),
                                 tk.rendered.problem)
    pc = Precompiler()
    try:
        pc.submit(tk.rendered, cfg)
        r = pc.result(tk.rendered, cfg, wait_s=300)
        assert r is not None and r.error is None
    finally:
        pc.close()
    import torch
    a = torch.randn(128, 256, device="cuda", dtype=torch.float16)
    b = torch.randn(256, n, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    (out,) = tk(a, b, config=cfg)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    assert torch.allclose(out.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-2)
    assert first < 0.25, f"first launch took {first:.2f} s: Triton's cache missed the precompile"


@pytest.mark.parametrize("prec,tol", [("tf32x3", 1e-4), ("bf16", 3e-2)])
def test_post_ln_kernels_formed_on_load_on_the_device(prec, tol):
    """The three kernel shapes of post-LN fusion on the GPU, built without the e-graph (the GPU
    image has no egglog): a residual normalized in the epilogue with its own statistics loop, a
    projection that forms the norm in its prologue and also writes the rows' mean and rstd, and a
    contraction whose epilogue normalizes its residual with those row values."""
    from lumc.backends.triton.launch import TritonKernel, to_numpy
    from lumc.compiler.core.kernel_builder import build_call
    from lumc.ir.graph import Graph, input_node
    from lumc.ir.library import norm
    from lumc.ir.tensor import Tensor
    rng = np.random.default_rng(3)
    m, d, f = 77, 96, 160
    g = rng.uniform(0.5, 1.5, d).astype(np.float32)
    b = (rng.standard_normal(d) * 0.1).astype(np.float32)
    w1 = (rng.standard_normal((d, f)) / np.sqrt(d)).astype(np.float32)
    w2 = (rng.standard_normal((f, d)) / np.sqrt(f)).astype(np.float32)
    s_ = Tensor(input_node("s", (1, m, d), dt.f32))
    h_ = Tensor(input_node("h", (1, m, f), dt.f32))
    mu_ = Tensor(input_node("mu", (1, m, 1), dt.f32))
    rs_ = Tensor(input_node("rs", (1, m, 1), dt.f32))
    y, mean, inv = norm.layer_norm(s_, Tensor.const(g), Tensor.const(b))
    up = y @ Tensor.const(w1)
    res_only = h_ @ Tensor.const(w2) + y
    res_rows = h_ @ Tensor.const(w2) + (s_ - mu_) * rs_ * Tensor.const(g) + Tensor.const(b)
    sv = (rng.standard_normal((1, m, d)) * 2 + 0.5).astype(np.float32)
    sv[0, 0] *= 300.0
    hv = rng.standard_normal((1, m, f)).astype(np.float32)
    s64 = sv.astype(np.float64)
    mu64 = s64.mean(-1, keepdims=True)
    rs64 = 1 / np.sqrt(((s64 - mu64) ** 2).mean(-1, keepdims=True) + 1e-5)
    y64 = (s64 - mu64) * rs64 * g + b
    cfg = configs.make(4, 3, BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=8, N_TILES=2,
                       PRECISION=prec)
    feeds = {"s": sv, "h": hv, "mu": mu64.astype(np.float32), "rs": rs64.astype(np.float32)}
    cases = [([up.node, mean.node, inv.node], [y64 @ w1, mu64, rs64]),
             ([res_only.node], [hv @ w2.astype(np.float64) + y64]),
             ([res_rows.node], [hv @ w2.astype(np.float64) + y64])]
    for roots, wants in cases:
        call = build_call(roots, lambda node_: False, push_views=False)
        tk = TritonKernel(call.kernel)
        args = [feeds[n.arg.name] if n.op == "Input" else n.arg.value for n in call.inputs]
        outs = tk(*args, config=cfg if tk.rendered.config_space == "matmul_rows" else None)
        for got, want in zip(outs, wants):
            got = to_numpy(got).reshape(want.shape)
            assert np.abs(got - want).max() <= tol * np.abs(want).max(), (roots, prec)
