"""A float ``Cast`` to an OCP float8 type with ``saturate=0`` overflows as the reference does
(ml_dtypes, the ONNX reference's conversion): e4m3fn past 464 is NaN, e5m2 from 61440 is ±inf.
Triton's own conversion saturates (448, 57344), so a kernel forms the overflow itself
(``lumc.backends.triton.exprs._float8_cast``); before, its values were 448 and 57344 where the
reference and onnxruntime give NaN and inf, and such a compile failed every check."""
from __future__ import annotations

import numpy as np
import pytest

from lumc.backends.reference import run_reference
from lumc.backends.triton import TritonKernel
from lumc.backends.triton.launch import to_numpy
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.ir.tensor import Tensor
from triton_cases import make_kernel

VALUES = [464.0, 464.00003, 463.99997, 480.0, -464.00003, -464.0, 61440.0, 61439.996, -61440.0,
          np.inf, -np.inf, np.nan, -0.0, 1e-45, 2e-3, -57344.0, 448.0, 1000.0, -1.5]


def _cast_graph(n: int, src: dt.DType, to: dt.DType) -> Graph:
    x = Tensor(input_node("x", (n,), src))
    return Graph({"x": x.node}, {"y": x.cast(to).cast(dt.f32).node})


@pytest.mark.parametrize("src", [dt.f32, dt.f16, dt.bf16], ids=str)
@pytest.mark.parametrize("to", [dt.f8e4m3fn, dt.f8e5m2], ids=str)
def test_kernel_overflows_as_reference(to, src):
    with np.errstate(all="ignore"):
        x = np.array(VALUES, np.float32).astype(src.np)
    want = run_reference(_cast_graph(len(x), src, to), {"x": x})["y"]
    k = make_kernel("pointwise", lambda a: a.cast(to).cast(dt.f32), [(x.shape, src)])
    (out,) = TritonKernel(k)(x)
    got = to_numpy(out)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    finite = np.isfinite(x.astype(np.float32))
    if to == dt.f8e4m3fn:   # the overflow is NaN, not the saturated 448
        assert np.isnan(got[finite & (np.abs(x.astype(np.float32)) > 464)]).all()
    else:
        assert np.isinf(got[finite & (np.abs(x.astype(np.float32)) >= 61440)]).all()


def test_compile_of_unsaturated_float8_cast(tmp_path):
    """The whole compile: it failed ("the fallback program's pointwise kernel failed its check",
    at every config), now its plan matches the reference."""
    import onnx.helper as oh
    from onnx import TensorProto as TP

    import lumc
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    x = np.array([1000.0, -1000.0, np.inf, 464.1, 1.5, np.nan, 448.0, 70000.0], np.float32)
    for to in (TP.FLOAT8E4M3FN, TP.FLOAT8E5M2):
        m = oh.make_model(oh.make_graph(
            [oh.make_node("Cast", ["x"], ["c"], to=to, saturate=0),
             oh.make_node("Cast", ["c"], ["y"], to=TP.FLOAT)], "g",
            [oh.make_tensor_value_info("x", TP.FLOAT, [8])],
            [oh.make_tensor_value_info("y", TP.FLOAT, [8])]),
            opset_imports=[oh.make_opsetid("", 19)])
        m.ir_version = 9
        cm = lumc.compile(m, budget="20s", device="sim:h200", example_inputs={"x": x},
                          db=TuningDatabase(tmp_path / f"db{to}.sqlite"), reuse_plan=False)
        want = x.astype(dt.f8e4m3fn.np if to == TP.FLOAT8E4M3FN else dt.f8e5m2.np)
        np.testing.assert_array_equal(np.asarray(cm(x)), want.astype(np.float32))
