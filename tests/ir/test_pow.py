"""``Tensor.pow`` on the reference executor against numpy: IEEE-754 ``pow`` (C99 Annex F.9.4.4) on a
grid of special and ordinary values for every float dtype, constant exponents, and exact integer
powers (wrapping like ``Mul``) with the ONNX reference's truncation for an integer base."""
import numpy as np
import pytest

from lumc.backends.reference import run_reference
from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, input_node
from lumc.ir.tensor import Tensor

SUB32 = float(np.float32(1e-45))    # the smallest fp32 subnormal, 2**-149
BASES = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, np.inf, -np.inf, np.nan,
         SUB32, -SUB32, 1e-40, -3e-39, 1.5, -7.25, 1e30, -1e30]
EXPONENTS = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 0.5, -0.5, np.inf, -np.inf, np.nan,
             2.0 ** 24 + 2, 2.0 ** 24 - 1, -(2.0 ** 24 - 1), 1e10, 1e10 + 1, 7.0, -7.0, 0.25, 1.5]


def grid(d: dt.DType):
    """Every (base, exponent) pair, flattened, in dtype ``d`` (values rounded to ``d``)."""
    x, y = np.meshgrid(np.array(BASES), np.array(EXPONENTS), indexing="ij")
    with np.errstate(all="ignore"):
        return x.ravel().astype(d.np), y.ravel().astype(d.np)


def run_pow(x, y):
    a = Tensor(input_node("x", x.shape, dt.from_numpy(x.dtype)))
    if isinstance(y, np.ndarray):
        b = Tensor(input_node("y", y.shape, dt.from_numpy(y.dtype)))
        g = Graph({"x": a.node, "y": b.node}, {"out": a.pow(b).node})
        return run_reference(g, {"x": x, "y": y})["out"]
    return run_reference(Graph({"x": a.node}, {"out": a.pow(y).node}), {"x": x})["out"]


def ieee_pow(x, y):
    """numpy's float64 ``pow`` (C99 Annex F) rounded once to ``x``'s dtype: the oracle. ``y`` is
    made a full array: numpy turns a scalar exponent 0.5 into ``sqrt`` (``sqrt(-0.0) = -0.0``)."""
    y = np.array(np.broadcast_to(np.asarray(y, np.float64), x.shape))
    with np.errstate(all="ignore"):
        return np.power(x.astype(np.float64), y).astype(x.dtype)


def assert_pow_equal(got, want, x, y, ulps=1):
    """Special results (NaN, ±inf, ±0, integers) equal, with the sign of zero; others within
    ``ulps`` units in the last place of ``want``."""
    assert got.dtype == want.dtype and got.shape == want.shape
    y = np.broadcast_to(y, x.shape)
    nan = np.isnan(want)
    bad = nan != np.isnan(got)
    exact = ~np.isfinite(want) | (want == 0)
    bad |= exact & ~nan & ((got != want) | (np.signbit(got) != np.signbit(want)))
    close = ~exact & ~nan
    err = np.abs(got[close].astype(np.float64) - want[close].astype(np.float64))
    bad[close] = err > ulps * np.spacing(np.abs(want[close])).astype(np.float64)
    assert not bad.any(), "pow differs at " + ", ".join(
        f"({x[i]!r}, {y[i]!r}): {got[i]!r} vs {want[i]!r}" for i in np.flatnonzero(bad)[:8])


@pytest.mark.parametrize("d", [dt.f32, dt.f64, dt.f16], ids=str)
def test_float_pow_special_and_ordinary_grid(d):
    x, y = grid(d)
    got = run_pow(x, y)
    # f64 has no wider type to compute in (error ~ |y log2 x| * 2**-52, see Tensor.pow)
    assert_pow_equal(got, ieee_pow(x, y), x, y, ulps=1 if d != dt.f64 else 2 ** 12)


def test_annex_f_cases_named():
    """The cases a user trial found wrong, each with its C99 F.9.4.4 value."""
    cases = [(-0.0, -1.0, -np.inf), (-0.0, -3.0, -np.inf), (0.0, -3.0, np.inf),
             (-0.0, -2.0, np.inf), (-0.0, -0.5, np.inf), (1.0, np.nan, 1.0), (1.0, np.inf, 1.0),
             (1.0, -np.inf, 1.0), (-1.0, np.inf, 1.0), (-1.0, -np.inf, 1.0), (np.nan, 0.0, 1.0),
             (np.nan, -0.0, 1.0), (-0.0, 3.0, -0.0), (-0.0, 2.0, 0.0), (-0.0, 0.5, 0.0),
             (-np.inf, 0.5, np.inf), (-np.inf, -0.5, 0.0), (-np.inf, 3.0, -np.inf),
             (-np.inf, -3.0, -0.0), (-2.0, 0.5, np.nan), (-1.0, np.nan, np.nan),
             (0.5, np.inf, 0.0), (0.5, -np.inf, np.inf), (-2.0, np.inf, np.inf),
             (-2.0, -np.inf, 0.0)]
    x = np.array([c[0] for c in cases], np.float32)
    y = np.array([c[1] for c in cases], np.float32)
    want = np.array([c[2] for c in cases], np.float32)
    assert_pow_equal(run_pow(x, y), want, x, y, ulps=0)


