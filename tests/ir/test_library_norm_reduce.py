"""lumc.ir.library.norm and .reduce against onnxruntime one-node models, torch eager and numpy."""
import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import helper

from lumc.backends.reference import ReferenceExecutor
from lumc.ir import dtypes as dt
from lumc.ir.errors import ModelError, ShapeError
from lumc.ir.graph import Graph, input_node
from lumc.ir.library import norm as N
from lumc.ir.library import reduce as R
from lumc.ir.tensor import Tensor

ort.set_default_logger_severity(3)
RNG = np.random.default_rng(11)
INF, NAN = np.inf, np.nan
TOL = {"f64": dict(rtol=1e-12, atol=1e-14), "f32": dict(rtol=2e-5, atol=2e-6),
       "f16": dict(rtol=1e-3, atol=1e-4)}


def randn(*shape, scale=1.0, dtype=np.float32):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def run(fn, *arrays, compute=None):
    """Evaluate ``fn`` on Input nodes of ``arrays`` (``compute`` casts float inputs in the graph);
    a tuple result gives a tuple of arrays."""
    ins = {f"x{k}": input_node(f"x{k}", a.shape, dt.from_numpy(a.dtype)) for k, a in enumerate(arrays)}
    ts = [Tensor(n) for n in ins.values()]
    if compute is not None:
        ts = [t.cast(compute) if t.dtype.is_float else t for t in ts]
    y = fn(*ts)
    ys = y if isinstance(y, tuple) else (y,)
    g = Graph(ins, {f"y{k}": t.node for k, t in enumerate(ys)})
    out = list(ReferenceExecutor(g)({f"x{k}": a for k, a in enumerate(arrays)}).values())
    return tuple(out) if isinstance(y, tuple) else out[0]


def ort_run(op, inputs, opset=18, nout=1, **attrs):
    """One-node model; ``None`` inputs are left out (empty name; trailing ones dropped)."""
    inputs = list(inputs)
    while inputs and inputs[-1] is None:
        inputs.pop()
    names = [f"x{k}" if a is not None else "" for k, a in enumerate(inputs)]
    vi = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
          for n, a in zip(names, inputs) if a is not None]
    outs = [helper.make_empty_tensor_value_info(f"y{k}") for k in range(nout)]
    node = helper.make_node(op, names, [o.name for o in outs], **attrs)
    m = helper.make_model(helper.make_graph([node], "g", vi, outs),
                          opset_imports=[helper.make_opsetid("", opset)])
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    res = s.run(None, {n: a for n, a in zip(names, inputs) if a is not None})
    return res if nout > 1 else res[0]


def assert_close(got, want, dtype="f32", **override):
    """Same shape and dtype; NaN where NaN, infinities exact, the rest within TOL[dtype]."""
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    g, w = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg="NaN positions")
    inf = np.isinf(w)
    np.testing.assert_array_equal(g[inf], w[inf], err_msg="infinities")
    fin = np.isfinite(w)
    np.testing.assert_allclose(g[fin], w[fin], **{**TOL[dtype], **override})


# ---- softmax ----------------------------------------------------------------------------------
def _softmax_input():
    x = randn(4, 5, 7, scale=3.0)
    x[0, 0] = -INF                      # a fully -inf row: NaN, as onnxruntime
    x[0, 1, 2] = INF                    # +inf in a row: NaN row
    x[0, 2, 3] = NAN
    x[0, 3, :3] = -INF                  # partly -inf: zeros there
    x[1, 0] = [1e30, -1e30, 1e30, 0, 3e38, -3e38, 1]   # huge values: shifted by the max
    x[1, 1] = [-0.0, 0.0, -0.0, 0.0, 0.0, 0.0, 0.0]
    return x


@pytest.mark.parametrize("axis", [-1, 2, 1, -3, 0])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_matches_onnxruntime(axis, log):
    x = _softmax_input()
    op, fn = ("LogSoftmax", N.log_softmax) if log else ("Softmax", N.softmax)
    want = ort_run(op, [x], opset=13, axis=axis)
    assert_close(run(lambda t: fn(t, axis), x), want)


