"""Handlers for movement and indexing ATen ops: views (``view``, ``permute``, ``expand``, ``slice``,
``select``...), ``cat``/``split``, padding, ``repeat``, and the gathers (``index``, ``index_select``,
``gather``, ``embedding``) and scatters into slices.

PyTorch's view semantics differ from ONNX in small ways handled here: ``squeeze`` of a dim that is
not 1 is a no-op, ``expand`` takes ``-1`` for "keep", ``slice`` bounds clamp, ``index`` with
non-adjacent index tensors moves the indexed dims to the front, and ``embedding``,
``index_select`` and ``gather`` refuse a negative index (``x[i]`` counts it from the end).
"""
from __future__ import annotations

import numpy as np
import torch

from lumc.compiler.frontends.torch_frontend.registry import aten, lib, lumc_dtype, promote, rank0_as_1d
from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.graph import view_node
from lumc.ir.tensor import Tensor, broadcast_shapes, concat, normalize_axis
from lumc.ir.views import View, prod

_BIG = 2 ** 63 - 1


def _copies(*names: str) -> list[str]:
    """Each overload and its ``*_copy`` twin (functionalized graphs use the copy variants)."""
    out = []
    for n in names:
        op, _, ov = n.partition(".")
        out += [n, f"{op}_copy.{ov}"]
    return out


@aten(*_copies("view.default", "_reshape_alias.default"), "_unsafe_view.default", "reshape.default")
def _view(ctx, x, size, *strides):
    return x.reshape(size)


@aten(*_copies("permute.default"))
def _permute(ctx, x, dims):
    return x.permute(dims)


@aten(*_copies("transpose.int"))
def _transpose(ctx, x, dim0, dim1):
    if x.ndim < 2:
        return x
    return x.transpose(dim0, dim1)


@aten(*_copies("t.default"))
def _t(ctx, x):
    return x if x.ndim < 2 else x.transpose(0, 1)


@aten(*_copies("expand.default"))
def _expand(ctx, x, size, *, implicit=False):
    size = list(size)
    lead = len(size) - x.ndim
    for k in range(x.ndim):
        if size[lead + k] == -1:
            size[lead + k] = x.shape[k]
    return x.expand(size)


@aten(*_copies("unsqueeze.default"))
def _unsqueeze(ctx, x, dim):
    return x.unsqueeze([normalize_axis(dim, x.ndim + 1)])


@aten(*_copies("squeeze.default", "squeeze.dim", "squeeze.dims"))
def _squeeze(ctx, x, dim=None):
    if x.ndim == 0:
        return x
    if dim is None:
        return x.squeeze()
    dims = [dim] if isinstance(dim, int) else list(dim)
    # PyTorch leaves a dim that is not of size 1 in place
    keep = [d for d in (normalize_axis(a, x.ndim) for a in dims) if x.shape[d] == 1]
    return x.squeeze(keep) if keep else x


@aten(*_copies("slice.Tensor"))
def _slice(ctx, x, dim=0, start=None, end=None, step=1):
    start = 0 if start is None else start
    end = _BIG if end is None else end
    return x.slice([start], [end], [dim], [step])


@aten(*_copies("select.int"))
def _select(ctx, x, dim, index):
    dim = normalize_axis(dim, x.ndim)
    n = x.shape[dim]
    if not -n <= index < n:
        raise ShapeError(f"select index {index} out of range for size {n}")
    index %= n
    return x.slice([index], [index + 1], [dim]).squeeze([dim])


@aten("cat.default")
def _cat(ctx, tensors, dim=0):
    # PyTorch still accepts (and skips) legacy empty 1-D tensors next to higher-rank ones
    rank = max(t.ndim for t in tensors)
    parts = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0 and rank > 1)]
    parts = promote(*parts)
    return concat(parts, normalize_axis(dim, rank))


@aten("stack.default")
def _stack(ctx, tensors, dim=0):
    parts = promote(*tensors)
    axis = normalize_axis(dim, parts[0].ndim + 1)
    return concat([t.unsqueeze([axis]) for t in parts], axis)


def _split(x: Tensor, sizes, dim) -> tuple[Tensor, ...]:
    dim = normalize_axis(dim, x.ndim)
    out, pos = [], 0
    for s in sizes:
        out.append(x.slice([pos], [pos + s], [dim]))
        pos += s
    return tuple(out)


