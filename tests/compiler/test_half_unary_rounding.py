"""f16 unary ops over every finite f16 value, against float64 rounded once to f16, on the
reference executor and the Triton kernels (interpreted on CPU): at most 1 ulp apart."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.compiler.test_onnx_edge_values import run_both, single_node

ALL_F16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
ALL_F16 = ALL_F16[np.isfinite(ALL_F16)]

F64 = {"Tanh": np.tanh, "Log": np.log, "Cos": np.cos, "Tan": np.tan,
       "Sigmoid": lambda x: torch.sigmoid(torch.from_numpy(x)).numpy()}


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How many f16 values lie between ``a`` and ``b`` (both finite)."""
    ia, ib = (v.view(np.int16).astype(np.int64) for v in (a, b))
    ia, ib = (np.where(i < 0, -32768 - i, i) for i in (ia, ib))
    return np.abs(ia - ib)


@pytest.mark.parametrize("op", sorted(F64))
def test_f16_transcendentals_round_once(op):
    """Computed in f16 step by step, ``tanh`` was up to 3 ulp off, ``log`` 2, ``tan`` 900 (its
    ``cos``), ``cos(54304)`` gave 0 for 1.9e-4 (2587 ulp), and ``sigmoid(-11.1)`` gave 0 for 1.5e-5:
    ``1 + exp(11.1)`` overflowed f16. In f32, rounded once, each is within 1 ulp."""
    with np.errstate(all="ignore"):
        want = F64[op](ALL_F16.astype(np.float64)).astype(np.float16)
    m = single_node(op, {"x": ALL_F16})
    for path, (got,) in run_both(m, {"x": ALL_F16}):
        assert got.dtype == np.float16, path
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=path)
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want), err_msg=path)
        fin = np.isfinite(want)
        d = ulp_distance(got[fin], want[fin])
        assert d.max() <= 1, (path, ALL_F16[fin][d.argmax()], got[fin][d.argmax()],
                              want[fin][d.argmax()])
