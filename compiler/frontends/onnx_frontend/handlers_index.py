"""Handlers for indexing and layout ops: gathers, Tile, Pad, Where, OneHot, Trilu, Range,
DepthToSpace / SpaceToDepth. The work is in ``lumc.ir.library.indexing``; this module reads the
ONNX attributes and the (import-time constant) shape-like inputs."""
from __future__ import annotations

import numpy as np

from lumc.compiler.frontends.onnx_frontend.registry import OpContext, handler, lib
from lumc.ir.errors import ShapeError


@handler("Gather", requires=["indexing.gather"])
def _gather(ctx: OpContext):
    return lib("indexing.gather")(ctx.input(0), ctx.input(1), axis=ctx.attr("axis", 0))


@handler("GatherElements", requires=["indexing.gather_elements"])
def _gather_elements(ctx: OpContext):
    return lib("indexing.gather_elements")(ctx.input(0), ctx.input(1), axis=ctx.attr("axis", 0),
                                           check_range=True)


@handler("GatherND", requires=["indexing.gather_nd"])
def _gather_nd(ctx: OpContext):
    return lib("indexing.gather_nd")(ctx.input(0), ctx.input(1),
                                     batch_dims=ctx.attr("batch_dims", 0))


@handler("Tile", requires=["indexing.tile"])
def _tile(ctx: OpContext):
    return lib("indexing.tile")(ctx.input(0), ctx.const_ints(1, "repeats"))


@handler("Pad", requires=["indexing.pad"])
def _pad(ctx: OpContext):
    x = ctx.input(0)
    if ctx.opset < 11:
        pads = ctx.attr("pads", ctx.attr("paddings"))
        mode, value, axes = ctx.attr("mode", "constant"), ctx.attr("value", 0.0), None
    else:
        pads = ctx.const_ints(1, "pads")
        mode = ctx.attr("mode", "constant")
        value = ctx.const_scalar(2, "constant_value") if ctx.has_input(2) else 0
        axes = ctx.const_ints(3, "axes")
    return lib("indexing.pad")(x, pads, mode=mode, value=value, axes=axes)


@handler("Where")
def _where(ctx: OpContext):
    return ctx.input(0).where(ctx.input(1), ctx.input(2))


@handler("OneHot", requires=["indexing.one_hot"])
def _one_hot(ctx: OpContext):
    depth = ctx.const_scalar(1, "depth")
    return lib("indexing.one_hot")(ctx.input(0), int(depth), ctx.input(2),
                                   axis=ctx.attr("axis", -1))


@handler("Trilu", requires=["indexing.trilu"])
def _trilu(ctx: OpContext):
    k = ctx.const_scalar(1, "k") if ctx.has_input(1) else 0
    return lib("indexing.trilu")(ctx.input(0), k=int(k), upper=bool(ctx.attr("upper", 1)))


@handler("Range", requires=["indexing.range_"])
def _range(ctx: OpContext):
    start, limit, delta = (ctx.const_scalar(i, w) for i, w in enumerate(("start", "limit", "delta")))
    d = ctx.input(0).dtype
    for i in (1, 2):
        if ctx.input(i).dtype != d:
            raise ShapeError(f"Range inputs differ in dtype: {d} vs {ctx.input(i).dtype}")
    return lib("indexing.range_")(np.asarray(start, d.np).item(), np.asarray(limit, d.np).item(),
                                  np.asarray(delta, d.np).item(), d)


@handler("DepthToSpace", requires=["indexing.depth_to_space"])
def _depth_to_space(ctx: OpContext):
    return lib("indexing.depth_to_space")(ctx.input(0), ctx.attr("blocksize"),
                                          mode=ctx.attr("mode", "DCR"))


@handler("SpaceToDepth", requires=["indexing.space_to_depth"])
def _space_to_depth(ctx: OpContext):
    return lib("indexing.space_to_depth")(ctx.input(0), ctx.attr("blocksize"),
                                          mode=ctx.attr("mode", "DCR"))
