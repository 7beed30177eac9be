"""GPU-only checks (``-m gpu``): bf16 for every form (the interpreter computes bf16 wrongly), the
same kernels compiled for the real device, and the benchmark cases at a reduced size against torch.
Skipped where CUDA is not available."""
from __future__ import annotations

import pytest

from lumc.ir import dtypes as dt
from lumc.backends.triton import configs
from triton_cases import (attention, check, conv_kernel, layernorm_kernel, make_kernel,
                          matmul_kernel, rmsnorm_kernel, softmax_kernel)

pytestmark = pytest.mark.gpu

D16 = [dt.bf16, dt.f16]


@pytest.mark.parametrize("d", D16, ids=str)
@pytest.mark.parametrize("n", [1, 7, 127, 1023, 4097])
def test_pointwise_and_reduction_bf16(d, n):
    check(make_kernel("pointwise", lambda a, b: (a * b + 1.0).exp() - a.sigmoid(),
                      [((3, n), d), ((1, n), d)]))
    check(make_kernel("reduction", lambda a: (a.sum(-1), a.max(-1)), [((5, n), d)]))
    check(make_kernel("reduction", lambda a: a.max(0), [((n, 5), d)]))


@pytest.mark.parametrize("d", D16, ids=str)
@pytest.mark.parametrize("n", [7, 1023, 4097])
def test_norms_bf16(d, n):
    for build in (softmax_kernel, layernorm_kernel, rmsnorm_kernel):
        check(build((9, n), d))
        check(build((9, n), d), variant="looped", config=configs.make(4, 2, BLOCK_M=1, BLOCK_K=512))


@pytest.mark.parametrize("d", D16 + [dt.f32], ids=str)
@pytest.mark.parametrize("mkn", [(1, 7, 127), (127, 1023, 7), (4097, 65, 129), (333, 4097, 77)])
def test_matmul_bf16(mkn, d):
    check(matmul_kernel(*mkn, d, epilogue=True))


@pytest.mark.parametrize("d", D16, ids=str)
def test_conv_bf16(d):
    check(conv_kernel(d))


@pytest.mark.parametrize("d", D16, ids=str)
@pytest.mark.parametrize("lq,lk", [(1, 7), (127, 1023), (1023, 4097)])
def test_attention_bf16(lq, lk, d):
    check(make_kernel("attention", attention(0.125, causal=lq == lk),
                      [((2, 4, lq, 64), d), ((2, 4, lk, 64), d), ((2, 4, lk, 64), d)]))


def test_bench_cases_small_match_torch():
    """The GPU benchmark's kernels, at 1/16 size, agree with their torch eager twins."""
    import torch
    from lumc.backends.triton import TritonKernel
    from lumc.backends.triton.benchcases import bench_cases
    for case in bench_cases(dt.bf16, scale=16):
        args = []
        for i, n in enumerate(case.kernel.inputs):
            if n.dtype.is_int:
                args.append(torch.randint(0, case.index_ranges.get(i, 2), n.shape, device="cuda"))
            else:
                args.append(torch.randn(n.shape, device="cuda", dtype=torch.bfloat16))
        (got,) = TritonKernel(case.kernel)(*args)
        want = case.torch_fn(*args)
        torch.testing.assert_close(got.float(), want.float().reshape(got.shape), rtol=5e-2,
                                   atol=5e-2 * max(1.0, want.float().abs().max().item()),
                                   msg=case.name)


@pytest.mark.parametrize("d", D16, ids=str)
def test_split_reduction_bf16(d):
    check(make_kernel("reduction", lambda a: (a.sum(None), a.max(None)), [(((1 << 20) + 3,), d)]),
          tol=(3e-2, 3e-2))
    check(make_kernel("reduction", lambda a: a.sum(-1), [((3, 70001), d)]), variant="split",
          config=configs.make(4, 2, BLOCK_M=2, BLOCK_K=512, SPLIT=64))


@pytest.mark.parametrize("d", D16, ids=str)
def test_attention_select_mask_bf16(d):
    """BERT's lowering of SDPA with a padding mask: where(keep, scores, -inf), one sequence all
    padding (NaN rows, as the reference)."""
    import numpy as np
    from lumc.ir.library.norm import softmax
    from triton_cases import random_inputs
    B, H, L, D = 3, 4, 300, 64
    k = make_kernel("attention", lambda q, kk, v, qm, km: softmax(qm.logical_and(km).where(
        (q @ kk.transpose(-1, -2)) * 0.125, float("-inf")), -1).cast(q.dtype) @ v,
        [((B, H, L, D), d)] * 3 + [((1, 1, L, 1), dt.bool_), ((B, 1, 1, L), dt.bool_)])
    feed = random_inputs(k)
    feed["in3"][:] = True
    feed["in4"][:] = True
    feed["in4"][1] = False
    feed["in4"][2, ..., L // 3:] = False
    check(k, feed)


@pytest.mark.parametrize("n", [1, 7, 1000, 4097])
@pytest.mark.parametrize("exclusive,reverse", [(False, False), (True, False), (False, True),
                                               (True, True)])
def test_scan_on_the_device(n, exclusive, reverse):
    """CumSum's scan kernel (``render_scan``) compiled for the device: int64 exact and the float
    cumsum's finite-operand scan, at the default config and at the widest and narrowest blocks."""
    from lumc.ir.library.reduce import prefix_contraction
    from test_triton_scan import finite_operand
    for d, op in ((dt.i64, lambda a: a), (dt.f32, finite_operand)):
        k = make_kernel("scan", lambda a: prefix_contraction(op(a), 1, exclusive, reverse),
                        [((3, n), d)])
        space = configs.config_space("scan", {"M": 3, "K": n})
        for cfg in (None, space[0], space[-1]):
            check(k, config=cfg)
