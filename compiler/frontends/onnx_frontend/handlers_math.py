"""Handlers for elementwise arithmetic, comparisons, logic, unary math, variadic ops, matmul/Gemm.

All of these map directly onto :class:`~lumc.ir.tensor.Tensor` methods with ONNX multidirectional
broadcasting; only the attribute plumbing (``Mod`` fmod, ``IsInf`` detect flags, ``Clip`` bounds
as attributes before opset 11, ``Gemm`` transposes and scales) lives here.
"""
from __future__ import annotations

import functools

import numpy as np

from lumc.compiler.frontends.onnx_frontend.registry import OpContext, handler, lib, scalar
from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.tensor import Tensor

_BINARY = {
    "Add": Tensor.add,
    "Sub": Tensor.sub,
    "Mul": Tensor.mul,
    "Div": Tensor.div,
    "Less": Tensor.lt,
    "LessOrEqual": Tensor.le,
    "Greater": Tensor.gt,
    "GreaterOrEqual": Tensor.ge,
    "Equal": Tensor.eq,
    "And": Tensor.logical_and,
    "Or": Tensor.logical_or,
    "Xor": Tensor.logical_xor,
}


@handler(*_BINARY)
def _binary(ctx: OpContext):
    a, b = ctx.input(0), ctx.input(1)
    if ctx.opset < 7 and ctx.attr("broadcast", 0) and "axis" in ctx.attrs:
        b = _legacy_broadcast(a, b, ctx.attr("axis"))
    return _BINARY[ctx.node.op_type](a, b)


def _legacy_broadcast(a: Tensor, b: Tensor, axis: int) -> Tensor:
    """Opset < 7 ``broadcast=1, axis=k``: ``b``'s dims align with ``a``'s starting at ``axis``."""
    axis = axis + a.ndim if axis < 0 else axis
    tail = a.ndim - axis - b.ndim
    return b.reshape(b.shape + (1,) * tail) if tail > 0 else b


@handler("Mod")
def _mod(ctx: OpContext):
    a, b = ctx.input(0), ctx.input(1)
    if ctx.attr("fmod", 0):
        return a.fmod(b)
    if not a.dtype.is_float:
        return a.mod(b)
    # floor modulo: fmod, moved by b where the signs differ; a zero result takes b's sign
    r = a.fmod(b)
    b = b.broadcast_to(r.shape)
    zero = r.scalar_like(0.0)
    fix = r.ne(zero).logical_and(r.lt(zero).logical_xor(b.lt(zero)))
    r = fix.where(r.add(b), r)
    signed_zero = b.lt(zero).where(r.scalar_like(-0.0), zero)
    return r.eq(zero).where(signed_zero, r)


@handler("Pow")
def _pow(ctx: OpContext):
    """IEEE-754 ``pow`` for floats, exact integer powers (see ``Tensor.pow``)."""
    return ctx.input(0).pow(ctx.input(1))


_UNARY = {
    "Abs": Tensor.abs,
    "Sign": Tensor.sign,
    "Reciprocal": Tensor.recip,
    "Sqrt": Tensor.sqrt,
    "Exp": Tensor.exp,
    "Log": Tensor.log,
    "Sin": Tensor.sin,
    "Cos": Tensor.cos,
    "Tanh": Tensor.tanh,
    "Sigmoid": Tensor.sigmoid,
    "Floor": Tensor.floor,
    "Ceil": Tensor.ceil,
    "Round": Tensor.round,
    "IsNaN": Tensor.isnan,
    "Not": Tensor.logical_not,
}


@handler(*_UNARY)
def _unary(ctx: OpContext):
    return _UNARY[ctx.node.op_type](ctx.input(0))


@handler("Neg")
def _neg(ctx: OpContext):
    return ctx.input(0).neg()


@handler("Tan")
def _tan(ctx: OpContext):
    """``sin(x) / cos(x)``: relative error grows like ``ulp(x) / |cos x|`` near odd multiples of
    pi/2 (f16/bf16 in f32, rounded once)."""
    return ctx.input(0).widened(lambda x: x.sin().div(x.cos()))


