"""A kernel whose float8 output holds a NaN passes its numerics check: the check compared the
non-float outputs (integers, bool, storage types) with ``np.array_equal``, where NaN != NaN, so a
model with a float8 output that holds one (a ``Cast`` or ``QuantizeLinear`` to float8 of a NaN,
which ONNX keeps) failed every kernel check and ``lumc.compile`` failed ("the fallback program's
pointwise kernel failed its check ... give a larger budget")."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx.helper as oh
import pytest
from onnx import TensorProto as TP

import lumc
from lumc.compiler.core.errors import exactly_equal
from lumc.compiler.runtime.tuning_db import TuningDatabase


def test_exactly_equal_nan_only_for_float_storage():
    a = np.array([1.0, np.nan, -2.0], np.float32)
    for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fnuz):
        assert exactly_equal(a.astype(t), a.astype(t))
        assert not exactly_equal(a.astype(t), np.array([1.0, np.nan, 2.0], np.float32).astype(t))
    assert exactly_equal(np.array([1, 2], np.int32), np.array([1, 2], np.int32))
    assert not exactly_equal(np.array([1, 2], np.int32), np.array([1, 3], np.int32))
    assert not exactly_equal(np.array([1, 2], np.int32), np.array([[1, 2]], np.int32))
    assert exactly_equal(np.array([True, False]), np.array([True, False]))


@pytest.mark.parametrize("to", [TP.FLOAT8E4M3FN, TP.FLOAT8E5M2], ids=["e4m3fn", "e5m2"])
def test_compile_with_nan_in_float8_output(to, tmp_path):
    x = np.array([1.0, np.nan, -2.5, 0.3, -np.nan, 7.0, 0.0, -1.0], np.float32)
    m = oh.make_model(oh.make_graph(
        [oh.make_node("Cast", ["x"], ["y"], to=to)], "g",
        [oh.make_tensor_value_info("x", TP.FLOAT, [8])],
        [oh.make_tensor_value_info("y", to, [8])]), opset_imports=[oh.make_opsetid("", 19)])
    m.ir_version = 9
    cm = lumc.compile(m, budget="20s", device="sim:h200", example_inputs={"x": x},
                      db=TuningDatabase(tmp_path / "tuning.sqlite"), reuse_plan=False)
    want = x.astype(ml_dtypes.float8_e4m3fn if to == TP.FLOAT8E4M3FN else ml_dtypes.float8_e5m2)
    got = np.asarray(cm(x))
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
