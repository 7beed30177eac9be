"""Handlers for reductions: ``Reduce*`` (axes as an attribute, or as an input from opset 13 for
ReduceSum and 18 for the rest), ``ArgMax``/``ArgMin``, ``CumSum`` and ``CumProd``."""
from __future__ import annotations

from lumc.compiler.frontends.onnx_frontend.registry import OpContext, handler, lib
from lumc.ir.tensor import Tensor, normalize_axis

_KINDS = {
    "ReduceSum": "sum",
    "ReduceMean": "mean",
    "ReduceMax": "max",
    "ReduceMin": "min",
    "ReduceProd": "prod",
    "ReduceL1": "l1",
    "ReduceL2": "l2",
    "ReduceLogSum": "log_sum",
    "ReduceLogSumExp": "log_sum_exp",
    "ReduceSumSquare": "sum_square",
}


@handler(*_KINDS, requires=["reduce.reduce"])
def _reduce(ctx: OpContext):
    op = ctx.node.op_type
    axes_as_input = ctx.opset >= (13 if op == "ReduceSum" else 18)
    axes = ctx.const_ints(1, "axes") if axes_as_input else ctx.attr("axes")
    return lib("reduce.reduce")(ctx.input(0), _KINDS[op], axes or None,
                                keepdims=bool(ctx.attr("keepdims", 1)),
                                noop_with_empty_axes=bool(ctx.attr("noop_with_empty_axes", 0))
                                and axes_as_input)


@handler("ArgMax", "ArgMin", requires=["reduce.argmax", "reduce.argmin"])
def _arg(ctx: OpContext):
    fn = lib("reduce.argmax" if ctx.node.op_type == "ArgMax" else "reduce.argmin")
    return fn(ctx.input(0), axis=ctx.attr("axis", 0), keepdims=bool(ctx.attr("keepdims", 1)),
              select_last_index=bool(ctx.attr("select_last_index", 0)))


@handler("CumSum", requires=["reduce.cumsum"])
def _cumsum(ctx: OpContext):
    return lib("reduce.cumsum")(ctx.input(0), int(ctx.const_scalar(1, "axis")),
                                exclusive=bool(ctx.attr("exclusive", 0)),
                                reverse=bool(ctx.attr("reverse", 0)))


@handler("CumProd", requires=["reduce.reduce"])
def _cumprod(ctx: OpContext):
    """``out[i] = prod over j <= i of x[j]`` (``j < i`` exclusive, mirrored when reversed) as a
    product-reduction over a triangular window (``O(n^2)`` along the axis)."""
    x = ctx.input(0)
    axis = normalize_axis(int(ctx.const_scalar(1, "axis")), x.ndim)
    n = x.shape[axis]
    i, j = Tensor.iota((n, n), 0), Tensor.iota((n, n), 1)
    if ctx.attr("reverse", 0):
        i, j = j, i
    keep = j.lt(i) if ctx.attr("exclusive", 0) else i.lt(j).logical_not()
    big = x.shape[:axis] + (n, n) + x.shape[axis + 1:]
    keep = keep.reshape((1,) * axis + (n, n) + (1,) * (x.ndim - axis - 1)).expand(big)
    xs = x.unsqueeze([axis]).expand(big)
    terms = keep.where(xs, xs.scalar_like(1))
    return lib("reduce.reduce")(terms, "prod", [axis + 1], keepdims=False)