def test_softmax_matches_torch_on_finite_inputs():
    x = randn(3, 9, 11, scale=5.0)
    for axis in (-1, 1, 0):
        want = F.softmax(torch.from_numpy(x), dim=axis).numpy()
        assert_close(run(lambda t: N.softmax(t, axis), x), want)
        want = F.log_softmax(torch.from_numpy(x), dim=axis).numpy()
        assert_close(run(lambda t: N.log_softmax(t, axis), x), want)


@pytest.mark.parametrize("axis", [1, -1, 0, 2])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_legacy_matches_onnxruntime_opset11(axis, log):
    x = randn(2, 3, 4, 5, scale=2.0)
    op, fn = ("LogSoftmax", N.log_softmax_legacy) if log else ("Softmax", N.softmax_legacy)
    want = ort_run(op, [x], opset=11, axis=axis)
    assert_close(run(lambda t: fn(t, axis), x), want)


def test_softmax_f16_via_cast_and_zero_size():
    x = randn(6, 33, scale=4.0)
    got = run(lambda t: N.softmax(t, -1), x, compute=dt.f16)
    x16 = torch.from_numpy(x.astype(np.float16).astype(np.float32))
    assert_close(got, F.softmax(x16, -1).numpy().astype(np.float16), "f16")
    for shape in [(3, 0), (0, 4)]:
        z = np.zeros(shape, np.float32)
        assert run(N.softmax, z).shape == shape
        assert run(N.log_softmax, z).shape == shape


# ---- layer / batch / instance / group / rms / lp / mvn ----------------------------------------
@pytest.mark.parametrize("axis", [-1, 1, -2, 0])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_matches_onnxruntime(axis, with_bias):
    x = randn(3, 4, 5, scale=2.0) + 10.0          # a large mean: the two-pass variance matters
    norm_shape = x.shape[axis % 3:]
    scale = randn(*norm_shape)
    bias = randn(*norm_shape) if with_bias else None
    want = ort_run("LayerNormalization", [x, scale, bias], opset=17, nout=3, axis=axis,
                   epsilon=1e-3)
    got = run(lambda *t: N.layer_norm(*t, axis=axis, epsilon=1e-3),
              *[a for a in (x, scale, bias) if a is not None])
    for g, w in zip(got, want):
        assert_close(g, w)
    assert got[1].shape == x.shape[:axis % 3] + (1,) * (3 - axis % 3)


def test_layer_norm_matches_torch_and_f16():
    x = randn(2, 7, 16)
    w, b = randn(16), randn(16)
    want = F.layer_norm(torch.from_numpy(x), (16,), torch.from_numpy(w), torch.from_numpy(b))
    y, mean, inv = run(lambda *t: N.layer_norm(*t), x, w, b)
    assert_close(y, want.numpy())
    assert_close(mean, x.mean(-1, keepdims=True))
    # f16 input: statistics in f32 (stash_type), Y rounded to f16 once
    y16, mean16, _ = run(lambda *t: N.layer_norm(*t), x, w, b, compute=dt.f16)
    assert y16.dtype == np.float16 and mean16.dtype == np.float32
    x16, w16, b16 = (torch.from_numpy(a.astype(np.float16).astype(np.float32)) for a in (x, w, b))
    want16 = F.layer_norm(x16, (16,), w16, b16).numpy().astype(np.float16)
    assert_close(y16, want16, "f16", atol=2e-3)


def test_batch_norm_matches_onnxruntime_and_torch():
    x = randn(2, 3, 5, 4, scale=3.0)
    scale, bias, mean = randn(3), randn(3), randn(3)
    var = np.abs(randn(3)) + 0.1
    got = run(lambda *t: N.batch_norm(*t, epsilon=1e-4), x, scale, bias, mean, var)
    assert_close(got, ort_run("BatchNormalization", [x, scale, bias, mean, var], opset=15,
                              epsilon=1e-4))
    tw = [torch.from_numpy(a) for a in (mean, var, scale, bias)]
    want = F.batch_norm(torch.from_numpy(x), tw[0], tw[1], tw[2], tw[3], False, 0.0, 1e-4)
    assert_close(got, want.numpy())
    with pytest.raises(ShapeError):
        run(N.batch_norm, x, randn(4), bias, mean, var)


