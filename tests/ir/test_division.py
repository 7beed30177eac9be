"""IEEE division: ``Tensor.div`` is the correctly rounded ``Div`` primitive on every path
(reference executor, Triton interpreter, the torch replay), and the reciprocal form is a fast-math
rewrite only."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from lumc.backends.reference import ReferenceExecutor
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.ir.tensor import Tensor
from lumc.rewrites import rules_algebra
from lumc.rewrites.schedule import Limits, Saturator, all_rules

sys.path.insert(0, str(Path(__file__).parents[1] / "backends"))


def _specials(dtype, rng, n=4000) -> tuple[np.ndarray, np.ndarray]:
    """Random quotients near exact integers, plus inf, NaN, +-0, subnormals and huge values."""
    b = rng.integers(1, 50, n).astype(np.float64) * rng.choice([-1, 1], n)
    q = rng.integers(-100, 100, n).astype(np.float64)
    a = (q * b).astype(dtype)
    # one ulp either side of the exact multiple: the cases a * (1/b) rounds the wrong way
    a[: n // 3] = np.nextafter(a[: n // 3], np.asarray(np.inf, dtype))
    a[n // 3: 2 * n // 3] = np.nextafter(a[n // 3: 2 * n // 3], np.asarray(-np.inf, dtype))
    a[-200:] = rng.standard_normal(200).astype(dtype)
    b = b.astype(dtype)
    sp = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 3e38, -3e38, 1.0], np.float64)
    with np.errstate(all="ignore"):
        sp = sp.astype(dtype)
    a = np.concatenate([a, np.repeat(sp, len(sp))])
    b = np.concatenate([b, np.tile(sp, len(sp))])
    return a, b


def _div_graph(d: dt.DType, n: int) -> Graph:
    x, y = input_node("a", (n,), d), input_node("b", (n,), d)
    return Graph({"a": x, "b": y}, {"q": Tensor(x).div(Tensor(y)).node,
                                    "t": Tensor(x).div(Tensor(y)).floor().node})


def _bits_equal(got: np.ndarray, want: np.ndarray) -> bool:
    u = f"u{want.dtype.itemsize}"
    same = (np.ascontiguousarray(got).view(u) == np.ascontiguousarray(want).view(u))
    return bool((same | (np.isnan(got) & np.isnan(want))).all())


def test_floor_of_quotient_is_ieee():
    """floor(14.999999f / 3) is 4 in IEEE fp32; the reciprocal form gives 5."""
    a = np.array([14.999999, 6.0, -9.0, 0.3], np.float32)
    b = np.array([3.0, 3.0, 3.0, 0.1], np.float32)
    out = ReferenceExecutor(_div_graph(dt.f32, 4))({"a": a, "b": b})
    np.testing.assert_array_equal(out["t"], np.floor(a / b))
    assert out["t"][0] == 4.0
    assert np.float32(a[0] * np.float32(1 / np.float32(3))) == np.float32(5.0)   # why it matters


@pytest.mark.parametrize("d", [dt.f32, dt.f16, dt.f64], ids=str)
def test_reference_div_is_correctly_rounded(d):
    a, b = _specials(d.np, np.random.default_rng(0))
    out = ReferenceExecutor(_div_graph(d, len(a)))({"a": a, "b": b})
    with np.errstate(all="ignore"):
        want = (a.astype(np.float64) / b.astype(np.float64)).astype(d.np) if d != dt.f64 else a / b
    assert out["q"].dtype == d.np
    assert _bits_equal(out["q"], want)


@pytest.mark.parametrize("d", [dt.f32, dt.f16, dt.f64], ids=str)
def test_triton_div_is_correctly_rounded(d):
    """The Triton rendering (``div_rn``; fp16 via one fp32 quotient) gives IEEE bits."""
    from triton_cases import make_kernel
    from lumc.backends.triton import TritonKernel
    from lumc.backends.triton.launch import to_numpy
    a, b = _specials(d.np, np.random.default_rng(1), n=900)
    k = make_kernel("pointwise", lambda x, y: (x.div(y), x.div(y).floor()),
                    [((len(a),), d), ((len(a),), d)])
    q, t = (to_numpy(o) for o in TritonKernel(k)(a, b))
    with np.errstate(all="ignore"):
        want = (a.astype(np.float64) / b.astype(np.float64)).astype(d.np)
    assert q.dtype == d.np and t.dtype == d.np
    assert _bits_equal(q, want)
    with np.errstate(all="ignore"):
        assert _bits_equal(t, np.floor(want))


def test_torch_replay_div():
    """The primitive graph replayed as torch (the compiled CPU path) divides in IEEE too."""
    from lumc.compiler.runtime.graph_torch import graph_module
    import torch
    a, b = _specials(np.float32, np.random.default_rng(2), n=600)
    gm = graph_module(_div_graph(dt.f32, len(a)))
    q, t = gm(torch.from_numpy(a), torch.from_numpy(b))
    with np.errstate(all="ignore"):
        want = a / b
    assert _bits_equal(q.numpy(), want)


def test_reciprocal_rewrite_is_fast_math_only():
    names = {r.name for r in all_rules()}
    assert rules_algebra.FAST_MATH and rules_algebra.FAST_MATH <= names
    assert all(r.numerics == "reassociating" for r in rules_algebra.fast_math_rules())
    default = {r.name for r in Saturator(Limits()).rules}
    fast = {r.name for r in Saturator(Limits(fast_math=True)).rules}
    assert not default & rules_algebra.FAST_MATH
    assert rules_algebra.FAST_MATH <= fast


def test_fast_math_reaches_the_egraph_only_when_asked(tmp_path, monkeypatch):
    """``lumc.compile(..., fast_math=True)`` (``lumc compile --fast-math``) loads the fast-math
    rules; by default they are left out, and a quotient stays IEEE through the compiled model."""
    import onnx
    from onnx import TensorProto as TP, helper as oh, numpy_helper as nh
    import lumc
    from lumc.compiler.core import egraph_pipeline
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    seen = []
    real = egraph_pipeline.saturator

    def spy(limits):
        seen.append(limits.fast_math)
        return real(limits)
    monkeypatch.setattr(egraph_pipeline, "saturator", spy)
    g = oh.make_graph([oh.make_node("Div", ["x", "c"], ["q"]), oh.make_node("Floor", ["q"], ["y"])],
                      "div", [oh.make_tensor_value_info("x", TP.FLOAT, [4])],
                      [oh.make_tensor_value_info("y", TP.FLOAT, [4])],
                      [nh.from_array(np.array(3.0, np.float32), "c")])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    x = np.array([14.999999, 6.0, -9.0, 2.9999998], np.float32)
    f = lumc.compile(m, budget="30s", device="sim:h200", db=TuningDatabase(tmp_path / "a.sqlite"))
    np.testing.assert_array_equal(f(x), np.floor(x / np.float32(3)))
    assert seen and not any(seen)
    seen.clear()
    lumc.compile(m, budget="30s", device="sim:h200", db=TuningDatabase(tmp_path / "b.sqlite"),
                 fast_math=True)
    assert seen and all(seen)


# ---- integer division: exact for every value of every integer dtype ------------------------------
INT_DTYPES = [dt.i8, dt.i16, dt.i32, dt.i64, dt.u8, dt.u16, dt.u32, dt.u64]


def _int_operands(d: dt.DType, rng, n: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of edge values (min, max, +-2**62, 2**53 + 1, zero remainders, +-1, 0) plus
    random full-range dividends over small and large divisors."""
    info = np.iinfo(d.np)
    lo, hi = int(info.min), int(info.max)
    edges = {lo, lo + 1, hi, hi - 1, 0, 1, 2, 3, 7, 255, 2 ** 62, 2 ** 61 + 1, 2 ** 53 + 1,
             2 ** 31, 2 ** 16 * 7, 6 * 2 ** 40}
    edges |= {-v for v in edges}
    edges = sorted(v for v in edges if lo <= v <= hi)
    a = [x for x in edges for _ in edges]
    b = [y for _ in edges for y in edges]
    big = rng.integers(lo, hi, n, dtype=d.np, endpoint=True)
    small = rng.integers(max(lo, -300), min(hi, 300), n, dtype=d.np, endpoint=True)
    a += big.tolist() * 2 + small.tolist()
    b += small.tolist() + big[::-1].tolist() + big.tolist()
    return np.array(a, dtype=d.np), np.array(b, dtype=d.np)


