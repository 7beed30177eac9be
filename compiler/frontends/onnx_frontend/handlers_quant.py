"""8-bit quantization: ``QuantizeLinear``, ``DequantizeLinear``, ``DynamicQuantizeLinear``
(per-tensor, per-axis and blocked scales), and the integer kernels ``MatMulInteger``,
``ConvInteger``, ``QLinearMatMul``, ``QLinearConv``, following the ONNX reference
(``onnx/reference/ops/op_quantize_linear.py`` and friends): ``saturate(round_half_even(x / scale) +
zp)``, ``(x - zp) * scale`` in f32, integer products accumulated exactly in i32 and requantized in
f64. 16/4/2-bit integer types saturate to their range; float8/float4 quantize as ``x / scale + zp``
saturated to the type's finite range and rounded to nearest even by the cast.
"""
from __future__ import annotations

import ml_dtypes

from lumc.compiler.frontends.onnx_frontend.loader import dtype_of
from lumc.compiler.frontends.onnx_frontend.registry import OpContext, handler, lib
from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.tensor import Tensor, normalize_axis

_RANGES = {dt.u8: (0, 255), dt.i8: (-128, 127), dt.u16: (0, 65535), dt.i16: (-32768, 32767),
           dt.i32: (-2 ** 31, 2 ** 31 - 1), dt.i4: (-8, 7), dt.u4: (0, 15), dt.i2: (-2, 1),
           dt.u2: (0, 3)}


def _broadcast_param(p: Tensor, shape: tuple[int, ...], axis: int, block: int) -> Tensor:
    """A scale or zero point shaped to broadcast against ``shape`` (as the reference's
    ``reshape_input``): scalar, per-axis vector, or blocks repeated ``block`` times along ``axis``."""
    if p.ndim == 0 or p.numel == 1:
        return p.reshape(())
    axis = normalize_axis(axis, len(shape))
    if not block:
        if p.ndim != 1 or p.shape[0] != shape[axis]:
            raise ShapeError(f"per-axis parameter {p.shape} does not fit axis {axis} of {shape}")
        dims = [1] * len(shape)
        dims[axis] = p.shape[0]
        return p.reshape(dims)
    rep = list(p.shape)
    rep.insert(axis + 1, block)
    q = p.unsqueeze([axis + 1]).expand(rep)
    flat = list(p.shape)
    flat[axis] *= block
    q = q.reshape(flat).slice([0], [shape[axis]], [axis])
    if q.shape != tuple(shape):
        raise ShapeError(f"blocked parameter {p.shape} does not fit {shape} (block {block})")
    return q


def _div(a: Tensor, b: Tensor) -> Tensor:
    """``a / b`` correctly rounded for f32/f16/bf16 (computed in f64, where ``a * (1/b)`` is within
    a f64 ulp of the quotient): ``Tensor.div``'s 1.5 ulp would move quotients off the exact
    ``k + 0.5`` ties that decide the rounding to an integer."""
    if a.dtype == dt.f64:
        return a.div(b)
    return a.cast(dt.f64).div(b.cast(dt.f64)).cast(a.dtype)


@handler("QuantizeLinear")
def _quantize(ctx: OpContext):
    x, scale, zp = ctx.input(0), ctx.input(1), ctx.opt(2)
    axis, block = ctx.attr("axis", 1), ctx.attr("block_size", 0)
    out = zp.dtype if zp is not None else (
        dtype_of(ctx.attr("output_dtype")) if ctx.attr("output_dtype") else dt.u8)
    s = _broadcast_param(scale, x.shape, axis, block)
    work = dtype_of(ctx.attr("precision")) if ctx.attr("precision") else (
        x.dtype if x.dtype == s.dtype else dt.f32)
    if out.is_storage and out not in (dt.i4, dt.u4, dt.i2, dt.u2):
        # float8/float4: x / scale + zp, saturated to the type's range (default), rounded by the cast
        v = _div(x.cast(work), s.cast(work))
        if zp is not None:
            v = v.add(_broadcast_param(zp, x.shape, axis, block).cast(dt.f32).cast(work))
        if ctx.attr("saturate", 1):
            big = float(ml_dtypes.finfo(out.np).max)
            v = v.clip(v.scalar_like(-big), v.scalar_like(big))
        return v.cast(out)
    if out not in _RANGES:
        raise ShapeError(f"quantized type {out} is not supported")
    # saturated in f64, which holds every integer the sum can be exactly: the rounded quotient
    # was cast to i32 first, and one past 2**31 wrapped (1e10 quantized to -128 in int8, 0 in
    # uint8, where the spec saturates to 127 and 255)
    q = _div(x.cast(work), s.cast(work)).round().cast(dt.f64)
    if zp is not None:
        q = q.add(_broadcast_param(zp, x.shape, axis, block).cast(dt.f64))
    lo, hi = _RANGES[out]
    return q.clip(q.scalar_like(lo), q.scalar_like(hi)).cast(out)


