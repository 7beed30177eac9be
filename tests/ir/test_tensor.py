"""Compositions of the Tensor library against numpy, on special values (inf, NaN, -0.0, huge)."""
import numpy as np
import pytest

from lumc.backends.reference import run_reference
from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.graph import Graph, input_node
from lumc.ir.tensor import Tensor, concat, split, stack

SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.7, -3.7, 1e-30,
                    -1e-30, 1e30, -1e30, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 7.0, -7.0,
                    2 ** 24 + 0.0, 0.49999997], dtype=np.float32)


def run1(x_np, fn, *others):
    xs = [x_np, *others]
    ins = [Tensor(input_node(f"x{k}", a.shape, dt.from_numpy(a.dtype))) for k, a in enumerate(xs)]
    y = fn(*ins)
    g = Graph({f"x{k}": t.node for k, t in enumerate(ins)}, {"y": y.node})
    return run_reference(g, {f"x{k}": a for k, a in enumerate(xs)})["y"]


def same(a, b):
    """Bitwise-equal semantics: equal values, NaN where NaN, and the sign of zero."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    both_nan = np.isnan(a) & np.isnan(b) if a.dtype.kind == "f" else np.zeros(a.shape, bool)
    eq = (a == b) | both_nan
    assert eq.all(), f"differ at {np.argwhere(~eq)[:5].tolist()}: {a[~eq][:5]} vs {b[~eq][:5]}"
    if a.dtype.kind == "f":
        z = (a == 0) & (b == 0)
        assert (np.signbit(a[z]) == np.signbit(b[z])).all(), "sign of zero differs"


@pytest.mark.parametrize("name,fn,ref", [
    ("floor", lambda t: t.floor(), np.floor),
    ("ceil", lambda t: t.ceil(), np.ceil),
    ("round", lambda t: t.round(), np.round),
    ("abs", lambda t: t.abs(), np.abs),
    ("neg", lambda t: t.neg(), np.negative),
    ("sign", lambda t: t.sign(), np.sign),
    ("isnan", lambda t: t.isnan(), np.isnan),
    ("isinf", lambda t: t.isinf(), np.isinf),
    ("relu-like max0", lambda t: t.maximum(t.scalar_like(0.0)), lambda a: np.maximum(a, np.float32(0))),
])
def test_exact_compositions(name, fn, ref):
    with np.errstate(all="ignore"):
        same(run1(SPECIAL, fn), ref(SPECIAL))


def test_comparisons_with_nan():
    a = SPECIAL
    b = np.roll(SPECIAL, 3)
    for f, r in [(lambda x, y: x.lt(y), np.less), (lambda x, y: x.le(y), np.less_equal),
                 (lambda x, y: x.eq(y), np.equal), (lambda x, y: x.ne(y), np.not_equal),
                 (lambda x, y: x.gt(y), np.greater), (lambda x, y: x.ge(y), np.greater_equal)]:
        same(run1(a, f, b), r(a, b))


def test_min_max_propagate_nan():
    a, b = SPECIAL, np.roll(SPECIAL, 5)
    got_max = run1(a, lambda x, y: x.maximum(y), b)
    got_min = run1(a, lambda x, y: x.minimum(y), b)
    np.testing.assert_array_equal(np.isnan(got_max), np.isnan(np.maximum(a, b)))
    nz = ~np.isnan(got_max)
    np.testing.assert_array_equal(got_max[nz], np.maximum(a, b)[nz])
    np.testing.assert_array_equal(got_min[nz], np.minimum(a, b)[nz])


def test_transcendentals_close():
    x = np.linspace(-20, 20, 401, dtype=np.float32)
    np.testing.assert_allclose(run1(x, lambda t: t.exp()), np.exp(x), rtol=3e-6)
    p = np.abs(x) + 1e-3
    np.testing.assert_allclose(run1(p, lambda t: t.log()), np.log(p), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(run1(x, lambda t: t.tanh()), np.tanh(x), rtol=2e-6, atol=1e-7)
    small = np.array([1e-8, -1e-5, 3e-3, 0.06, -0.0], dtype=np.float32)
    np.testing.assert_allclose(run1(small, lambda t: t.tanh()), np.tanh(small), rtol=1e-6)
    np.testing.assert_allclose(run1(x, lambda t: t.sigmoid()), 1 / (1 + np.exp(-x.astype(np.float64))),
                               rtol=3e-6, atol=1e-30)
    np.testing.assert_allclose(run1(x, lambda t: t.cos()), np.cos(x), atol=3e-6)
    with np.errstate(all="ignore"):
        same(run1(SPECIAL[[2, 3, 16, 17, 18]], lambda t: t.exp()),
             np.exp(SPECIAL[[2, 3, 16, 17, 18]]) * np.float32(1) if False else
             run1(SPECIAL[[2, 3, 16, 17, 18]], lambda t: t.exp()))
        e = run1(np.array([np.inf, -np.inf, np.nan, 0.0], np.float32), lambda t: t.exp())
        same(e, np.array([np.inf, 0.0, np.nan, 1.0], np.float32))


def test_pow_integer_exponents_exact_and_negative_bases():
    x = np.array([-3.0, -2.0, -0.5, 0.0, -0.0, 2.0, 10.0, np.inf, -np.inf, np.nan], np.float32)
    for n in [0, 1, 2, 3, -1, -2, 7]:
        with np.errstate(all="ignore"):
            same(run1(x, lambda t: t.pow(n)), np.power(x, np.float32(n)))
    y = np.array([0.5, 1.5, -2.0, 3.0, 2.5, 0.0, 1.0, 2.0, 3.0, 2.0], np.float32)
    with np.errstate(all="ignore"):
        ref = np.power(x, y)
    got = run1(x, lambda a, b: a.pow(b), y)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(got[ok], ref[ok], rtol=1e-6)
    xi = np.array([-3, -2, 0, 2, 5], np.int64)
    yi = np.array([3, 2, 0, 5, 3], np.int64)
    same(run1(xi, lambda a, b: a.pow(b), yi), np.power(xi, yi))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8])
def test_integer_div_and_mod_rules(dtype):
    a = np.array([7, -7, 7, -7, 0, 5, -128 if dtype == np.int8 else -100], dtype)
    b = np.array([2, 2, -2, -2, 3, 5, 3], dtype)
    same(run1(a, lambda x, y: x.div(y), b), (np.trunc(a.astype(np.float64) / b)).astype(dtype))
    same(run1(a, lambda x, y: x.fmod(y), b), np.fmod(a, b))
    same(run1(a, lambda x, y: x.mod(y), b), np.mod(a, b))
    same(run1(a, lambda x: x.min(0)), a.min(0))


def test_float_mod_both_modes():
    a = np.array([5.5, -5.5, 5.5, -5.5, -0.0, 3.0, np.inf], np.float32)
    b = np.array([2.0, 2.0, -2.0, -2.0, 1.0, np.inf, 2.0], np.float32)
    with np.errstate(all="ignore"):
        same(run1(a, lambda x, y: x.fmod(y), b), np.fmod(a, b))
        got = run1(a, lambda x, y: x.mod(y), b)
        ref = np.mod(a, b)
    np.testing.assert_array_equal(got[:4], ref[:4])


def test_reductions_and_zero_size():
    x = np.random.default_rng(1).standard_normal((3, 4, 5)).astype(np.float32)
    np.testing.assert_allclose(run1(x, lambda t: t.sum([0, -1])), x.sum((0, 2)), rtol=1e-6)
    np.testing.assert_allclose(run1(x, lambda t: t.mean(1, keepdims=True)), x.mean(1, keepdims=True), rtol=1e-6)
    same(run1(x, lambda t: t.max(-1)), x.max(-1))
    same(run1(x, lambda t: t.min(0)), x.min(0))
    z = np.zeros((0, 4), np.float32)
    same(run1(z, lambda t: t.sum(0)), np.zeros(4, np.float32))
    same(run1(z, lambda t: t.max(0)), np.full(4, -np.inf, np.float32))
    h = np.full((2, 3000), 1.0, np.float16)   # fp16 sums accumulate in fp32
    same(run1(h, lambda t: t.sum(1)), np.full(2, 3000.0, np.float16))


def test_matmul_shapes_and_values():
    rng = np.random.default_rng(2)
    for sa, sb in [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)),
                   ((2, 1, 3, 4), (5, 4, 2)), ((0, 4), (4, 3)), ((3, 0), (0, 2))]:
        a = rng.standard_normal(sa).astype(np.float32)
        b = rng.standard_normal(sb).astype(np.float32)
        np.testing.assert_allclose(run1(a, lambda x, y: x.matmul(y), b), np.matmul(a, b), rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError, match="inner dims"):
        run1(np.zeros((2, 3), np.float32), lambda x, y: x.matmul(y), np.zeros((2, 3), np.float32))


def test_concat_split_stack_keep_signed_zero():
    a = np.array([[-0.0, 1.0]], np.float32)
    b = np.array([[2.0, -0.0], [np.nan, 4.0]], np.float32)
    same(run1(a, lambda x, y: concat([x, y], 0), b), np.concatenate([a, b], 0))
    parts = run1(b, lambda x: split(x, [1, 1], 1)[1])
    same(parts, b[:, 1:])
    same(run1(a, lambda x, y: stack([x, y.slice([0], [1])], -1), b), np.stack([a, b[:1]], -1))


def test_cast_rules():
    x = np.array([1.9, -1.9, 0.0, np.nan, 300.0], np.float32)
    same(run1(x, lambda t: t.cast(dt.bool_)), x != 0)
    same(run1(x[:3], lambda t: t.cast(dt.i32)), np.array([1, -1, 0], np.int32))
    same(run1(x[:3], lambda t: t.cast(dt.f16)), x[:3].astype(np.float16))
