"""Indexing and layout ops of ONNX built from ``Gather``, ``Iota``, ``Where`` and views.

``gather``/``gather_elements``/``gather_nd`` end in exactly one primitive ``Gather`` (the only
data-dependent read; torch's ``gather_elements(negative_indices=False)`` first reads its index
through a second one, over ``[0, n)``, which range-checks it), except that ``gather`` by a constant
index that is one run of positions is a view (``select``, ``chunk``); the others (``tile``, ``pad`` in
every mode, ``one_hot``, ``trilu``, ``range_``, ``depth_to_space``, ``space_to_depth``) are views,
iotas and selects, so the e-graph can fuse them.
Negative indices are normalized as ONNX says (``i < 0 -> i + n``; ``gather`` and ``gather_elements``
with ``negative_indices=False`` leave them out of range, as torch's ``embedding`` and ``gather``
have them); an index still out of range is an error the reference executor raises (``IndexError``)
and other backends leave undefined, as ONNX does.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.graph import node
from lumc.ir.tensor import Tensor, concat, normalize_axis
from lumc.ir.views import prod

PAD_MODES = ("constant", "reflect", "edge", "wrap")


def take(x: Tensor, index: Tensor, axis: int) -> Tensor:
    """The primitive ``Gather``: ``x.shape[:axis] + index.shape + x.shape[axis+1:]``; ``index``
    (i32/i64) must already lie in ``[0, x.shape[axis])``."""
    return Tensor(node("Gather", (x.node, index.node), normalize_axis(axis, x.ndim)))


def _as_index(indices, dtype: dt.DType = dt.i64) -> Tensor:
    if isinstance(indices, Tensor):
        if indices.dtype not in (dt.i32, dt.i64):
            raise ShapeError(f"indices must be i32 or i64, got {indices.dtype}")
        return indices
    arr = np.asarray(indices)
    if arr.dtype.kind not in "iu" and arr.size:
        raise ShapeError(f"indices must be integers, got {arr.dtype}")
    return Tensor.const(arr.astype(dtype.np))


def normalize_indices(indices: Tensor, n: int | Tensor) -> Tensor:
    """``indices + n`` where negative (ONNX), folded at build time for constant indices.

    ``n`` is an int, or a tensor broadcastable to ``indices`` (per-element sizes).
    """
    if indices.node.op == "Constant" and isinstance(n, int):
        v = indices.node.arg.value
        return Tensor.const(np.where(v < 0, v + n, v).astype(v.dtype))
    zero = indices.scalar_like(0)
    nn = n if isinstance(n, Tensor) else indices._coerce(n)
    return indices.lt(zero).where(indices.add(nn.cast(indices.dtype)), indices)


def gather(x: Tensor, indices, axis: int = 0, negative_indices: bool = True) -> Tensor:
    """ONNX ``Gather``: ``out = x.shape[:axis] + indices.shape + x.shape[axis+1:]``.

    Args:
        x: any dtype and rank >= 1.
        indices: i32/i64 tensor (or array-like), values in ``[-n, n)``; in ``[0, n)`` when
            ``negative_indices`` is False (torch ``embedding`` and ``index_select``, which refuse
            a negative index): it then reaches the ``Gather`` primitive as given, so a negative
            one is out of range there like one past the end.
        axis: in ``[-rank, rank)``.
    Raises:
        ShapeError: bad axis or index dtype.
    """
    if x.ndim == 0:
        raise ShapeError("Gather needs a tensor of rank >= 1", op="Gather")
    axis = normalize_axis(axis, x.ndim)
    idx = _as_index(indices)
    if negative_indices:
        idx = normalize_indices(idx, x.shape[axis])
    as_view = _constant_run(x, idx, axis)
    return as_view if as_view is not None else take(x, idx, axis)


def _constant_run(x: Tensor, idx: Tensor, axis: int) -> Tensor | None:
    """``x`` gathered along ``axis`` by a constant index that is one run (one position, or
    consecutive ones up or down: ``select``, ``chunk`` and ``unbind`` as exporters write them) as
    a view, which fuses into whatever reads it; None for any other index (data-dependent, several
    runs, or out of range, whose read stays a ``Gather`` that raises)."""
    if idx.node.op != "Constant":
        return None
    v = np.asarray(idx.node.arg.value).reshape(-1)
    n = x.shape[axis]
    if v.size == 0 or v.min() < 0 or v.max() >= n or len(_index_runs(v)) != 1:
        return None
    picked = _take_runs(x, axis, v)                          # the run along axis, v.size long
    return picked.reshape(x.shape[:axis] + tuple(idx.shape) + x.shape[axis + 1:])


def gather_elements(x: Tensor, indices, axis: int = 0, negative_indices: bool = True,
                    check_range: bool = False) -> Tensor:
    """ONNX ``GatherElements``: ``out[i..] = x[i_0, .., indices[i..], .., i_{r-1}]`` (index replaces
    coordinate ``axis``), ``out`` has ``indices``' shape (each dim <= ``x``'s, except along ``axis``).

    One ``Gather`` from the flattened ``x`` at a linear index built from iotas.

    Args:
        x: any dtype and rank >= 1.
        indices: i32/i64 tensor (or array-like) of ``x``'s rank, values in ``[-n, n)``, ``n`` the
            size of ``axis``; in ``[0, n)`` when ``negative_indices`` is False (torch ``gather``,
            which refuses a negative index).
        axis: in ``[-rank, rank)``.
        check_range: also with ``negative_indices`` (after counting negatives from the end),
            route the index through a ``Gather`` of ``[0, n)``, as without it: an index outside
            its axis is refused there; the linear index alone reads a neighbouring row (ONNX
            index 5 on an axis of 4 read the next row's element 1, where onnxruntime refuses the
            node). Off for indices in range by construction (TopK, scatters): no extra kernel.
    Raises:
        ShapeError: bad axis, index rank or index shape.
    """
    idx = _as_index(indices)
    r = x.ndim
    axis = normalize_axis(axis, r)
    if idx.ndim != r:
        raise ShapeError(f"indices rank {idx.ndim} != data rank {r}", op="GatherElements")
    for k in range(r):
        if k != axis and idx.shape[k] > x.shape[k]:
            raise ShapeError(f"indices shape {idx.shape} exceeds data shape {x.shape} on axis {k}",
                             op="GatherElements")
    if negative_indices:
        idx = normalize_indices(idx, x.shape[axis])
    if check_range or not negative_indices:
        # read back through a Gather of [0, n): an index outside its axis is refused there
        # (naming the node) instead of reading a neighbouring row through the linear index
        idx = take(Tensor.iota((x.shape[axis],), 0, idx.dtype), idx, 0)
    idx = idx.cast(dt.i64)
    strides = [prod(x.shape[k + 1:]) for k in range(r)]
    lin = idx.mul(strides[axis]) if strides[axis] != 1 else idx
    for k in range(r):
        if k != axis and idx.shape[k] > 1:
            lin = lin.add(Tensor.iota(idx.shape, k).mul(strides[k]))
    return take(x.reshape((x.numel,)), lin, 0)


def gather_nd(x: Tensor, indices, batch_dims: int = 0) -> Tensor:
    """ONNX ``GatherND``: ``indices[..., k]`` addresses the first ``k`` dims after the batch dims.

    Each index component is checked against its own dim (a ``Gather`` of ``[0, n)``, which the
    reference executor refuses naming the node) before the components are folded into one flat
    index.

    Returns:
        ``indices.shape[:-1] + x.shape[batch_dims + k:]``.
    Raises:
        ShapeError: when batch dims differ or ``k`` exceeds the remaining rank.
    """
    idx = _as_index(indices).cast(dt.i64)
    b = int(batch_dims)
    if idx.ndim < 1 or idx.ndim <= b or x.ndim <= b:
        raise ShapeError(f"bad ranks: data {x.shape}, indices {idx.shape}, batch_dims {b}",
                         op="GatherND")
    if tuple(x.shape[:b]) != tuple(idx.shape[:b]):
        raise ShapeError(f"batch dims differ: {x.shape[:b]} vs {idx.shape[:b]}", op="GatherND")
    k = idx.shape[-1]
    if b + k > x.ndim:
        raise ShapeError(f"index depth {k} exceeds data rank {x.ndim} - batch_dims {b}",
                         op="GatherND")
    addressed = x.shape[b:b + k]
    rest = tuple(x.shape[b + k:])
    bsize, asize = prod(x.shape[:b]), prod(addressed)
    lin = None
    for j in range(k):
        comp = normalize_indices(idx.slice([j], [j + 1], [-1]).squeeze([-1]), addressed[j])
        if k > 1 or b:
            # read back through a Gather of [0, n_j): the flat index alone let a component
            # past its dim read another row ([0, 5] of a [3, 4] table read [1, 1])
            comp = take(Tensor.iota((addressed[j],), 0, comp.dtype), comp, 0)
        comp = comp.mul(prod(addressed[j + 1:]))
        lin = comp if lin is None else lin.add(comp)
    lead = idx.shape[:-1]
    if lin is None:
        lin = Tensor.full(lead, 0, dt.i64)
    if b:
        flat_batch = None
        for j in range(b):
            t = Tensor.iota(lead, j).mul(prod(x.shape[j + 1:b]) * asize)
            flat_batch = t if flat_batch is None else flat_batch.add(t)
        lin = lin.add(flat_batch)
    return take(x.reshape((bsize * asize,) + rest), lin, 0)


def tile(x: Tensor, repeats: Sequence[int]) -> Tensor:
    """ONNX ``Tile`` as views: ``[d0, d1..] -> [1, d0, 1, d1..] -> [r0, d0, r1, d1..] -> [r0 d0, ..]``."""
    repeats = [int(r) for r in repeats]
    if len(repeats) != x.ndim or any(r < 0 for r in repeats):
        raise ShapeError(f"repeats {repeats} do not fit rank {x.ndim}", op="Tile")
    inter = [d for r, s in zip(repeats, x.shape) for d in (1, s)]
    big = [d for r, s in zip(repeats, x.shape) for d in (r, s)]
    return x.reshape(inter).expand(big).reshape([r * s for r, s in zip(repeats, x.shape)])


def _index_runs(idx: np.ndarray) -> list[tuple[int, int, int]]:
    """Split a constant index vector into runs ``(start, step, count)`` with step in (-1, 0, 1)."""
    runs, i, n = [], 0, len(idx)
    while i < n:
        j = i + 1
        step = int(idx[j] - idx[i]) if j < n and abs(int(idx[j] - idx[i])) <= 1 else 0
        while j < n and int(idx[j] - idx[j - 1]) == step:
            j += 1
        runs.append((int(idx[i]), step, j - i))
        i = j
    return runs


def _take_runs(x: Tensor, axis: int, idx: np.ndarray) -> Tensor:
    """``x`` indexed along ``axis`` by a constant index vector, as a concat of slice/expand views."""
    parts = []
    for start, step, count in _index_runs(idx):
        if step == 0:
            one = x.slice([start], [start + 1], [axis])
            shape = list(one.shape)
            shape[axis] = count
            parts.append(one.expand(shape))
        elif step == 1:
            parts.append(x.slice([start], [start + count], [axis]))
        else:
            end = start - count
            parts.append(x.slice([start], [end if end >= 0 else -(2 ** 63)], [axis], [-1]))
    return concat(parts, axis) if len(parts) > 1 else parts[0]


def pad(x: Tensor, pads: Sequence[int], mode: str = "constant", value=0, axes=None) -> Tensor:
    """ONNX ``Pad``: ``pads`` = all begins then all ends (over ``axes``, default all), may be negative
    (crop).

    Modes: ``constant`` (``value``, converted to ``x``'s dtype), ``reflect`` (mirror without the edge
    element, any pad size: reflects back and forth), ``edge`` (repeat the border), ``wrap``
    (periodic). Non-constant modes are concatenations of slice/flip/expand views.

    Raises:
        ShapeError: bad lengths or mode; negative pads removing more than an axis holds (the
            output size was clamped to 0; onnxruntime refuses); a non-constant mode padding an
            empty axis.
    """
    rank = x.ndim
    axes = list(range(rank)) if axes is None else [normalize_axis(a, rank) for a in axes]
    pads = [int(p) for p in pads]
    if len(pads) != 2 * len(axes):
        raise ShapeError(f"{len(pads)} pads for {len(axes)} axes", op="Pad")
    if mode not in PAD_MODES:
        raise ShapeError(f"unknown mode {mode!r} (expected one of {PAD_MODES})", op="Pad")
    pairs = [(0, 0)] * rank
    for i, a in enumerate(axes):
        pairs[a] = (pads[i], pads[len(axes) + i])
        crop = -min(pairs[a][0], 0) - min(pairs[a][1], 0)
        if crop > x.shape[a]:
            raise ShapeError(f"pads {list(pairs[a])} on axis {a} remove {crop} of its "
                             f"{x.shape[a]} elements", op="Pad")
    if mode == "constant":
        v = np.asarray(value if value is not None else 0).astype(x.dtype.np).item()
        return x.pad(pairs, v)
    # crop first (negative pads), then pad the rest by an index table along each axis
    x = x.pad([(min(b, 0), min(e, 0)) for b, e in pairs])
    for a, (b, e) in enumerate(pairs):
        b, e = max(b, 0), max(e, 0)
        if b == 0 and e == 0:
            continue
        n = x.shape[a]
        if n == 0:
            raise ShapeError(f"cannot {mode}-pad empty axis {a}", op="Pad")
        np_mode = {"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode]
        if mode == "reflect" and n == 1:
            np_mode = "edge"                   # a single element reflects onto itself
        idx = np.pad(np.arange(n), (b, e), mode=np_mode)
        x = _take_runs(x, a, idx)
    return x


def one_hot(indices: Tensor, depth: int, values, axis: int = -1) -> Tensor:
    """ONNX ``OneHot``: ``values[1]`` where ``iota == indices`` along the new ``axis``, else
    ``values[0]``.

    Args:
        indices: any numeric dtype (floats truncate); negative ones count from ``depth``; out of
            ``[-depth, depth)`` gives an all-off row.
        depth: static int.
        values: ``[off, on]`` as a 2-element tensor or array-like (output dtype: its dtype).
        axis: where the new ``depth`` axis goes, in ``[-r-1, r]``.
    """
    depth = int(depth)
    r = indices.ndim
    axis = normalize_axis(axis, r + 1)
    if not isinstance(values, Tensor):
        values = Tensor.const(np.asarray(values))
    if values.numel != 2:
        raise ShapeError(f"values needs 2 elements, got shape {values.shape}", op="OneHot")
    flat = values.reshape((2,))
    off, on = flat.slice([0], [1]).reshape(()), flat.slice([1], [2]).reshape(())
    idx = indices.cast(dt.i64)
    idx = normalize_indices(idx, depth)
    out_shape = indices.shape[:axis] + (depth,) + indices.shape[axis:]
    hit = Tensor.iota(out_shape, axis).eq(idx.unsqueeze([axis]))
    return hit.where(on, off)


def trilu(x: Tensor, k: int = 0, upper: bool = True) -> Tensor:
    """ONNX ``Trilu`` on the last two axes: keep ``j - i >= k`` (upper) or ``j - i <= k`` (lower),
    zero elsewhere (a ``Where``, so NaN/inf outside the kept triangle become 0)."""
    if x.ndim < 2:
        raise ShapeError(f"Trilu needs rank >= 2, got {x.shape}", op="Trilu")
    m, n = x.shape[-2:]
    diff = Tensor.iota((m, n), 1).sub(Tensor.iota((m, n), 0))
    kk = diff.scalar_like(int(k))
    keep = diff.ge(kk) if upper else diff.le(kk)
    return keep.where(x, x.scalar_like(0))


def range_(start, limit, delta, dtype: dt.DType) -> Tensor:
    """ONNX ``Range`` with static scalars: ``start + i * delta`` for ``i < max(ceil((limit - start)
    / delta), 0)`` in ``dtype`` (integers exact; floats one rounding of the product and the sum).

    Raises:
        ShapeError: ``delta == 0``.
    """
    if delta == 0:
        raise ShapeError("delta must be nonzero", op="Range")
    n = max(int(np.ceil((limit - start) / delta)), 0)
    i = Tensor.iota((n,), 0, dtype)
    return i.mul(Tensor.const(np.asarray(delta, dtype.np))).add(Tensor.const(np.asarray(start, dtype.np)))


def depth_to_space(x: Tensor, blocksize: int, mode: str = "DCR") -> Tensor:
    """ONNX ``DepthToSpace`` on ``[N, C, H, W]`` -> ``[N, C/b², H b, W b]`` (views).

    ``DCR``: channel ``c`` splits as ``(b1, b2, c')``; ``CRD``: as ``(c', b1, b2)``.
    """
    b = int(blocksize)
    if x.ndim != 4 or b < 1 or x.shape[1] % (b * b):
        raise ShapeError(f"DepthToSpace needs [N, C, H, W] with C divisible by {b}², got {x.shape}",
                         op="DepthToSpace")
    n, c, h, w = x.shape
    cc = c // (b * b)
    if mode == "DCR":
        y = x.reshape((n, b, b, cc, h, w)).permute((0, 3, 4, 1, 5, 2))
    elif mode == "CRD":
        y = x.reshape((n, cc, b, b, h, w)).permute((0, 1, 4, 2, 5, 3))
    else:
        raise ShapeError(f"unknown mode {mode!r} (DCR or CRD)", op="DepthToSpace")
    return y.reshape((n, cc, h * b, w * b))


def space_to_depth(x: Tensor, blocksize: int, mode: str = "DCR") -> Tensor:
    """ONNX ``SpaceToDepth`` on ``[N, C, H, W]`` -> ``[N, C b², H/b, W/b]`` (views), the inverse
    of :func:`depth_to_space` in the same mode: output channel ``(b1, b2, c)`` for ``DCR``,
    ``(c, b1, b2)`` for ``CRD`` (opset 28)."""
    b = int(blocksize)
    if x.ndim != 4 or b < 1 or x.shape[2] % b or x.shape[3] % b:
        raise ShapeError(f"SpaceToDepth needs [N, C, H, W] with H, W divisible by {b}, got "
                         f"{x.shape}", op="SpaceToDepth")
    n, c, h, w = x.shape
    y = x.reshape((n, c, h // b, b, w // b, b))
    if mode == "DCR":
        y = y.permute((0, 3, 5, 1, 2, 4))
    elif mode == "CRD":
        y = y.permute((0, 1, 3, 5, 2, 4))
    else:
        raise ShapeError(f"unknown mode {mode!r} (DCR or CRD)", op="SpaceToDepth")
    return y.reshape((n, c * b * b, h // b, w // b))