@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (2, 3, 7), (1, 4, 2, 3, 2)])
def test_instance_norm_matches_onnxruntime(shape):
    x = randn(*shape, scale=2.0) + 3.0
    scale, bias = randn(shape[1]), randn(shape[1])
    got = run(lambda *t: N.instance_norm(*t, epsilon=1e-5), x, scale, bias)
    assert_close(got, ort_run("InstanceNormalization", [x, scale, bias], opset=6, epsilon=1e-5))


@pytest.mark.parametrize("groups", [1, 2, 3, 6])
def test_group_norm_matches_onnxruntime_and_torch(groups):
    x = randn(2, 6, 3, 4, scale=2.0) - 5.0
    scale, bias = randn(6), randn(6)
    got = run(lambda *t: N.group_norm(*t, groups, 1e-5), x, scale, bias)
    assert_close(got, ort_run("GroupNormalization", [x, scale, bias], opset=21,
                              num_groups=groups, epsilon=1e-5))
    want = F.group_norm(torch.from_numpy(x), groups, torch.from_numpy(scale),
                        torch.from_numpy(bias), 1e-5)
    assert_close(got, want.numpy())


def test_group_norm_opset18_per_group_scale():
    x = randn(2, 6, 5)
    scale, bias = randn(3), randn(3)
    got = run(lambda *t: N.group_norm(*t, 3, 1e-5), x, scale, bias)
    assert_close(got, ort_run("GroupNormalization", [x, scale, bias], opset=18, num_groups=3))
    with pytest.raises(ShapeError):
        run(lambda *t: N.group_norm(*t, 4, 1e-5), x, randn(6), randn(6))


@pytest.mark.parametrize("axis", [-1, 1])
def test_rms_norm_matches_onnxruntime(axis):
    x = randn(3, 4, 8, scale=3.0)
    scale = randn(*x.shape[axis % 3:])
    got = run(lambda *t: N.rms_norm(*t, axis=axis, epsilon=1e-6), x, scale)
    assert_close(got, ort_run("RMSNormalization", [x, scale], opset=23, axis=axis,
                              epsilon=1e-6))


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_lp_normalization_matches_onnxruntime(p, axis):
    x = randn(4, 5, 3)
    x[0, 0, :] = 0.0          # a zero norm along axis 2 gives 0, not NaN
    x[:, 1, 1] = 0.0
    x[2, :, 2] = 0.0
    got = run(lambda t: N.lp_normalization(t, axis, p), x)
    assert_close(got, ort_run("LpNormalization", [x], opset=1, axis=axis, p=p))
    with pytest.raises(ModelError):
        run(lambda t: N.lp_normalization(t, axis, 3), x)


@pytest.mark.parametrize("axes", [(0, 2, 3), (2, 3), (1,), (-1, 0)])
def test_mean_variance_normalization_matches_onnxruntime(axes):
    x = randn(2, 3, 4, 5, scale=2.0) + 1.0
    got = run(lambda t: N.mean_variance_normalization(t, axes), x)
    assert_close(got, ort_run("MeanVarianceNormalization", [x], opset=13, axes=list(axes)))


def test_norms_reject_integers_and_bad_axes():
    xi = np.ones((2, 3), np.int32)
    with pytest.raises(ShapeError):
        run(N.softmax, xi)
    with pytest.raises(ShapeError):
        run(lambda t: N.softmax(t, 2), np.ones((2, 3), np.float32))
    with pytest.raises(ShapeError):
        run(lambda *t: N.layer_norm(*t), np.ones((2, 3), np.float32), np.ones(4, np.float32))


# ---- reductions -------------------------------------------------------------------------------
KIND_OPS = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin",
            "prod": "ReduceProd", "l1": "ReduceL1", "l2": "ReduceL2", "log_sum": "ReduceLogSum",
            "log_sum_exp": "ReduceLogSumExp", "sum_square": "ReduceSumSquare"}


def _ort_reduce(kind, x, axes, keepdims, noop=0):
    ax = np.array(axes if axes is not None else [], np.int64)
    return ort_run(KIND_OPS[kind], [x, ax], opset=18, keepdims=int(keepdims),
                   noop_with_empty_axes=noop)


@pytest.mark.parametrize("kind", R.KINDS)
@pytest.mark.parametrize("axes,keepdims", [([1], True), ([-1, 0], False), (None, False),
                                           ([0, 2], True)])
