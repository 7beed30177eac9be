"""Convolutions read back out of a kernel's meaning, for cuDNN (``IMPL=cudnn``).

lumc lowers ``Conv`` to views, ``Mul`` and ``SumReduce`` (``lumc.ir.library.conv``): the input is
padded by a masked view ``P`` over its flat elements, a window view ``V`` over ``P`` lays out
``[N, (g,) Mg, Cg, o_0, k_0, o_1, k_1, ...]`` (stride 0 along the output channels), the weight is
a broadcast view of ``[M, Cg, *k]``, and the product is summed over ``Cg`` and the taps. Nothing of
that is a pattern a model exporter wrote; it is what any convolution becomes, so this module reads
the convolution back from the strides alone, wherever the e-graph and fusion left it.

:func:`conv_plans` proves, not guesses, that a contraction is ``F.conv{1,2,3}d(x, w, stride,
padding, dilation, groups)``:

* every stride of ``V`` is ``mult * cs(P)[axis]`` for one axis of the padded shape (``cs``:
  row-major strides), and along each axis the largest reachable ``sum(mult * (size - 1))`` stays
  inside ``P``: no index carries into the next axis, so the flat position ``V`` reads decomposes
  exactly into per-axis coordinates;
* ``P`` is the input's flat elements reshaped to ``Q = (N, C, *S)`` (or ``(N, g, Cg, *S)``) and
  padded: its strides are ``cs(Q)``, its mask the unpadded box, its offset ``-sum(pad * cs(Q))``;
* each dim of the product then has one role: batch ``n`` (axis 0, kept), group ``g`` (kept, read by
  both operands), output channel ``m`` (kept, broadcast in ``V``), input channel ``c`` (summed,
  multiplier 1), and per spatial axis an output position ``o`` (kept, multiplier = stride) and a tap
  ``k`` (summed, multiplier = dilation); the weight view reads ``[M, Cg, *k]`` at exactly those
  roles (the same no-carry proof over ``cs(W)``).

Anything else (a masked or offset window view, a dim broadcast in both operands, a role twice) is
not a convolution cuDNN is handed; the kernel keeps its ``cublas`` (im2col einsum) and Triton
configs. The runtime side (``lumc.compiler.runtime.extern``) calls ``F.conv{n}d`` with the plan,
padding symmetric through cuDNN where the windows allow and explicitly (``F.pad``) where not.
"""
from __future__ import annotations

from dataclasses import dataclass

from lumc.backends.triton.indexing import per_axis
from lumc.ir.graph import Node
from lumc.ir.views import View, contiguous_strides, prod


@dataclass(frozen=True)
class ConvPlan:
    """One contraction as a vendor convolution.

    Attributes:
        node: the ``SumReduce`` it replaces (its keepdims shape is the full product's with the
            summed dims 1).
        x, w: the nodes under the views: ``x`` holds ``prod(x_shape)`` elements row-major,
            ``w`` ``prod(w_shape)``.
        x_shape: ``(N, C, *S)``; w_shape: ``(M, C / groups, *k)``.
        stride, dilation: per spatial axis; pad_begin: zeros before each spatial axis;
        pad_end: zeros the windows read after it (<= 0: they stop short of the end).
        groups: the convolution's groups; out_spatial: ``O`` per axis.
        out_roles: per dim of ``node.shape``: ``"n"``, ``"g"``, ``"m"``, ``"o0"``.. or None (a
            summed or size-1 dim).
    """
    node: Node
    x: Node
    w: Node
    x_shape: tuple
    w_shape: tuple
    stride: tuple
    dilation: tuple
    pad_begin: tuple
    pad_end: tuple
    groups: int
    out_spatial: tuple
    out_roles: tuple

    @property
    def nsp(self) -> int:
        return len(self.stride)

    @property
    def flops(self) -> int:
        """``2 N M prod(O) Cg prod(k)``: the multiply-adds of the convolution itself."""
        n, m = self.x_shape[0], self.w_shape[0]
        return 2 * n * m * prod(self.out_spatial) * prod(self.w_shape[1:])

    @property
    def symmetric(self) -> bool:
        """True when ``F.conv`` with ``padding=pad_begin`` reads every position the windows read
        (the end padding the windows need is at most the begin padding); else ``F.pad`` first."""
        return all(e <= b for b, e in zip(self.pad_begin, self.pad_end))


def _decompose(strides, sizes, space: tuple) -> list | None:
    """Per dim ``(axis, mult)`` of ``space`` (None for a stride-0 or size-1 dim), with the no-carry
    proof of :func:`lumc.backends.triton.indexing.per_axis`; None when the strides do not decompose
    or a multiplier is not positive (no convolution walks an axis backwards)."""
    pa = per_axis(View(tuple(sizes), tuple(strides), 0, None), tuple(space))
    if pa is None:
        return None
    out: list = [None] * len(sizes)
    for axis, (_, terms) in enumerate(pa):
        for j, mult in terms:
            if mult <= 0:
                return None
            out[j] = (axis, mult)
    return out


