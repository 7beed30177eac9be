"""Scatters with static shapes (ONNX ``ScatterElements`` / ``ScatterND``; PyTorch ``scatter``,
``scatter_add``, ``scatter_reduce``, ``index_put``, ``index_add``, ``index_copy``), built from
comparisons and reductions over an extra axis.

There is no scatter primitive: every output position is compared with every update's target index
(``O(positions x updates)`` compares), the updates that hit a position are combined by a reduction
over the updates axis, and a plain (``"none"``) scatter reads the last update that hits it with
one ``Gather`` (exact: NaN and -0.0 preserved). Duplicate targets of a plain scatter take the last
update in index order (ONNX leaves the order undefined, PyTorch too unless ``accumulate``).
Negative indices count from the end (``i < 0 -> i + n``). An index outside ``[-n, n)`` is an
error (ONNX, PyTorch): a constant one is refused here, when the scatter is built; one that comes
from an input is refused by the run's index check (``compiler/runtime/index_ranges.py``); one the
model computes is read back through a ``Gather`` of ``[0, n)`` (:func:`_normalized`), which the
reference executor refuses naming the scatter's model node (a GPU kernel masks it, and it hits no
position).
"""
from __future__ import annotations

import numpy as np

from lumc.ir import dtypes as dt
from lumc.ir.errors import IndexRangeError, ShapeError
from lumc.ir.graph import node
from lumc.ir.library.indexing import gather, gather_elements
from lumc.ir.library.reduce import reduce
from lumc.ir.tensor import Tensor, normalize_axis
from lumc.ir.views import prod

REDUCTIONS = ("none", "add", "mul", "max", "min", "mean")


def move_last(x: Tensor, axis: int) -> tuple[Tensor, list[int]]:
    """``x`` with ``axis`` moved last, and the permutation that moves it back."""
    perm = [k for k in range(x.ndim) if k != axis] + [axis]
    back = [0] * x.ndim
    for i, p in enumerate(perm):
        back[p] = i
    return x.permute(perm), back


def _combine(reduction: str, old: Tensor, hits: Tensor, upd: Tensor, any_hit: Tensor,
             include_self: bool) -> Tensor:
    """``old`` combined with every update whose ``hits`` flag is set (the last axis of ``hits``
    and ``upd`` runs over the updates); without ``include_self`` a position that is hit starts
    from the reduction's identity instead of ``old`` (PyTorch's ``scatter_reduce``)."""
    if reduction in ("add", "mean"):
        total = hits.where(upd, upd.scalar_like(0)).sum(-1)
        new = old.add(total) if include_self else total
        if reduction == "mean":   # PyTorch: the count includes ``old`` when it is included
            n = hits.cast(dt.i64).sum(-1).add(1 if include_self else 0)
            n = n.lt(n.scalar_like(1)).where(n.scalar_like(1), n)
            new = new.div(n.cast(new.dtype)) if new.dtype.is_float else \
                _floor_div(new, n.cast(new.dtype))
    elif reduction == "mul":
        prod_ = reduce(hits.where(upd, upd.scalar_like(1)), "prod", [-1], keepdims=False)
        new = old.mul(prod_) if include_self else prod_
    elif reduction in ("max", "min"):
        fill = upd.dtype.min_value() if reduction == "max" else upd.dtype.max_value()
        sel = hits.where(upd, upd.scalar_like(fill))
        best = sel.max(-1) if reduction == "max" else sel.min(-1)
        if include_self:
            best = old.maximum(best) if reduction == "max" else old.minimum(best)
        new = best
    else:
        raise ShapeError(f"unknown reduction {reduction!r} (one of {', '.join(REDUCTIONS)})")
    return any_hit.where(new, old)