@aten(*_copies("split_with_sizes.default"))
def _split_with_sizes(ctx, x, split_sizes, dim=0):
    if sum(split_sizes) != x.shape[normalize_axis(dim, x.ndim)]:
        raise ShapeError(f"split sizes {split_sizes} do not add up to dim {dim} of {x.shape}")
    return _split(x, split_sizes, dim)


@aten(*_copies("split.Tensor"))
def _split_tensor(ctx, x, split_size, dim=0):
    n = x.shape[normalize_axis(dim, x.ndim)]
    sizes = [min(split_size, n - p) for p in range(0, n, split_size)] if split_size else [n]
    return _split(x, sizes or [0], dim)


@aten(*_copies("unbind.int"))
def _unbind(ctx, x, dim=0):
    dim = normalize_axis(dim, x.ndim)
    return tuple(p.squeeze([dim]) for p in _split(x, [1] * x.shape[dim], dim))


@aten("flip.default")
@rank0_as_1d
def _flip(ctx, x, dims):
    for d in dims:
        x = x.flip(d)
    return x


@aten("roll.default")
def _roll(ctx, x, shifts, dims=()):
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if not dims:
        flat = _roll(ctx, x.reshape((x.numel,)), shifts, [0])
        return flat.reshape(x.shape)
    for s, d in zip(shifts, dims):
        d = normalize_axis(d, x.ndim)
        n = x.shape[d]
        if n == 0 or s % n == 0:
            continue
        s %= n
        x = concat([x.slice([n - s], [n], [d]), x.slice([0], [n - s], [d])], d)
    return x


@aten(*_copies("as_strided.default"), "as_strided_.default", requires=["indexing.take"])
def _as_strided(ctx, x, size, stride, storage_offset=None):
    """``as_strided`` reads its input's *storage*: PyTorch's decompositions emit it to give a
    result its input's memory format (``adaptive_avg_pool2d`` to 1x1 of a channels_last tensor
    is ``as_strided(mean, [N, C, 1, 1], [C, 1, C, C])``; through ``torch.compile``, whose
    functionalization keeps metadata mutations, the in-place ``as_strided_``). The storage offset
    of each element of the input comes from its strides as traced; the result is the input
    re-read at the offsets ``size``/``stride`` name: a reshape where that is the input in order,
    else one gather with a constant index table. Refused where it reads storage the input does
    not cover, and for ``as_strided_`` that moves elements where a later node reads the input
    (it would see the new strides)."""
    from lumc.compiler.frontends.torch_frontend.lowering import concrete_int
    val = ctx.node.args[0].meta.get("val") if isinstance(ctx.node.args[0], torch.fx.Node) else None
    if not isinstance(val, torch.Tensor):
        raise ctx.unsupported("as_strided of a value without traced strides")
    size, stride = [int(d) for d in size], [int(d) for d in stride]
    if len(size) != len(stride):
        raise ShapeError(f"as_strided: {len(size)} sizes and {len(stride)} strides")
    in_strides = [concrete_int(d, ctx.sym_env) for d in val.stride()]
    base = concrete_int(val.storage_offset(), ctx.sym_env)
    start = base if storage_offset is None else int(storage_offset)
    n_out = prod(size)
    if x.numel == 0 or n_out == 0:
        if n_out:
            raise ctx.unsupported("as_strided reads storage its (empty) input does not cover")
        return Tensor.full(size, 0, x.dtype)

    def offsets(shape, strides, first):
        off = np.full((), first, np.int64)
        for d, st in zip(shape, strides):
            off = np.add.outer(off, np.arange(d, dtype=np.int64) * st)
        return off.reshape(-1)
    held = offsets(x.shape, in_strides, base)          # storage offset of each input element
    where = np.full(int(held.max()) + 1, -1, np.int64)
    where[held] = np.arange(held.size)
    want = offsets(size, stride, start)
    if want.min() < 0 or want.max() >= where.size or (where[want] < 0).any():
        raise ctx.unsupported("as_strided reads storage its input does not cover")
    idx = where[want]
    flat = x.reshape((x.numel,))
    if idx.size == x.numel and np.array_equal(idx, np.arange(idx.size)):
        return flat.reshape(size)
    if ctx.node.target is torch.ops.aten.as_strided_.default and _read_after(ctx.node):
        raise ctx.unsupported("as_strided_ re-strides a value a later node reads")
    return lib("indexing.take")(flat, Tensor.const(idx), 0).reshape(size)


