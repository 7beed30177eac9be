"""Data-dependent selection with static shapes: ``TopK``, ``ScatterElements`` / ``Scatter`` /
``ScatterND`` and ``ReverseSequence``; and those whose output size is a count of their input's
nonzeros or distinct values, computed when that input is known at compile time: ``Compress`` (a
``Gather`` of the selected slices of any data), ``NonZero`` and ``Unique`` (constants).

There is no sort or scatter primitive, so these are built from comparisons and reductions over an
extra axis: ``TopK`` ranks every element against every other along the axis (``O(n^2)`` compares),
and a scatter compares every output position with every update's target index (``O(positions x
updates)``, :mod:`lumc.ir.library.scatter`). Selected values are read with ``Gather`` (exact, NaN
and -0.0 preserved).
"""
from __future__ import annotations

import numpy as np

from lumc.compiler.frontends.onnx_frontend.registry import OpContext, constant, handler, lib
from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.library.scatter import move_last
from lumc.ir.tensor import Tensor, normalize_axis


@handler("TopK", requires=["indexing.gather_elements"])
def _top_k(ctx: OpContext):
    """The k largest (or smallest) along ``axis``, sorted, ties broken by the lower index (as
    ONNX specifies). NaN orders above every number, as numpy's sort, onnxruntime and PyTorch
    order it (the first NaNs for ``largest``, the last for smallest), so every slice is ranked by
    a total order and the result is a selection of its elements."""
    x = ctx.input(0)
    k = int(ctx.const_scalar(1, "k")) if ctx.opset >= 10 else ctx.attr("k")
    axis = normalize_axis(ctx.attr("axis", -1), x.ndim)
    largest = bool(ctx.attr("largest", 1))
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise ShapeError(f"k = {k} out of range for an axis of {n}")
    xt, back = move_last(x, axis)
    lead = xt.shape[:-1]
    a = xt.unsqueeze([-1]).expand(lead + (n, n))      # x_i along axis -2
    b = xt.unsqueeze([-2]).expand(lead + (n, n))      # x_j along axis -1
    before = b.gt(a) if largest else b.lt(a)
    same = b.eq(a)
    if x.dtype.is_float:                                  # NaN above every number
        an, bn = a.ne(a), b.ne(b)
        nan_first = bn.logical_and(an.logical_not()) if largest else \
            an.logical_and(bn.logical_not())
        before = before.logical_or(nan_first)
        same = same.logical_or(an.logical_and(bn))
    i = Tensor.iota(lead + (n, n), -2)
    j = Tensor.iota(lead + (n, n), -1)
    tie_first = same.logical_and(j.lt(i))
    rank = before.logical_or(tie_first).cast(dt.i64).sum(-1)            # lead + (n,)
    hit = rank.unsqueeze([-2]).expand(lead + (k, n)).eq(Tensor.iota(lead + (k, n), -2))
    idx = hit.where(Tensor.iota(lead + (k, n), -1), Tensor.full(lead + (k, n), -1, dt.i64)).max(-1)
    values = lib("indexing.gather_elements")(xt, idx, axis=-1)
    return [values.permute(back), idx.permute(back)]


@handler("ScatterElements", "Scatter", requires=["scatter.scatter_elements"])
def _scatter_elements(ctx: OpContext):
    return lib("scatter.scatter_elements")(ctx.input(0), ctx.input(1), ctx.input(2),
                                           axis=ctx.attr("axis", 0),
                                           reduction=ctx.attr("reduction", "none"))


@handler("ScatterND", requires=["scatter.scatter_nd"])
def _scatter_nd(ctx: OpContext):
    return lib("scatter.scatter_nd")(ctx.input(0), ctx.input(1), ctx.input(2),
                                     reduction=ctx.attr("reduction", "none"))