def test_ordinary_values_within_one_ulp():
    rng = np.random.default_rng(5)
    x = (np.exp(rng.uniform(-40, 40, 4096)) * rng.choice([-1, 1], 4096)).astype(np.float32)
    y = rng.uniform(-3, 3, 4096).astype(np.float32)
    y[::2] = np.round(y[::2] * 5)
    assert_pow_equal(run_pow(x, y), ieee_pow(x, y), x, y, ulps=1)


@pytest.mark.parametrize("c", [0, 1, 2, 3, 4, -1, -2, 5, 0.5, -0.5, 2.5, 64, -64])
def test_constant_exponents(c):
    with np.errstate(all="ignore"):
        x = np.array(BASES).astype(np.float32)
    assert_pow_equal(run_pow(x, c), ieee_pow(x, np.float32(c)), x, np.float32(c), ulps=1)


def wrapped_pow(x: int, y: int, d) -> int:
    """Exact ``x ** y`` wrapped to the integer dtype ``d`` (y >= 0)."""
    bits = 8 * np.dtype(d).itemsize
    r = pow(x, y, 2 ** bits)
    return r - 2 ** bits if np.dtype(d).kind == "i" and r >= 2 ** (bits - 1) else r


@pytest.mark.parametrize("d", [np.int64, np.int32, np.int8, np.uint8, np.uint64])
def test_integer_pow_exact_and_wrapping(d):
    signed = np.dtype(d).kind == "i"
    bases = [0, 1, 2, 3, 5, 7, 11, np.iinfo(d).max]
    bases += [-1, -2, -3, -7, np.iinfo(d).min] if signed else []
    exps = [0, 1, 2, 3, 7, 8, 15, 31, 33, 39, 62, 63, 64, 65, 100, int(np.iinfo(d).max)]
    exps = [e for e in exps if e <= np.iinfo(d).max]
    xs, ys = np.meshgrid(np.array(bases, d), np.array(exps, d), indexing="ij")
    got = run_pow(xs.ravel(), ys.ravel())
    want = np.array([wrapped_pow(int(a), int(b), d) for a, b in zip(xs.ravel(), ys.ravel())], d)
    np.testing.assert_array_equal(got, want)


def test_integer_pow_negative_exponent_truncates():
    x = np.array([2, -2, 3, 1, -1, -1, 1, 0, 9], np.int64)
    y = np.array([-1, -1, -2, -5, -3, -4, -(2 ** 62), -1, -(2 ** 63)], np.int64)
    want = np.array([0, 0, 0, 1, -1, 1, 1, np.iinfo(np.int64).max, 0], np.int64)
    np.testing.assert_array_equal(run_pow(x, y), want)
    # an int32 base with an int64 exponent: the exponent keeps its own type
    np.testing.assert_array_equal(run_pow(np.array([3, -1], np.int32), np.array([19, 2 ** 40 + 1])),
                                  np.array([3 ** 19, -1], np.int32))


def test_integer_base_float_exponent_truncates_like_the_onnx_reference():
    x = np.array([3, 3, 7, 3, -8, 4, -3, 2], np.int64)
    y = np.array([0.5, 1.7, 2.5, 2.9, 1 / 3, -0.5, 0.5, 62.0], np.float32)
    # onnx/reference/ops/op_pow.py: np.power(x, y).astype(x.dtype), a truncation; NaN ((-3) ** 0.5)
    # converts to 0 (lumc's Cast, see cast_array)
    with np.errstate(all="ignore"):
        w = np.power(x.astype(np.float64), y.astype(np.float64))
    want = np.where(np.isnan(w), 0.0, np.trunc(w)).astype(np.int64)
    np.testing.assert_array_equal(run_pow(x, y), want)
    np.testing.assert_array_equal(run_pow(x[:4], 0.5), np.array([1, 1, 2, 1], np.int64))


@pytest.mark.parametrize("d", [np.int32, np.int64])
def test_integer_base_integral_float_exponent_is_exact(d):
    """``9 ** 3.0`` was 728: exp2(3 log2 9) is an ulp under 729 in f64 and truncation kept it (the
    ONNX conformance case test_pow_types_int32_float32 fails that way). An integral exponent's
    value is an integer (or in [-1, 1]): rounded first, it truncates as numpy's exact one does."""
    x = np.arange(-12, 13, dtype=d)
    for e in range(-3, 12):
        y = np.full(x.shape, float(e), np.float32)
        with np.errstate(all="ignore"):
            want = np.power(x.astype(np.float64), y.astype(np.float64))
        ok = np.isfinite(want) & (np.abs(want) < np.iinfo(d).max)
        got = run_pow(x, y)
        np.testing.assert_array_equal(got[ok], want[ok].astype(d), err_msg=f"y = {e}")