@handler("DequantizeLinear")
def _dequantize(ctx: OpContext):
    x, scale, zp = ctx.input(0), ctx.input(1), ctx.opt(2)
    axis, block = ctx.attr("axis", 1), ctx.attr("block_size", 0)
    out = dtype_of(ctx.attr("output_dtype")) if ctx.attr("output_dtype") else scale.dtype
    d = x.cast(dt.f32)
    if zp is not None:
        d = d.sub(_broadcast_param(zp, x.shape, axis, block).cast(dt.f32))
    return d.mul(_broadcast_param(scale, x.shape, axis, block).cast(dt.f32)).cast(out)


@handler("DynamicQuantizeLinear")
def _dynamic_quantize(ctx: OpContext):
    """uint8 quantization with the scale and zero point of the tensor's range (including 0)."""
    x = ctx.input(0)
    if x.dtype != dt.f32:
        raise ShapeError(f"needs f32, got {x.dtype}")
    zero = Tensor.full((), 0.0, dt.f32)
    maxx = x.max().maximum(zero)
    minx = x.min().minimum(zero)
    rng = maxx.eq(minx).where(zero.scalar_like(1.0), maxx.sub(minx))
    scale = rng.div(zero.scalar_like(255.0))
    zp = zero.sub(_div(minx, scale)).clip(zero, zero.scalar_like(255.0)).round()
    y = _div(x, scale).round().add(zp).clip(zero, zero.scalar_like(255.0))
    return [y.cast(dt.u8), scale, zp.cast(dt.u8)]


def _centered(x: Tensor, zp: Tensor | None, per_axis_shape=None) -> Tensor:
    """``x - zero_point`` in i32 (exact); a vector zero point is reshaped to ``per_axis_shape``."""
    v = x.cast(dt.i32)
    if zp is None:
        return v
    z = zp.cast(dt.i32)
    if z.numel == 1:
        z = z.reshape(())
    elif per_axis_shape is not None:
        z = z.reshape(per_axis_shape)
    return v.sub(z)


def _requantize(acc: Tensor, multiplier: Tensor, zp: Tensor | None, like: dt.DType) -> Tensor:
    """``saturate(round_half_even(acc * multiplier + zp))`` computed in f64 (the reference
    promotes the i32 accumulator times the float multiplier to f64)."""
    d = acc.cast(dt.f64).mul(multiplier.cast(dt.f64))
    out = like
    if zp is not None:
        d = d.add(zp.cast(dt.f64).reshape(()) if zp.numel == 1 else zp.cast(dt.f64))
        out = zp.dtype
    lo, hi = _RANGES[out]
    return d.round().clip(d.scalar_like(lo), d.scalar_like(hi)).cast(out)


def _scale(s: Tensor, per_axis_shape=None) -> Tensor:
    if s.numel == 1:
        return s.reshape(())
    return s.reshape(per_axis_shape) if per_axis_shape is not None else s


@handler("MatMulInteger")
def _matmul_integer(ctx: OpContext):
    a, b = ctx.input(0), ctx.input(1)
    return _centered(a, ctx.opt(2), (-1, 1)).matmul(_centered(b, ctx.opt(3)))


@handler("QLinearMatMul")
def _qlinear_matmul(ctx: OpContext):
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = (ctx.opt(i) for i in range(8))
    acc = _centered(a, a_zp, (-1, 1)).matmul(_centered(b, b_zp))
    # the multiplier in the scales' dtype, as the reference computes it
    m = _div(_scale(a_s, (-1, 1)).mul(_scale(b_s)), _scale(y_s))
    return _requantize(acc, m, y_zp, a.dtype)


def _conv_attrs(ctx: OpContext) -> dict:
    return dict(strides=ctx.attr("strides"), pads=ctx.attr("pads"), dilations=ctx.attr("dilations"),
                auto_pad=ctx.attr("auto_pad", "NOTSET"), group=ctx.attr("group", 1))


@handler("ConvInteger", requires=["conv.conv"])
def _conv_integer(ctx: OpContext):
    x, w = ctx.input(0), ctx.input(1)
    wz_shape = (-1,) + (1,) * (w.ndim - 1)
    return lib("conv.conv")(_centered(x, ctx.opt(2)), _centered(w, ctx.opt(3), wz_shape),
                            **_conv_attrs(ctx))


@handler("QLinearConv", requires=["conv.conv"])
def _qlinear_conv(ctx: OpContext):
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, bias = (ctx.opt(i) for i in range(9))
    per_channel = (-1,) + (1,) * (w.ndim - 1)
    acc = lib("conv.conv")(_centered(x, x_zp), _centered(w, w_zp, per_channel),
                           None if bias is None else bias.cast(dt.i32), **_conv_attrs(ctx))
    m = _div(_scale(x_s).mul(_scale(w_s, (1, -1) + (1,) * (w.ndim - 2))), _scale(y_s))
    return _requantize(acc, m, y_zp, x.dtype)