def test_reduce_float_matches_onnxruntime(kind, axes, keepdims):
    x = randn(3, 4, 5, scale=1.5)
    if kind in ("log_sum",):
        x = np.abs(x) + 0.1
    if kind == "prod":
        x = x + np.sign(x)        # magnitudes >= 1 keep the product away from underflow
    got = run(lambda t: R.reduce(t, kind, axes, keepdims), x)
    assert_close(got, _ort_reduce(kind, x, axes, keepdims))


@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min", "prod", "l1", "l2", "sum_square",
                                  "log_sum"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reduce_int_matches_onnxruntime(kind, dtype):
    x = RNG.integers(-7, 8, (3, 5, 4)).astype(dtype)
    if kind == "log_sum":
        x = np.abs(x) + 1
    got = run(lambda t: R.reduce(t, kind, [1], False), x)
    want = _ort_reduce(kind, x, [1], False)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_reduce_max_min_small_integers(dtype):
    info = np.iinfo(dtype)
    x = np.array([[info.min, 3, info.max], [5, info.min, 7], [9, 9, 9]], dtype)
    for kind, ref in (("max", np.max), ("min", np.min)):
        for axes in ([0], [1], None):
            got = run(lambda t: R.reduce(t, kind, axes, False), x)
            np.testing.assert_array_equal(got, ref(x, axis=None if axes is None else axes[0]))
            np.testing.assert_array_equal(got, _ort_reduce(kind, x, axes, False))
    np.testing.assert_array_equal(run(lambda t: R.argmin(t, 1, False), x), np.argmin(x, axis=1))


def test_reduce_noop_with_empty_axes_applies_only_the_elementwise_part():
    x = randn(3, 4)
    for kind in ("sum", "sum_square", "l1", "max", "log_sum_exp"):
        got = run(lambda t: R.reduce(t, kind, [], True, noop_with_empty_axes=True), x)
        assert_close(got, _ort_reduce(kind, x, [], True, noop=1))
    got = run(lambda t: R.reduce(t, "sum", [], False), x)     # empty axes without noop: all
    assert_close(got, np.float32(x.sum(dtype=np.float64)))


def test_log_sum_exp_special_rows():
    x = np.array([[-INF, -INF, -INF], [1.0, INF, 2.0], [1.0, NAN, 2.0], [1e30, 1e30, -1e30],
                  [-1e30, -1e30, -INF], [0.0, 1.0, 2.0]], np.float32)
    got = run(lambda t: R.reduce(t, "log_sum_exp", [1], False), x)
    want = _ort_reduce("log_sum_exp", x, [1], False)
    assert_close(got, want)
    assert got[0] == -INF and got[1] == INF and np.isnan(got[2])
    np.testing.assert_allclose(got[3], 1e30 + np.log(2), rtol=1e-7)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.uint8])
def test_reduce_zero_size_gives_the_onnx_identities(dtype):
    x = np.zeros((2, 0, 3), dtype)
    is_f = np.dtype(dtype).kind == "f"
    info = np.finfo(dtype) if is_f else np.iinfo(dtype)
    want = {"sum": 0, "prod": 1, "l1": 0, "l2": 0, "sum_square": 0, "mean": 0,
            "max": -INF if is_f else info.min, "min": INF if is_f else info.max}
    if is_f:
        want.update(log_sum=-INF, log_sum_exp=-INF)
    if dtype == np.uint8:            # ONNX takes 8-bit integers only in ReduceMax/ReduceMin
        want = {k: want[k] for k in ("max", "min")}
    for kind, v in want.items():
        got = run(lambda t: R.reduce(t, kind, [1], False), x)
        assert got.shape == (2, 3) and got.dtype == dtype, kind
        np.testing.assert_array_equal(got, np.full((2, 3), v, dtype), err_msg=kind)
        if kind in ("sum", "prod", "max", "min", "log_sum_exp"):
            np.testing.assert_array_equal(got, _ort_reduce(kind, x, [1], False), err_msg=kind)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_reduce_prod_special_values_and_signs():
    x = np.array([[-0.0, 2.0, 3.0], [INF, 0.0, 1.0], [-2.0, -3.0, 1e20], [-2.0, 3.0, 1e20],
                  [1e30, 1e30, 1.0], [1e-30, 1e-30, -1.0], [NAN, 1.0, 2.0], [-INF, 2.0, -1.0],
                  [0.0, -1.0, 5.0], [7.0, 11.0, 13.0]], np.float32)
    got = run(lambda t: R.reduce(t, "prod", [1], False), x)
    with np.errstate(all="ignore"):
        want = np.prod(x, axis=1)
    assert_close(got, want, rtol=0, atol=0)        # exact: correctly rounded from f64
    np.testing.assert_array_equal(np.signbit(got[[0, 8]]), np.signbit(want[[0, 8]]))
    assert np.signbit(got[0]) and np.signbit(got[8]) and np.signbit(got[5])


