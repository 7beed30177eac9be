"""Views as movement steps: split a :class:`~lumc.ir.views.View` into reshape/permute/expand.

Rules and kernels reason about movement by kind (a permute cancels a permute; a broadcast feeds a
matmul), while the IR keeps one composed affine view per node. :func:`decompose_view` recovers the
steps of an unmasked, offset-0 view over a contiguous source::

    view = expand(reshape(permute(reshape(src, P), perm), S1), shape)

(identity steps left out), and :func:`compose_view` applies a view on top of another by replaying
those steps with the :class:`View` methods, which keep masks and offsets exact.
"""
from __future__ import annotations

from lumc.ir.views import View, prod

Shape = tuple[int, ...]
Step = tuple  # ("reshape", shape) | ("permute", perm) | ("expand", shape)


def apply_steps(v: View | None, steps: list[Step]) -> View | None:
    """Replay movement steps on a view; None when a reshape cannot be one view."""
    for kind, arg in steps:
        if v is None:
            return None
        if kind == "reshape":
            v = v.reshape(arg)
        elif kind == "permute":
            v = v.permute(arg)
        else:
            v = v.expand(arg)
    return v


def decompose_view(src_shape: Shape, v: View) -> list[Step] | None:
    """Movement steps equal to ``v`` read over a contiguous ``src_shape``, or None.

    None means the view is not a reshape/permute/expand combination (a slice, pad, window, or
    overlapping strides); callers then keep it whole.
    """
    src_shape = tuple(src_shape)
    if v.mask is not None or v.offset != 0 or v.numel == 0 or prod(src_shape) == 0:
        return None
    if v.is_identity_of(src_shape):
        return []
    s1 = tuple(1 if (d > 1 and st == 0) else d for d, st in zip(v.shape, v.strides))
    if prod(s1) != prod(src_shape):
        return None
    dims = [k for k, d in enumerate(s1) if d > 1]
    order = sorted(dims, key=lambda k: -v.strides[k])
    sizes = [s1[k] for k in order]
    expect = 1
    for k in reversed(order):
        if v.strides[k] != expect:
            return None
        expect *= s1[k]
    steps: list[Step] = []
    p_shape = tuple(sizes)
    perm = tuple(order.index(k) for k in dims)
    if perm != tuple(range(len(perm))):
        same_rank = _same_rank_steps(src_shape, v, s1, order, sizes)
        if same_rank is not None:
            return same_rank
    else:
        # no permutation: one reshape (keeps size-1 dims out of the way)
        steps = [("reshape", s1)] if s1 != src_shape else []
        if s1 != tuple(v.shape):
            steps.append(("expand", tuple(v.shape)))
        return steps if apply_steps(View.contiguous(src_shape), steps) == v else None
    if p_shape != src_shape:
        steps.append(("reshape", p_shape))
    steps.append(("permute", perm))
    q_shape = tuple(p_shape[p] for p in perm)
    if q_shape != s1:
        steps.append(("reshape", s1))
    if s1 != tuple(v.shape):
        steps.append(("expand", tuple(v.shape)))
    if apply_steps(View.contiguous(src_shape), steps) != v:
        return None
    return steps


def _same_rank_steps(src_shape: Shape, v: View, s1: Shape, order: list[int],
                     sizes: list[int]) -> list[Step] | None:
    """``[permute][expand]`` keeping size-1 dims in place, when the ranks agree."""
    if len(src_shape) != len(s1):
        return None
    src_big = [i for i, d in enumerate(src_shape) if d > 1]
    if [src_shape[i] for i in src_big] != sizes:
        return None
    perm: list[int] = [0] * len(s1)
    for j, k in enumerate(order):
        perm[k] = src_big[j]
    ones_out = [k for k, d in enumerate(s1) if d == 1]
    ones_src = [i for i, d in enumerate(src_shape) if d == 1]
    for k, i in zip(ones_out, ones_src):
        perm[k] = i
    steps: list[Step] = []
    if tuple(perm) != tuple(range(len(perm))):
        steps.append(("permute", tuple(perm)))
    if s1 != tuple(v.shape):
        steps.append(("expand", tuple(v.shape)))
    if apply_steps(View.contiguous(src_shape), steps) != v:
        return None
    return steps


def _unravel(flat: int, shape: Shape) -> list[int] | None:
    out = []
    for d in reversed(shape):
        out.append(flat % d if d else 0)
        flat //= d if d else 1
    return None if flat else list(reversed(out))


