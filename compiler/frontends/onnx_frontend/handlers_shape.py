"""Handlers for constants, shapes, casts and pure data movement (views).

Everything here is a view or a constant in the IR, so these ops cost nothing at run time; shape
arguments that ONNX passes as tensors (``Reshape`` shape, ``Slice`` starts...) must be known at
import time, which the folder guarantees for any shape subgraph that does not read input data.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx

from lumc.compiler.frontends.onnx_frontend.loader import dtype_of
from lumc.compiler.frontends.onnx_frontend.registry import OpContext, constant, handler
from lumc.ir import dtypes as dt
from lumc.ir.errors import ModelError, ShapeError
from lumc.ir.tensor import Tensor, concat, normalize_axis, split


def _check_constant(node: onnx.NodeProto, opset: int) -> str | None:
    for a in node.attribute:
        if a.name in ("value_string", "value_strings"):
            return "string constant"
    return None


@handler("Constant", check=_check_constant)
def _constant(ctx: OpContext):
    a = ctx.attrs
    if "value" in a:
        return constant(ctx.tensor_attr("value"))
    if "value_float" in a:
        return constant(np.array(a["value_float"], dtype=np.float32))
    if "value_floats" in a:
        return constant(np.array(a["value_floats"], dtype=np.float32))
    if "value_int" in a:
        return constant(np.array(a["value_int"], dtype=np.int64))
    if "value_ints" in a:
        return constant(np.array(a["value_ints"], dtype=np.int64))
    raise ModelError("Constant has no supported value attribute")


@handler("ConstantOfShape")
def _constant_of_shape(ctx: OpContext):
    shape = ctx.const_ints(0, "shape")
    v = ctx.tensor_attr("value")
    v = np.zeros(1, np.float32) if v is None else v
    d = dt.from_numpy(v.dtype)
    return Tensor.full(shape, v.reshape(-1)[0], d)


@handler("Identity")
def _identity(ctx: OpContext):
    return ctx.input(0)


@handler("Shape")
def _shape(ctx: OpContext):
    shape = ctx.input(0).shape
    r = len(shape)
    start, end = ctx.attr("start", 0), ctx.attr("end", None)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = r if end is None else min(max(end + r if end < 0 else end, 0), r)
    return constant(np.array(shape[start:end], dtype=np.int64))


@handler("Size")
def _size(ctx: OpContext):
    return constant(np.array(ctx.input(0).numel, dtype=np.int64))


@handler("Reshape")
def _reshape(ctx: OpContext):
    x = ctx.input(0)
    shape = ctx.attr("shape") if ctx.opset < 5 else ctx.const_ints(1, "shape")
    allowzero = ctx.attr("allowzero", 0)
    if not allowzero:
        bad = [k for k, d in enumerate(shape) if d == 0 and k >= x.ndim]
        if bad:   # (a zero-size dim computed into the shape reads as "copy", as onnxruntime has it)
            raise ShapeError(f"shape {list(shape)} has 0 at position {bad[0]}, which allowzero=0 "
                             f"reads as 'copy input dim {bad[0]}', but the input {x.shape} has "
                             f"rank {x.ndim} (a zero-size dim reaching this Reshape?)")
        shape = [x.shape[k] if d == 0 else d for k, d in enumerate(shape)]
    return x.reshape(shape)


@handler("Flatten")
def _flatten(ctx: OpContext):
    x = ctx.input(0)
    axis = ctx.attr("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    if not 0 <= axis <= x.ndim:
        raise ShapeError(f"axis {ctx.attr('axis', 1)} out of range for rank {x.ndim}")
    return x.flatten(axis)


@handler("Transpose")
def _transpose(ctx: OpContext):
    x = ctx.input(0)
    perm = ctx.attr("perm") or list(reversed(range(x.ndim)))
    return x.permute(perm)


def _axes_arg(ctx: OpContext, first_input_opset: int, index: int = 1) -> list[int] | None:
    """Axes given as an attribute before ``first_input_opset`` and as input ``index`` from it."""
    if ctx.opset < first_input_opset:
        return ctx.attr("axes")
    return ctx.const_ints(index, "axes")


@handler("Squeeze")
def _squeeze(ctx: OpContext):
    axes = _axes_arg(ctx, 13)
    return ctx.input(0).squeeze(axes if axes else None)


@handler("Unsqueeze")
def _unsqueeze(ctx: OpContext):
    x = ctx.input(0)
    axes = _axes_arg(ctx, 13)
    if axes is None:
        raise ModelError("Unsqueeze needs axes")
    rank = x.ndim + len(axes)
    norm = [normalize_axis(a, rank) for a in axes]
    if len(set(norm)) != len(norm):
        raise ShapeError(f"repeated axes {axes}")
    return x.unsqueeze(norm)


@handler("Concat")
def _concat(ctx: OpContext):
    xs = [t for t in ctx.inputs if t is not None]
    axis = ctx.attr("axis", 1 if ctx.opset < 4 else None)
    if axis is None:
        raise ModelError("Concat needs an axis")
    return concat(xs, axis)


@handler("Split")
def _split(ctx: OpContext):
    x = ctx.input(0)
    axis = normalize_axis(ctx.attr("axis", 0), x.ndim)
    n = x.shape[axis]
    sizes = ctx.attr("split") if ctx.opset < 13 else ctx.const_ints(1, "split")
    if not sizes:
        parts = ctx.attr("num_outputs", ctx.n_outputs)
        if ctx.opset >= 18 and "num_outputs" in ctx.attrs:
            chunk = -(-n // parts)
            sizes = [min(chunk, max(n - k * chunk, 0)) for k in range(parts)]
        else:
            if n % parts:
                raise ShapeError(f"cannot split {n} evenly into {parts} outputs")
            sizes = [n // parts] * parts
    return split(x, sizes, axis)


@handler("Slice")
def _slice(ctx: OpContext):
    x = ctx.input(0)
    if ctx.opset < 10:
        starts, ends, axes, steps = ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes"), None
    else:
        starts, ends = ctx.const_ints(1, "starts"), ctx.const_ints(2, "ends")
        axes, steps = ctx.const_ints(3, "axes"), ctx.const_ints(4, "steps")
    if len(starts) != len(ends):
        raise ShapeError(f"starts {starts} and ends {ends} differ in length")
    if axes is not None and len(set(normalize_axis(a, x.ndim) for a in axes)) != len(axes):
        raise ShapeError(f"repeated axes {axes}")
    return x.slice(starts, ends, axes, steps)


@handler("Expand")
def _expand(ctx: OpContext):
    return ctx.input(0).broadcast_to(ctx.const_ints(1, "shape"))


def _cast_to(x, to, saturate: bool):
    """``Cast`` to ``to``; to a float8 type with ``saturate`` (the default) values beyond the
    type's range, infinities included, become its largest finite value (ONNX Cast-19). Float to
    integer (undefined in ONNX out of range): truncated, saturated to the type's min/max, NaN -> 0
    (``lumc.ir.ops.cast_array``)."""
    if saturate and to in dt.FLOAT8_DTYPES and x.dtype != to:
        if x.dtype.is_storage:
            x = x.cast(dt.f32)
        if x.dtype.is_float:
            big = float(ml_dtypes.finfo(to.np).max)
            x = x.clip(x.scalar_like(-big), x.scalar_like(big))
    return x.cast(to)


@handler("Cast")
def _cast(ctx: OpContext):
    return _cast_to(ctx.input(0), dtype_of(ctx.attr("to")), bool(ctx.attr("saturate", 1)))


@handler("CastLike")
def _cast_like(ctx: OpContext):
    return _cast_to(ctx.input(0), ctx.input(1).dtype, bool(ctx.attr("saturate", 1)))


def _check_dropout(node: onnx.NodeProto, opset: int) -> str | None:
    for a in node.attribute:
        if a.name == "is_test" and a.i == 0 and opset < 7:
            return "training mode (random)"
    return None


@handler("Dropout", check=_check_dropout)
def _dropout(ctx: OpContext):
    """Inference: identity; the mask output is all true (nothing dropped)."""
    x = ctx.input(0)
    if ctx.has_input(2):
        training = ctx.const_scalar(2, "training_mode")
        ratio = ctx.const_scalar(1, "ratio") if ctx.has_input(1) else 0.5
        if training and ratio != 0:
            from lumc.ir.errors import UnsupportedOpError
            raise UnsupportedOpError("Dropout in training mode is random; lumc compiles inference")
    if ctx.opset < 10:   # the mask had the input's type before opset 10
        return [x, Tensor.full(x.shape, 1, x.dtype)]
    return [x, Tensor.full(x.shape, True, dt.bool_)]


@handler("EyeLike")
def _eye_like(ctx: OpContext):
    x = ctx.input(0)
    if x.ndim != 2:
        raise ShapeError(f"EyeLike needs a 2-D input, got rank {x.ndim}")
    d = dtype_of(ctx.attr("dtype")) if "dtype" in ctx.attrs else x.dtype
    k = ctx.attr("k", 0)
    rows = Tensor.iota(x.shape, 0)
    cols = Tensor.iota(x.shape, 1)
    on = cols.eq(rows.add(Tensor.full(x.shape, k, dt.i64)))
    return on.where(Tensor.full(x.shape, 1, d), Tensor.full(x.shape, 0, d))


@handler("CenterCropPad")
def _center_crop_pad(ctx: OpContext):
    """Crop or zero-pad each listed axis to the target size around the center (the extra element
    of an odd difference goes to the end, as the ONNX reference)."""
    x = ctx.input(0)
    shape = ctx.const_ints(1, "shape")
    axes = ctx.attr("axes") or list(range(x.ndim))
    pads = [(0, 0)] * x.ndim
    for a, target in zip(axes, shape):
        a = normalize_axis(a, x.ndim)
        d = x.shape[a]
        lo = abs(target - d) // 2
        hi = abs(target - d) - lo
        pads[a] = (lo, hi) if target >= d else (-lo, -hi)
    return x.pad(pads)
