"""``Pow`` through the frontends: an ONNX ``Pow`` model against onnxruntime (float special values,
integer powers, mixed base/exponent types) and ``torch.pow`` against eager PyTorch."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import lumc
from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.core.torch_compile import compile_module
from lumc.compiler.frontends.onnx_frontend import import_onnx

SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, np.inf, -np.inf, np.nan,
           1e-45, -1e-45, 1e-40, 1.5]
EXPS = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 0.5, -0.5, np.inf, -np.inf, np.nan,
        16777217.0, 16777215.0, -16777215.0, 1e10, 1.5]
# torch.export deep-copies pytree specs through a deprecated path (PyTorch's own warning)
pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
ONNX_TYPE = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64,
             np.dtype(np.int32): TensorProto.INT32}


def _grid():
    x, y = np.meshgrid(np.array(SPECIAL, np.float32), np.array(EXPS, np.float32), indexing="ij")
    return x.ravel(), y.ravel()


def _pow_model(a: np.ndarray, b: np.ndarray) -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("Pow", ["a", "b"], ["y"])], "pow",
        [helper.make_tensor_value_info("a", ONNX_TYPE[a.dtype], list(a.shape)),
         helper.make_tensor_value_info("b", ONNX_TYPE[b.dtype], list(b.shape))],
        [helper.make_tensor_value_info("y", ONNX_TYPE[a.dtype], list(a.shape))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    m.ir_version = 8
    return m


def _ort(m, feeds):
    return ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _assert_same_floats(got, want, rtol=2.4e-7):
    """NaN where NaN; inf, zeros (with their sign) and exact results equal; others within rtol."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    exact = ~np.isfinite(want) | (want == 0)
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[exact & ok], want[exact & ok])
    np.testing.assert_array_equal(np.signbit(got[exact & ok]), np.signbit(want[exact & ok]))
    np.testing.assert_allclose(got[~exact & ok], want[~exact & ok], rtol=rtol)


def test_onnx_pow_special_grid_matches_onnxruntime():
    a, b = _grid()
    m = _pow_model(a, b)
    want = _ort(m, {"a": a, "b": b})
    got = ReferenceExecutor(import_onnx(m).graph)({"a": a, "b": b})["y"]
    _assert_same_floats(got, want)
    # and through the whole compiler (e-graph candidates, generated kernels, the CPU executor)
    _assert_same_floats(np.asarray(lumc.compile(m, budget="20s")(a, b)), want)


def test_onnx_pow_float_base_integer_exponent():
    a = np.array([-2.0, -1.5, 2.0, -0.0, -0.0, 0.0, np.inf, -np.inf, np.nan, 1.0], np.float32)
    b = np.array([3, 2, -2, -1, 3, -3, -1, 3, 0, 7], np.int64)
    m = _pow_model(a, b)
    _assert_same_floats(ReferenceExecutor(import_onnx(m).graph)({"a": a, "b": b})["y"],
                        _ort(m, {"a": a, "b": b}))


@pytest.mark.parametrize("d", [np.int64, np.int32])
def test_onnx_integer_pow_matches_onnxruntime(d):
    # results in the type's range (ORT's integer Pow is exact there; overflow is undefined)
    a = np.array([3, -3, 2, -2, 7, 5, 1, -1, -1, 0, 0, 10], d)
    b = np.array([19, 19, 30, 31, 11, 13, 1000, 1001, 1000, 0, 5, 9], d)
    if d == np.int64:
        a = np.concatenate([a, np.array([3, -3, 7], d)])
        b = np.concatenate([b, np.array([33, 39, 22], d)])
    m = _pow_model(a, b)
    got = ReferenceExecutor(import_onnx(m).graph)({"a": a, "b": b})["y"]
    want = _ort(m, {"a": a, "b": b})
    # ORT's integer Pow goes through double past 2**53 (3**39 comes back rounded): exact there
    small = np.abs(want.astype(np.float64)) < 2.0 ** 53
    np.testing.assert_array_equal(got[small], want[small])
    exact = [int(x) ** int(y) for x, y in zip(a[~small], b[~small])]
    np.testing.assert_array_equal(got[~small], exact)


def test_onnx_integer_base_float_exponent_truncates_like_onnxruntime():
    a = np.array([3, 3, 2, 7, 3, 2, 1, 4], np.int64)
    b = np.array([0.5, 1.7, 0.5, 2.5, 2.9, -1.0, -5.0, 0.5], np.float32)
    m = _pow_model(a, b)
    got = ReferenceExecutor(import_onnx(m).graph)({"a": a, "b": b})["y"]
    np.testing.assert_array_equal(got, _ort(m, {"a": a, "b": b}))


class _Pow(torch.nn.Module):
    def forward(self, x, y):
        # eager's x ** 0.5 and x ** -0.5 are sqrt and rsqrt ((-inf) ** 0.5 is NaN there)
        return torch.pow(x, y), x ** 3, torch.pow(2.0, y), x ** 0.5, x ** -0.5, x ** -1, x ** 2.5


def test_torch_pow_matches_eager_on_special_values():
    a, b = (torch.from_numpy(v) for v in _grid())
    f = compile_module(_Pow().eval(), (a, b), search=False)
    got = f(a, b)
    with torch.no_grad():
        want = _Pow()(a, b)
    for g, w in zip(got, want):
        _assert_same_floats(g.numpy(), w.numpy())


def test_torch_integer_pow_matches_eager():
    class IntPow(torch.nn.Module):
        def forward(self, x, y):
            return torch.pow(x, y)
    x = torch.tensor([3, -3, 2, 7, 5, -1, 0, 3], dtype=torch.int64)
    y = torch.tensor([33, 39, 62, 22, 27, 1001, 0, 64], dtype=torch.int64)
    f = compile_module(IntPow().eval(), (x, y), search=False)
    assert torch.equal(f(x, y), torch.pow(x, y))
