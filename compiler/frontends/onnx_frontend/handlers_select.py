"""Data-dependent selection with static shapes: ``TopK``, ``ScatterElements`` / ``Scatter`` /
``ScatterND`` and ``ReverseSequence``.

There is no sort or scatter primitive, so these are built from comparisons and reductions over an
extra axis: ``TopK`` ranks every element against every other along the axis (``O(n^2)`` compares),
and a scatter compares every output position with every update's target index (``O(positions x
updates)``). Selected values are read with ``Gather`` (exact, NaN and -0.0 preserved).
"""
from __future__ import annotations

from lumc.compiler.frontends.onnx_frontend.registry import OpContext, handler, lib
from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.tensor import Tensor, normalize_axis
from lumc.ir.views import prod


def _move_last(x: Tensor, axis: int) -> tuple[Tensor, list[int]]:
    perm = [k for k in range(x.ndim) if k != axis] + [axis]
    back = [0] * x.ndim
    for i, p in enumerate(perm):
        back[p] = i
    return x.permute(perm), back


@handler("TopK", requires=["indexing.gather_elements"])
def _top_k(ctx: OpContext):
    """The k largest (or smallest) along ``axis``, sorted, ties broken by the lower index (as
    ONNX specifies). NaN compares as neither larger nor smaller, so slices holding NaN are not
    ordered as numpy's sort would order them."""
    x = ctx.input(0)
    k = int(ctx.const_scalar(1, "k")) if ctx.opset >= 10 else ctx.attr("k")
    axis = normalize_axis(ctx.attr("axis", -1), x.ndim)
    largest = bool(ctx.attr("largest", 1))
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise ShapeError(f"k = {k} out of range for an axis of {n}")
    xt, back = _move_last(x, axis)
    lead = xt.shape[:-1]
    a = xt.unsqueeze([-1]).expand(lead + (n, n))      # x_i along axis -2
    b = xt.unsqueeze([-2]).expand(lead + (n, n))      # x_j along axis -1
    before = b.gt(a) if largest else b.lt(a)
    i = Tensor.iota(lead + (n, n), -2)
    j = Tensor.iota(lead + (n, n), -1)
    tie_first = b.eq(a).logical_and(j.lt(i))
    rank = before.logical_or(tie_first).cast(dt.i64).sum(-1)            # lead + (n,)
    hit = rank.unsqueeze([-2]).expand(lead + (k, n)).eq(Tensor.iota(lead + (k, n), -2))
    idx = hit.where(Tensor.iota(lead + (k, n), -1), Tensor.full(lead + (k, n), -1, dt.i64)).max(-1)
    values = lib("indexing.gather_elements")(xt, idx, axis=-1)
    return [values.permute(back), idx.permute(back)]


def _combine(reduction: str, old: Tensor, hits: Tensor, upd: Tensor, any_hit: Tensor) -> Tensor:
    """``old`` combined with every update whose ``hits`` flag is set (the last axis of ``hits``
    and ``upd`` runs over the updates)."""
    if reduction == "add":
        new = old.add(hits.where(upd, upd.scalar_like(0)).sum(-1))
    elif reduction == "mul":
        prod_ = lib("reduce.reduce")(hits.where(upd, upd.scalar_like(1)), "prod", [-1],
                                     keepdims=False)
        new = old.mul(prod_)
    elif reduction in ("max", "min"):
        fill = upd.dtype.min_value() if reduction == "max" else upd.dtype.max_value()
        sel = hits.where(upd, upd.scalar_like(fill))
        new = old.maximum(sel.max(-1)) if reduction == "max" else old.minimum(sel.min(-1))
    else:
        raise ShapeError(f"unknown reduction {reduction!r}")
    return any_hit.where(new, old)


def _last_hit(hits: Tensor) -> Tensor:
    """Index of the last set flag along the last axis, -1 where none is set."""
    iota = Tensor.iota(hits.shape, hits.ndim - 1)
    return hits.where(iota, Tensor.full(hits.shape, -1, dt.i64)).max(-1)


