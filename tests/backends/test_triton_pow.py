"""``pow`` in a generated Triton kernel (the interpreter on CPU) against numpy's float64 ``pow``
rounded to the kernel's dtype: IEEE-754 special values (C99 Annex F.9.4.4) bit for bit, with the
sign of zero, ordinary values within 1 ulp; exact integer powers."""
from __future__ import annotations

import numpy as np
import pytest

from lumc.backends.triton import TritonKernel
from lumc.backends.triton.launch import to_numpy
from lumc.ir import dtypes as dt
from triton_cases import check, make_kernel

SUB32 = float(np.float32(1e-45))
BASES = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, np.inf, -np.inf, np.nan,
         SUB32, -SUB32, 1e-40, -3e-39, 1.5, -7.25, 1e30]
EXPONENTS = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 0.5, -0.5, np.inf, -np.inf, np.nan,
             2.0 ** 24 + 2, 2.0 ** 24 - 1, -(2.0 ** 24 - 1), 1e10, 7.0, -7.0, 1.5]


def _kernel_pow(x: np.ndarray, y: np.ndarray, d: dt.DType) -> tuple[np.ndarray, str]:
    k = make_kernel("pointwise", lambda a, b: a.pow(b), [(x.shape, d), (y.shape, d)])
    check(k, {"in0": x, "in1": y}, tol=(0, 0))   # the reference executor agrees exactly
    tk = TritonKernel(k)
    (out,) = tk(x, y)
    return to_numpy(out), tk.source


def _assert_ieee(got, x, y, ulps):
    with np.errstate(all="ignore"):
        want = np.power(x.astype(np.float64), y.astype(np.float64)).astype(x.dtype)
    nan = np.isnan(want)
    exact = ~np.isfinite(want) | (want == 0)
    bad = nan != np.isnan(got)
    bad |= exact & ~nan & ((got != want) | (np.signbit(got) != np.signbit(want)))
    close = ~exact & ~nan
    err = np.abs(got[close].astype(np.float64) - want[close].astype(np.float64))
    bad[close] = err > ulps * np.spacing(np.abs(want[close])).astype(np.float64)
    assert not bad.any(), [(x[i], y[i], got[i], want[i]) for i in np.flatnonzero(bad)[:8]]


@pytest.mark.parametrize("d", [dt.f32, dt.f16], ids=str)
def test_pow_special_grid_in_kernel(d):
    gx, gy = np.meshgrid(np.array(BASES), np.array(EXPONENTS), indexing="ij")
    with np.errstate(all="ignore"):
        x, y = gx.ravel().astype(d.np), gy.ravel().astype(d.np)
    got, source = _kernel_pow(x, y, d)
    _assert_ieee(got, x, y, ulps=1)
    # the magnitude is computed one precision up (f32 in f64, f16 in f32) and rounded once
    assert ("tl.float64" in source) == (d == dt.f32)


def test_pow_ordinary_values_within_one_ulp_in_kernel():
    rng = np.random.default_rng(11)
    x = (np.exp(rng.uniform(-40, 40, 1023)) * rng.choice([-1, 1], 1023)).astype(np.float32)
    y = rng.uniform(-3, 3, 1023).astype(np.float32)
    y[::2] = np.round(y[::2] * 5)
    got, _ = _kernel_pow(x, y, dt.f32)
    _assert_ieee(got, x, y, ulps=1)


def test_integer_pow_exact_in_kernel():
    x = np.array([3, 3, -3, 7, 2, -2, 5, 1, -1, -1, 0, 2, 3, 2], np.int64)
    y = np.array([33, 39, 39, 22, 62, 63, 27, 10 ** 12, 10 ** 12 + 1, -3, 0, 64, 40, -1], np.int64)
    k = make_kernel("pointwise", lambda a, b: a.pow(b), [((14,), dt.i64), ((14,), dt.i64)])
    check(k, {"in0": x, "in1": y})
    (out,) = TritonKernel(k)(x, y)
    want = [pow(int(a), int(b), 2 ** 64) if b >= 0 else (int(a) ** int(b) if abs(a) == 1 else 0)
            for a, b in zip(x, y)]
    want = np.array([w - 2 ** 64 if w >= 2 ** 63 else w for w in want], np.int64)
    np.testing.assert_array_equal(to_numpy(out), want)
