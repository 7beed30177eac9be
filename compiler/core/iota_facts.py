"""Facts about index arithmetic that hold at every size of a probed dim, proved symbolically.

At a fixed shape the constant folder (:mod:`lumc.compiler.core.constfold`) evaluates index values
built from ``arange`` (``Iota``): transformers' packed-sequence check (``diff(position_ids) != 1``
and its ``cumsum``), the gathers of ``arange`` by its own wrapped index. At a probed size
(``lumc.ir.symbolic``) those values are held as computations, since a folded array could not be
re-sized, and each stays a small kernel on every call. This module proves what they are *for every
size* instead: each integer or bool value computed from iotas and scalars alone gets an abstract
value, a list of disjoint boxes of its index space, on each of which it is affine in the index::

    v[o] = c0 + sum_k c_k * o_k        (c_k integers, c0 and the box bounds linear in the probes)

with ``c0``, box bounds and sizes as :class:`Lin`, ``a + sum_p b_p * p`` over the probe primes
``p`` (a size ``3 * L``, a padded extent ``L + 1``, the wrap constant ``L`` of a negative index).
A comparison is decided on a box when the difference's minimum (or maximum) over the box has its
sign for every size ``p >= 1`` (:meth:`Lin.nonneg`: every probe coefficient >= 0 and the value at
``p = 1`` >= 0: a sufficient condition). A value whose boxes all carry the same affine form is
that form at every size, and :func:`rebuild` writes it as iotas and a scalar, which re-size.

Exact: integer arithmetic only (no float value is analysed), an integer product is taken only by a
size-independent constant or by zero (a zero times anything integer is zero), a gather only with
its index proved inside the table. Values whose facts are not proved keep their computation.
"""
from __future__ import annotations

from dataclasses import dataclass

from lumc.ir.graph import Node
from lumc.ir.symbolic import decompose
from lumc.ir.tensor import Tensor

MAX_PIECES = 16        # boxes per value; past it the value is not analysed
NEAR = 8               # an extent m * p + a with |a|, m <= NEAR is read as affine in the probe p
BOUND = 1 << 20        # |coefficients| analysed: no int64 arithmetic of sizes up to 2^40 overflows
NEAR_MIN_PROBE = 64    # ... where p is at least this (a static extent that near a probe is taken
                       # for a padded one, as ``lumc.ir.symbolic`` takes a multiple for a size)


@dataclass(frozen=True)
class Lin:
    """``a + sum(b * p for p, b in terms)``: an integer linear in the probe primes."""
    a: int
    terms: tuple = ()        # ((p, b), ...) sorted by p, b != 0

    def _combine(self, other: "Lin", sign: int) -> "Lin":
        t = dict(self.terms)
        for p, b in other.terms:
            t[p] = t.get(p, 0) + sign * b
        return Lin(self.a + sign * other.a, tuple(sorted((p, b) for p, b in t.items() if b)))

    def __add__(self, other: "Lin") -> "Lin":
        return self._combine(other, 1)

    def __sub__(self, other: "Lin") -> "Lin":
        return self._combine(other, -1)

    def scale(self, k: int) -> "Lin":
        return Lin(self.a * k, tuple((p, b * k) for p, b in self.terms if b * k))

    def nonneg(self) -> bool:
        """True when ``>= 0`` for every size ``>= 1`` of every probe (sufficient, not necessary;
        size 0: :func:`empty_at_zero`)."""
        return all(b >= 0 for _, b in self.terms) and self.a + sum(b for _, b in self.terms) >= 0

    def small(self) -> bool:
        return abs(self.a) <= BOUND and all(abs(b) <= BOUND for _, b in self.terms)

    def value(self) -> int:
        """The value at the probe sizes themselves."""
        return self.a + sum(b * p for p, b in self.terms)


ZERO = Lin(0)


