"""Float -> integer ``Cast`` of values ONNX leaves undefined (NaN, ±inf, out of range): lumc
truncates and saturates to the integer type's exact min/max, NaN -> 0, for every signed and
unsigned type, the same in the reference executor, a Triton kernel (the interpreter on CPU) and the
torch replay of the primitive graph (``lumc.compiler.runtime.graph_torch``, the compiled CPU path).
The expected values are built here from that definition with Python integers (exact)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lumc.backends.reference import run_reference
from lumc.backends.triton import TritonKernel
from lumc.backends.triton.launch import to_numpy
from lumc.compiler.runtime.graph_torch import graph_module
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.ir.tensor import Tensor
from triton_cases import make_kernel

INT_TYPES = [dt.i8, dt.i16, dt.i32, dt.i64, dt.u8, dt.u16, dt.u32, dt.u64]


def _inputs(to: dt.DType, src: dt.DType) -> np.ndarray:
    """Special values and the values just inside and outside ``to``'s range, rounded to ``src``."""
    info = np.iinfo(to.np)
    lo, hi = int(info.min), int(info.max)
    edges = [float(hi + 1), float(lo)]   # powers of two: exact
    near = [np.nextafter(e, d) for e in edges for d in (-np.inf, np.inf)]
    vals = [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 2.7, -2.7, 1e30, -1e30, float(hi),
            float(hi) + 0.5, float(lo) - 0.5, float(lo) - 1.0, float(lo) + 0.75, *edges, *near]
    with np.errstate(all="ignore"):
        return np.array(vals, np.float64).astype(src.np)


def _saturated(x: np.ndarray, to: dt.DType) -> np.ndarray:
    """The definition, element by element with Python ints."""
    info = np.iinfo(to.np)
    out = []
    for v in x.astype(np.float64).tolist():
        if math.isnan(v):
            out.append(0)
        elif math.isinf(v):
            out.append(int(info.max) if v > 0 else int(info.min))
        else:
            out.append(min(max(math.trunc(v), int(info.min)), int(info.max)))
    return np.array(out, dtype=to.np)


def _cast_graph(n: int, src: dt.DType, to: dt.DType) -> Graph:
    x = Tensor(input_node("x", (n,), src))
    return Graph({"x": x.node}, {"y": x.cast(to).node})


@pytest.mark.parametrize("src", [dt.f32, dt.f64, dt.f16], ids=str)
@pytest.mark.parametrize("to", INT_TYPES, ids=str)
def test_reference_saturates_exactly(to, src):
    x = _inputs(to, src)
    got = run_reference(_cast_graph(len(x), src, to), {"x": x})["y"]
    assert got.dtype == to.np
    np.testing.assert_array_equal(got, _saturated(x, to))


@pytest.mark.parametrize("to", INT_TYPES, ids=str)
def test_kernel_saturates_exactly(to):
    for src in (dt.f32, dt.f64):
        x = _inputs(to, src)
        k = make_kernel("pointwise", lambda a: a.cast(to), [(x.shape, src)])
        (out,) = TritonKernel(k)(x)
        got = to_numpy(out)
        assert got.dtype == to.np
        np.testing.assert_array_equal(got, _saturated(x, to), err_msg=f"{src} -> {to}")


@pytest.mark.parametrize("to", INT_TYPES, ids=str)
def test_torch_replay_saturates_exactly(to):
    x = _inputs(to, dt.f32)
    (y,) = graph_module(_cast_graph(len(x), dt.f32, to))(torch.from_numpy(x))
    got = y.view(torch.int64).numpy().view(np.uint64) if to == dt.u64 else y.numpy()
    np.testing.assert_array_equal(got, _saturated(x, to))


def test_int64_max_from_inf_and_two_to_the_63():
    """The user trial's case: +inf and 2**63 give INT64_MAX, not the largest double below it."""
    x = np.array([np.inf, 2.0 ** 63, -np.inf, np.nan], np.float32)
    want = np.array([2 ** 63 - 1, 2 ** 63 - 1, -2 ** 63, 0], np.int64)
    np.testing.assert_array_equal(run_reference(_cast_graph(4, dt.f32, dt.i64), {"x": x})["y"],
                                  want)
