"""Reduction kernels (sum, max over any axes, fused prologue/epilogue) through the interpreter.

One-pass and looped variants over ragged rows; fp16 accumulates in fp32; NaN propagates through
max; integer sums wrap as the reference's; empty reductions give 0 and -inf.
"""
from __future__ import annotations

import numpy as np
import pytest

from lumc.ir import dtypes as dt
from lumc.backends.triton import configs, render
from triton_cases import check, make_kernel

SIZES = [1, 7, 127, 1023, 4097]


@pytest.mark.parametrize("d", [dt.f32, dt.f16], ids=str)
@pytest.mark.parametrize("k", SIZES)
def test_sum_last_axis_with_prologue_and_epilogue(d, k):
    kern = make_kernel("reduction", lambda x, b: (x * x).sum(-1, keepdims=True) * 0.5 + b,
                       [((7, k), d), ((7, 1), d)])
    check(kern)


@pytest.mark.parametrize("d", [dt.f32, dt.f16], ids=str)
@pytest.mark.parametrize("m", SIZES)
def test_sum_over_first_axis(d, m):
    kern = make_kernel("reduction", lambda x: x.sum(0), [((m, 7), d)])
    check(kern, tol=(1e-4, 1e-4) if d == dt.f32 else None)


@pytest.mark.parametrize("d", [dt.f32, dt.f16], ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_max_over_middle_axis_of_transposed_input(d, n):
    """Max over axis 1 of a [3, n, 5] view of a [5, n, 3] input (read transposed in place)."""
    kern = make_kernel("reduction", lambda x: x.permute((2, 1, 0)).max(1), [((5, n, 3), d)])
    check(kern)


def test_sum_over_several_axes_of_a_broadcast_input():
    kern = make_kernel("reduction", lambda x, y: (x + y).sum((0, 2), keepdims=True),
                       [((9, 1, 127), dt.f32), ((1, 5, 127), dt.f32)])
    check(kern)


def test_sum_of_all_elements():
    kern = make_kernel("reduction", lambda x: x.sum(None), [((33, 127), dt.f32)])
    check(kern)


@pytest.mark.parametrize("d", [dt.f32, dt.f16], ids=str)
@pytest.mark.parametrize("k", [1023, 4097])
def test_looped_variant_matches(d, k):
    kern = make_kernel("reduction", lambda x: (x.exp().sum(-1), x.max(-1)), [((7, k), d)])
    cfg = configs.make(4, 2, BLOCK_M=2, BLOCK_K=256)
    tk = check(kern, variant="looped", config=cfg)
    assert tk.rendered.variant == "looped" and "for k_start in range" in tk.source


def test_long_rows_pick_the_looped_variant():
    kern = make_kernel("reduction", lambda x: x.sum(-1), [((2, configs.ROW_FIT * 2 + 3), dt.f32)])
    rk = render(kern)
    assert rk.variant == "looped"
    check(kern, config=configs.make(4, 2, BLOCK_M=1, BLOCK_K=4096), tol=(1e-4, 1e-4))


def test_fp16_sum_accumulates_in_fp32():
    """4097 halves of 1.0 + tiny: an fp16 accumulator would stall at 2048."""
    kern = make_kernel("reduction", lambda x: x.sum(-1), [((1, 4097), dt.f16)])
    x = np.ones((1, 4097), np.float16)
    tk = check(kern, {"in0": x})
    assert "tl.float32" in tk.source


def test_max_propagates_nan_and_handles_inf():
    kern = make_kernel("reduction", lambda x: x.max(-1), [((4, 1023), dt.f32)])
    x = np.random.default_rng(0).standard_normal((4, 1023)).astype(np.float32)
    x[0, 500] = np.nan
    x[1, :] = -np.inf
    x[2, 7] = np.inf
    check(kern, {"in0": x})
    check(kern, {"in0": x}, variant="looped", config=configs.make(4, 2, BLOCK_M=1, BLOCK_K=256))


@pytest.mark.parametrize("d", [dt.i32, dt.i8, dt.i64], ids=str)
def test_integer_sums_and_max(d):
    kern = make_kernel("reduction", lambda x: (x.sum(-1), x.max(-1)), [((7, 127), d)])
    x = np.random.default_rng(0).integers(-100, 100, (7, 127)).astype(d.np)
    check(kern, {"in0": x})


def test_empty_reduction_gives_identities():
    kern = make_kernel("reduction", lambda x: (x.sum(-1), x.max(-1)), [((3, 0), dt.f32)])
    check(kern, {"in0": np.zeros((3, 0), np.float32)})


def test_reduction_over_size_one_axis_is_pointwise():
    kern = make_kernel("reduction", lambda x: x.sum(1) * 2.0, [((127, 1), dt.f16)])
    assert render(kern).variant == "flat"
    check(kern)


@pytest.mark.parametrize("k", [7, 4097])
def test_bool_max_used_as_a_condition_stays_bool(k):
    """``torch.where(torch.isinf(x).any(), a, b)`` (T5's fp16 clamp): Triton's ``tl.max`` of an
    int1 tile returns int32, which fed ``tl.where`` as its condition (deprecated, "will error out
    in a future triton release"); the reduced value is cast back to the reduction's dtype."""
    import warnings
    from lumc.ir.tensor import Tensor
    kern = make_kernel("reduction", lambda x: x.isinf().max((0, 1)).where(
        Tensor.const(np.float32(1.0)), Tensor.const(np.float32(2.0))), [((3, k), dt.f16)])
    x = np.ones((3, k), np.float16)
    for val in (1.0, np.inf):
        x[1, k // 2] = val
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="tl.where with a non-boolean condition")
            tk = check(kern, {"in0": x})
        assert tk.rendered.variant in ("one-pass", "looped")