def _int_quotients(a: np.ndarray, b: np.ndarray, d: dt.DType) -> tuple[np.ndarray, np.ndarray]:
    """trunc(a / b) and floor(a / b) in Python integers, wrapped into ``d`` (``MIN / -1`` is
    ``MIN``, as torch's floor division); ``x / 0`` is 0, max or min by the sign of ``x``."""
    info = np.iinfo(d.np)
    trunc, floor = [], []
    for x, y in zip(a.tolist(), b.tolist()):
        if y == 0:
            t = f = 0 if x == 0 else (int(info.max) if x > 0 else int(info.min))
        else:
            f = x // y
            t = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
        trunc.append(t)
        floor.append(f)
    wrap = (lambda v: np.array(v, dtype=object) % 2 ** (8 * d.itemsize))
    as_d = (lambda v: wrap(v).astype(np.uint64).astype(d.np))
    return as_d(trunc), as_d(floor)


def _int_div_graph(d: dt.DType, n: int, const_b: np.ndarray | None = None) -> Graph:
    x = input_node("a", (n,), d)
    ins = {"a": x}
    if const_b is None:
        ins["b"] = input_node("b", (n,), d)
        y = Tensor(ins["b"])
    else:
        y = Tensor.const(const_b, d)
    return Graph(ins, {"t": Tensor(x).div(y).node, "f": Tensor(x).floordiv(y).node})


