"""Element types of lumc tensors.

Thirteen dtypes: f64, f32, f16, bf16, i64, i32, i16, i8, u64, u32, u16, u8, bool. ``bf16`` is backed
by ``ml_dtypes.bfloat16`` (the same numpy extension type the ``onnx`` package uses), so numpy arrays
can hold it. Integer arithmetic wraps (two's complement), as numpy, torch and Triton do. Nine
storage-only types (float8, float4, int4, int2; ``ml_dtypes``) are held, moved and cast, never
computed on.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class DType:
    """An element type.

    Attributes:
        name: short name (``f32``); also its egglog and text-dump spelling.
        np: the numpy dtype used by the reference executor.
        itemsize: bytes per element.
        kind: ``"float"``, ``"int"``, ``"uint"``, ``"bool"`` or ``"storage"`` (held and cast only).
        triton: the Triton type name (``tl.float32``).
    """
    name: str
    np: np.dtype
    itemsize: int
    kind: str
    triton: str

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @property
    def is_storage(self) -> bool:
        """A storage-only type (float8, float4, int4, int2): no arithmetic, only casts and moves."""
        return self.kind == "storage"

    @property
    def accumulator(self) -> "DType":
        """The dtype reductions accumulate in: fp32 for f16/bf16, the dtype itself otherwise."""
        return f32 if self in (f16, bf16) else self

    def min_value(self):
        """Smallest value (``-inf`` for floats, the integer minimum otherwise, False for bool)."""
        if self.is_float:
            return -np.inf
        if self.is_bool:
            return False
        return np.iinfo(self.np).min

    def max_value(self):
        """Largest value (``inf`` for floats, the integer maximum otherwise, True for bool)."""
        if self.is_float:
            return np.inf
        if self.is_bool:
            return True
        return np.iinfo(self.np).max

    def __repr__(self) -> str:
        return self.name


f64 = DType("f64", np.dtype(np.float64), 8, "float", "tl.float64")
f32 = DType("f32", np.dtype(np.float32), 4, "float", "tl.float32")
f16 = DType("f16", np.dtype(np.float16), 2, "float", "tl.float16")
bf16 = DType("bf16", np.dtype(ml_dtypes.bfloat16), 2, "float", "tl.bfloat16")
i64 = DType("i64", np.dtype(np.int64), 8, "int", "tl.int64")
i32 = DType("i32", np.dtype(np.int32), 4, "int", "tl.int32")
i16 = DType("i16", np.dtype(np.int16), 2, "int", "tl.int16")
i8 = DType("i8", np.dtype(np.int8), 1, "int", "tl.int8")
u64 = DType("u64", np.dtype(np.uint64), 8, "uint", "tl.uint64")
u32 = DType("u32", np.dtype(np.uint32), 4, "uint", "tl.uint32")
u16 = DType("u16", np.dtype(np.uint16), 2, "uint", "tl.uint16")
u8 = DType("u8", np.dtype(np.uint8), 1, "uint", "tl.uint8")
bool_ = DType("bool", np.dtype(np.bool_), 1, "bool", "tl.int1")

# storage-only types (ONNX float8, float4, int4, int2): held, cast and moved, never computed on;
# a Cast to one rounds as ml_dtypes does (the ONNX reference's own conversion). The two OCP float8
# types NVIDIA GPUs load (sm_89+) have Triton types (a kernel reads them and casts them up); the
# rest have none
f8e4m3fn = DType("f8e4m3fn", np.dtype(ml_dtypes.float8_e4m3fn), 1, "storage", "tl.float8e4nv")
f8e4m3fnuz = DType("f8e4m3fnuz", np.dtype(ml_dtypes.float8_e4m3fnuz), 1, "storage", "")
f8e5m2 = DType("f8e5m2", np.dtype(ml_dtypes.float8_e5m2), 1, "storage", "tl.float8e5")
f8e5m2fnuz = DType("f8e5m2fnuz", np.dtype(ml_dtypes.float8_e5m2fnuz), 1, "storage", "")
f4e2m1 = DType("f4e2m1", np.dtype(ml_dtypes.float4_e2m1fn), 1, "storage", "")
i4 = DType("i4", np.dtype(ml_dtypes.int4), 1, "storage", "")
u4 = DType("u4", np.dtype(ml_dtypes.uint4), 1, "storage", "")
i2 = DType("i2", np.dtype(ml_dtypes.int2), 1, "storage", "")
u2 = DType("u2", np.dtype(ml_dtypes.uint2), 1, "storage", "")
STORAGE_DTYPES = (f8e4m3fn, f8e4m3fnuz, f8e5m2, f8e5m2fnuz, f4e2m1, i4, u4, i2, u2)
FLOAT8_DTYPES = (f8e4m3fn, f8e4m3fnuz, f8e5m2, f8e5m2fnuz)

ALL_DTYPES: tuple[DType, ...] = (f64, f32, f16, bf16, i64, i32, i16, i8, u64, u32, u16, u8, bool_,
                                 *STORAGE_DTYPES)
FLOAT_DTYPES = tuple(d for d in ALL_DTYPES if d.is_float)
INT_DTYPES = tuple(d for d in ALL_DTYPES if d.is_int)
BY_NAME = {d.name: d for d in ALL_DTYPES}
_BY_NP = {d.np: d for d in ALL_DTYPES}


def from_numpy(dt) -> DType:
    """The lumc dtype of a numpy dtype.

    Raises:
        KeyError: for numpy dtypes lumc does not support (complex, strings, float8...).
    """
    dt = np.dtype(dt)
    try:
        return _BY_NP[dt]
    except KeyError:
        raise KeyError(f"unsupported numpy dtype {dt}") from None


# Tolerances by dtype, relative to the largest magnitude of the reference (one table for the whole
# project: kernel numerics checks, ``lumc run --check`` and tests). Integers and bool are exact.
RTOL: dict[str, float] = {"f64": 1e-10, "f32": 1e-4, "f16": 1e-2, "bf16": 4e-2}


def rtol_for(d: DType) -> float:
    """The relative tolerance of ``d`` (0 for exact integer and bool dtypes)."""
    return RTOL.get(d.name, 0.0)


def native_order(a):
    """``a`` in this machine's byte order: a big-endian array (``>f4``, as a ``.npy`` written on
    such a machine or with ``dtype='>f4'``) becomes the same values as ``float32``; every other
    value is returned as it is. Inputs pass through here where they enter lumc, so such an array is
    not refused as another dtype."""
    if isinstance(a, np.ndarray) and not a.dtype.isnative:
        return a.astype(a.dtype.newbyteorder("="))
    return a