def test_reduce_prod_error_bound_fp32():
    # 2000 factors around 1: the f64 log-sum keeps the f32 result within one ulp
    x = (1.0 + randn(50, 2000, scale=0.05)).astype(np.float32)
    x[:, ::7] *= -1
    got = run(lambda t: R.reduce(t, "prod", [1], False), x).astype(np.float64)
    exact = np.prod(x.astype(np.float64), axis=1)     # rel error ~2000 * 2**-53: negligible here
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    assert (np.abs(got - exact) / ulp).max() <= 1.0


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8])
def test_reduce_prod_integers_exact_with_wraparound(dtype):
    x = RNG.integers(-9, 10, (4, 3, 13)).astype(dtype)
    got = run(lambda t: R.reduce(t, "prod", [0, 2], True), x)
    np.testing.assert_array_equal(got, np.prod(x, axis=(0, 2), keepdims=True, dtype=dtype))
    big = np.array([[2 ** 20, 2 ** 15, 3], [46341, 46341, 1]], np.int32)   # overflows: wraps
    np.testing.assert_array_equal(run(lambda t: R.reduce(t, "prod", [1], False), big),
                                  np.prod(big, axis=1, dtype=np.int32))


def test_reduce_f16_via_cast():
    x = randn(5, 300, scale=3.0)
    x16 = x.astype(np.float16).astype(np.float64)
    for kind, ref in [("sum", np.sum), ("mean", np.mean), ("l2", lambda a, axis: np.sqrt(
            np.sum(a * a, axis=axis))), ("log_sum_exp", lambda a, axis: np.log(np.sum(np.exp(a),
                                                                                     axis=axis)))]:
        got = run(lambda t: R.reduce(t, kind, [1], False), x, compute=dt.f16)
        assert_close(got, ref(x16, axis=1).astype(np.float16), "f16", atol=2e-2)


# ---- argmax / argmin --------------------------------------------------------------------------
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_argmax_argmin_nan_and_ties_match_numpy(largest, axis):
    x = RNG.integers(-3, 4, (5, 6, 4)).astype(np.float32)      # many ties
    x[1, 2, :] = NAN
    x[3, :, 1] = NAN
    x[0, 0, 0] = -0.0
    fn = R.argmax if largest else R.argmin
    got = run(lambda t: fn(t, axis, False), x)
    want = (np.argmax if largest else np.argmin)(x, axis=axis)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_argmax_argmin_match_onnxruntime_without_nan(largest, last, keepdims):
    x = RNG.integers(-3, 4, (4, 7, 3)).astype(np.float32)
    op, fn = ("ArgMax", R.argmax) if largest else ("ArgMin", R.argmin)
    for axis in (1, -1, 0):
        got = run(lambda t: fn(t, axis, bool(keepdims), bool(last)), x)
        want = ort_run(op, [x], opset=13, axis=axis, keepdims=keepdims, select_last_index=last)
        np.testing.assert_array_equal(got, want)
        assert got.shape == want.shape


def test_argmax_last_nan_and_integer_and_bool_inputs():
    x = np.array([[1.0, NAN, 3.0, NAN], [2.0, 2.0, 1.0, 1.0]], np.float32)
    np.testing.assert_array_equal(run(lambda t: R.argmax(t, 1, False, True), x), [3, 1])
    np.testing.assert_array_equal(run(lambda t: R.argmin(t, 1, False, True), x), [3, 3])
    xi = np.array([[-2 ** 31, 5, 2 ** 31 - 1, 5]], np.int32)
    np.testing.assert_array_equal(run(lambda t: R.argmax(t, 1, False), xi), [2])
    np.testing.assert_array_equal(run(lambda t: R.argmin(t, 1, False), xi), [0])
    xb = np.array([[False, True, True], [False, False, False]])
    np.testing.assert_array_equal(run(lambda t: R.argmax(t, 1, False), xb), [1, 0])
    np.testing.assert_array_equal(run(lambda t: R.argmin(t, 1, False, True), xb), [0, 2])
    with pytest.raises(ShapeError):
        run(lambda t: R.argmax(t, 1), np.zeros((3, 0), np.float32))


