"""Integer bit operations from arithmetic: ``BitShift`` (opset 11 and the signed form of 28),
``BitwiseNot`` and ``BitwiseAnd/Or/Xor`` (bit planes by repeated floor-halving, recombined).

A left shift is a wrapping multiply by ``2^y`` (read from a constant table of the dtype, where
``2^(w-1)`` wraps to the sign bit). A right shift is a floor division by ``2^y``, exact for every
value (``Tensor.idiv``). Shift amounts outside ``[0, w)`` give the sign fill (``-1`` for a right
shift of a negative value, else 0), as the spec says. ``~x`` is ``-1 - x`` (signed) or
``max - x`` (unsigned), exact.
"""
from __future__ import annotations

import numpy as np

from lumc.compiler.frontends.onnx_frontend.registry import OpContext, constant, handler, lib
from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.tensor import Tensor


def _bits(x: Tensor) -> int:
    if not x.dtype.is_int:
        raise ShapeError(f"needs an integer tensor, got {x.dtype}")
    return x.dtype.itemsize * 8


@handler("BitShift", requires=["indexing.gather"])
def _bit_shift(ctx: OpContext):
    x, y = ctx.input(0), ctx.input(1)
    w = _bits(x)
    x, y = x._bcast(y)
    signed = x.dtype.kind == "int"
    zero = x.scalar_like(0)
    valid = y.lt(zero).logical_not().logical_and(y.lt(x.scalar_like(w)))
    ys = valid.where(y, zero).cast(dt.i64)
    # 2^k for k < w, wrapped into the dtype (2^(w-1) is the sign bit of a signed dtype)
    table = constant((np.uint64(1) << np.arange(w, dtype=np.uint64)).view(np.int64)
                     .astype(x.dtype.np))
    p = lib("indexing.gather")(table, ys, axis=0)
    if ctx.attr("direction") == "LEFT":
        return valid.where(x.mul(p), zero)
    fill = x.lt(zero).where(x.scalar_like(-1), zero) if signed else zero
    if signed:
        # 2^(w-1) does not fit the signed dtype: that shift is the sign fill
        valid = valid.logical_and(ys.lt(ys.scalar_like(w - 1)))
        p = valid.where(p, x.scalar_like(1))
    q = x.idiv(p)
    floor = q.sub(x.fmod(p).ne(zero).logical_and(x.lt(zero)).where(x.scalar_like(1), zero)) \
        if signed else q
    return valid.where(floor, fill)


@handler("BitwiseNot")
def _bitwise_not(ctx: OpContext):
    x = ctx.input(0)
    _bits(x)
    if x.dtype.kind == "uint":
        return x.scalar_like(x.dtype.max_value()).sub(x)
    return x.scalar_like(-1).sub(x)


def _bit_planes(x: Tensor, w: int) -> list[Tensor]:
    """The ``w`` two's-complement bits of ``x`` (i64 0/1 tensors, least significant first), by
    repeated floor-halving (exact: ``Tensor.idiv``)."""
    q = x.cast(dt.i64)
    two = q.scalar_like(2)
    planes = []
    for _ in range(w):
        bit = q.mod(two)                     # floor modulo: the bit, also for negative q
        planes.append(bit)
        q = q.sub(bit).idiv(two)
    return planes


@handler("BitwiseAnd", "BitwiseOr", "BitwiseXor")
def _bitwise(ctx: OpContext):
    a, b = ctx.input(0), ctx.input(1)
    w = _bits(a)
    a, b = a._bcast(b)
    op = ctx.node.op_type
    out = None
    for k, (pa, pb) in enumerate(zip(_bit_planes(a, w), _bit_planes(b, w))):
        if op == "BitwiseAnd":
            bit = pa.mul(pb)
        elif op == "BitwiseOr":
            bit = pa.add(pb).sub(pa.mul(pb))
        else:
            bit = pa.add(pb).mod(pa.scalar_like(2))
        # the top bit of a signed dtype weighs -2^(w-1); u64's 2^63 is the same bits in i64
        weight = -(1 << k) if (k == w - 1 and (a.dtype.kind == "int" or w == 64)) else (1 << k)
        term = bit.mul(bit.scalar_like(weight))
        out = term if out is None else out.add(term)
    return out.cast(a.dtype)