@handler("ScatterElements", "Scatter", requires=["indexing.gather_elements", "reduce.reduce"])
def _scatter_elements(ctx: OpContext):
    data, indices, updates = ctx.input(0), ctx.input(1), ctx.input(2)
    r = data.ndim
    axis = normalize_axis(ctx.attr("axis", 0), r)
    reduction = ctx.attr("reduction", "none")
    if indices.shape != updates.shape or indices.ndim != r:
        raise ShapeError(f"indices {indices.shape} and updates {updates.shape} must match and have "
                         f"data's rank {r}")
    if any(updates.shape[k] > data.shape[k] for k in range(r) if k != axis):
        raise ShapeError(f"updates {updates.shape} exceed data {data.shape} off the axis")
    n = data.shape[axis]
    idx = indices.cast(dt.i64)
    idx = idx.lt(idx.scalar_like(0)).where(idx.add(idx.scalar_like(n)), idx)
    # region: data restricted to the updates' extent off the axis, the full axis on it
    region_shape = tuple(n if k == axis else updates.shape[k] for k in range(r))
    region = data.slice([0] * r, list(region_shape))
    it, _ = _move_last(idx, axis)                       # rest + (m,)
    ut, _ = _move_last(updates, axis)
    m = updates.shape[axis]
    rest = it.shape[:-1]
    # output positions along the axis go in front of the updates axis: rest + (n, m)
    big = rest + (n, m)
    hits = it.unsqueeze([-2]).expand(big).eq(Tensor.iota(big, len(rest)))
    rt, back = _move_last(region, axis)                 # rest + (n,)
    any_hit = hits.max(-1) if hits.numel else Tensor.full(rest + (n,), False, dt.bool_)
    if reduction == "none":
        last = _last_hit(hits)
        safe = last.lt(last.scalar_like(0)).where(last.scalar_like(0), last)
        picked = lib("indexing.gather_elements")(ut, safe, axis=-1) if m else rt
        new = any_hit.where(picked, rt)
    else:
        new = _combine(reduction, rt, hits, ut.unsqueeze([-2]).expand(big), any_hit)
    new = new.permute(back)
    if region_shape == data.shape:
        return new
    pads = [(0, d - s) for d, s in zip(data.shape, region_shape)]
    inside = Tensor.full(region_shape, True, dt.bool_).pad(pads, False)
    return inside.where(new.pad(pads), data)


@handler("ScatterND", requires=["indexing.gather", "reduce.reduce"])
def _scatter_nd(ctx: OpContext):
    data, indices, updates = ctx.input(0), ctx.input(1), ctx.input(2)
    reduction = ctx.attr("reduction", "none")
    k = indices.shape[-1]
    if k > data.ndim or updates.shape != indices.shape[:-1] + data.shape[k:]:
        raise ShapeError(f"indices {indices.shape} / updates {updates.shape} do not fit data "
                         f"{data.shape}")
    p_n, t_n = prod(data.shape[:k]), prod(data.shape[k:])
    m = prod(indices.shape[:-1])
    idx = indices.cast(dt.i64).reshape((m, k))
    lin = Tensor.full((m,), 0, dt.i64)
    for j in range(k):
        col = idx.slice([j], [j + 1], [1]).reshape((m,))
        d = data.shape[j]
        col = col.lt(col.scalar_like(0)).where(col.add(col.scalar_like(d)), col)
        lin = lin.add(col.mul(int(prod(data.shape[j + 1:k]))))
    flat = data.reshape((p_n, t_n))
    upd = updates.reshape((m, t_n))
    hits = lin.reshape((1, m)).expand((p_n, m)).eq(Tensor.iota((p_n, m), 0))
    any_hit = hits.max(-1).reshape((p_n, 1)).expand((p_n, t_n)) if m else \
        Tensor.full((p_n, t_n), False, dt.bool_)
    if reduction == "none":
        last = _last_hit(hits)
        safe = last.lt(last.scalar_like(0)).where(last.scalar_like(0), last)
        picked = lib("indexing.gather")(upd, safe, axis=0) if m else flat
        out = any_hit.where(picked, flat)
    else:
        h3 = hits.reshape((p_n, 1, m)).expand((p_n, t_n, m))
        u3 = upd.permute((1, 0)).reshape((1, t_n, m)).expand((p_n, t_n, m))
        out = _combine(reduction, flat, h3, u3, any_hit)
    return out.reshape(data.shape)


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