def lin_of(v: int, probes, near: bool = True) -> Lin | None:
    """``v`` (an extent, offset or literal at the probe sizes) as a :class:`Lin`: ``c * p`` by the
    probes' factorization (``lumc.ir.symbolic.decompose``), ``m * p + a`` for a small ``a`` (a
    padded extent; only with ``near``: never for a literal of the model), else a size-independent constant; None for a power or product of probes."""
    v = int(v)
    if v == 0:
        return ZERO
    c, fs = decompose(v, probes)
    sign = 1 if v > 0 else -1
    if len(fs) == 1:
        return Lin(0, ((fs[0][0], sign * c),))
    if fs:
        return None
    # a padded extent m * p + a (a probe is a large prime: NEAR_MIN_PROBE), read against the
    # nearest probe: at a check import the probe and check primes are both active, and 502 is
    # the check prime 503 less one, not the probe 509 less 7; a tie between two probes is not read
    found = []
    for p in probes if near else ():
        for a in range(-NEAR, NEAR + 1):
            m = (v - a) // p
            if p >= NEAR_MIN_PROBE and a and (v - a) % p == 0 and 1 <= m <= NEAR:
                found.append((abs(a), a, p, m))
    if found:
        found.sort()
        if len(found) > 1 and found[1][0] == found[0][0] and found[1][2] != found[0][2]:
            return None
        _, a, p, m = found[0]
        return Lin(a, ((p, m),))
    return Lin(v)


@dataclass(frozen=True)
class Piece:
    """``c0 + sum_k coef[k] * o_k`` on the box ``lo[k] <= o_k < hi[k]``."""
    lo: tuple
    hi: tuple
    c0: Lin
    coef: tuple

    @property
    def constant(self) -> bool:
        return not any(self.coef)

    def extreme(self, top: bool) -> Lin:
        """The form's maximum (``top``) or minimum over the box (a nonempty box's)."""
        out = self.c0
        for c, lo, hi in zip(self.coef, self.lo, self.hi):
            if c:
                at = (hi - Lin(1)) if (c > 0) == top else lo
                out = out + at.scale(c)
        return out


Value = tuple        # of Piece, disjoint, covering the index space


def _order(x: Lin, y: Lin) -> int | None:
    """-1 when ``x <= y`` at every size, 1 when ``x >= y``, 0 when equal, None when undecided."""
    if x == y:
        return 0
    if (y - x).nonneg():
        return -1
    if (x - y).nonneg():
        return 1
    return None


def _meet(p: Piece, lo: tuple, hi: tuple):
    """``p`` restricted to the box ``[lo, hi)``: a Piece, "empty" when provably empty, None when
    a bound's order is undecided."""
    nlo, nhi = [], []
    for a, b, c, d in zip(p.lo, p.hi, lo, hi):
        o1, o2 = _order(a, c), _order(b, d)
        if o1 is None or o2 is None:
            return None
        x, y = (c if o1 < 0 else a), (b if o2 < 0 else d)
        if (x - y).nonneg():
            return "empty"
        nlo.append(x)
        nhi.append(y)
    return Piece(tuple(nlo), tuple(nhi), p.c0, p.coef)


def _pairs(xs: Value, ys: Value):
    """The nonempty intersections ``(px, py, box piece)`` of two partitions; None if undecided."""
    out = []
    for px in xs:
        for py in ys:
            m = _meet(px, py.lo, py.hi)
            if m is None:
                return None
            if m != "empty":
                out.append((px, py, m))
    return out if len(out) <= MAX_PIECES else None


def _full(shape, probes) -> tuple | None:
    his = [lin_of(d, probes) for d in shape]
    if any(h is None for h in his):
        return None
    return tuple(ZERO for _ in shape), tuple(his)


def _const(shape, c0: Lin, probes) -> Value | None:
    box = _full(shape, probes)
    return None if box is None else (Piece(box[0], box[1], c0, (0,) * len(shape)),)


def _is_zero(v: Value | None) -> bool:
    return v is not None and all(p.constant and p.c0 == ZERO for p in v)


def _binary(op: str, x: Value, y: Value) -> Value | None:
    pairs = _pairs(x, y)
    if pairs is None:
        return None
    out = []
    for px, py, box in pairs:
        if op == "Add":
            c0, coef = px.c0 + py.c0, tuple(a + b for a, b in zip(px.coef, py.coef))
        elif op == "Mul":
            if px.constant and not px.c0.terms:
                k, other = px.c0.a, py
            elif py.constant and not py.c0.terms:
                k, other = py.c0.a, px
            else:
                return None
            c0, coef = other.c0.scale(k), tuple(k * c for c in other.coef)
        else:   # LessThan: x < y on the box when min(y - x) >= 1; never when max(y - x) <= 0
            d = Piece(box.lo, box.hi, py.c0 - px.c0, tuple(b - a for a, b in zip(px.coef, py.coef)))
            if (d.extreme(False) - Lin(1)).nonneg():
                c0 = Lin(1)
            elif d.extreme(True).scale(-1).nonneg():
                c0 = ZERO
            else:
                return None
            coef = (0,) * len(box.lo)
        if not (c0.small() and all(abs(c) <= BOUND for c in coef)):
            return None
        out.append(Piece(box.lo, box.hi, c0, coef))
    return tuple(out)