@handler("ReverseSequence", requires=["indexing.gather_elements"])
def _reverse_sequence(ctx: OpContext):
    """Reverse the first ``sequence_lens[b]`` steps of each batch entry along the time axis."""
    x, lens = ctx.input(0), ctx.input(1)
    t_ax, b_ax = ctx.attr("time_axis", 0), ctx.attr("batch_axis", 1)
    if x.ndim < 2 or {t_ax, b_ax} != {0, 1}:
        raise ShapeError(f"needs time/batch axes 0 and 1 of a rank >= 2 input, got {t_ax}, {b_ax}")
    t = Tensor.iota(x.shape, t_ax)
    shape_b = [1] * x.ndim
    shape_b[b_ax] = x.shape[b_ax]
    n = lens.cast(dt.i64).reshape(shape_b).expand(x.shape)
    src = t.lt(n).where(n.sub(t).sub(t.scalar_like(1)), t)
    return lib("indexing.gather_elements")(x, src, axis=t_ax)



@handler("Compress", requires=["indexing.take"])
def _compress(ctx: OpContext):
    """The slices of ``x`` along ``axis`` (of flattened ``x`` without one) where the 1-D
    ``condition`` is true, gathered by their constant indices. The condition sets the output's
    size, so it must be known at compile time; a condition shorter than the axis drops the
    slices past it (the spec), a longer one's extra entries select nothing (onnxruntime)."""
    x = ctx.input(0)
    if x.ndim == 0:
        raise ShapeError("input must have rank >= 1, got a scalar")
    cond = np.asarray(ctx.const(1, "condition, which sets the output size"))
    if cond.ndim != 1:
        raise ShapeError(f"condition must be 1-D, got shape {list(cond.shape)}")
    axis = ctx.attr("axis")
    if axis is None:
        x, axis = x.reshape((x.numel,)), 0
    axis = normalize_axis(axis, x.ndim)
    idx = np.flatnonzero(cond[:x.shape[axis]]).astype(np.int64)
    return lib("indexing.take")(x, constant(idx), axis)


@handler("NonZero")
def _nonzero(ctx: OpContext):
    """``[rank, count]`` int64 indices of the nonzero elements in row-major order (NaN is nonzero,
    -0.0 is zero), a constant: the count sets the output's size, so the input must be known at
    compile time. A rank-0 input reads as one element, ``[1, count]``, as onnxruntime gives."""
    v = np.asarray(ctx.const(0, "its count of nonzeros is the output size"))
    return constant(np.array(np.nonzero(v.reshape(v.shape or (1,))), dtype=np.int64))


@handler("Unique")
def _unique(ctx: OpContext):
    """``(Y, indices, inverse_indices, counts)`` of the distinct elements (slices along ``axis``)
    of an input known at compile time (their count is Y's size), as constants: Y ascending with
    ``sorted`` (the default), else in order of first occurrence; ``indices`` the first occurrence
    of each, ``inverse_indices`` each element's (slice's) place in Y. NaNs are one value, as in
    numpy's ``unique`` and the ONNX reference (onnxruntime drops them from Y); -0.0 and 0.0 are
    one, Y holding the first occurrence's."""
    v = np.asarray(ctx.const(0, "its count of distinct values is the output size"))
    axis = ctx.attr("axis")
    if axis is None:
        v, axis = v.reshape(-1), 0
    else:
        axis = normalize_axis(axis, v.ndim)
    y, first, inverse, counts = np.unique(v, return_index=True, return_inverse=True,
                                          return_counts=True, axis=axis)
    if not ctx.attr("sorted", 1):
        order = np.argsort(first, kind="stable")
        place = np.empty_like(order)
        place[order] = np.arange(order.size)
        y, first, counts, inverse = np.take(y, order, axis), first[order], counts[order], \
            place[inverse.reshape(-1)]
    return [constant(np.ascontiguousarray(y).astype(v.dtype))] + [
        constant(np.asarray(a, np.int64).reshape(-1)) for a in (first, inverse, counts)]