def decompose_sliced(src_shape: Shape, v: View) -> tuple[View, list[Step]] | None:
    """``(box, steps)`` with ``v == apply_steps(box, steps)``, where ``box`` is a slice (a sub-box,
    step 1 along each axis) of the contiguous source and ``steps`` are movement steps over the box's
    own shape. This finds a split (``q, k, v = x.split(...)``) under a reshape and a transpose."""
    src_shape = tuple(src_shape)
    if v.mask is not None or v.numel == 0 or prod(src_shape) == 0 or any(s < 0 for s in v.strides):
        return None
    last = v.offset + sum((d - 1) * s for d, s in zip(v.shape, v.strides))
    lo, hi = _unravel(v.offset, src_shape), _unravel(last, src_shape)
    if lo is None or hi is None or any(a > b for a, b in zip(lo, hi)):
        return None
    box_shape = tuple(b - a + 1 for a, b in zip(lo, hi))
    box = View.contiguous(src_shape).slice(lo, [1] * len(lo), box_shape)
    if box.is_identity_of(src_shape):
        return None
    box_strides = contiguous_strides_full(box_shape)
    strides = []
    for st in v.strides:
        c = _unravel(st, src_shape) if st else [0] * len(src_shape)
        if c is None:
            return None
        strides.append(sum(ci * bs for ci, bs in zip(c, box_strides)))
    inner = View._make(v.shape, strides, 0, None)
    steps = decompose_view(box_shape, inner)
    if steps is None or apply_steps(box, steps) != v:
        return None
    return box, steps


def refine_shape(src_shape: Shape, v: View) -> Shape:
    """``src_shape`` with each dim split where a stride of ``v`` falls inside it (a row-major
    reshape, so the flat index space is unchanged): ``[T, 3*H*D]`` read as GPT-NeoX's per-head
    ``q = x.view(T, H, 3*D)[..., :D]`` (head stride ``3*D``) is ``[T, H, 3*D]``, whose ``q`` is a
    box slice. A stride ``s`` splits dim ``d`` (row-major stride ``S``, size ``n``) into
    ``(S*n/s, s/S)`` when ``S < s < S*n`` and both divide evenly."""
    out: list[int] = []
    for d, st in zip(src_shape, contiguous_strides_full(src_shape)):
        cuts = sorted({s for s, n in zip(v.strides, v.shape)
                       if n > 1 and st < s < st * d and s % st == 0 and (st * d) % s == 0})
        # nested splits: each cut must divide the next one up, else keep the dim whole
        if any(b % a for a, b in zip(cuts, cuts[1:])):
            out.append(d)
            continue
        inner = [c // st for c in cuts]          # sizes below each cut, innermost first
        sizes, below = [], 1
        for c in inner:
            sizes.append(c // below)
            below = c
        sizes.append(d // below)
        out.extend(reversed(sizes))
    return tuple(out)


def decompose_refined(src_shape: Shape, v: View) -> tuple[Shape, View, list[Step]] | None:
    """``(refined, box, steps)`` with ``v == apply_steps(box, steps)`` where ``box`` is a slice of
    the contiguous ``refined`` shape (:func:`refine_shape`; ``src_shape`` itself when the slice is
    a box there already), or None (the view stays whole)."""
    for shape in dict.fromkeys((tuple(src_shape), refine_shape(src_shape, v))):
        out = decompose_sliced(shape, v)
        if out is not None:
            return (shape, *out)
    return None


def contiguous_strides_full(shape: Shape) -> tuple[int, ...]:
    """Row-major strides, size-1 dims included (the flat-index weight of every axis)."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


def compose_view(inner: View, outer: View) -> View | None:
    """One view equal to reading ``outer`` over the result of ``inner``, or None (then stack them)."""
    if inner.is_contiguous:
        # outer indexes inner's contiguous space, which is the source's own flat space here
        return outer
    steps = decompose_view(inner.shape, outer)
    if steps is None:
        return None
    return apply_steps(inner, steps)


def compose_views(views: list[View]) -> View | None:
    """One view equal to reading ``views`` in turn (the innermost first, as a chain of ``View``
    nodes from a buffer up to its reader lists them), or None when there are none or two do not
    compose (:func:`compose_view`)."""
    if not views:
        return None
    cur = views[0]
    for v in views[1:]:
        cur = compose_view(cur, v)
        if cur is None:
            return None
    return cur