def _where(c: Value, a: Value, b: Value) -> Value | None:
    if not all(p.constant and not p.c0.terms for p in c):
        return None
    out = []
    for pc in c:
        for p in (a if pc.c0.a else b):
            m = _meet(p, pc.lo, pc.hi)
            if m is None:
                return None
            if m != "empty":
                out.append(m)
    return tuple(out) if len(out) <= MAX_PIECES else None


def _view(n: Node, src: Value, probes) -> Value | None:
    """A view of a contiguous source: each output dim walks one source axis (stride equal to
    that axis's), from the source index of the first valid element; zero outside the mask."""
    v, sshape = n.arg, n.srcs[0].shape
    cs = [1] * len(sshape)
    for j in range(len(sshape) - 2, -1, -1):
        cs[j] = cs[j + 1] * sshape[j + 1]
    mask = v.mask or tuple((0, d) for d in v.shape)
    full = _full(v.shape, probes)
    if full is None:
        return None
    if any(lo >= hi for lo, hi in mask):
        return _const(v.shape, ZERO, probes)
    axis_of: dict[int, int] = {}
    for k, (d, s) in enumerate(zip(v.shape, v.strides)):
        if d > 1 and s:
            js = [j for j in range(len(sshape)) if cs[j] == s and sshape[j] > 1]
            if len(js) != 1 or js[0] in axis_of.values():
                return None
            axis_of[k] = js[0]
    pos0 = v.offset + sum(s * lo for s, (lo, _) in zip(v.strides, mask))
    total = 1
    for d in sshape:
        total *= d
    if not 0 <= pos0 < total:
        return None
    m0, rest = [], pos0
    for c in cs:
        m0.append(rest // c)
        rest %= c
    for k, j in axis_of.items():
        if m0[j] + mask[k][1] - 1 - mask[k][0] >= sshape[j]:
            return None
    lm0 = [lin_of(x, probes) for x in m0]
    lmask = [(lin_of(lo, probes), lin_of(hi, probes)) for lo, hi in mask]
    if any(x is None for x in lm0) or any(a is None or b is None for a, b in lmask):
        return None
    lmask = [(lo, full[1][k] if mask[k][1] == v.shape[k] else hi) for k, (lo, hi) in enumerate(lmask)]
    out = []
    for p in src:
        # the output box where the source index lies in p's box, inside the valid region
        lo, hi = list(full[0]), list(full[1])
        skip = False
        for j in range(len(sshape)):
            ks = [k for k, jj in axis_of.items() if jj == j]
            if ks:
                k = ks[0]
                lo[k] = p.lo[j] - lm0[j] + lmask[k][0]
                hi[k] = p.hi[j] - lm0[j] + lmask[k][0]
            else:
                o1, o2 = _order(p.lo[j], lm0[j]), _order(lm0[j] + Lin(1), p.hi[j])
                if o1 is None or o2 is None:
                    return None
                if o1 > 0 or o2 > 0:
                    skip = True
        if skip:
            continue
        c0 = p.c0
        for j in range(len(sshape)):
            c0 = c0 + lm0[j].scale(p.coef[j])
        coef = [0] * len(v.shape)
        for k, j in axis_of.items():
            c0 = c0 - lmask[k][0].scale(p.coef[j])
            coef[k] = p.coef[j]
        inner = Piece(tuple(lmask[k][0] for k in range(len(v.shape))),
                      tuple(lmask[k][1] for k in range(len(v.shape))), c0, tuple(coef))
        m = _meet(inner, tuple(lo), tuple(hi))
        if m is None:
            return None
        if m != "empty":
            out.append(m)
    # zero outside the mask: the complement of the valid box, one slab per dim
    lo, hi = list(full[0]), list(full[1])
    for k, (a, b) in enumerate(lmask):
        for slab in ((lo[k], a), (b, hi[k])):
            o = _order(slab[0], slab[1])
            if o is None:
                return None
            if o == -1:
                blo, bhi = list(lo), list(hi)
                blo[k], bhi[k] = slab
                out.append(Piece(tuple(blo), tuple(bhi), ZERO, (0,) * len(v.shape)))
        lo[k], hi[k] = a, b
    return tuple(out) if len(out) <= MAX_PIECES else None


def _gather(n: Node, table: Value | None, idx: Value | None, probes) -> Value | None:
    if idx is None or table is None or int(n.arg) != 0 or len(n.srcs[0].shape) != 1:
        return None
    size = lin_of(n.srcs[0].shape[0], probes)
    if size is None or len(table) != 1:
        return None
    t = table[0]
    out = []
    for p in idx:     # the index proved inside [0, size) on the box, then the table's form of it
        if not (p.extreme(False).nonneg() and (size - Lin(1) - p.extreme(True)).nonneg()):
            return None
        k = t.coef[0]
        out.append(Piece(p.lo, p.hi, t.c0 + p.c0.scale(k), tuple(k * c for c in p.coef)))
    return tuple(out)


def index_value(n: Node, srcs: list, probes) -> Value | None:
    """The abstract value of ``n`` (see the module docstring) from its sources' (``srcs``, None
    for a source not analysed); None when ``n`` is not an integer or bool value of iotas and
    scalars whose form the rules here prove."""
    if not ((n.dtype.kind == "int" and n.dtype.itemsize == 8) or n.dtype.is_bool):
        return None         # int64 and bool alone: a narrower or unsigned integer could wrap
    op = n.op
    if op == "Iota":
        box = _full(n.shape, probes)
        if box is None:
            return None
        return (Piece(box[0], box[1], ZERO, tuple(int(k == n.arg.axis) for k in range(len(n.shape)))),)
    if op == "Constant":
        if n.shape != () and n.numel != 1:
            return None
        c = lin_of(int(n.arg.value.reshape(-1)[0]), probes, near=False)
        return None if c is None else _const(n.shape, c, probes)
    if op == "Mul" and n.dtype.is_int and (_is_zero(srcs[0]) or _is_zero(srcs[1])):
        return _const(n.shape, ZERO, probes)          # 0 * x == 0 for any integer x
    if op == "SumReduce" and n.dtype.is_int and _is_zero(srcs[0]):
        return _const(n.shape, ZERO, probes)
    if op == "Gather":
        return _gather(n, srcs[0], srcs[1], probes)
    if any(s is None for s in srcs):
        return None
    if op in ("Add", "Mul", "LessThan") and not (op != "LessThan" and n.dtype.is_bool):
        return _binary(op, srcs[0], srcs[1])
    if op == "Where":
        return _where(*srcs)
    if op == "Contiguous":
        return srcs[0]
    if op == "View":
        return _view(n, srcs[0], probes)
    if op == "Cast" and not n.dtype.is_bool:       # bool -> int, int -> a no narrower int
        src = n.srcs[0].dtype
        if src.is_bool or n.dtype.itemsize >= src.itemsize:
            return srcs[0]
    return None


def used_probes(value: Value, shape, srcs_used, probes) -> frozenset:
    """The probes a value's facts were decided over: its sources', and those of its own forms,
    boxes and extents (a decision compares bounds and forms of its sources or of itself)."""
    out = set().union(*srcs_used) if srcs_used else set()
    for pc in value:
        for x in (pc.c0, *pc.lo, *pc.hi):
            out.update(p for p, _ in x.terms)
    out.update(p for d in shape for p in probes if d and d % p == 0)
    return frozenset(out)


def empty_at_zero(shape, used) -> bool:
    """True when ``shape`` has no element once any probe in ``used`` is 0 (each divides one of its
    dims): the facts, decided for sizes >= 1, then hold vacuously at 0 too."""
    return all(any(d and d % p == 0 for d in shape) for p in used)


def rebuild(n: Node, value: Value, probes) -> Node | None:
    """``n``'s value as a scalar plus iotas when every box carries one form whose constant
    re-sizes (a literal, or ``c * p``); None otherwise."""
    first = value[0]
    if any(p.c0 != first.c0 or p.coef != first.coef for p in value[1:]):
        return None
    c0 = first.c0
    if len(c0.terms) > 1 or (c0.terms and c0.a):
        return None
    out = None
    for k, c in enumerate(first.coef):
        if c:
            term = Tensor.iota(n.shape, k, n.dtype)
            term = term if c == 1 else term.mul(Tensor.full(n.shape, c, n.dtype))
            out = term if out is None else out.add(term)
    if out is None or c0 != ZERO:
        full = Tensor.full(n.shape, c0.value(), n.dtype)
        out = full if out is None else out.add(full)
    return out.node
