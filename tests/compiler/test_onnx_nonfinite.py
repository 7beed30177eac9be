"""ONNX ops fed inf, NaN and -0.0 where an implementation detail (a product with a structurally
zero weight, a 0/0 scale) would invent a NaN the spec does not give; each against onnxruntime
or numpy in float64, on the reference executor and the Triton kernels (interpreted on CPU)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.compiler.test_onnx_edge_values import onnxruntime_outputs, run_both, single_node

RESIZE_INPUTS = {"roi": np.zeros(0, np.float32)}


@pytest.mark.parametrize("mode,ctm", [("linear", "asymmetric"), ("linear", "align_corners"),
                                      ("cubic", "asymmetric")])
def test_resize_on_an_input_sample_is_that_sample_even_when_a_neighbor_is_inf(mode, ctm):
    """Resize is a weighted average of the neighborhood: an output whose coordinate is an input
    sample has weight 1 there and exactly 0 on the other taps. lumc multiplied every tap by its
    weight, so a neighbor's inf gave 0 * inf = NaN at [1, inf, 2, 3, 4] -> y[0] (onnxruntime too,
    its right tap; the ONNX reference at y[4], its left tap). A zero-weight tap adds nothing."""
    x = np.array([[[[1.0, np.inf, 2.0, 3.0, 4.0], [5.0, 6.0, -np.inf, 7.0, 8.0]]]], np.float32)
    m = single_node("Resize", {"x": x}, {**RESIZE_INPUTS,
                                         "s": np.array([1, 1, 1, 2], np.float32)},
                    mode=mode, coordinate_transformation_mode=ctm)
    ort_y = onnxruntime_outputs(m, {"x": x})[0]
    n_in, n_out = x.shape[-1], 2 * x.shape[-1]
    src = np.arange(n_out) * ((n_in - 1) / (n_out - 1) if ctm == "align_corners" else 0.5)
    on_sample = src == np.round(src)
    for path, (got,) in run_both(m, {"x": x}):
        assert got.shape == ort_y.shape, path
        assert not np.isnan(got).any(), (path, got)       # one infinity per row: no inf - inf
        want = x[..., np.round(src[on_sample]).astype(int)]
        np.testing.assert_array_equal(got[..., on_sample], want, err_msg=path)
        finite = ~np.isnan(ort_y)                          # elsewhere as onnxruntime
        np.testing.assert_allclose(got[finite], ort_y[finite], rtol=1e-5, err_msg=path)


def test_bilinear_resize_keeps_an_inf_sample_and_its_finite_far_neighbors():
    """Both axes resized (the second pass reads the first's infinities): every output on a grid
    point of the input is that input, and no output is NaN."""
    x = np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)
    x[0, 0, 1, 2] = np.inf
    m = single_node("Resize", {"x": x}, {**RESIZE_INPUTS,
                                         "s": np.array([1, 1, 2, 2], np.float32)},
                    mode="linear", coordinate_transformation_mode="asymmetric")
    ort_y = onnxruntime_outputs(m, {"x": x})[0]
    for path, (got,) in run_both(m, {"x": x}):
        assert not np.isnan(got).any(), (path, got)
        np.testing.assert_array_equal(got[..., ::2, ::2], x, err_msg=path)
        finite = ~np.isnan(ort_y)
        np.testing.assert_allclose(got[finite], ort_y[finite], rtol=1e-5, err_msg=path)


@pytest.mark.parametrize("k,s", [(3, 2), (5, 3), (4, 3), (2, 2)])
def test_conv_transpose_with_inf_inputs_where_the_stride_does_not_divide_the_kernel(k, s):
    """The phase form pads the kernel to a multiple of the stride; a short phase's padded zero
    weight met the input, so an inf input gave 0 * inf = NaN at outputs the definition makes
    finite (3x3 stride 2: 42 of 120 outputs NaN, onnxruntime none)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 4, 5)).astype(np.float32)
    x[0, 0, 1, 2], x[0, 1, 3, 0] = np.inf, -np.inf
    w = rng.standard_normal((2, 3, k, k)).astype(np.float32)
    m = single_node("ConvTranspose", {"x": x}, {"w": w}, strides=[s, s], pads=[1, 0, 0, 1],
                    output_padding=[s - 1, 0])
    want = onnxruntime_outputs(m, {"x": x})[0]
    assert not np.isnan(want).any()
    for path, (got,) in run_both(m, {"x": x}):
        assert got.shape == want.shape, path
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=path)


@pytest.mark.parametrize("zdt", [np.int8, np.uint8, np.int16])
def test_quantize_linear_saturates_a_quotient_past_the_int32_range(zdt):
    """``saturate(round(x / scale) + zp)``: the rounded quotient was cast to i32 before the
    saturation, so 1e10 / 0.5 wrapped and quantized to -128 (int8) or 0 (uint8) instead of the
    type's maximum (onnxruntime; the ONNX reference implementation wraps too)."""
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 127.5, -128.6, 1e10, -1e10, 3e38, -3e38, 1e9],
                 np.float32)
    m = single_node("QuantizeLinear", {"x": x}, {"s": np.array(0.5, np.float32),
                                                 "z": np.array(3, zdt)}, opset=21)
    info = np.iinfo(zdt)
    want = np.clip(np.round(x.astype(np.float64) / 0.5) + 3, info.min, info.max).astype(zdt)
    np.testing.assert_array_equal(onnxruntime_outputs(m, {"x": x})[0], want)
    for path, (got,) in run_both(m, {"x": x}):
        assert got.dtype == want.dtype, path
        np.testing.assert_array_equal(got, want, err_msg=path)
