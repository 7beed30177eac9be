"""Index expressions for generated kernels: unravel, reshape maps, view addresses, int64 decisions.

A tile element is named by one index expression per dim of the tensor being read (``idx``). Views
turn the index of their output into a flat position in their source (``View.index_expr``); reads of
a computed source unravel that position back into the source's dims. The helpers here keep those
expressions short: the outermost dim of a bounded flat index needs no ``%``, size-1 dims are ``0``,
and a reshape that only adds or drops size-1 dims maps dims one to one instead of through ``//``/``%``.
"""
from __future__ import annotations

import contextlib
import contextvars

from lumc.ir.graph import Node
from lumc.ir.views import View, contiguous_strides, prod

INT32_LIMIT = 2 ** 31 - 1


def unravel(flat: str, shape: tuple[int, ...]) -> list[str]:
    """Row-major indices of ``shape`` from ``flat``, assumed in ``[0, prod(shape))`` where it matters.

    Masked-off lanes may carry a ``flat`` past the end; their indices are then out of range too, and
    every read they feed is masked.
    """
    nonone = [k for k, d in enumerate(shape) if d != 1]
    out = ["0"] * len(shape)
    acc = 1
    for pos, k in enumerate(reversed(nonone)):
        d = shape[k]
        e = flat if acc == 1 else f"({flat}) // {acc}"
        if pos != len(nonone) - 1:          # the outermost dim is bounded by the mask already
            e = f"({e}) % {d}"
        out[k] = e if e.isidentifier() else f"({e})"
        acc *= d
    return out


def flat_index(idx: list[str], shape: tuple[int, ...]) -> str:
    """Row-major flat position of ``idx`` in a contiguous tensor of ``shape``."""
    terms = []
    for e, st in zip(idx, contiguous_strides(shape)):
        if st == 0 or e == "0":
            continue
        terms.append(e if st == 1 else f"{e} * {st}")
    return " + ".join(terms) if terms else "0"


def reshape_index(idx: list[str], src_shape: tuple[int, ...], dst_shape: tuple[int, ...]) -> list[str]:
    """Indices in ``dst_shape`` of the element at ``idx`` in ``src_shape`` (same row-major order)."""
    if tuple(src_shape) == tuple(dst_shape):
        return list(idx)
    a = [(k, d) for k, d in enumerate(src_shape) if d != 1]
    b = [(k, d) for k, d in enumerate(dst_shape) if d != 1]
    if [d for _, d in a] == [d for _, d in b]:
        out = ["0"] * len(dst_shape)
        for (ka, _), (kb, _) in zip(a, b):
            out[kb] = idx[ka]
        return out
    return unravel(flat_index(idx, src_shape), dst_shape)


def is_pure_reshape(v: View, src_shape: tuple[int, ...]) -> bool:
    """True when the view reads ``src_shape`` in row-major order (a reshape, nothing else)."""
    return v.is_contiguous and v.numel == prod(src_shape)


def permutation_of(v: View, src_shape: tuple[int, ...]) -> list[int] | None:
    """``perm`` with ``v == permute(contiguous(src_shape), perm)``, else None (dims of size 1 free)."""
    if v.offset or v.mask is not None or len(v.shape) != len(src_shape):
        return None
    cs = contiguous_strides(src_shape)
    perm, used = [], set()
    for d, st in zip(v.shape, v.strides):
        cands = [k for k in range(len(src_shape))
                 if k not in used and src_shape[k] == d and (cs[k] == st or d == 1)]
        if not cands:
            return None
        perm.append(cands[0])
        used.add(cands[0])
    return perm


def max_address(v: View) -> int:
    """An upper bound on ``|flat|`` over the view's elements (for the int32/int64 decision)."""
    return abs(v.offset) + sum((d - 1) * abs(s) for d, s in zip(v.shape, v.strides) if d > 0)


_SERVED: contextvars.ContextVar = contextvars.ContextVar("lumc_served_sizes", default=None)


