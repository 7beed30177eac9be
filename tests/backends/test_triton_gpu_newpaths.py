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
def test_post_ln_block_formed_on_load_on_the_device(prec, tol):
    """BERT's post-LN feed-forward half as three contractions on the GPU: the up-projection's
    statistics prologue writes the row values, the down-projection normalizes its residual with
    them; and a residual-only kernel computes its statistics in its own epilogue loops."""
    from test_triton_norm_epilogue import _on_load_program, _post_ln_block, _residual_only, _run, _x
    rng = np.random.default_rng(3)
    graph, want = _post_ln_block((1, 77, 96), 160, "layernorm", rng)
    prog = _on_load_program(graph)
    assert [c.kernel.form for c in prog.calls] == ["matmul"] * 3
    cfg = configs.make(4, 3, BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=8, N_TILES=2,
                       PRECISION=prec)
    xv = _x((1, 77, 96), rng, 0.5)
    got = _run(prog, {"x": xv}, cfg)[id(prog.calls[-1].outputs[0])]
    ref = want(xv.astype(np.float64))
    assert np.abs(got.reshape(ref.shape) - ref).max() <= tol * np.abs(ref).max()
    graph, want = _residual_only((1, 77, 96), 160, "rmsnorm", rng)
    call = _on_load_program(graph).calls[0]
    from lumc.backends.triton.launch import TritonKernel, to_numpy
    hv = rng.standard_normal((1, 77, 160)).astype(np.float32)
    sv = _x((1, 77, 96), rng)
    args = [{"h": hv, "s": sv}[n.arg.name] if n.op == "Input" else n.arg.value
            for n in call.inputs]
    got = to_numpy(TritonKernel(call.kernel)(*args, config=cfg)[0])
    ref = want(hv.astype(np.float64), sv.astype(np.float64))
    assert np.abs(got.reshape(ref.shape) - ref).max() <= tol * np.abs(ref).max()
