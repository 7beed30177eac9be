"""Softmax, layer norm and RMS norm kernels (``lumc.ir.library.norm``) through the interpreter.

One pass where the row fits, and the looped online forms (online softmax, Chan moments) forced by
small ``BLOCK_K`` configs so the loops really iterate; special rows (-inf, +inf, NaN) as the reference.
"""
from __future__ import annotations

import numpy as np
import pytest

from lumc.ir import dtypes as dt
from lumc.ir.library.norm import softmax
from lumc.backends.triton import configs, render
from triton_cases import (check, layernorm_kernel, make_kernel, random_inputs, rmsnorm_kernel,
                          softmax_kernel)

SIZES = [1, 7, 127, 1023, 4097]
LOOP = configs.make(4, 2, BLOCK_M=2, BLOCK_K=256)
BUILDERS = {"softmax": softmax_kernel, "layernorm": layernorm_kernel, "rmsnorm": rmsnorm_kernel}


@pytest.mark.parametrize("form", list(BUILDERS))
@pytest.mark.parametrize("d", [dt.f32, dt.f16], ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_one_pass(form, d, n):
    k = BUILDERS[form]((7, n), d)
    tk = check(k)
    assert tk.rendered.variant == ("flat" if n == 1 else "one-pass")


@pytest.mark.parametrize("form", list(BUILDERS))
@pytest.mark.parametrize("d", [dt.f32, dt.f16], ids=str)
@pytest.mark.parametrize("n", [127, 1023, 4097])
def test_looped_online(form, d, n):
    k = BUILDERS[form]((5, n), d)
    tk = check(k, variant="looped", config=LOOP)
    src = tk.source
    marker = {"softmax": "online softmax", "layernorm": "Chan/Welford", "rmsnorm": "for k_start"}
    assert marker[form] in src
    # online forms: statistics in one loop, output in a second: the input is read twice
    assert src.count("for k_start in range") == 2


def test_softmax_over_a_leading_axis():
    k = make_kernel("softmax", lambda x: softmax(x, 0), [((127, 9), dt.f32)])
    check(k)
    check(k, variant="looped", config=configs.make(4, 2, BLOCK_M=4, BLOCK_K=32))


@pytest.mark.parametrize("variant", ["one-pass", "looped"])
def test_softmax_special_rows(variant):
    """All -inf gives NaN (as onnxruntime), a leading -inf block contributes 0, +inf and NaN give
    NaN rows: the online form's guarded rescale must agree with the two-pass reference."""
    k = softmax_kernel((5, 3000), dt.f32)
    x = np.random.default_rng(1).standard_normal((5, 3000)).astype(np.float32)
    x[0, :] = -np.inf
    x[1, :2000] = -np.inf
    x[2, 5] = np.inf
    x[3, 2500] = np.nan
    x[4, :] = -1e30
    cfg = configs.make(4, 2, BLOCK_M=1, BLOCK_K=512) if variant == "looped" else None
    check(k, {"in0": x}, variant=variant, config=cfg)


def test_layernorm_with_large_mean_is_stable():
    """|mean| >> std: Chan's merge keeps the variance (E[x^2]-E[x]^2 in fp32 would lose it all).
    Judged against the float64 reference: no worse than the fp32 two-pass reference itself."""
    from lumc.backends.reference import ReferenceExecutor
    from lumc.backends.triton import TritonKernel
    k = layernorm_kernel((3, 4097), dt.f32)
    rng = np.random.default_rng(2)
    feed = {"in0": (1e4 + rng.standard_normal((3, 4097))).astype(np.float32),
            "in1": rng.standard_normal(4097).astype(np.float32),
            "in2": rng.standard_normal(4097).astype(np.float32)}
    exact = ReferenceExecutor(k.meaning, "float64")(feed)["out0"].astype(np.float64)
    native = ReferenceExecutor(k.meaning)(feed)["out0"].astype(np.float64)
    (got,) = TritonKernel(k, "looped")(*feed.values(), config=LOOP)
    err_ref = np.abs(native - exact).max()
    err = np.abs(got.numpy().astype(np.float64) - exact).max()
    assert err <= 2 * err_ref + 1e-5, (err, err_ref)


def test_layernorm_row_whose_squares_overflow_is_not_nan():
    """A row of magnitude 1e30 in the looped (Chan) form: the two-pass variance is +inf and the
    normalized row is the bias; the first block's cross term ``delta^2 * 0`` was NaN."""
    k = layernorm_kernel((3, 1023), dt.f32)
    feed = random_inputs(k, 3)
    feed["in0"][1] *= 1e30
    check(k, feed, variant="looped", config=LOOP)

def test_layernorm_all_outputs():
    """Y, Mean and InvStdDev: full-size and per-row outputs of one kernel."""
    from lumc.ir.library.norm import layer_norm
    k = make_kernel("layernorm", lambda x, s, b: layer_norm(x, s, b),
                    [((7, 1023), dt.f16), ((1023,), dt.f16), ((1023,), dt.f16)])
    check(k)
    check(k, variant="looped", config=LOOP)


def test_row_fit_threshold_picks_the_variant():
    assert render(softmax_kernel((2, configs.ROW_FIT), dt.f32)).variant == "one-pass"
    assert render(softmax_kernel((2, configs.ROW_FIT + 1), dt.f32)).variant == "looped"
