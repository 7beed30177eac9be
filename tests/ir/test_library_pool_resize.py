"""Pooling and Resize of lumc.ir.library against onnxruntime, torch eager and numpy."""
import itertools

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

from lumc.backends.reference import ReferenceExecutor
from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError, UnsupportedOpError
from lumc.ir.graph import Graph, input_node
from lumc.ir.library.pool import (avg_pool, global_avg_pool, global_lp_pool, global_max_pool,
                                  lp_pool, max_pool, max_pool_indices)
from lumc.ir.library.resize import output_shape, resize
from lumc.ir.tensor import Tensor

ort.set_default_logger_severity(3)
RNG = np.random.default_rng(99)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def build(fn, x):
    n = input_node("x", x.shape, dt.from_numpy(x.dtype))
    out = fn(Tensor(n))
    outs = out if isinstance(out, tuple) else (out,)
    return Graph({"x": n}, {f"y{i}": o.node for i, o in enumerate(outs)})


def run(fn, x):
    r = ReferenceExecutor(build(fn, x))({"x": x})
    return r["y0"] if len(r) == 1 else tuple(r.values())


def ort_run(op, x, *, extra=(), n_out=1, opset=19, **attrs):
    """One-node model: input ``x`` (+ constant initializers ``extra`` as (name, array) or None)."""
    names, inits = ["x"], []
    for item in extra:
        if item is None:
            names.append("")
        else:
            names.append(item[0])
            inits.append(numpy_helper.from_array(item[1], item[0]))
    while names[-1] == "":
        names.pop()
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, **attrs)
    et = helper.np_dtype_to_tensor_dtype(x.dtype)
    ov = [helper.make_tensor_value_info(o, et if i == 0 else TensorProto.INT64, None)
          for i, o in enumerate(outs)]
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", et, x.shape)], ov,
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    r = s.run(None, {"x": x})
    return r[0] if n_out == 1 else tuple(r)


def close(a, b, tol=1e-5):
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