@pytest.mark.parametrize("d", INT_DTYPES, ids=str)
def test_reference_integer_division_is_exact(d):
    """``Tensor.div`` (ONNX ``Div``, torch trunc division) and ``Tensor.floordiv`` on integers
    equal Python's exact integer quotients, above 2**52 too (the f64 composition gave
    ``2**61 // 7 = 329406144173384832``, not ``...850``)."""
    a, b = _int_operands(d, np.random.default_rng(3))
    out = ReferenceExecutor(_int_div_graph(d, len(a)))({"a": a, "b": b})
    trunc, floor = _int_quotients(a, b, d)
    assert out["t"].dtype == d.np and out["f"].dtype == d.np
    np.testing.assert_array_equal(out["t"], trunc)
    np.testing.assert_array_equal(out["f"], floor)
    if d == dt.i64:
        hit = a == 2 ** 61
        assert (out["f"][hit & (b == 7)] == 329406144173384850).all()


def test_reference_integer_division_by_a_constant():
    """A constant divisor without zeros leaves out the division-by-zero select; the quotient is
    the same exact one (a scalar broadcast, as ``x // 7`` lowers)."""
    d = dt.i64
    a, _ = _int_operands(d, np.random.default_rng(4))
    for c in (7, -3, 1, -1):
        out = ReferenceExecutor(_int_div_graph(d, len(a), np.array(c)))({"a": a})
        trunc, floor = _int_quotients(a, np.full_like(a, c), d)
        np.testing.assert_array_equal(out["t"], trunc)
        np.testing.assert_array_equal(out["f"], floor)


@pytest.mark.parametrize("d", [dt.i64, dt.u64, dt.i32, dt.i8], ids=str)
def test_triton_integer_division_is_exact(d):
    """The same compositions rendered to Triton (the interpreter here) give the exact quotients
    and agree with the reference executor (``triton_cases.check``)."""
    from triton_cases import check, make_kernel
    a, b = _int_operands(d, np.random.default_rng(5), n=100)
    k = make_kernel("pointwise", lambda x, y: (x.div(y), x.floordiv(y)),
                    [((len(a),), d), ((len(a),), d)])
    tk = check(k, {"in0": a, "in1": b}, tol=(0, 0))
    from lumc.backends.triton.launch import to_numpy
    t, f = (to_numpy(o) for o in tk(a, b))
    trunc, floor = _int_quotients(a, b, d)
    np.testing.assert_array_equal(t, trunc)
    np.testing.assert_array_equal(f, floor)
