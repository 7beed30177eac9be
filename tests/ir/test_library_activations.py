"""lumc.ir.library.activations against onnxruntime (one-node models), torch eager and math.erf."""
import math

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import helper

from lumc.backends.reference import ReferenceExecutor
from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.graph import Graph, input_node
from lumc.ir.library import activations as A
from lumc.ir.tensor import Tensor

ort.set_default_logger_severity(3)
RNG = np.random.default_rng(7)
INF, NAN = np.inf, np.nan
# tolerances by the dtype of the result
TOL = {"f64": dict(rtol=1e-12, atol=1e-14), "f32": dict(rtol=1e-5, atol=1e-6),
       "f16": dict(rtol=1e-3, atol=1e-5)}
SPECIAL = np.array([-INF, -1e30, -100, -30, -3, -1, -0.5, -1e-3, -1e-8, -1e-40, -0.0, 0.0, 1e-40,
                    1e-8, 1e-3, 0.5, 1, 3, 30, 100, 1e30, INF, NAN], np.float32)


def values(n=230):
    """Special values plus random ones of several magnitudes (fp32)."""
    r = np.concatenate([RNG.standard_normal(n) * s for s in (0.1, 1.0, 4.0, 40.0)])
    return np.concatenate([SPECIAL, r.astype(np.float32)])


def run(fn, *arrays, compute=None, precision="native"):
    """Evaluate ``fn`` on Input nodes of ``arrays``; ``compute`` casts float inputs in the graph."""
    ins = {f"x{k}": input_node(f"x{k}", a.shape, dt.from_numpy(a.dtype)) for k, a in enumerate(arrays)}
    ts = [Tensor(n) for n in ins.values()]
    if compute is not None:
        ts = [t.cast(compute) if t.dtype.is_float else t for t in ts]
    y = fn(*ts)
    g = Graph(ins, {"y": y.node})
    return ReferenceExecutor(g, precision)({f"x{k}": a for k, a in enumerate(arrays)})["y"]