# ---- cumsum -----------------------------------------------------------------------------------
def _np_cumsum(x, axis, exclusive, reverse):
    y = np.flip(x, axis) if reverse else x
    c = np.cumsum(y, axis=axis, dtype=x.dtype)
    if exclusive:
        c = np.concatenate([np.zeros_like(np.take(c, [0], axis)),
                            np.take(c, range(c.shape[axis] - 1), axis)], axis)
    return np.flip(c, axis) if reverse else c


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumsum_matches_onnxruntime(exclusive, reverse, axis):
    x = randn(4, 6, 5)
    got = run(lambda t: R.cumsum(t, axis, exclusive, reverse), x)
    want = ort_run("CumSum", [x, np.array(axis, np.int64)], opset=14, exclusive=int(exclusive),
                   reverse=int(reverse))
    assert_close(got, want)
    xi = RNG.integers(-100, 100, (4, 6, 5)).astype(np.int64)
    np.testing.assert_array_equal(run(lambda t: R.cumsum(t, axis, exclusive, reverse), xi),
                                  _np_cumsum(xi, axis, exclusive, reverse))


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum_non_finite_values_act_as_a_sequential_scan(exclusive, reverse):
    x = np.array([[1.0, INF, 2.0, NAN, 3.0, -INF, 4.0],
                  [1.0, -INF, 2.0, 3.0, 4.0, 5.0, 6.0],
                  [INF, 1.0, -INF, 2.0, 3.0, 4.0, 5.0],
                  [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, INF]], np.float32)
    got = run(lambda t: R.cumsum(t, 1, exclusive, reverse), x)
    with np.errstate(invalid="ignore"):
        want = _np_cumsum(x, 1, exclusive, reverse)
    assert_close(got, want, rtol=0, atol=0)
    want_ort = ort_run("CumSum", [x, np.array(1, np.int64)], opset=14, exclusive=int(exclusive),
                       reverse=int(reverse))
    assert_close(got, want_ort, rtol=0, atol=0)


def test_cumsum_f16_int32_and_wraparound():
    x = randn(3, 40)
    got = run(lambda t: R.cumsum(t, 1), x, compute=dt.f16)
    want = np.cumsum(x.astype(np.float16).astype(np.float64), axis=1).astype(np.float16)
    assert_close(got, want, "f16", atol=1e-2)
    xi = np.array([2 ** 31 - 1, 1, 5], np.int32)
    np.testing.assert_array_equal(run(lambda t: R.cumsum(t, 0), xi), np.cumsum(xi, dtype=np.int32))


def test_zero_size_batches_and_scans():
    x = np.zeros((0, 3, 4), np.float32)
    c = np.ones(3, np.float32)
    y, mean, inv = run(lambda *t: N.layer_norm(*t), x, np.ones(4, np.float32))
    assert y.shape == (0, 3, 4) and mean.shape == (0, 3, 1) and inv.shape == (0, 3, 1)
    assert run(lambda *t: N.batch_norm(*t), x, c, c, c, c).shape == (0, 3, 4)
    assert run(lambda *t: N.instance_norm(*t), x, c, c).shape == (0, 3, 4)
    assert run(lambda *t: N.group_norm(*t, 3, 1e-5), x, c, c).shape == (0, 3, 4)
    assert run(lambda t: R.cumsum(t, 1), x).shape == (0, 3, 4)
    assert run(lambda t: R.cumsum(t, 0, True, True), np.zeros((0, 2), np.int64)).shape == (0, 2)
    assert run(lambda t: R.argmax(t, 1, False), x).shape == (0, 4)
    assert run(lambda t: R.reduce(t, "log_sum_exp", [-1], True), x).shape == (0, 3, 1)
