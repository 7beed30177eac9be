"""Handlers for data-dependent selection with static shapes: ``topk``, ``sort``, ``bucketize``.

There is no sort primitive: an element's rank along the axis is the number of elements that must
come before it (larger for a descending order, ties broken by the lower index), from an
``[..., n, n]`` comparison; output position ``r`` then reads the element of rank ``r`` (one
``Gather``). ``O(n^2)`` compares per slice: meant for the short axes of inference graphs. NaN sorts
as larger than every number, as PyTorch's ``sort`` does.
"""
from __future__ import annotations

from lumc.compiler.frontends.torch_frontend.registry import aten, lib
from lumc.ir import dtypes as dt
from lumc.ir.tensor import Tensor, normalize_axis


def _gt(a: Tensor, b: Tensor) -> Tensor:
    """``a > b`` with NaN above every number."""
    r = b.lt(a)
    if a.dtype.is_float:
        r = r.logical_or(a.isnan().logical_and(b.isnan().logical_not()))
    return r


def _same(a: Tensor, b: Tensor) -> Tensor:
    r = a.eq(b)
    if a.dtype.is_float:
        r = r.logical_or(a.isnan().logical_and(b.isnan()))
    return r


def _ranked(x: Tensor, dim: int, k: int, descending: bool) -> tuple[Tensor, Tensor]:
    """The first ``k`` elements of a stable sort along ``dim``: ``(values, i64 indices)``."""
    if x.ndim == 0:
        return x, Tensor.full((), 0, dt.i64)
    dim = normalize_axis(dim, x.ndim)
    perm = [a for a in range(x.ndim) if a != dim] + [dim]
    back = [perm.index(a) for a in range(x.ndim)]
    xl = x.permute(perm)
    xc = xl.cast(dt.u8) if xl.dtype.is_bool else xl
    n = xl.shape[-1]
    a, b = xc.unsqueeze([-1]), xc.unsqueeze([-2])          # element i on axis -2, j on axis -1
    before = Tensor.iota((n, n), 1).lt(Tensor.iota((n, n), 0))    # j < i
    ahead = _gt(b, a) if descending else _gt(a, b)
    rank = ahead.logical_or(_same(a, b).logical_and(before)).cast(dt.i64).sum([-1])
    slots = Tensor.iota((k,), 0).reshape((1,) * (xl.ndim - 1) + (1, k))
    hit = rank.unsqueeze([-1]).eq(slots)                    # [..., n, k]
    pos = Tensor.iota((n, k), 0).reshape((1,) * (xl.ndim - 1) + (n, k))
    idx = hit.where(pos.expand(hit.shape), Tensor.full(hit.shape, 0, dt.i64)).sum([-2])
    vals = lib("indexing.gather_elements")(xl, idx, axis=-1)
    return vals.permute(back), idx.permute(back)


@aten("topk.default", requires=["indexing.gather_elements"])
def _topk(ctx, x, k, dim=-1, largest=True, sorted=True):
    return _ranked(x, dim, int(k), bool(largest))


@aten("sort.default", requires=["indexing.gather_elements"])
def _sort(ctx, x, dim=-1, descending=False):
    n = x.shape[normalize_axis(dim, x.ndim)] if x.ndim else 1
    return _ranked(x, dim, n, bool(descending))


@aten("sort.stable", requires=["indexing.gather_elements"])
def _sort_stable(ctx, x, *, stable=None, dim=-1, descending=False):
    return _sort(ctx, x, dim, descending)


@aten("bucketize.Tensor")
def _bucketize(ctx, x, boundaries, *, out_int32=False, right=False):
    """Bucket index of each element: the number of boundaries below it (``right``: at or below)."""
    b = boundaries.cast(x.dtype).reshape((1,) * x.ndim + boundaries.shape)
    xe = x.unsqueeze([-1])
    below = b.le(xe) if right else b.lt(xe)
    r = below.cast(dt.i64).sum([-1])
    return r.cast(dt.i32) if out_int32 else r