def ort_run(op, inputs, opset=21, **attrs):
    vi = [helper.make_tensor_value_info(f"x{k}", helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
          for k, a in enumerate(inputs)]
    node = helper.make_node(op, [v.name for v in vi], ["y"], **attrs)
    g = helper.make_graph([node], "g", vi, [helper.make_empty_tensor_value_info("y")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {f"x{k}": a for k, a in enumerate(inputs)})[0]


def assert_close(got, want, dtype="f32", **override):
    """Same shape and dtype class; NaN where NaN, infinities exact, the rest within TOL[dtype]."""
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    g, w = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg="NaN positions")
    inf = np.isinf(w)
    np.testing.assert_array_equal(g[inf], w[inf], err_msg="infinities")
    fin = np.isfinite(w)
    np.testing.assert_allclose(g[fin], w[fin], **{**TOL[dtype], **override})


# ---- erf: the error bound stated in the docstring ---------------------------------------------
def _erf_grid():
    x = np.concatenate([np.linspace(-6, 6, 2_000_001), np.geomspace(1e-30, 6, 200_001),
                        -np.geomspace(1e-30, 6, 200_001)])
    return x.astype(np.float32)


def test_erf_error_bound_fp32():
    x = _erf_grid()
    got = run(A.erf, x)
    assert got.dtype == np.float32
    ref = torch.special.erf(torch.from_numpy(x.astype(np.float64))).numpy()
    abs_err = np.abs(got.astype(np.float64) - ref)
    assert got[ref == 0].tolist() == [0.0]
    rel_err = abs_err[ref != 0] / np.abs(ref[ref != 0])
    ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    assert abs_err.max() <= 3.7e-7
    assert rel_err.max() <= 3.7e-7
    assert (abs_err / ulp).max() <= 6.2
    # torch's float64 erf is the oracle here: check it against math.erf on a sample
    sample = x[::997].astype(np.float64)
    assert max(abs(math.erf(v) - r) for v, r in zip(sample, ref[::997])) < 1e-15


def test_erf_approximation_error_float64():
    x = _erf_grid().astype(np.float64)
    got = run(A.erf, x)
    ref = torch.special.erf(torch.from_numpy(x)).numpy()
    err = np.abs(got - ref)
    assert err.max() <= 6.0e-8
    assert err[np.abs(x) < 3.8].max() <= 2.1e-8


def test_erf_special_values():
    x = np.array([-INF, -4.0, -0.0, 0.0, 4.0, INF, NAN, 1e-30, -1e-30], np.float32)
    got = run(A.erf, x)
    np.testing.assert_array_equal(got[:6], [-1, -1, 0, 0, 1, 1])
    assert np.signbit(got[2]) and not np.signbit(got[3])
    assert np.isnan(got[6])
    # erf(x) ~ 2x/sqrt(pi) near 0: full relative precision, sign kept
    np.testing.assert_allclose(got[7:], np.float32([1.1283792e-30, -1.1283792e-30]), rtol=1e-6)


# ---- every activation against onnxruntime -----------------------------------------------------
ORT_CASES = [
    # (lumc fn, ONNX op, attrs, opset)
    (A.erf, "Erf", {}, 13),
    (A.gelu, "Gelu", {}, 20),
    (lambda x: A.gelu(x, "tanh"), "Gelu", {"approximate": "tanh"}, 20),
    (A.relu, "Relu", {}, 14),
    (A.leaky_relu, "LeakyRelu", {}, 16),
    (lambda x: A.leaky_relu(x, 0.3), "LeakyRelu", {"alpha": 0.3}, 16),
    (A.elu, "Elu", {}, 6),
    (lambda x: A.elu(x, 0.4), "Elu", {"alpha": 0.4}, 6),
    (A.selu, "Selu", {}, 6),
    (lambda x: A.selu(x, 1.5, 2.0), "Selu", {"alpha": 1.5, "gamma": 2.0}, 6),
    (A.celu, "Celu", {}, 12),
    (lambda x: A.celu(x, 0.6), "Celu", {"alpha": 0.6}, 12),
    (A.softplus, "Softplus", {}, 1),
    (A.softsign, "Softsign", {}, 1),
    (A.hard_sigmoid, "HardSigmoid", {}, 6),
    (lambda x: A.hard_sigmoid(x, 0.3, 0.1), "HardSigmoid", {"alpha": 0.3, "beta": 0.1}, 6),
    (A.hard_swish, "HardSwish", {}, 14),
    (A.mish, "Mish", {}, 18),
    (A.thresholded_relu, "ThresholdedRelu", {}, 10),
    (lambda x: A.thresholded_relu(x, 0.5), "ThresholdedRelu", {"alpha": 0.5}, 10),
]


@pytest.mark.parametrize("fn,op,attrs,opset", ORT_CASES,
                         ids=[f"{c[1]}{c[2] or ''}" for c in ORT_CASES])
def test_activation_matches_onnxruntime(fn, op, attrs, opset):
    x = values().reshape(-1, 23)
    want = ort_run(op, [x], opset=opset, **attrs)
    got = run(fn, x)
    assert got.dtype == np.float32
    # exp-based ops lose ~|x| eps relative (exp(x) = exp2(x log2 e)), onnxruntime's own error is
    # similar; near a cancellation (1 + erf(x) at x = -3) compare absolutely
    assert_close(got, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("name,fn,ref", [
    ("gelu", A.gelu, F.gelu),
    ("gelu_tanh", lambda x: A.gelu(x, "tanh"), lambda t: F.gelu(t, approximate="tanh")),
    ("elu", lambda x: A.elu(x, 0.7), lambda t: F.elu(t, 0.7)),
    # ONNX's default Selu constants are the fp32 roundings of torch's
    ("selu", A.selu, lambda t: A.SELU_GAMMA * torch.where(t > 0, t, A.SELU_ALPHA * torch.expm1(t))),
    ("celu", lambda x: A.celu(x, 2.5), lambda t: F.celu(t, 2.5)),
    ("softplus", A.softplus, lambda t: F.softplus(t, threshold=1e9)),
    ("mish", A.mish, F.mish),
    ("silu", A.silu, F.silu),
    ("hardswish", A.hard_swish, F.hardswish),
    ("softsign", A.softsign, F.softsign),
])
def test_activation_matches_torch_float64(name, fn, ref):
    x = values().astype(np.float64)
    got = run(fn, x)
    want = ref(torch.from_numpy(x)).numpy()
    # float64 graph: the only approximation left is erf (2e-8 absolute, and 0 past |x| = 3.83,
    # which costs gelu up to 5.4 * erfc(3.83) / 2 = 1.6e-7 absolute)
    tol = dict(rtol=1e-7, atol=2e-7) if name == "gelu" else dict(rtol=1e-12, atol=1e-14)
    assert_close(got, want, "f64", **tol)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
@pytest.mark.parametrize("fn,ref", [
    (A.erf, torch.special.erf), (A.gelu, F.gelu), (A.mish, F.mish), (A.silu, F.silu),
    (A.elu, F.elu), (A.softplus, lambda t: F.softplus(t, threshold=1e9)), (A.relu, F.relu),
    (A.hard_swish, F.hardswish),
])
def test_activation_f16_via_cast(fn, ref):
    x = values()
    got = run(fn, x, compute=dt.f16)
    assert got.dtype == np.float16
    x16 = x.astype(np.float16).astype(np.float64)
    want = ref(torch.from_numpy(x16)).numpy().astype(np.float16)
    assert_close(got, want, "f16")


def test_relu_keeps_nan_and_negative_zero():
    x = np.array([NAN, -0.0, 0.0, -1.0, 2.0, -INF, INF], np.float32)
    got = run(A.relu, x)
    np.testing.assert_array_equal(got, [NAN, 0.0, 0.0, 0.0, 2.0, 0.0, INF])
    assert np.signbit(got[1])           # onnxruntime: -0.0 stays -0.0
    np.testing.assert_array_equal(np.signbit(got), np.signbit(ort_run("Relu", [x], opset=14)))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8])
