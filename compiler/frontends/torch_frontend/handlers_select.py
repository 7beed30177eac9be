"""Handlers for data-dependent selection with static shapes: ``topk``, ``sort``, ``bucketize``,
``searchsorted``, ``kthvalue``, ``median``, ``cummax`` / ``cummin``, and the scatters (``scatter``, ``scatter_add``, ``scatter_reduce``, ``index_put``).

There is no sort primitive: an element's rank along the axis is the number of elements that must
come before it (larger for a descending order, ties broken by the lower index), from an
``[..., n, n]`` comparison; output position ``r`` then reads the element of rank ``r`` (one
``Gather``). ``O(n^2)`` compares per slice: meant for the short axes of inference graphs. NaN sorts
as larger than every number, as PyTorch's ``sort`` does.
"""
from __future__ import annotations

from lumc.compiler.frontends.torch_frontend.registry import aten, lib, promote
from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError, UnsupportedOpError
from lumc.ir.tensor import Tensor, broadcast_shapes, concat, normalize_axis


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


def _count_below(values: Tensor, seq: Tensor, right: bool) -> Tensor:
    """For each of ``values`` (``[..., k]`` against ``seq`` ``[..., n]``, or ``seq`` 1-D): how many
    of ``seq`` lie below it (``right``: at or below), i64. NaN is above every number, as in
    PyTorch's sort (a NaN value counts all ``n``); a ``seq`` holding NaN is not sorted, and PyTorch's
    binary search then answers differently."""
    b = seq.unsqueeze([-2])                                   # [..., 1, n]
    xe = values.unsqueeze([-1])                               # [..., k, 1]
    below = b.le(xe) if right else b.lt(xe)
    if values.dtype.is_float:
        below = below.logical_or(xe.isnan().logical_and(b.isnan().logical_not()))
    return below.cast(dt.i64).sum([-1])


@aten("bucketize.Tensor")
def _bucketize(ctx, x, boundaries, *, out_int32=False, right=False):
    """Bucket index of each element: the number of boundaries below it (``right``: at or below)."""
    x, boundaries = promote(x, boundaries)
    r = _count_below(x.reshape(x.shape + (1,)), boundaries, right).reshape(x.shape) \
        if x.ndim else _count_below(x.reshape((1,)), boundaries, right).reshape(())
    return r.cast(dt.i32) if out_int32 else r


@aten("searchsorted.Tensor", "searchsorted.Scalar")
def _searchsorted(ctx, seq, values, *, out_int32=False, right=False, side=None, sorter=None):
    """Insertion points of ``values`` in the sorted last dim of ``seq`` (1-D, or with ``values``'
    leading dims): :func:`_count_below`."""
    if sorter is not None:
        raise UnsupportedOpError("searchsorted with a sorter")
    right = bool(right) or side == "right"
    seq, values = promote(seq, values)      # a Python scalar becomes a 0-d tensor
    if values.ndim == 0:
        r = _count_below(values.reshape((1,)), seq, right).reshape(())
    elif seq.ndim == 1:
        r = _count_below(values.reshape(values.shape + (1,)), seq, right).reshape(values.shape)
    else:
        r = _count_below(values, seq, right)
    return r.cast(dt.i32) if out_int32 else r


def _kth(x: Tensor, dim: int, k: int, keepdim: bool) -> tuple[Tensor, Tensor]:
    """The ``k``-th smallest (0-based, NaN largest) along ``dim`` and its index."""
    d = normalize_axis(dim, x.ndim)
    n = x.shape[d]
    if not 0 <= k < n:
        raise ShapeError(f"k = {k + 1} out of range for a dim of {n}")
    vals, idx = _ranked(x, d, n, False)
    v = vals.slice([k], [k + 1], [d])
    i = idx.slice([k], [k + 1], [d])
    return (v, i) if keepdim else (v.squeeze([d]), i.squeeze([d]))


