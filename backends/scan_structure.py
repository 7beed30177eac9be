"""The scan structure of a triangular contraction: ``out[..., i, ...] = sum_j M[i, j] v[..., j, ...]``
with ``M`` the 0/1 mask ``j <= i`` (``j < i`` exclusive, mirrored when reversed) that
``lumc.ir.library.reduce.cumsum`` builds, read as a prefix sum (ONNX ``CumSum``) instead of ``L^2``
multiply-adds.

:func:`scan_of` recognizes it on a ``SumReduce`` node of a model graph or of a kernel's meaning:

    SumReduce(Mul(mask_view, v_view), (k,))        # big = [..., i, j, ...], i at k-1, j at k
    mask = Where(LessThan(Iota a, Iota b) [negated by Where(c, False, True)], 1, 0)   # [n, n]

The mask is read at ``(i, j)`` (strides ``n`` and ``1`` into the contiguous ``[n, n]`` mask, 0
elsewhere) and ``v`` is broadcast along ``i`` (stride 0). A scan equals the contraction only where
``v`` is finite: a masked product ``0 * inf`` is NaN in the contraction (and ``0 * -x`` a ``-0.0``
term), so a float ``v`` must be finite by construction (integers cast to a float whose range
holds them, not int32 to f16; finite constants, ``Where`` selections of them, and the library's
``where(x < inf, where(-inf < x, x, 0), 0)``), which the library's float ``cumsum`` contracts (it
counts infinities in two more scans of 0/1 indicators).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes

from lumc.ir.graph import Node


@dataclass(frozen=True)
class ScanSpec:
    """A triangular contraction read as a scan.

    Attributes:
        red: the ``SumReduce`` node (shape ``big`` with axis ``k`` kept as 1).
        operand: the ``v`` side of the product (shape ``big``, stride 0 along ``k - 1``).
        k: the reduced axis ``j`` of ``big``; the scan axis of the result is ``k - 1``.
        n: elements along the scan axis.
        exclusive: ``j < i`` (the sum of the elements before), else ``j <= i``.
        reverse: mirrored (``j > i`` / ``j >= i``: suffix sums).
    """
    red: Node
    operand: Node
    k: int
    n: int
    exclusive: bool
    reverse: bool

    @property
    def rows(self) -> tuple[int, ...]:
        """The result's dims other than the scan axis (and the kept 1), in order."""
        return tuple(d for a, d in enumerate(self.red.shape) if a not in (self.k - 1, self.k))


def _scalar(n: Node):
    """The value of a scalar constant, seen through broadcast views, else None (a masked view,
    padding, reads 0 outside its mask: not that scalar everywhere)."""
    while n.op == "View":
        if n.arg.mask is not None:
            return None
        n = n.srcs[0]
    if n.op == "Constant" and n.numel == 1:
        return n.arg.value.reshape(-1)[0].item()
    return None


def _iota_axes(c: Node, n: int) -> tuple[int, int] | None:
    """``(a, b)`` when ``c`` is ``LessThan(Iota axis a, Iota axis b)`` over ``[n, n]``."""
    if c.op != "LessThan" or c.shape != (n, n):
        return None
    ia, ib = c.srcs
    if ia.op != "Iota" or ib.op != "Iota" or ia.shape != (n, n) or ib.shape != (n, n):
        return None
    a, b = ia.arg.axis, ib.arg.axis
    return (a, b) if {a, b} == {0, 1} else None


def _mask_kind(m: Node, n: int) -> tuple[bool, bool] | None:
    """``(exclusive, reverse)`` of a triangular 0/1 mask ``m`` (``[n, n]``, rows i, columns j)."""
    if m.op != "Where" or m.shape != (n, n) or _scalar(m.srcs[1]) != 1 or _scalar(m.srcs[2]) != 0:
        return None
    c = m.srcs[0]
    strict = _iota_axes(c, n)
    if strict is not None:                    # i < j (reverse) or j < i (forward)
        return True, strict == (0, 1)
    if c.op == "Where" and _scalar(c.srcs[1]) is False and _scalar(c.srcs[2]) is True:
        neg = _iota_axes(c.srcs[0], n)        # not (i < j): j <= i; not (j < i): j >= i
        if neg is not None:
            return False, neg == (1, 0)
    return None