def test_relu_integers(dtype):
    x = np.array([-128 if dtype == np.int8 else -(2 ** 31), -1, 0, 1, 127], dtype)
    np.testing.assert_array_equal(run(A.relu, x), np.maximum(x, 0))


@pytest.mark.parametrize("slope_shape", [(1,), (3, 1, 1), (5,), (2, 3, 4, 5)])
def test_prelu_broadcast(slope_shape):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    x[0, 0, 0, :3] = [NAN, -INF, -0.0]
    slope = RNG.standard_normal(slope_shape).astype(np.float32)
    assert_close(run(A.prelu, x, slope), ort_run("PRelu", [x, slope], opset=16))


def test_prelu_rejects_slope_that_does_not_broadcast_to_x():
    with pytest.raises(ShapeError):
        run(A.prelu, np.zeros((2, 3), np.float32), np.zeros((4, 2, 3), np.float32))


def test_expm1_log1p_keep_relative_precision_near_zero():
    x = np.concatenate([-np.geomspace(1e-30, 0.99, 500), np.geomspace(1e-30, 0.99, 500),
                        [-0.0, 0.0]]).astype(np.float32)
    got = run(A.expm1, x).astype(np.float64)
    want = np.expm1(x.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=5e-7, atol=0)
    assert np.signbit(got[-2])
    xp = np.abs(x)
    np.testing.assert_allclose(run(A.log1p, xp), np.log1p(xp.astype(np.float64)), rtol=5e-7, atol=0)
    big = np.array([-INF, -1.0, -200.0, 50.0, INF, NAN], np.float32)
    np.testing.assert_array_equal(run(A.expm1, big)[[0, 2, 4]], [-1.0, -1.0, INF])
    assert np.isnan(run(A.expm1, big)[5])
    np.testing.assert_array_equal(run(A.log1p, np.float32([-1.0, INF]))[[0, 1]], [-INF, INF])


def test_softplus_is_stable_for_large_magnitudes():
    x = np.array([-1e4, -200.0, -90.0, 90.0, 200.0, 1e4, 3e38], np.float32)
    got = run(A.softplus, x)
    want = np.logaddexp(0.0, x.astype(np.float64)).astype(np.float32)
    # exp(x) = exp2(x log2 e) costs |x| eps relative; -90 lands in the subnormals
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=0)


def test_float_only_activations_reject_integers():
    for fn in (A.erf, A.gelu, A.elu, A.softplus, A.mish, A.leaky_relu):
        with pytest.raises(ShapeError):
            run(fn, np.arange(4, dtype=np.int32))
    with pytest.raises(ShapeError):
        run(lambda x: A.gelu(x, "fast"), np.zeros(3, np.float32))