@contextlib.contextmanager
def served_at(sub):
    """Within this block, :func:`needs_int64` bounds sizes at ``sub`` (a
    :class:`~lumc.ir.symbolic.Substitution` to the largest sizes a size-generic kernel serves),
    not at the probe sizes it is rendered at (``lumc.backends.triton.size_generic``)."""
    token = _SERVED.set(sub)
    try:
        yield
    finally:
        _SERVED.reset(token)


def served_size(v: int) -> int:
    """Size ``v`` (a dim or a product of dims, at the sizes the kernel is rendered at) at the
    largest sizes of :func:`served_at`, when set; else ``v``. A size-generic kernel takes the
    variant (looped or split rows, split-K) that the search chose its config for, at its bucket's
    largest size: one chosen at the probe sizes takes other knobs (``SPLIT``, ``SPLIT_K``) than
    the plan's config names."""
    sub = _SERVED.get()
    if sub is None:
        return v
    from lumc.ir.symbolic import resize_int
    return abs(resize_int(v, sub))


def needs_int64(nodes: list[Node], extra_sizes: tuple[int, ...] = (),
                virtual_shapes: tuple[tuple[int, ...], ...] = ()) -> bool:
    """True when any tensor, view address or iteration space can pass ``2**31 - 1`` (at the
    sizes of :func:`served_at`, when set).

    ``virtual_shapes``: iteration spaces no index is computed over as a whole (a contraction's
    ``M x N x K`` product space, walked in tiles): nodes of that shape count by the addresses they
    read, not by their element count, so only a real address past ``2**31`` forces int64.
    """
    sub = _SERVED.get()
    if sub is not None:
        from lumc.ir.symbolic import resize_arg, resize_int
        at = lambda v: abs(resize_int(v, sub))                           # noqa: E731
        numel = lambda n: prod(resize_int(d, sub) for d in n.shape)      # noqa: E731
        view = lambda n: resize_arg(n, sub)                              # noqa: E731
    else:
        at, numel, view = abs, (lambda n: n.numel), (lambda n: n.arg)
    bound = max((at(v) for v in extra_sizes), default=0)
    virtual = {tuple(s) for s in virtual_shapes}
    for n in nodes:
        if tuple(n.shape) not in virtual or n.op in ("Input", "Constant"):
            bound = max(bound, numel(n))
        if n.op == "View":
            bound = max(bound, max_address(view(n)), numel(n.srcs[0]))
    return bound >= INT32_LIMIT


def per_axis(v: View, src_shape: tuple[int, ...]) -> list[tuple[int, list[tuple[int, int]]]] | None:
    """The source coordinates a view reads, one affine expression per source axis, when they can
    be read off its strides without the ``//``/``%`` of unravelling its flat position.

    Returns ``[(offset_i, [(dim j, mult)])]`` per axis ``i`` of ``src_shape``: the coordinate along
    ``i`` is ``offset_i + sum(mult * idx[j])``. Exact when every stride is ``mult * cs[i]`` for one
    axis (``cs``: row-major strides of ``src_shape``) and, over the view's valid box (its mask), each
    coordinate stays in ``[0, src_shape[i])``: no position carries into the next axis, so the flat
    position decomposes uniquely. A convolution's window view over its padded input is one (the
    taps and outputs of an axis add up there); masked lanes may get coordinates out of range, and
    every read they feed is masked. None when the strides do not decompose that way.
    """
    cs = contiguous_strides(src_shape)
    axes = [i for i, c in enumerate(cs) if c > 0]
    if not axes:
        return None
    box = v.mask or tuple((0, d) for d in v.shape)
    terms: dict[int, list[tuple[int, int]]] = {i: [] for i in axes}
    lo = {i: 0 for i in axes}
    hi = {i: 0 for i in axes}
    for j, (d, st) in enumerate(zip(v.shape, v.strides)):
        if d == 1 or st == 0:
            continue
        i = next((a for a in axes if cs[a] <= abs(st) and abs(st) % cs[a] == 0), None)
        if i is None:
            return None
        mult = st // cs[i] if st > 0 else -((-st) // cs[i])
        a, b = box[j][0] * mult, (box[j][1] - 1) * mult
        lo[i] += min(a, b)
        hi[i] += max(a, b)
        terms[i].append((j, mult))
    # the offset split over the axes, outermost first: each axis takes the share that leaves the
    # inner axes a representable remainder, and its coordinates must stay inside the axis
    rest, offs = v.offset, {}
    for pos, i in enumerate(axes):
        inner_min = sum((-lo[k]) * cs[k] for k in axes[pos + 1:])
        o = (rest - inner_min) // cs[i]
        if not (0 <= o + lo[i] and o + hi[i] < src_shape[i]):
            return None
        offs[i] = o
        rest -= o * cs[i]
    if rest != 0:
        return None
    return [(offs.get(i, 0), terms.get(i, [])) for i in range(len(src_shape))]