def _unpad(p_view, x: Node):
    """``(Q, pad_begin, pad_after)`` when view ``p_view`` is ``x``'s flat elements reshaped to ``Q``
    and zero-padded; None otherwise."""
    shape = tuple(p_view.shape)
    mask = p_view.mask or tuple((0, d) for d in shape)
    q = tuple(hi - lo for lo, hi in mask)
    if min(q, default=1) <= 0 or prod(q) != x.numel:
        return None
    cs = contiguous_strides(q)
    if tuple(p_view.strides) != tuple(0 if d == 1 else s for d, s in zip(shape, cs)):
        return None
    if p_view.offset != -sum(lo * c for (lo, _), c in zip(mask, cs)):
        return None
    return q, tuple(lo for lo, _ in mask), tuple(d - hi for (_, hi), d in zip(mask, shape))


def _windowed(a: Node):
    """``(x, Q, P-shape, pad_begin, top view)`` for a window view over a padded (or plain) input."""
    if a.op != "View" or a.arg.mask is not None or a.arg.offset != 0:
        return None
    src = a.srcs[0]
    if src.op == "View" and src.arg.mask is not None:
        u = _unpad(src.arg, src.srcs[0])
        if u is None:
            return None
        q, pb, _ = u
        return src.srcs[0], q, tuple(src.shape), pb, a.arg
    return src, tuple(src.shape), tuple(src.shape), (0,) * len(src.shape), a.arg


def conv_plan(c) -> ConvPlan | None:
    """The :class:`ConvPlan` of contraction ``c`` (``lumc.backends.triton.contraction``), or None
    when it is not provably one convolution (module doc)."""
    for a, b in ((c.a, c.b), (c.b, c.a)):
        p = _plan(c, a, b)
        if p is not None:
            return p
    return None


def _plan(c, a: Node, b: Node) -> ConvPlan | None:
    win = _windowed(a)
    if win is None or b.op != "View" or b.arg.mask is not None or b.arg.offset != 0:
        return None
    x, q, pshape, pb, v = win
    w = b.srcs[0]
    nsp = len(w.shape) - 2
    if nsp < 1 or not (x.dtype.is_float and w.dtype.is_float and x.dtype == w.dtype):
        return None
    grouped = len(q) == nsp + 3
    if len(q) != nsp + 2 and not grouped:
        return None
    full = c.full
    red = set(c.node.arg)
    da = _decompose(v.strides, full, pshape)
    db = _decompose(b.arg.strides, full, tuple(w.shape))
    if da is None or db is None:
        return None
    sp0 = 3 if grouped else 2                 # first spatial axis of Q
    cax = 2 if grouped else 1                 # the (per-group) input-channel axis of Q
    roles: dict[str, tuple[int, int, int]] = {}   # role -> (dim, mult in x, mult in w)
    for j, (ra, rb) in enumerate(zip(da, db)):
        if full[j] == 1:
            continue
        summed = j in red
        if ra is None and rb is None:
            return None                          # broadcast in both: a batch or a scale
        if ra is None:
            role = "m" if not summed and rb == (0, 1) else None
        else:
            axis, mult = ra
            if axis == 0:
                role = "n" if not summed and mult == 1 and rb is None else None
            elif grouped and axis == 1:
                role = "g" if not summed and mult == 1 and rb is not None and rb[0] == 0 else None
            elif axis == cax:
                role = "c" if summed and mult == 1 and rb == (1, 1) else None
            else:
                s = axis - sp0
                if summed:
                    role = f"k{s}" if rb == (2 + s, 1) else None
                else:
                    role = f"o{s}" if rb is None else None
        if role is None or role in roles:
            return None
        roles[role] = (j, ra[1] if ra else 0, rb[1] if rb else 0)
    if any(pb[i] for i in range(sp0)) or any(pshape[i] != q[i] for i in range(sp0)):
        return None                              # padding along batch or channels
    size = {r: full[j] for r, (j, _, _) in roles.items()}
    groups = q[1] if grouped else 1
    cg = q[2] if grouped else q[1]
    mg = size.get("m", 1)
    wshape = tuple(w.shape)
    if wshape[0] != groups * mg or wshape[1] != cg or size.get("c", 1) != cg:
        return None
    if grouped and groups > 1 and roles.get("g", (0, 0, 0))[2] != mg:
        return None
    if size.get("n", 1) != q[0] or size.get("g", 1) != groups:
        return None
    stride, dil, outs, ends = [], [], [], []
    for s in range(nsp):
        k = wshape[2 + s]
        if size.get(f"k{s}", 1) != k:
            return None
        st = roles[f"o{s}"][1] if f"o{s}" in roles else 1
        dl = roles[f"k{s}"][1] if f"k{s}" in roles else 1
        o = size.get(f"o{s}", 1)
        stride.append(st)
        dil.append(dl)
        outs.append(o)
        ends.append((o - 1) * st + (k - 1) * dl + 1 - pb[sp0 + s] - q[sp0 + s])
    out_roles = tuple(next((r for r, (j, _, _) in roles.items() if j == d and d not in red), None)
                      for d in range(len(full)))
    xs = (q[0], groups * cg) + tuple(q[sp0:])
    return ConvPlan(c.node, x, w, xs, wshape, tuple(stride), tuple(dil),
                    tuple(pb[sp0:]), tuple(ends), groups, tuple(outs), out_roles)


def conv_plans(contractions) -> list[ConvPlan]:
    """The convolutions among ``contractions`` (see :func:`conv_plan`)."""
    return [p for p in map(conv_plan, contractions) if p is not None]