def _read_after(node: torch.fx.Node) -> bool:
    """Whether a node after ``node`` reads its first argument (an in-place op's ``self``)."""
    src, seen = node.args[0], False
    for n in node.graph.nodes:
        seen = seen or n is node
        if seen and n is not node and src in n.all_input_nodes:
            return True
    return False


@aten("constant_pad_nd.default")
def _constant_pad_nd(ctx, x, pad, value=0):
    # pad lists (before, after) pairs starting from the last dim
    pairs = [(0, 0)] * x.ndim
    for k in range(len(pad) // 2):
        pairs[x.ndim - 1 - k] = (int(pad[2 * k]), int(pad[2 * k + 1]))
    value = bool(value) if x.dtype.is_bool else (float(value) if x.dtype.is_float else int(value))
    return x.pad(pairs, value)


@aten("repeat.default", requires=["indexing.tile"])
def _repeat(ctx, x, repeats):
    repeats = list(repeats)
    x = x.reshape((1,) * (len(repeats) - x.ndim) + x.shape)
    return lib("indexing.tile")(x, repeats)


# ---- gathers ----------------------------------------------------------------------------------------
# embedding, index_select and gather refuse a negative index (an error in eager), unlike x[i]: it
# stays out of range of the Gather primitive, refused like one past the end
@aten("index_select.default", requires=["indexing.gather"])
@rank0_as_1d
def _index_select(ctx, x, dim, index):
    return lib("indexing.gather")(x, index, axis=dim, negative_indices=False)


@aten("gather.default", requires=["indexing.gather_elements"])
@rank0_as_1d
def _gather(ctx, x, dim, index, *, sparse_grad=False):
    return lib("indexing.gather_elements")(x, index, axis=dim, negative_indices=False)


@aten("embedding.default", requires=["indexing.gather"])
def _embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return lib("indexing.gather")(weight, indices, axis=0, negative_indices=False)


def _index_check(node) -> str | None:
    idx = node.args[1] if len(node.args) > 1 else node.kwargs.get("indices", [])
    for t in idx:
        v = t.meta.get("val") if isinstance(t, torch.fx.Node) else None
        if isinstance(v, torch.Tensor) and v.dtype in (torch.bool, torch.uint8):
            return "boolean mask indexing (its result shape depends on the data)"
    return None


@aten("index.Tensor", requires=["indexing.take", "indexing.normalize_indices"], check=_index_check)
def _index(ctx, x, indices):
    """Advanced indexing ``x[..., i, j, ...]``: index tensors broadcast to one shape ``B``; the
    indexed dims are merged into one, addressed by a linear index, and read with one ``Gather``.
    Adjacent indexed dims put ``B`` in their place; separated ones put it first (as numpy)."""
    pos = [k for k, t in enumerate(indices) if t is not None]
    if not pos:
        return x
    b_shape = broadcast_shapes(*[indices[k].shape for k in pos])
    norm = lib("indexing.normalize_indices")
    idx = [norm(indices[k].cast(dt.i64), x.shape[k]).expand(b_shape) for k in pos]
    if pos != list(range(pos[0], pos[-1] + 1)):
        rest = [k for k in range(x.ndim) if k not in pos]
        x = x.permute(pos + rest)
        pos = list(range(len(pos)))
    p0, k = pos[0], len(pos)
    dims = x.shape[p0:p0 + k]
    lin = None
    for j, t in enumerate(idx):
        term = t.mul(prod(dims[j + 1:])) if prod(dims[j + 1:]) != 1 else t
        lin = term if lin is None else lin.add(term)
    merged = x.reshape(x.shape[:p0] + (prod(dims),) + x.shape[p0 + k:])
    return lib("indexing.take")(merged, lin, p0)


# ---- scatters into slices --------------------------------------------------------------------------
def _place(x: Tensor, src: Tensor, dim: int, positions: range) -> Tensor:
    """``x`` with ``x[..., positions[j], ...] = src[..., j, ...]`` along ``dim`` (constant positions):
    ``src`` is read at a constant index table and selected with ``Where``."""
    dim = normalize_axis(dim, x.ndim)
    n = x.shape[dim]
    table = np.zeros(n, np.int64)
    hit = np.zeros(n, bool)
    for j, p in enumerate(positions):
        table[p], hit[p] = j, True
    if not hit.any():
        return x
    src = src.cast(x.dtype)
    if src.shape[dim] == 0:
        return x
    picked = lib("indexing.take")(src, Tensor.const(table), dim)
    shape = [1] * x.ndim
    shape[dim] = n
    mask = Tensor.const(hit.reshape(shape))
    return mask.where(picked, x)


@aten("slice_scatter.default", requires=["indexing.take"])
def _slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
    dim = normalize_axis(dim, x.ndim)
    n = x.shape[dim]
    r = range(*slice(0 if start is None else start, _BIG if end is None else end, step).indices(n))
    return _place(x, src, dim, r)


@aten("select_scatter.default", requires=["indexing.take"])
def _select_scatter(ctx, x, src, dim, index):
    dim = normalize_axis(dim, x.ndim)
    index %= x.shape[dim]
    return _place(x, src.unsqueeze([dim]), dim, range(index, index + 1))


# ---- sizes (ints at a concrete specialization) -----------------------------------------------------
@aten("sym_size.int")
def _sym_size(ctx, x, dim):
    return x.shape[normalize_axis(dim, x.ndim)]


@aten("size.default")
def _size(ctx, x):
    return tuple(x.shape)


@aten("sym_numel.default", "numel.default")
def _numel(ctx, x):
    return x.numel


@aten("dim.default")
def _dim(ctx, x):
    return x.ndim


def _strided(x: Tensor, fn) -> Tensor:
    """``x`` through the view ``fn(View) -> View`` on its contiguous layout (composed with a view
    ``x`` already is, where ``fn`` accepts it: None makes it a view of the materialized value)."""
    return Tensor(view_node(x.node, fn))


@aten(*_copies("diagonal.default"))
def _diagonal(ctx, x, offset=0, dim1=0, dim2=1):
    """The ``offset`` diagonal of the ``dim1`` x ``dim2`` planes, appended as the last dim: one
    view (stride ``s1 + s2``), no copy."""
    d1, d2 = normalize_axis(dim1, x.ndim), normalize_axis(dim2, x.ndim)
    if d1 == d2:
        raise ShapeError(f"diagonal dims must differ, got {dim1} and {dim2}")
    n1, n2 = x.shape[d1], x.shape[d2]
    r0, c0 = (0, offset) if offset >= 0 else (-offset, 0)
    length = max(0, min(n1 - r0, n2 - c0))
    keep = [d for d in range(x.ndim) if d not in (d1, d2)]

    def fn(v: View) -> View | None:
        if v.mask is not None:
            return None
        st = v.strides
        off = v.offset + (r0 * st[d1] + c0 * st[d2] if length else 0)
        return View._make([v.shape[d] for d in keep] + [length],
                          [st[d] for d in keep] + [st[d1] + st[d2]], off, None)
    return _strided(x, fn)


@aten(*_copies("unfold.default"))
def _unfold(ctx, x, dimension, size, step):
    """``Tensor.unfold``: windows of ``size`` every ``step`` along ``dimension``, the window
    appended as the last dim: one view, no copy."""
    if x.ndim == 0:
        return x.reshape((1,))
    d = normalize_axis(dimension, x.ndim)
    n = x.shape[d]
    if size > n or step <= 0:
        raise ShapeError(f"unfold size {size} > {n} or step {step} <= 0")
    count = (n - size) // step + 1

    def fn(v: View) -> View | None:
        if v.mask is not None:
            return None
        shape, st = list(v.shape), list(v.strides)
        return View._make(shape[:d] + [count] + shape[d + 1:] + [size],
                          st[:d] + [st[d] * step] + st[d + 1:] + [st[d]], v.offset, None)
    return _strided(x, fn)


@aten("triu_indices.default", "tril_indices.default")
def _tri_indices(ctx, row, col, offset=0, *, dtype=None, **_layout):
    """The ``[2, N]`` row and column indices of the upper (lower) triangle: a constant."""
    upper = ctx.op.startswith("aten.triu")
    r, c = (np.triu_indices if upper else np.tril_indices)(row, offset, col)
    d = lumc_dtype(dtype) if dtype is not None else dt.i64
    return Tensor.const(np.stack([r, c]).astype(d.np))