@handler("IsInf")
def _isinf(ctx: OpContext):
    return ctx.input(0).isinf(bool(ctx.attr("detect_positive", 1)),
                              bool(ctx.attr("detect_negative", 1)))


@handler("Erf", requires=["activations.erf"])
def _erf(ctx: OpContext):
    return lib("activations.erf")(ctx.input(0))


def _variadic(ctx: OpContext, op) -> Tensor:
    xs = [t for t in ctx.inputs if t is not None]
    return functools.reduce(op, xs)


@handler("Max")
def _max(ctx: OpContext):
    return _variadic(ctx, Tensor.maximum)


@handler("Min")
def _min(ctx: OpContext):
    return _variadic(ctx, Tensor.minimum)


def _widened_sum(xs: list[Tensor]) -> Tensor:
    """The sum of ``xs``; f16/bf16 summed in their f32 accumulator and left there for the caller
    to round once (as ``ReduceSum``/``ReduceMean`` and onnxruntime: summed in f16, three values
    of 60000 overflowed to inf, and ``2048 + 1 + 1`` lost both ones)."""
    acc = xs[0].dtype.accumulator
    return functools.reduce(Tensor.add, [x.cast(acc) for x in xs])


@handler("Sum")
def _sum(ctx: OpContext):
    xs = [t for t in ctx.inputs if t is not None]
    return _widened_sum(xs).cast(xs[0].dtype) if len(xs) > 1 else xs[0]


@handler("Mean")
def _mean(ctx: OpContext):
    """The sum divided by the count; f16/bf16 in f32, rounded once (a mean of f16 values near
    the top of the range is representable where their sum is not)."""
    xs = [t for t in ctx.inputs if t is not None]
    if len(xs) == 1:
        return xs[0]
    s = _widened_sum(xs)
    return s.div(scalar(len(xs), s.dtype)).cast(xs[0].dtype)


@handler("Clip")
def _clip(ctx: OpContext):
    x = ctx.input(0)
    if ctx.opset < 11:
        lo = ctx.attr("min")
        hi = ctx.attr("max")
        lo = None if lo is None else scalar(lo, x.dtype)
        hi = None if hi is None else scalar(hi, x.dtype)
    else:
        lo, hi = ctx.opt(1), ctx.opt(2)
    lo, hi = (None if b is None else b.reshape(()) if b.numel == 1 else b for b in (lo, hi))
    return x.clip(lo, hi)   # an x equal to a bound is kept: Clip(-0.0, 0) is -0.0 (onnxruntime)


@handler("MatMul")
def _matmul(ctx: OpContext):
    return ctx.input(0).matmul(ctx.input(1))


@handler("Gemm")
def _gemm(ctx: OpContext):
    a, b = ctx.input(0), ctx.input(1)
    if ctx.attr("transA", 0):
        a = a.transpose()
    if ctx.attr("transB", 0):
        b = b.transpose()
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    y = a.matmul(b)
    if alpha != 1.0:
        y = y.mul(scalar(alpha, y.dtype))
    c = ctx.opt(2)
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = c.mul(scalar(beta, c.dtype))
        y = y.add(c.broadcast_to(y.shape))
    return y


@handler("Einsum")
def _einsum(ctx: OpContext):
    from lumc.compiler.frontends.onnx_frontend.einsum import einsum
    return einsum(ctx.attr("equation"), [t for t in ctx.inputs if t is not None])


@handler("Shrink")
def _shrink(ctx: OpContext):
    x = ctx.input(0)
    lambd, bias = ctx.attr("lambd", 0.5), ctx.attr("bias", 0.0)
    lo, hi = x.scalar_like(-lambd), x.scalar_like(lambd)
    return x.lt(lo).where(x.add(x.scalar_like(bias)),
                          hi.lt(x).where(x.sub(x.scalar_like(bias)), x.scalar_like(0)))


@handler("Det", requires=["linalg.det"])
def _det(ctx: OpContext):
    return lib("linalg.det")(ctx.input(0))