def store_order(v: View) -> list[tuple[int, int]] | None:
    """``[(dim, stride)]`` of ``v``'s non-unit dims, largest stride first, when a kernel can store
    a value through ``v`` from the positions of its source (a model output that is a slice, a
    permutation or a split of heads of a contraction's tile: ``render_matmul``); else None.

    That needs every source position to be read by at most one index, found digit by digit: no
    mask, positive strides, and each stride at least the next smaller one times its dim's size
    (``strides[a] >= strides[b] * shape[b]``). Then an index's offset from the first position,
    ``sum(i_k * strides[k])``, is a mixed-radix number whose digits ``i_k`` are taken greedily,
    largest stride first (the smaller dims' terms sum to less than the next larger stride, by the
    nesting), so :func:`store_through` inverts the view exactly. A view of no elements is refused
    too: its size-0 dims would drop out with the unit ones, and the digits of the rest would store
    into an empty buffer (the copy kernel of nothing stays instead).
    """
    if v.mask is not None or 0 in v.shape:
        return None
    dims = [(k, s) for k, (d, s) in enumerate(zip(v.shape, v.strides)) if d > 1]
    if any(s <= 0 for _, s in dims):
        return None
    dims.sort(key=lambda t: -t[1])
    if any(s1 < s2 * v.shape[k2] for (_, s1), (k2, s2) in zip(dims, dims[1:])):
        return None
    return dims


def store_through(w, v: View, addr: str, level: int) -> tuple[list[str], str | None]:
    """``(idx, valid)``: the index in ``v.shape`` of the element ``v`` reads from source position
    ``addr`` (a tile of flat positions), one expression per dim, and the mask of the positions
    ``v`` reads at all (None: every one). Emitted on ``w`` (a ``SourceWriter``) at ``level``;
    ``v`` must pass :func:`store_order`.

    Each digit is ``r // stride`` of the remaining offset ``r``; a position is read when
    ``r >= 0`` at the start, every digit is below its dim's size and nothing remains. Masked-off
    lanes may compute any digits (C's truncating ``//`` of a negative ``r``): they are never
    stored.
    """
    order = store_order(v)
    assert order is not None, f"view {v} cannot be stored through"
    r = w.bind(f"({addr}) - {v.offset}" if v.offset else f"({addr})", "vr", level)
    valid = [f"({r} >= 0)"] if v.offset else []
    idx = ["0"] * len(v.shape)
    for k, s in order:
        idx[k] = r if s == 1 else w.bind(f"{r} // {s}", "vi", level)
        valid.append(f"({idx[k]} < {v.shape[k]})")
        r = "0" if s == 1 else w.bind(f"{r} - {idx[k]} * {s}", "vr", level)
    if r != "0":
        valid.append(f"({r} == 0)")
    return idx, (" & ".join(valid) or None)
