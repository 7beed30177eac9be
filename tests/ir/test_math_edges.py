"""Numerics a breaking helper found off (2026-12-06), each against a float64 or framework reference
on inputs built here: cos at large |x| and by symmetry, sinh/cosh between exp's overflow and their
own, torch's mean over an empty dim (NaN), ONNX LpNormalization of a row whose norm is NaN."""
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from lumc.backends.reference import run_reference
from lumc.compiler.frontends.onnx_frontend.handlers_trig import cosh, sinh
from lumc.compiler.frontends.onnx_frontend.importer import import_onnx
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.ir.tensor import Tensor


def _run(fns: dict, x: np.ndarray) -> dict:
    n = input_node("x", x.shape, dt.BY_NAME[x.dtype.name] if x.dtype.name in dt.BY_NAME else dt.f32)
    return run_reference(Graph({"x": n}, {k: f(Tensor(n)).node for k, f in fns.items()}), {"x": x})


def test_cos_is_accurate_at_any_size_and_even():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-10, 10, 3000), rng.uniform(-1e5, 1e5, 3000),
                        [1e4, 3e5, 8191.3, 4095.9, 4096.1, 1e30, 25000001.0, np.pi / 2, 3 * np.pi / 2]]
                       ).astype(np.float32)
    out = _run({"c": lambda t: t.cos(), "m": lambda t: t.neg().cos()}, x)
    ref = np.cos(x.astype(np.float64))
    assert np.abs(out["c"] - ref).max() < 5e-7       # was 1.06 at 1e30, 1.5e-4 at 1e4
    assert np.abs(out["m"] - ref).max() < 5e-7       # cos(-x) = cos(x)
    near = np.abs(x) < 10                            # near the zeros: relative precision
    assert (np.abs(out["c"] - ref)[near] / np.maximum(np.abs(ref[near]), 1e-30)).max() < 1e-5
    sp = _run({"c": lambda t: t.cos()}, np.array([np.inf, -np.inf, np.nan], np.float32))["c"]
    assert np.isnan(sp).all()


def test_sinh_cosh_are_finite_until_their_own_overflow():
    x = np.array([-89.4, -88.8, -50, -1, -1e-5, 0, 1e-5, 0.5, 2, 10, 88.7, 88.8, 89.4, 89.5, np.inf],
                 np.float32)
    out = _run({"s": sinh, "c": cosh}, x)
    with np.errstate(over="ignore"):
        for k, f in (("s", np.sinh), ("c", np.cosh)):
            ref = f(x.astype(np.float64)).astype(np.float32)      # inf past fp32's max
            fin = np.isfinite(ref)
            assert np.array_equal(np.isinf(out[k]), np.isinf(ref)), (k, out[k])
            assert (np.abs(out[k][fin] - ref[fin]) / np.abs(ref[fin]).clip(1e-30)).max() < 4e-7


@pytest.mark.parametrize("p", [1, 2])
def test_lp_normalization_keeps_a_nan_row_nan(p):
    x = np.array([[1, np.nan, 2], [3, 0, 4], [0, 0, 0], [np.inf, 1, 0]], np.float32)
    g = helper.make_graph([helper.make_node("LpNormalization", ["x"], ["y"], axis=1, p=p)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    got = run_reference(import_onnx(m).graph, {"x": x})["y"]
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)


def test_torch_mean_over_an_empty_dim_is_nan():
    torch = pytest.importorskip("torch")
    from lumc.compiler.frontends.torch_frontend.capture import import_torch

    class M(torch.nn.Module):
        def forward(self, x):
            return x.mean(1), x.mean((0, 1)), x.mean(0), x.mean(-1, keepdim=True)
    t = torch.zeros(3, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = import_torch(M(), (t,)).graph
        want = M()(t)
    out = run_reference(g, {k: t.numpy() for k in g.inputs})
    for got, w in zip(out.values(), want):
        np.testing.assert_array_equal(np.asarray(got), w.numpy())


def test_odd_functions_keep_the_sign_of_zero():
    """atan, asin, sinh, asinh, atanh of -0.0 are -0.0 (IEEE 754; eager and onnxruntime): the
    sign test ``x < 0`` alone returned +0.0."""
    torch = pytest.importorskip("torch")
    from lumc.compiler.frontends.onnx_frontend import handlers_trig as trig
    names = ("atan", "asin", "sinh", "asinh", "atanh")
    x = np.array([-0.0, 0.0, -0.25, 0.25, np.nan], np.float32)
    out = _run({k: getattr(trig, k) for k in names}, x)
    for k in names:
        want = getattr(torch, k)(torch.tensor(x)).numpy()
        np.testing.assert_allclose(out[k], want, rtol=2e-7, equal_nan=True)
        assert np.signbit(out[k][:2]).tolist() == [True, False], k


@pytest.mark.parametrize("largest", [1, 0])
def test_topk_orders_nan_above_every_number(largest):
    """ONNX TopK ranked with plain compares, where NaN is neither larger nor smaller: on
    ``[1, nan, 5, nan]`` with k = 2 it returned ``[nan, 1]`` for the largest (5 dropped) and
    ``[nan, 5]`` for the smallest. NaN now orders above every number, as onnxruntime orders it."""
    x = np.array([[1, np.nan, 5, np.nan], [1, np.nan, 5, 3], [2, 2, np.nan, -1],
                  [np.inf, np.nan, -np.inf, 0]], np.float32)
    g = helper.make_graph([helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1,
                                            largest=largest)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                          [helper.make_tensor_value_info("v", TensorProto.FLOAT, [4, 2]),
                           helper.make_tensor_value_info("i", TensorProto.INT64, [4, 2])],
                          [onnx.numpy_helper.from_array(np.array([2], np.int64), "k")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    got = run_reference(import_onnx(m).graph, {"x": x})
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(got["v"], want[0])
    np.testing.assert_array_equal(got["i"], want[1])
