"""Split (two-stage) reductions through the interpreter: few, very long rows cut into chunks reduced
by separate programs, then merged by a second kernel.

The size rule picks the variant for few rows of 2**16 or more elements; the tests force it on ragged
small sizes too (most chunks then partly or wholly masked), with fp32 and fp16 inputs, NaN/inf,
integer wrap-around, several reductions and epilogues, and the refusals.
"""
from __future__ import annotations

import numpy as np
import pytest

from lumc.ir import dtypes as dt
from lumc.backends.triton import configs, render
from lumc.backends.triton.codegen import RenderError
from triton_cases import check, make_kernel, random_inputs, softmax_kernel

SMALL = configs.make(4, 2, BLOCK_M=1, BLOCK_K=512, SPLIT=16)
ROWS2 = configs.make(4, 2, BLOCK_M=2, BLOCK_K=512, SPLIT=32)


@pytest.mark.parametrize("d", [dt.f32, dt.f16], ids=str)
def test_global_sum_of_a_long_vector_picks_split(d):
    n = (1 << 17) + 37
    kern = make_kernel("reduction", lambda x: x.sum(None), [((n,), d)])
    rk = render(kern)
    assert rk.variant == "split" and rk.config_space == "split"
    assert rk.source.count("@triton.jit") == 4 and "_finish[" in rk.source   # 2 helpers + 2 stages
    check(kern, tol=(1e-4, 1e-4) if d == dt.f32 else None)
    check(kern, config=configs.make(4, 2, BLOCK_M=1, BLOCK_K=1024, SPLIT=64),
          tol=(1e-4, 1e-4) if d == dt.f32 else None)


@pytest.mark.parametrize("d", [dt.f32, dt.f16], ids=str)
@pytest.mark.parametrize("k", [7, 127, 1023, 4097])
def test_forced_split_on_ragged_rows_with_epilogue(d, k):
    """Sum and max of the same prologue, a per-row bias in the epilogue, 7 ragged rows."""
    kern = make_kernel("reduction",
                       lambda x, b: ((x * x).sum(-1, keepdims=True) * 0.5 + b, x.max(-1)),
                       [((7, k), d), ((7, 1), d)])
    tk = check(kern, variant="split", config=ROWS2)
    assert tk.rendered.variant == "split" and "ws1_ptr" in tk.source


@pytest.mark.parametrize("d", [dt.f32, dt.f16], ids=str)
def test_split_mean_over_the_first_axis(d):
    """Reduced axis is not the last: each chunk reads a strided column block."""
    kern = make_kernel("reduction", lambda x: x.mean(0), [((4097, 3), d)])
    check(kern, variant="split", config=SMALL, tol=(1e-4, 1e-4) if d == dt.f32 else None)


@pytest.mark.parametrize("variant", ["looped", "split"])
def test_long_sums_keep_inf_and_nan(variant):
    """Kahan compensation across blocks must not turn inf (or an overflow) into NaN."""
    kern = make_kernel("reduction", lambda x: (x.sum(-1), x.max(-1)), [((4, 20001), dt.f32)])
    feed = random_inputs(kern)
    x = feed["in0"]
    x[0, 10] = np.inf                      # inf early in the row, finite blocks after it
    x[1, 20:22] = 3e38                     # finite values whose sum overflows
    x[2, 30] = np.inf
    x[2, 19000] = -np.inf                  # inf - inf: NaN, as the reference
    x[3, 15000] = np.nan
    cfg = SMALL if variant == "split" else configs.make(4, 2, BLOCK_M=1, BLOCK_K=512)
    check(kern, feed, variant=variant, config=cfg, tol=(1e-4, 1e-4))


@pytest.mark.parametrize("d", [dt.i8, dt.i32, dt.i64], ids=str)
def test_split_integer_sums_wrap_as_the_reference(d):
    kern = make_kernel("reduction", lambda x: (x.sum(-1), x.max(-1)), [((3, 5000), d)])
    x = np.random.default_rng(1).integers(-120, 120, (3, 5000)).astype(d.np)
    check(kern, {"in0": x}, variant="split", config=SMALL)


def test_split_stores_a_free_elementwise_output_in_stage_one():
    kern = make_kernel("reduction", lambda x: (x * 2.0, (x * 2.0).sum(-1)), [((2, 3001), dt.f32)])
    check(kern, variant="split", config=SMALL)


def test_split_of_an_empty_row_gives_identities():
    kern = make_kernel("reduction", lambda x: (x.sum(-1), x.max(-1)), [((3, 0), dt.f32)])
    check(kern, {"in0": np.zeros((3, 0), np.float32)}, variant="split", config=SMALL)


def test_split_refuses_two_level_and_per_element_dependent_kernels():
    with pytest.raises(RenderError, match="depends on another reduction"):
        render(softmax_kernel((2, 5000), dt.f32), "split")
    kern = make_kernel("reduction", lambda x: x - x.sum(-1, keepdims=True), [((2, 5000), dt.f32)])
    with pytest.raises(RenderError, match="per element"):
        render(kern, "split")
    # and the size rule falls back to the looped variant for them
    assert render(softmax_kernel((2, 1 << 16), dt.f32)).variant == "looped"


def test_split_config_space_and_default():
    kern = make_kernel("reduction", lambda x: x.sum(None), [((1 << 24,), dt.bf16)])
    rk = render(kern)
    space = configs.config_space(rk.config_space, rk.problem)
    default = configs.default_config(rk.config_space, rk.problem)
    assert default in space
    # the default fills an H100/H200: hundreds of stage-1 programs for one row
    assert default["SPLIT"] >= 256
    assert all(c["BLOCK_K"] * c["SPLIT"] <= 1 << 24 and c["BLOCK_M"] == 1 for c in space)