@aten("kthvalue.default")
def _kthvalue(ctx, x, k, dim=-1, keepdim=False):
    """The ``k``-th smallest along ``dim`` (NaN largest) and its index (among equal values, the
    lowest; PyTorch leaves which one unspecified). ``O(n^2)`` compares, as :func:`_ranked`."""
    if x.ndim == 0:
        return x, Tensor.full((), 0, dt.i64)
    return _kth(x, dim, int(k) - 1, bool(keepdim))


@aten("median.dim")
def _median_dim(ctx, x, dim=-1, keepdim=False):
    """The lower median along ``dim`` and its index; a slice holding NaN gives NaN at its first
    NaN, as PyTorch does."""
    if x.ndim == 0:
        return x, Tensor.full((), 0, dt.i64)
    d = normalize_axis(dim, x.ndim)
    n = x.shape[d]
    v, i = _kth(x, d, (n - 1) // 2, True)
    if x.dtype.is_float:
        nan = x.isnan()
        pos = Tensor.iota(x.shape, d).broadcast_to(x.shape)
        first = nan.where(pos, pos.scalar_like(n)).min([d], keepdims=True)
        has = nan.max([d], keepdims=True)
        v = has.where(v.scalar_like(float("nan")), v)
        i = has.where(first, i)
    return (v, i) if keepdim else (v.squeeze([d]), i.squeeze([d]))


@aten("median.default")
def _median(ctx, x):
    if x.numel == 0:      # PyTorch: the median of nothing is NaN
        return Tensor.full((), float("nan"), x.dtype if x.dtype.is_float else dt.f32)
    return _median_dim(ctx, x.reshape((x.numel,)), 0)[0] if x.ndim else x


def _cumulative(x: Tensor, dim: int, largest: bool) -> tuple[Tensor, Tensor]:
    """``cummax`` / ``cummin``: the running extreme and the last index holding it (PyTorch's
    ``>=`` update); once a NaN is seen it stays, indexed by the latest NaN."""
    if x.ndim == 0:
        return x, Tensor.full((), 0, dt.i64)
    xc = x.cast(dt.u8) if x.dtype.is_bool else x
    fill = xc.dtype.min_value() if largest else xc.dtype.max_value()
    sel, keep, back = lib("reduce.scan_grid")(xc, dim, fill)
    best = sel.max([-1], keepdims=True) if largest else sel.min([-1], keepdims=True)
    hit = keep.logical_and(_same(sel, best))      # sel is x[j] wherever keep holds
    j = Tensor.iota(hit.shape, hit.ndim - 1)
    idx = hit.where(j, j.scalar_like(-1)).max([-1])
    vals = best.reshape(best.shape[:-1])
    if x.dtype.is_bool:
        vals = vals.cast(dt.bool_)
    return vals.permute(back), idx.permute(back)


@aten("cummax.default", requires=["reduce.scan_grid"])
def _cummax(ctx, x, dim):
    return _cumulative(x, dim, True)


@aten("cummin.default", requires=["reduce.scan_grid"])
def _cummin(ctx, x, dim):
    return _cumulative(x, dim, False)


# ---- scatters -------------------------------------------------------------------------------------
# ``lumc.ir.library.scatter``: every output position compared with every update's target
_TORCH_REDUCE = {"sum": "add", "add": "add", "prod": "mul", "multiply": "mul", "amax": "max",
                 "amin": "min", "mean": "mean"}


def _scatter(x: Tensor, dim: int, index: Tensor, src, reduce: str = "none",
             include_self: bool = True) -> Tensor:
    """PyTorch's ``scatter`` family: ``index`` may be smaller than ``src`` in every dim (only its
    extent is read) and than ``x`` off ``dim``; a scalar ``src`` fills ``index``'s shape."""
    if x.ndim == 0:   # PyTorch treats a 0-d scatter as a 1-element one
        s1 = src.reshape((1,)) if isinstance(src, Tensor) else src
        return _scatter(x.reshape((1,)), 0, index.reshape((1,)), s1, reduce,
                        include_self).reshape(())
    if isinstance(src, Tensor):
        if src.ndim != index.ndim or any(s < i for s, i in zip(src.shape, index.shape)):
            raise ShapeError(f"index {index.shape} reaches past src {src.shape}")
        upd = src.cast(x.dtype).slice([0] * index.ndim, list(index.shape))
    else:
        upd = Tensor.full(index.shape, src, x.dtype)
    red = _TORCH_REDUCE.get(reduce, reduce)
    # PyTorch's scatters refuse a negative index (eager: "index -1 is out of bounds"), where
    # ONNX's count it from the end
    return lib("scatter.scatter_elements")(x, index, upd, axis=dim, reduction=red,
                                           include_self=include_self, negative_indices=False)


@aten("scatter.src", "scatter.value", requires=["scatter.scatter_elements"])
def _scatter_plain(ctx, x, dim, index, src):
    return _scatter(x, dim, index, src)


@aten("scatter.reduce", "scatter.value_reduce", requires=["scatter.scatter_elements"])
def _scatter_reduce_old(ctx, x, dim, index, src, *, reduce):
    return _scatter(x, dim, index, src, reduce)


@aten("scatter_add.default", requires=["scatter.scatter_elements"])
def _scatter_add(ctx, x, dim, index, src):
    return _scatter(x, dim, index, src, "add")


@aten("scatter_reduce.two", requires=["scatter.scatter_elements"])
def _scatter_reduce(ctx, x, dim, index, src, reduce, *, include_self=True):
    return _scatter(x, dim, index, src, reduce, bool(include_self))


@aten("index_add.default", requires=["scatter.scatter_elements"])
def _index_add(ctx, x, dim, index, source, *, alpha=1):
    """``x.index_add(dim, index, source, alpha=a)``: ``a * source``'s slices along ``dim`` added
    at the positions ``index`` names (repeats add up). Kept undecomposed (``KEEP_UNDECOMPOSED``):
    the decomposition writes it as ``x[index] += source``, which counts a negative index from the
    end, where eager refuses it ("index -1 is out of bounds")."""
    return _index_scatter(x, dim, index, source, "add", alpha)


@aten("index_copy.default", requires=["scatter.scatter_elements"])
def _index_copy(ctx, x, dim, index, source):
    """``x.index_copy(dim, index, source)``: ``source``'s slices along ``dim`` written at
    ``index``; a negative index is refused as eager refuses it (see :func:`_index_add`)."""
    return _index_scatter(x, dim, index, source, "none")


def _index_scatter(x: Tensor, dim: int, index: Tensor, source: Tensor, reduce: str,
                   alpha=1) -> Tensor:
    """``index`` (0-d or 1-d) selects slices of ``x`` along ``dim``; ``source`` holds one slice
    per index (``x``'s shape with ``len(index)`` along ``dim``; 0-d for a 0-d ``x``).

    Raises:
        ShapeError: ``index`` of rank > 1, or ``source`` of the wrong shape.
    """
    if index.ndim > 1:
        raise ShapeError(f"index of shape {index.shape}: index_add/index_copy take a 0-d or 1-d "
                         "index")
    r = max(x.ndim, 1)
    xs = x.reshape((1,)) if x.ndim == 0 else x
    d = normalize_axis(dim, r)
    m = index.numel
    src = source.reshape((1,)) if source.ndim == 0 and x.ndim == 0 else source
    want = xs.shape[:d] + (m,) + xs.shape[d + 1:]
    if tuple(src.shape) != tuple(want):
        raise ShapeError(f"source of shape {tuple(source.shape)} for {m} indices into "
                         f"{tuple(x.shape)} along dim {dim}: expected {want}")
    src = src.cast(x.dtype)
    if alpha != 1:
        src = src.mul(src.scalar_like(alpha))
    full = index.cast(dt.i64).reshape((1,) * d + (m,) + (1,) * (r - d - 1)).expand(want)
    out = _scatter(xs, d, full, src, reduce)
    return out.reshape(()) if x.ndim == 0 else out


@aten("one_hot.default", requires=["indexing.gather", "indexing.one_hot"])
def _one_hot(ctx, x, num_classes=-1):
    """``F.one_hot(x, num_classes)`` (int64 out, the class axis last). Kept undecomposed: the
    decomposition's range check is an ``_assert_async`` that export drops, so a class outside
    ``[0, num_classes)`` gave an all-zero row where eager raises. Here every index is read through
    a ``Gather`` of ``arange(num_classes)`` that refuses one out of range, negatives included.

    Raises:
        UnsupportedOpError: ``num_classes=-1`` (the count is the input's maximum plus one, known
            only at run time).
    """
    if num_classes is None or int(num_classes) < 0:
        raise UnsupportedOpError("one_hot without num_classes: the class count is the input's "
                                 "largest value plus one, known only at run time; pass "
                                 "num_classes")
    n = int(num_classes)
    checked = lib("indexing.gather")(Tensor.iota((n,), 0), x.cast(dt.i64), axis=0,
                                     negative_indices=False) if n else x.cast(dt.i64)
    return lib("indexing.one_hot")(checked, n, [0, 1], axis=-1).cast(dt.i64)


@aten("index_put.default", requires=["scatter.scatter_nd"])
def _index_put(ctx, x, indices, values, accumulate=False):
    """``x[indices] = values`` (``+=`` with ``accumulate``; ``index_copy`` and ``index_add``
    export as this). Integer index tensors (broadcast together, adjacent, after any number of full
    slices) become one ``ScatterND`` over the indexed dims; a boolean mask becomes a select, where
    ``values`` broadcast over the selected positions (``x[m] = 0``, ``x[m] = row``): a ``values``
    with one entry per selected position depends on how many the mask selects, which is known only
    at run time (UnsupportedOpError)."""
    if x.dtype.is_bool and accumulate:    # adding bools is or-ing them: through i64 and back
        out = _index_put(ctx, x.cast(dt.i64), indices, values.cast(dt.i64), True)
        return out.ne(out.scalar_like(0))
    idx = list(indices) + [None] * (x.ndim - len(indices))
    pos = [i for i, t in enumerate(idx) if t is not None]
    if not pos:
        return values.cast(x.dtype).expand(x.shape)
    if pos != list(range(pos[0], pos[-1] + 1)):
        raise UnsupportedOpError("index tensors separated by a full slice (x[i, :, j] = v)")
    a, k = pos[0], len(pos)
    its = [idx[i] for i in pos]
    v = values.cast(x.dtype)
    if any(t.dtype.is_bool for t in its):
        if k != 1:
            raise UnsupportedOpError("a boolean mask combined with other indices")
        m = its[0]
        rest = x.shape[a + m.ndim:]
        vs = v.shape
        while vs and vs[0] == 1 and len(vs) > len(rest):
            vs = vs[1:]
        if len(vs) > len(rest):
            raise UnsupportedOpError(
                f"x[mask] = values with values of shape {tuple(v.shape)}: one value per selected "
                f"position depends on how many the mask selects, known only at run time")
        v = v.reshape(vs).expand(x.shape)
        mb = m.reshape((1,) * a + m.shape + (1,) * len(rest)).expand(x.shape)
        return mb.where(x.add(v) if accumulate else v, x)
    b = broadcast_shapes(*(t.shape for t in its))
    stacked = concat([t.cast(dt.i64).expand(b).unsqueeze([len(b)]) for t in its], len(b))
    perm = list(range(a, a + k)) + list(range(a)) + list(range(a + k, x.ndim))
    target = x.shape[:a] + b + x.shape[a + k:]
    vp = v.expand(target).permute(list(range(a, a + len(b))) + list(range(a)) +
                                  list(range(a + len(b), len(target))))
    out = lib("scatter.scatter_nd")(x.permute(perm), stacked, vp,
                                    reduction="add" if accumulate else "none")
    return out.permute([perm.index(d) for d in range(x.ndim)])