def _floor_div(a: Tensor, b: Tensor) -> Tensor:
    """Integer ``a // b`` rounded toward negative infinity (PyTorch's integer ``mean`` scatter)."""
    q = a.div(b)
    r = a.sub(q.mul(b))
    fix = r.ne(r.scalar_like(0)).logical_and(r.lt(r.scalar_like(0)).ne(b.lt(b.scalar_like(0))))
    return fix.where(q.sub(q.scalar_like(1)), q)


def _last_hit(hits: Tensor) -> Tensor:
    """Index of the last set flag along the last axis, -1 where none is set."""
    iota = Tensor.iota(hits.shape, hits.ndim - 1)
    return hits.where(iota, Tensor.full(hits.shape, -1, dt.i64)).max(-1)


def check_constant_indices(idx: Tensor, sizes, op: str, negative: bool = True) -> None:
    """Raise IndexRangeError when ``idx`` is a model constant with a value outside ``[-n, n)``
    (``[0, n)`` without ``negative``); ``sizes``: one ``n`` for every index, or one per component
    of the last axis (ScatterND)."""
    if idx.node.op != "Constant" or not idx.numel:
        return
    v = np.asarray(idx.node.arg.value).astype(np.int64)
    v = np.broadcast_to(v, idx.shape)
    n = np.broadcast_to(np.asarray(sizes, np.int64), v.shape)
    lo = -n if negative else 0 * n
    bad = (v < lo) | (v >= n)
    if bad.any():
        k = tuple(int(i) for i in np.argwhere(bad)[0])
        raise IndexRangeError(f"scatter index {int(v[k])} at {list(k)} out of range "
                              f"[{int(lo[k])}, {int(n[k])})", op=op)


def _normalized(idx: Tensor, n: int, negative: bool = True) -> Tensor:
    """``idx`` with negatives counted from the end, read back through a ``Gather`` of
    ``[0, n)`` (``negative=False``: negatives are not counted from the end, PyTorch's scatters
    refuse them): the same values, but an index still outside ``[0, n)`` (one the model computes,
    which no input check sees) is refused by the reference executor, naming the scatter's model
    node, instead of hitting no position. A GPU kernel masks it (see ``codegen._gather``)."""
    idx = idx.cast(dt.i64)
    if negative:
        idx = idx.lt(idx.scalar_like(0)).where(idx.add(idx.scalar_like(n)), idx)
    return Tensor(node("Gather", (Tensor.iota((n,), 0).node, idx.node), 0))


def scatter_elements(data: Tensor, indices: Tensor, updates: Tensor, axis: int = 0,
                     reduction: str = "none", include_self: bool = True,
                     negative_indices: bool = True) -> Tensor:
    """ONNX ``ScatterElements``: ``out[..., indices[p], ...] (op)= updates[p]`` along ``axis`` for
    every position ``p`` of ``indices`` (shape of ``updates``, rank of ``data``, at most ``data``'s
    extent off the axis). ``reduction``: one of :data:`REDUCTIONS` (``none`` replaces).
    ``negative_indices``: False refuses a negative index (PyTorch's ``scatter``) where ONNX counts
    it from the end. Shape and dtype of ``data``.

    Raises:
        ShapeError: mismatched shapes or an unknown reduction.
        IndexRangeError: a constant index outside ``[-n, n)`` (``[0, n)`` without
            ``negative_indices``).
    """
    r = data.ndim
    axis = normalize_axis(axis, r)
    if indices.shape != updates.shape or indices.ndim != r:
        raise ShapeError(f"indices {indices.shape} and updates {updates.shape} must match and have "
                         f"data's rank {r}")
    if any(updates.shape[k] > data.shape[k] for k in range(r) if k != axis):
        raise ShapeError(f"updates {updates.shape} exceed data {data.shape} off the axis")
    if reduction not in REDUCTIONS:
        raise ShapeError(f"unknown reduction {reduction!r} (one of {', '.join(REDUCTIONS)})")
    n = data.shape[axis]
    check_constant_indices(indices, n, "ScatterElements", negative_indices)
    idx = _normalized(indices, n, negative_indices)
    # region: data restricted to the updates' extent off the axis, the full axis on it
    region_shape = tuple(n if k == axis else updates.shape[k] for k in range(r))
    region = data.slice([0] * r, list(region_shape))
    it, _ = move_last(idx, axis)                        # rest + (m,)
    ut, _ = move_last(updates, axis)
    m = updates.shape[axis]
    rest = it.shape[:-1]
    # output positions along the axis go in front of the updates axis: rest + (n, m)
    big = rest + (n, m)
    hits = it.unsqueeze([-2]).expand(big).eq(Tensor.iota(big, len(rest)))
    rt, back = move_last(region, axis)                  # rest + (n,)
    any_hit = hits.max(-1) if hits.numel else Tensor.full(rest + (n,), False, dt.bool_)
    if reduction == "none":
        last = _last_hit(hits)
        safe = last.lt(last.scalar_like(0)).where(last.scalar_like(0), last)
        picked = gather_elements(ut, safe, axis=-1) if m else rt
        new = any_hit.where(picked, rt)
    else:
        new = _combine(reduction, rt, hits, ut.unsqueeze([-2]).expand(big), any_hit, include_self)
    new = new.permute(back)
    if region_shape == data.shape:
        return new
    pads = [(0, d - s) for d, s in zip(data.shape, region_shape)]
    inside = Tensor.full(region_shape, True, dt.bool_).pad(pads, False)
    return inside.where(new.pad(pads), data)


