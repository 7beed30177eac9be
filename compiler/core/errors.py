"""Error metrics of the numerics checks and the quality report: a kernel's or a plan's outputs
against a reference, in float64, with NaN and inf required to match exactly (IEEE: matching
infinities are no error)."""
from __future__ import annotations

import numpy as np

from lumc.ir import dtypes as dt

# the storage types that are floats (NaN-capable): float8 and float4
_FLOAT_STORAGE = frozenset(d.np for d in (*dt.FLOAT8_DTYPES, dt.f4e2m1))


def _finite_errors(got: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(|got - ref|, |ref|)`` in float64 over the finite reference values, or None where the
    shapes differ or the NaN/inf values do not match exactly (an error of ``inf``)."""
    g = np.asarray(got, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if g.shape != r.shape:
        return None
    fin = np.isfinite(r)
    if not np.array_equal(np.isnan(g), np.isnan(r)) or not np.array_equal(g[~fin & ~np.isnan(r)],
                                                                          r[~fin & ~np.isnan(r)]):
        return None
    return np.abs(g[fin] - r[fin]), np.abs(r[fin])


def exactly_equal(got: np.ndarray, ref: np.ndarray) -> bool:
    """Elementwise equality of a non-float output (integers, bool, the storage types), as the
    numerics checks require it: float8/float4 values are floats to ml_dtypes, so NaN equals NaN
    there (``np.array_equal`` alone failed every kernel whose float8 output holds a NaN)."""
    g, r = np.asarray(got), np.asarray(ref)
    nan_able = g.dtype in _FLOAT_STORAGE and r.dtype in _FLOAT_STORAGE
    return g.shape == r.shape and bool(np.array_equal(g, r, equal_nan=nan_able))


def max_abs_error(got: np.ndarray, ref: np.ndarray) -> float:
    """``max|got - ref|`` over finite reference values, with NaN/inf required to match exactly (a
    mismatch there is ``inf``); 0 where nothing is finite. Matching infinities are no error: their
    difference is NaN in IEEE arithmetic, which made a report's max abs error NaN."""
    e = _finite_errors(got, ref)
    if e is None:
        return float("inf")
    return float(e[0].max()) if e[0].size else 0.0


def max_rel_error(got: np.ndarray, ref: np.ndarray, floor: float = 0.0) -> float:
    """``max|got - ref| / max(max|ref|, floor)`` over finite reference values, with NaN/inf
    required to match exactly (a mismatch there is an error of ``inf``)."""
    e = _finite_errors(got, ref)
    if e is None:
        return float("inf")
    diff, mag = e
    if not diff.size:
        return 0.0
    scale = max(float(mag.max()), floor, np.finfo(np.float32).tiny)
    return float(diff.max() / scale)