def _reads_at(view: Node, k: int, n: int, along: dict[int, int]) -> bool:
    """Whether ``view`` (shape ``big``) reads its source at stride ``along[a]`` on axis ``a`` and
    0 on every other axis of extent > 1 (offset 0, no mask)."""
    v = view.arg
    if v.offset != 0 or v.mask is not None:
        return False
    return all(d == 1 or s == along.get(a, 0) for a, (s, d) in enumerate(zip(v.strides, v.shape)))


def _float_max(d) -> float:
    """The largest finite value of float dtype ``d``."""
    return float(ml_dtypes.finfo(d.np).max)


def finite_by_construction(v: Node, depth: int = 8) -> bool:
    """Whether every value of ``v`` is finite whatever its inputs (see the module docstring)."""
    if not v.dtype.is_float:
        return True
    if depth == 0:
        return False
    if v.op == "View":
        return finite_by_construction(v.srcs[0], depth - 1)
    if v.op == "Constant" and v.numel == 1:
        return math.isfinite(float(v.arg.value.reshape(-1)[0]))
    if v.op == "Cast":     # an integer the float's range holds (int32 -> f16 overflows to inf)
        src = v.srcs[0].dtype
        return src.is_bool or (src.is_int and float(src.max_value()) <= _float_max(v.dtype))
    if v.op == "Where":
        c, a, b = v.srcs
        if not finite_by_construction(b, depth - 1):
            return False
        if finite_by_construction(a, depth - 1):
            return True
        # where(x < inf, where(-inf < x, x, f), f): x selected only where it is finite
        if c.op == "LessThan" and _scalar(c.srcs[1]) == math.inf and a.op == "Where":
            x = c.srcs[0]
            c2, a2, b2 = a.srcs
            return (c2.op == "LessThan" and _scalar(c2.srcs[0]) == -math.inf and c2.srcs[1] is x
                    and a2 is x and finite_by_construction(b2, depth - 1))
    return False


def scan_of(red: Node, finite: bool = False) -> ScanSpec | None:
    """The scan a ``SumReduce`` node computes, or None when it is not a triangular contraction
    of a finite operand (see the module docstring). ``finite``: the operand is known finite (a
    kernel's meaning reads it from memory when another kernel computed it; the form was checked
    on the model graph, ``lumc.compiler.core.fusion``)."""
    if red.op != "SumReduce" or len(red.arg) != 1 or red.srcs[0].op != "Mul":
        return None
    prod = red.srcs[0]
    big = prod.shape
    k = int(red.arg[0]) % max(len(big), 1)
    if k < 1 or big[k - 1] != big[k]:
        return None
    n = big[k]
    if n == 0:     # an empty scan axis: nothing to read or write, whatever the mask
        return ScanSpec(red, prod.srcs[1], k, 0, False, False)
    for mask_side, v_side in (prod.srcs, prod.srcs[::-1]):
        m = mask_side.srcs[0] if mask_side.op == "View" else mask_side
        kind = _mask_kind(m, n)
        if kind is None:
            continue
        if mask_side.op == "View" and not _reads_at(mask_side, k, n, {k - 1: n, k: 1}):
            return None
        if mask_side.op != "View" and big != (n, n):
            return None
        if v_side.op != "View" or v_side.shape != big or (v_side.arg.strides[k - 1] != 0 and n > 1):
            return None
        if not finite and not finite_by_construction(v_side.srcs[0]):
            return None
        return ScanSpec(red, v_side, k, n, kind[0], kind[1])
    return None


__all__ = ["ScanSpec", "scan_of", "finite_by_construction"]