def scatter_nd(data: Tensor, indices: Tensor, updates: Tensor, reduction: str = "none") -> Tensor:
    """ONNX ``ScatterND``: ``indices[..., :k]`` addresses slices ``data[i0, ..., ik-1]``, which get
    (or are combined with) ``updates[...]`` of shape ``indices.shape[:-1] + data.shape[k:]``.
    Shape and dtype of ``data``.

    Raises:
        ShapeError: mismatched shapes or an unknown reduction.
        IndexRangeError: a constant index outside its dim of ``data``.
    """
    k = indices.shape[-1]
    if k > data.ndim or updates.shape != indices.shape[:-1] + data.shape[k:]:
        raise ShapeError(f"indices {indices.shape} / updates {updates.shape} do not fit data "
                         f"{data.shape}")
    if reduction not in REDUCTIONS:
        raise ShapeError(f"unknown reduction {reduction!r} (one of {', '.join(REDUCTIONS)})")
    check_constant_indices(indices, data.shape[:k], "ScatterND")
    p_n, t_n = prod(data.shape[:k]), prod(data.shape[k:])
    m = prod(indices.shape[:-1])
    idx = indices.cast(dt.i64).reshape((m, k))
    lin = Tensor.full((m,), 0, dt.i64)
    for j in range(k):
        col = _normalized(idx.slice([j], [j + 1], [1]).reshape((m,)), data.shape[j])
        lin = lin.add(col.mul(int(prod(data.shape[j + 1:k]))))
    flat = data.reshape((p_n, t_n))
    upd = updates.reshape((m, t_n))
    hits = lin.reshape((1, m)).expand((p_n, m)).eq(Tensor.iota((p_n, m), 0))
    any_hit = hits.max(-1).reshape((p_n, 1)).expand((p_n, t_n)) if m else \
        Tensor.full((p_n, t_n), False, dt.bool_)
    if reduction == "none":
        last = _last_hit(hits)
        safe = last.lt(last.scalar_like(0)).where(last.scalar_like(0), last)
        picked = gather(upd, safe, axis=0) if m else flat
        out = any_hit.where(picked, flat)
    else:
        h3 = hits.reshape((p_n, 1, m)).expand((p_n, t_n, m))
        u3 = upd.permute((1, 0)).reshape((1, t_n, m)).expand((p_n, t_n, m))
        out = _combine(reduction, flat, h3, u3, any_hit, True)
    return out.reshape(data.shape)