# ---- pooling ------------------------------------------------------------------------------------
POOL_CASES = [
    # x shape, kernel, strides, pads, dilations, ceil_mode
    ((2, 3, 11, 8), [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 1),
    ((2, 3, 11, 8), [2, 3], [2, 3], [0, 1, 1, 0], [1, 1], 1),
    ((1, 2, 11, 8), [3, 2], [2, 1], [1, 0, 0, 1], [2, 1], 0),
    ((1, 2, 11, 8), [4, 4], [3, 3], [1, 2, 2, 1], [1, 1], 1),     # ceil drops a window past the input
    ((1, 2, 13), [5], [4], [2, 1], [1], 1),                       # 1-D
    ((1, 2, 5, 6, 7), [2, 3, 2], [2, 2, 3], [0, 1, 1, 1, 0, 0], [1, 1, 1], 1),   # 3-D
    ((1, 1, 1, 1), [1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 0),
    ((1, 1, 7, 7), [7, 7], [1, 1], [0, 0, 0, 0], [1, 1], 0),      # one window, global-like
]


@pytest.mark.parametrize("xs,k,s,p,d,cm", POOL_CASES)
def test_max_pool_matches_onnxruntime(xs, k, s, p, d, cm):
    x = randn(*xs)
    attrs = dict(kernel_shape=k, strides=s, pads=p, dilations=d, ceil_mode=cm)
    close(run(lambda t: max_pool(t, k, strides=s, pads=p, dilations=d, ceil_mode=cm), x),
          ort_run("MaxPool", x, **attrs), tol=0)
    y, idx = run(lambda t: max_pool_indices(t, k, strides=s, pads=p, dilations=d, ceil_mode=cm), x)
    want_y, want_idx = ort_run("MaxPool", x, n_out=2, **attrs)
    close(y, want_y, tol=0)
    assert idx.dtype == np.int64 and (idx == want_idx).all()


@pytest.mark.parametrize("cip", [0, 1])
@pytest.mark.parametrize("xs,k,s,p,d,cm", POOL_CASES)
def test_avg_pool_matches_onnxruntime(xs, k, s, p, d, cm, cip):
    x = randn(*xs)
    got = run(lambda t: avg_pool(t, k, strides=s, pads=p, dilations=d, ceil_mode=cm,
                                 count_include_pad=cip), x)
    close(got, ort_run("AveragePool", x, kernel_shape=k, strides=s, pads=p, dilations=d,
                       ceil_mode=cm, count_include_pad=cip))


@pytest.mark.parametrize("p_norm", [1, 2, 3])
@pytest.mark.parametrize("xs,k,s,p,d,cm", POOL_CASES[:4])
def test_lp_pool_matches_onnxruntime(xs, k, s, p, d, cm, p_norm):
    x = randn(*xs)
    got = run(lambda t: lp_pool(t, k, p_norm, strides=s, pads=p, dilations=d, ceil_mode=cm), x)
    close(got, ort_run("LpPool", x, kernel_shape=k, strides=s, pads=p, dilations=d, ceil_mode=cm,
                       p=p_norm), tol=1e-5 if p_norm < 3 else 2e-5)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_pool_auto_pad_matches_onnxruntime(auto_pad):
    x = randn(1, 2, 9, 8)
    k, s = [4, 3], [2, 3]
    close(run(lambda t: max_pool(t, k, strides=s, auto_pad=auto_pad), x),
          ort_run("MaxPool", x, kernel_shape=k, strides=s, auto_pad=auto_pad), tol=0)
    close(run(lambda t: avg_pool(t, k, strides=s, auto_pad=auto_pad), x),
          ort_run("AveragePool", x, kernel_shape=k, strides=s, auto_pad=auto_pad))


@settings(max_examples=30, deadline=None, derandomize=True)
@given(data=st.data())
def test_pools_match_torch_random(data):
    d = data.draw
    k = [d(st.integers(1, 4)), d(st.integers(1, 4))]
    s = [d(st.integers(1, 3)), d(st.integers(1, 3))]
    p = [d(st.integers(0, k[0] // 2)), d(st.integers(0, k[1] // 2))]
    hw = [d(st.integers(max(1, k[i] - 2 * p[i]), 12)) for i in range(2)]
    cm = d(st.booleans())
    cip = d(st.booleans())
    x = randn(d(st.integers(1, 2)), d(st.integers(1, 3)), *hw)
    pads = p + p
    got = run(lambda t: max_pool(t, k, strides=s, pads=pads, ceil_mode=cm), x)
    close(got, F.max_pool2d(torch.tensor(x), k, s, p, ceil_mode=cm).numpy(), tol=0)
    got = run(lambda t: avg_pool(t, k, strides=s, pads=pads, ceil_mode=cm, count_include_pad=cip), x)
    close(got, F.avg_pool2d(torch.tensor(x), k, s, p, ceil_mode=cm, count_include_pad=cip).numpy())


def test_max_pool_nan_inf_propagation_matches_torch():
    x = randn(1, 2, 6, 7)
    x[0, 0, 1, 1] = np.nan
    x[0, 0, 4, 5] = np.inf
    x[0, 1, :3, :3] = -np.inf              # a window of only -inf next to the padding
    x[0, 1, 5, 6] = np.nan
    got_y, got_i = run(lambda t: max_pool_indices(t, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), x)
    want_y, want_i = F.max_pool2d(torch.tensor(x), 3, 2, 1, return_indices=True)
    np.testing.assert_array_equal(got_y, want_y.numpy())        # NaN == NaN for array_equal here
    plane = 6 * 7
    base = (np.arange(2) * plane).reshape(1, 2, 1, 1)
    np.testing.assert_array_equal(got_i, want_i.numpy() + base)
    assert np.isnan(got_y[0, 0, 0, 0]) and np.isnan(got_y[0, 1, -1, -1])
    assert got_y[0, 1, 0, 0] == -np.inf


def test_max_pool_integer_pads_with_dtype_minimum():
    x = RNG.integers(-128, 0, size=(1, 2, 5, 5)).astype(np.int8)
    got = run(lambda t: max_pool(t, [3, 3], pads=[1, 1, 1, 1]), x)
    assert got.dtype == np.int8
    want = F.max_pool2d(torch.tensor(x.astype(np.float32)), 3, 1, 1).numpy().astype(np.int8)
    np.testing.assert_array_equal(got, want)     # padding never beats negative values
    np.testing.assert_array_equal(got, ort_run("MaxPool", x, kernel_shape=[3, 3], pads=[1, 1, 1, 1]))


def test_global_pools_match_numpy():
    x = randn(2, 3, 5, 7)
    close(run(global_avg_pool, x), x.mean(axis=(2, 3), keepdims=True))
    close(run(global_max_pool, x), x.max(axis=(2, 3), keepdims=True), tol=0)
    close(run(lambda t: global_lp_pool(t, 2), x), np.sqrt((x * x).sum(axis=(2, 3), keepdims=True)))
    close(run(lambda t: global_lp_pool(t, 3), x),
          ((np.abs(x.astype(np.float64)) ** 3).sum(axis=(2, 3), keepdims=True) ** (1 / 3)), tol=2e-5)
    x3 = randn(1, 2, 3, 4, 5)
    close(run(global_avg_pool, x3), ort_run("GlobalAveragePool", x3))
    x[0, 0, 2, 2] = np.nan
    assert np.isnan(run(global_max_pool, x)[0, 0, 0, 0])


@pytest.mark.parametrize("dtype", [np.float16, dt.bf16.np], ids=["f16", "bf16"])
def test_half_pools_sum_in_f32(dtype):
    """An f16 GlobalAveragePool over 64x64 values of 30 gave inf (its sum, 122880, rounded to f16
    before the division); an AveragePool's window sum rounded once more (999.5 for 1000), and the
    Lp pools' sums of squares overflowed. They sum in f32 and round once, as ReduceMean and
    ReduceL2 do: each result is its exact value rounded once to the dtype."""
    def want(v):
        return np.float32(v).astype(dtype).astype(np.float32)
    x = np.full((1, 2, 64, 64), 30, np.float32).astype(dtype)
    y = run(global_avg_pool, x)
    assert y.dtype == x.dtype and (y.astype(np.float32) == want(30)).all(), y.ravel()
    x = np.full((1, 2, 16, 16), 1000, np.float32).astype(dtype)
    y = run(lambda t: avg_pool(t, [9, 9], pads=[4, 4, 4, 4]), x)
    assert y.dtype == x.dtype and (y.astype(np.float32) == want(1000)).all(), np.unique(y)
    y = run(lambda t: lp_pool(t, [3, 3], 2), x)
    assert y.dtype == x.dtype and (y.astype(np.float32) == want(3000)).all(), np.unique(y)
    y = run(lambda t: global_lp_pool(t, 2), x)
    assert y.dtype == x.dtype and (y.astype(np.float32) == want(16000)).all(), np.unique(y)
    if dtype == np.float16:   # onnxruntime has f16 GlobalAveragePool: it agrees
        x = np.full((1, 2, 64, 64), 30, np.float16)
        np.testing.assert_array_equal(run(global_avg_pool, x), ort_run("GlobalAveragePool", x))


def test_pools_on_empty_batch():
    x = randn(0, 3, 6, 5)
    assert run(lambda t: max_pool(t, [2, 2], strides=[2, 2]), x).shape == (0, 3, 3, 2)
    assert run(lambda t: avg_pool(t, [3, 3], pads=[1, 1, 1, 1]), x).shape == (0, 3, 6, 5)
    assert run(global_avg_pool, x).shape == (0, 3, 1, 1)


def test_pool_errors():
    x = randn(1, 1, 3, 3)
    with pytest.raises(ShapeError):
        run(lambda t: max_pool(t, [4, 4]), x)
    with pytest.raises(ShapeError):
        run(lambda t: avg_pool(t, [2]), x)


# ---- resize ------------------------------------------------------------------------------------
def ort_resize(x, scales=None, sizes=None, roi=None, opset=19, **attrs):
    extra = [("roi", np.array(roi, np.float32)) if roi is not None else None,
             ("scales", np.array(scales, np.float32)) if scales is not None else None,
             ("sizes", np.array(sizes, np.int64)) if sizes is not None else None]
    return ort_run("Resize", x, extra=extra, opset=opset, **attrs)


RESIZE_SPECS = [dict(scales=[1, 1, 2.0, 3.0]), dict(scales=[1, 1, 0.6, 1.7]),
                dict(sizes=[1, 2, 3, 11]), dict(sizes=[1, 2, 1, 1]), dict(sizes=[1, 2, 14, 2])]
COORD_MODES = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
               "asymmetric", "tf_crop_and_resize"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


def _resize_cases():
    for mode, ctm, spec in itertools.product(["nearest", "linear", "cubic"], COORD_MODES,
                                             range(len(RESIZE_SPECS))):
        for nm in (NEAREST_MODES if mode == "nearest" else ["round_prefer_floor"]):
            if (mode, ctm, nm, spec) == ("nearest", "half_pixel_symmetric", "round_prefer_floor", 1):
                # an exact x.5 tie in real arithmetic: float rounding decides; see the module doc
                continue
            for exc in ([0, 1] if mode == "cubic" else [0]):
                yield mode, ctm, nm, spec, exc


@pytest.mark.parametrize("mode,ctm,nm,spec,exc", list(_resize_cases()))
def test_resize_matches_onnxruntime(mode, ctm, nm, spec, exc):
    x = randn(1, 2, 7, 5)
    kw = dict(RESIZE_SPECS[spec])
    if ctm == "tf_crop_and_resize":
        kw["roi"] = [0, 0, 0.2, -0.1, 1, 1, 0.9, 1.3]       # partly outside: extrapolation
    attrs = dict(mode=mode, coordinate_transformation_mode=ctm, nearest_mode=nm,
                 exclude_outside=exc, extrapolation_value=-3.0)
    close(run(lambda t: resize(t, **kw, **attrs), x), ort_resize(x, **kw, **attrs))


@pytest.mark.parametrize("kw", [
    dict(sizes=[9, 4], axes=[2, 3], keep_aspect_ratio_policy="not_larger"),
    dict(sizes=[9, 4], axes=[2, 3], keep_aspect_ratio_policy="not_smaller"),
    dict(sizes=[10], axes=[-1]),
    dict(scales=[2.5], axes=[2], mode="linear"),
    dict(scales=[0.5, 1.5], axes=[3, 2], mode="cubic"),
    dict(scales=[1.0, 1.0, 1.0, 1.0]),                     # identity
    dict(sizes=[5, 2], axes=[2, 3], coordinate_transformation_mode="tf_crop_and_resize",
         roi=[0.1, 0.3, 0.8, 0.9], mode="linear"),
])
def test_resize_axes_and_aspect_policy_match_onnxruntime(kw):
    x = randn(2, 3, 6, 5)
    kw = dict(kw)
    ort_kw = {k: kw.pop(k) for k in ("scales", "sizes", "roi") if k in kw}
    close(run(lambda t: resize(t, **ort_kw, **kw), x), ort_resize(x, **ort_kw, **kw))


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("ctm", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("spec", [dict(scales=[1, 1, 0.4, 0.7]), dict(sizes=[1, 2, 3, 2]),
                                  dict(scales=[1, 1, 0.5, 1.6])])
@pytest.mark.parametrize("exc", [0, 1])
def test_resize_antialias_matches_onnxruntime(mode, ctm, spec, exc):
    x = randn(1, 2, 13, 11)
    attrs = dict(mode=mode, coordinate_transformation_mode=ctm, antialias=1, exclude_outside=exc)
    close(run(lambda t: resize(t, **spec, **attrs), x), ort_resize(x, **spec, **attrs))


def test_resize_antialias_matches_torch():
    """torch (like PIL) drops taps outside the input and renormalizes: ONNX exclude_outside=1."""
    x = randn(1, 3, 17, 12)
    got = run(lambda t: resize(t, sizes=[1, 3, 5, 7], mode="linear", antialias=1, exclude_outside=1,
                               coordinate_transformation_mode="pytorch_half_pixel"), x)
    want = F.interpolate(torch.tensor(x), size=(5, 7), mode="bilinear", antialias=True,
                         align_corners=False).numpy()
    close(got, want)


def test_resize_zero_size():
    x = randn(0, 3, 4, 4)
    assert run(lambda t: resize(t, scales=[1, 1, 2, 2], mode="linear"), x).shape == (0, 3, 8, 8)
    assert run(lambda t: resize(t, sizes=[1, 3, 0, 4], mode="cubic"), randn(1, 3, 4, 4)).shape == (
        1, 3, 0, 4)


def test_resize_matches_torch_interpolate():
    x = randn(2, 3, 5, 7)
    tx = torch.tensor(x)
    cases = [
        (dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
         dict(mode="nearest")),
        (dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel"),
         dict(mode="bilinear", align_corners=False)),
        (dict(mode="linear", coordinate_transformation_mode="align_corners"),
         dict(mode="bilinear", align_corners=True)),
        (dict(mode="cubic", coordinate_transformation_mode="align_corners"),
         dict(mode="bicubic", align_corners=True)),
    ]
    for ours, theirs in cases:
        got = run(lambda t: resize(t, sizes=[2, 3, 9, 4], **ours), x)
        close(got, F.interpolate(tx, size=(9, 4), **theirs).numpy(), tol=1e-5)


def test_resize_nearest_integer_upsample_is_a_view():
    x = randn(1, 3, 4, 5)
    g = build(lambda t: resize(t, scales=[1, 1, 2, 2]), x)
    assert "Gather" not in g.op_counts()
    got = ReferenceExecutor(g)({"x": x})["y0"]
    np.testing.assert_array_equal(got, x.repeat(2, axis=2).repeat(2, axis=3))
    # the same for the opset-9 Upsample semantics (asymmetric + floor)
    got = run(lambda t: resize(t, scales=[1, 1, 3, 2], coordinate_transformation_mode="asymmetric",
                               nearest_mode="floor"), x)
    np.testing.assert_array_equal(got, ort_run("Upsample", x, opset=9, extra=[
        ("scales", np.array([1, 1, 3, 2], np.float32))], mode="nearest"))


def test_resize_nearest_on_integers_and_inf():
    x = RNG.integers(-50, 50, size=(1, 1, 4, 6)).astype(np.int32)
    got = run(lambda t: resize(t, scales=[1, 1, 1.5, 0.5]), x)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, ort_resize(x, scales=[1, 1, 1.5, 0.5]))
    xf = randn(1, 1, 4, 4)
    xf[0, 0, 0, 0] = np.inf
    got = run(lambda t: resize(t, scales=[1, 1, 2, 2], mode="linear"), xf)
    want = ort_resize(xf, scales=[1, 1, 2, 2], mode="linear")
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    close(np.where(np.isfinite(want), got, 0), np.where(np.isfinite(want), want, 0))


def test_resize_output_shape_and_errors():
    assert output_shape([1, 3, 10, 10], scales=[1, 1, 0.29, 2.5]) == (
        [1, 3, 2, 25], [1.0, 1.0, float(np.float32(0.29)), 2.5])
    assert output_shape([1, 3, 10, 20], sizes=[5, 5], axes=[2, 3],
                        keep_aspect_ratio_policy="not_larger")[0] == [1, 3, 3, 5]
    x = randn(1, 1, 3, 3)
    with pytest.raises(ShapeError):
        run(lambda t: resize(t), x)
    with pytest.raises(ShapeError):
        run(lambda t: resize(t, scales=[1, 1, 2, 2], mode="bilinear"), x)
    with pytest.raises(ShapeError):
        run(lambda t: resize(t, scales=[1, 1, 2, 2], antialias=1), x)     # nearest has no filter
    with pytest.raises(UnsupportedOpError):
        run(lambda t: resize(t, scales=[1, 1, 2, 2], mode="linear"), x.astype(np.int32))
