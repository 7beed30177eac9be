"""Symbolic sizes by probing: a graph imported with each dynamic dim at a large prime, re-sized to
any value of that dim by rewriting every integer the dim's prime divides.

A dynamic dim ``d`` is imported at a *probe* size ``P_d``, a prime in the dim's range (in units of
its step: ``H = 32 * P``), distinct per dim (``lumc.compiler.core.buckets``). Every size, stride, offset and mask bound that depends on ``d``
polynomially is then ``c * P_d**k`` with ``c`` not divisible by ``P_d``, and that factorization is
unique; :func:`resize_int` rewrites it to ``c * n**k``. Scalar constants that are such a product or
its reciprocal (``1/L`` of a mean over tokens, a float ``L``) are rewritten the same way, in their
dtype. So :func:`resize` turns the probed graph (or program, or kernel meaning) into the one at
``d = n`` without importing again.

A padded size is not such a product (``H + 2``, ``(H + 2) (W + 2)``): where the probing needs
them, it learns a *table* of affine values, ``c * prod(m P + a)`` per probed value
(:func:`learn_table`, from imports at two more sizes), and re-sizes a value of the table by its
entry and any other value by the table's factors (:class:`Substitution`).

This is sound only where the model's size arithmetic is such products, and where no static size
is a multiple of a probe (or equal to a learned affine value). It is *checked*, never assumed: :func:`same_graph` compares the probed
graph re-sized to a second prime with the graph imported there (node for node: nodes are hash-consed, so equal graphs are the same objects), and
the compiler compares the probed graph re-sized to the range's two smallest and two largest sizes
with the model imported there, by value (a strided window count, ``floor((H - k) / s) + 1``, can
agree at two primes; it is monotone, so right at both ends means right throughout), and checks
each size bucket's numerics at its smallest and largest size. A constant array
with a probed dim (a folded position table, a gather index computed from the size), or an integer
that is not such a product (``L - 1``, ``min(L, 512)``), makes the check fail, and the range is
then refused in one line rather than served wrong (:class:`NotSymbolic`).

Only numpy and :mod:`lumc.ir` are used (the ``ir`` layer).
"""
from __future__ import annotations

import contextlib
import functools
import math
import contextvars

import numpy as np

from lumc.ir.graph import ConstArg, Graph, InputArg, IotaArg, Node, node, toposort
from lumc.ir.views import View, contiguous_strides
from lumc.ir.provenance import carry

_PROBES: contextvars.ContextVar[tuple[int, ...]] = contextvars.ContextVar("lumc_probes", default=())


@contextlib.contextmanager
def probing(primes):
    """Within this block, values whose shape has a probed dim are never folded into constants
    (:func:`held`): a folded table of ``L`` rows could not be re-sized, the computation that
    makes it can."""
    token = _PROBES.set(tuple(int(p) for p in primes))
    try:
        yield
    finally:
        _PROBES.reset(token)


def probing_active() -> bool:
    """True inside :func:`probing` (an import at probe sizes, which may lie outside a declared
    range: ``lumc.compiler.core.buckets`` verifies the result at sizes inside it)."""
    return bool(_PROBES.get())


def active_probes() -> tuple[int, ...]:
    """The probe primes of the enclosing :func:`probing` block (empty outside one)."""
    return _PROBES.get()


def held(shape) -> bool:
    """True when a probe is active and divides a dim of ``shape`` (see :func:`probing`)."""
    probes = _PROBES.get()
    return bool(probes) and any(d and any(int(d) % p == 0 for p in probes) for d in shape)


def held_values(v) -> bool:
    """True when a probe is active and ``v`` is an integer array of several values one of which a
    probe divides (``iota(B) * L``, ``[0, 61]`` at ``L = 61``): folded to a constant it would not
    re-size (only a scalar constant does), so it is kept as the computation, which does."""
    probes = _PROBES.get()
    v = np.asarray(v)
    if not probes or v.dtype.kind not in "iu" or v.size < 2:
        return False
    flat = v.reshape(-1).astype(np.int64)
    return bool((flat != flat[0]).any()) and any(
        bool(((flat % p == 0) & (flat != 0)).any()) for p in probes)


class NotSymbolic(ValueError):
    """A value of the probed graph that cannot be re-sized (names it and why)."""


class Substitution(dict):
    """``{probe prime: size in units of its step}``, with the range's affine values (``table``:
    ``{probed value: (c, ((p, m, a), ...))}``, :func:`learn_table`).

    A value ``c * prod(m p + a)`` that products of the probes alone do not explain (a padded size
    ``H + 2``, its strides and mask bounds) re-sizes to ``c * prod(m sub[p] + a)``: a value of the
    table by its entry, any other value by the table's factors (``m p + a``, ``a != 0``, largest
    first; the product of a padded plane ``C (H + 2) (W + 2)`` that a kernel computes), then the
    probes themselves."""

    def __init__(self, sizes=(), table: dict | None = None):
        super().__init__(sizes)
        self.table = dict(table or {})
        self.family = family_of(self.table)


def family_of(table: dict) -> list:
    """The affine factors ``(p, m, a)`` (``a != 0``) of a table's entries, largest first."""
    return sorted({f for _, fs in table.values() for f in fs if f[2]},
                  key=lambda f: -(f[1] * f[0] + f[2]))


def decompose(v: int, primes, table: dict | None = None, family=()) -> tuple[int, tuple]:
    """``(c, factors)`` with ``|v| = c * prod(m p + a)`` over ``factors`` (``(p, m, a)``; a factor
    of the probe ``p`` itself is ``(p, 1, 0)``): a value of ``table`` by its entry, else the
    table's ``family`` of affine factors taken out first, then the probes. ``factors`` is empty
    when ``v`` does not depend on the probes. The one decomposition :func:`resize_int` and the
    size-generic kernels' literals (``lumc.backends.triton.size_generic``) both use."""
    v = abs(int(v))
    if table and v in table:
        return table[v]
    fs = []
    for p, m, a in family:
        f = m * p + a
        while v and v % f == 0:
            v //= f
            fs.append((p, m, a))
    for p in primes:
        while v and v % p == 0:
            v //= p
            fs.append((p, 1, 0))
    return v, tuple(fs)


def resize_int(v: int, sub: dict[int, int]) -> int:
    """``v`` with every factor ``p**k`` of a probe ``p`` in ``sub`` replaced by ``sub[p]**k`` (and,
    for a :class:`Substitution` with a table, its affine factors re-sized)."""
    v = int(v)
    c, factors = decompose(v, sub, getattr(sub, "table", None), getattr(sub, "family", ()))
    return (-1 if v < 0 else 1) * _value((c, factors), sub) if factors else v


def _resize_tuple(t, sub):
    return tuple(resize_int(x, sub) for x in t)


def float_count(x: float, depends, dtype=np.float32):
    """``(n, reciprocal)``: the integer count ``n`` that float ``x`` holds, as ``n`` itself or as
    ``1 / n`` rounded to ``dtype``, for which ``depends(n, rounded)`` holds (``rounded``: found
    among the neighbours below); None when there is none.

    Above ``2**mantissa`` several integers round to one float (``1 / (64 p q)`` of a mean over a
    probed plane, ``p, q`` > 1000), so the neighbours of the nearest integer that round to the
    same float are tried too, nearest first."""
    x = float(x)
    if not np.isfinite(x) or x == 0:
        return None
    dt = np.dtype(dtype)
    mant = np.finfo(dt).nmant + 1 if dt.kind == "f" else 53
    want = dt.type(x)
    for recip, t in ((False, x), (True, 1.0 / x)):
        if not abs(t) < 2.0 ** 62:
            continue
        c = int(round(t))
        span = int(abs(t) * 2.0 ** -(mant - 1)) + 1 if abs(t) >= 2.0 ** (mant - 1) else 0
        for n in sorted(range(c - span, c + span + 1), key=lambda n: abs(n - t)):
            if n and dt.type(1.0 / n if recip else float(n)) == want and (
                    recip or float(n) == x or span) and depends(n, bool(span)):
                return n, recip
    return None


MAX_COUNT_COEFFICIENT = 1 << 20   # c of a rounded count c * P**k (a mean's 1 / (64 H' W'))


def count_depends(n: int, primes, table: dict | None, family, rounded: bool) -> bool:
    """``n`` depends on the probes (:func:`decompose`); a count found among rounded neighbours
    (:func:`float_count`) also needs its static part small, or a constant such as ``1e-12``
    (a LayerNorm epsilon, ``1 / 1e12``) would be read as one of the integers around 1e12 that a
    probe divides."""
    c, factors = decompose(n, primes, table, family)
    return bool(factors) and (not rounded or c < MAX_COUNT_COEFFICIENT)


def _resize_float(x: float, sub: dict[int, int], dtype) -> float | None:
    """A float constant that is a probe product ``c * P**k`` or its reciprocal, rounded to
    ``dtype`` (:func:`float_count`), re-sized; None when it is neither (it does not depend on the
    probed dims)."""
    table, family = getattr(sub, "table", None), getattr(sub, "family", ())
    if table and x and math.isfinite(x) and any(
            table.get(round(t), (0, (1,)))[1] == () for t in (x, 1.0 / x) if abs(t) < 2.0 ** 62):
        return None        # a count the table holds static (learn_table)
    got = float_count(x, lambda n, rounded: count_depends(n, sub, table, family, rounded), dtype)
    if got is None:
        return None
    n, recip = got
    m = resize_int(n, sub)
    if recip and m == 0:      # 1 / (L - 1) at L = 1: IEEE division by zero, as the import gives
        return math.copysign(math.inf, n)
    return 1.0 / m if recip else float(m)


def _depends(shape, sub) -> bool:
    return any(resize_int(d, sub) != d for d in shape)


def _resize_const(arg: ConstArg, sub: dict[int, int], where: str) -> ConstArg:
    a = arg.value
    if _depends(a.shape, sub):
        raise NotSymbolic(f"{where}: a constant of shape {list(a.shape)} has a probed dim "
                          "(its values depend on the size)")
    if a.size != 1 or a.dtype.kind not in "iuf":
        return arg
    x = a.reshape(-1)[0]
    if a.dtype.kind in "iu":
        w = resize_int(int(x), sub)
        return arg if w == int(x) else ConstArg(np.array(w, dtype=a.dtype).reshape(a.shape))
    f = _resize_float(float(x), sub, a.dtype)
    return arg if f is None else ConstArg(np.array(f, dtype=a.dtype).reshape(a.shape))


def _resize_value(v, sub):
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, np.integer)):
        return resize_int(int(v), sub)
    if isinstance(v, tuple):
        return tuple(_resize_value(x, sub) for x in v)
    if isinstance(v, list):
        return [_resize_value(x, sub) for x in v]
    return v


def resize_arg(n: Node, sub: dict[int, int]):
    """The arg of node ``n`` re-sized (see the module docstring)."""
    a = n.arg
    if isinstance(a, View):
        if a.is_contiguous:     # row-major at the probe stays row-major: at sizes 0 and 1 the
            shape = _resize_tuple(a.shape, sub)     # affine strides (0 for L = 0) are not
            return View._make(shape, contiguous_strides(shape), 0, None)    # the canonical ones
        mask = None if a.mask is None else tuple((resize_int(lo, sub), resize_int(hi, sub))
                                                 for lo, hi in a.mask)
        return View._make(_resize_tuple(a.shape, sub), _resize_tuple(a.strides, sub),
                          resize_int(a.offset, sub), mask)
    if isinstance(a, InputArg):
        return InputArg(a.name, _resize_tuple(a.shape, sub), a.dtype)
    if isinstance(a, IotaArg):
        return IotaArg(_resize_tuple(a.shape, sub), a.axis, a.dtype)
    if isinstance(a, ConstArg):
        return _resize_const(a, sub, f"%{n.id} Constant")
    return _resize_value(a, sub)


class Resizer:
    """Re-sizes nodes from the probe sizes to ``sub`` (``{probe prime: size}``), memoized, so a
    graph and the programs and kernel meanings bound to its nodes re-size consistently."""

    def __init__(self, sub: dict[int, int], table: dict | None = None):
        self.sub = Substitution({int(p): int(n) for p, n in sub.items()},
                                table if table is not None else getattr(sub, "table", None))
        self.memo: dict[int, Node] = {}

    def __call__(self, root: Node) -> Node:
        if id(root) in self.memo:
            return self.memo[id(root)]
        for n in toposort([root]):
            if id(n) in self.memo:
                continue
            srcs = tuple(self.memo[id(s)] for s in n.srcs)
            arg = resize_arg(n, self.sub)
            same = arg is n.arg or (type(arg) is type(n.arg) and arg == n.arg)
            self.memo[id(n)] = n if same and all(a is b for a, b in zip(srcs, n.srcs)) \
                else node(n.op, srcs, arg)
            carry(n, self.memo[id(n)])      # its origin and index scores hold at the new size
        return self.memo[id(root)]

    def graph(self, g: Graph) -> Graph:
        return Graph({k: self(v) for k, v in g.inputs.items()},
                     {k: self(v) for k, v in g.outputs.items()})

    def value(self, v):
        """A kernel attribute value (ints re-sized, recursively)."""
        return _resize_value(v, self.sub)


def resize(g: Graph, sub: dict[int, int]) -> Graph:
    """Graph ``g`` (imported at probe sizes) at the sizes ``sub`` gives its probes."""
    return Resizer(sub).graph(g)


MAX_OFFSET = 16   # |a| of an affine factor ``H + a``: conv and pool pads are (k - 1) d / 2 or less


def _arg_ints(a) -> list[int]:
    """The integers of a node arg that a re-size may change (sizes, strides, offsets, bounds)."""
    if isinstance(a, View):
        out = list(a.shape) + list(a.strides) + [a.offset]
        for lo, hi in a.mask or ():
            out += [lo, hi]
        return out
    if isinstance(a, (InputArg, IotaArg)):
        return list(a.shape)
    if isinstance(a, ConstArg):
        x = a.value
        if x.size != 1 or x.dtype.kind not in "iuf":
            return []
        if x.dtype.kind in "iu":
            return [int(x.reshape(-1)[0])]
        # a float count or its reciprocal (1 / (L - 1) of an unbiased variance), as that count:
        # re-sized by the table like an integer (_resize_float)
        got = float_count(float(x.reshape(-1)[0]), lambda n, rounded: True, x.dtype)
        return [got[0]] if got is not None else []
    if isinstance(a, bool) or a is None:
        return []
    if isinstance(a, (int, np.integer)):
        return [int(a)]
    if isinstance(a, (tuple, list)):
        return [v for x in a for v in _arg_ints(x)]
    return []


def _paired_ints(a: Graph, others: list[Graph]):
    """``(x, (y, ...))`` for each integer slot of graph ``a`` and the same slot of each of
    ``others``, walked together from their outputs where their structure agrees (a difference is
    :func:`same_graph`'s to report)."""
    seen: set[int] = set()
    stack = [(a.outputs[k], tuple(o.outputs[k] for o in others)) for k in a.outputs
             if all(k in o.outputs for o in others)]
    while stack:
        x, ys = stack.pop()
        if id(x) in seen or any(y.op != x.op or len(y.srcs) != len(x.srcs) for y in ys):
            continue
        seen.add(id(x))
        xs, yss = _arg_ints(x.arg), [_arg_ints(y.arg) for y in ys]
        if all(len(v) == len(xs) for v in yss):
            yield from zip(xs, zip(*yss)) if yss else ()
        stack.extend(zip(x.srcs, zip(*[y.srcs for y in ys])))


MAX_MULTIPLIER = 64    # m of a factor m p + a: H / 32 .. 2 H of a 32-step range


@functools.lru_cache(maxsize=1 << 16)
def _explain(x: int, ys: tuple, subs: tuple, depth: int = 4):
    """A decomposition ``(c, ((p, m, a), ...))`` of ``x`` (at the probes) whose re-size to each
    substitution of ``subs`` (``((p, n), ...)`` each) is the matching value of ``ys``: factors
    ``m p + a`` (``1 <= m <= MAX_MULTIPLIER``, ``|a| <= MAX_OFFSET``) and a static coefficient
    ``c``; None when there is none of at most ``depth`` factors."""
    if all(y == x for y in ys):
        return x, ()
    if depth == 0:
        return None
    probes = [p for p, _ in subs[0]]
    # simplest first: the probes themselves, then H + 1, H - 1, H + 2, ... (canonical factors:
    # gcd(m, a) = 1, the rest goes to the coefficient), each for the largest m first
    for a in sorted(range(-MAX_OFFSET, MAX_OFFSET + 1), key=lambda a: (abs(a), -a)):
        for j, p in enumerate(probes):
            for m in ([1] if a == 0 else range(MAX_MULTIPLIER, 0, -1)):
                if a and math.gcd(m, abs(a)) != 1:
                    continue
                f = m * p + a
                if f <= 1 or x % f:
                    continue
                gs = [m * int(sub[j][1]) + a for sub in subs]
                if all(g > 0 and y % g == 0 for g, y in zip(gs, ys)):
                    r = _explain(x // f, tuple(y // g for y, g in zip(ys, gs)), subs, depth - 1)
                    if r is not None:
                        return r[0], ((p, m, a),) + r[1]
    return None


def learn_table(probed: Graph, sized: list[Graph], subs: list[dict[int, int]]) -> dict:
    """The affine values of ``probed`` (imported at the probes ``p``), from the graphs ``sized``
    (imported at ``subs[i][p]``), which hold each integer slot's value at other sizes.

    A slot whose value products of the probes do not re-size right (:func:`resize_int`) gets the
    decomposition :func:`_explain` finds for its values: a padded convolution's ``H + 2`` (its
    padded size, the padded view's strides and mask bounds), ``H / 4 + 2`` and the products of
    such. Two slots with the same probed value and different decompositions leave it out. Three
    sizes whose points are not on one line (the caller's choice) rule out an affine coincidence
    (``2 (2 H' - 1) = W' + 6`` holds wherever ``H' = W' + 2``).

    Returns ``{probed value: (c, factors)}`` for :class:`Substitution`; the caller checks the
    result with :func:`same_graph`."""
    subs_t = tuple(tuple(sorted((int(p), int(n)) for p, n in s.items())) for s in subs)
    pures = [Substitution(s) for s in subs]
    table: dict = {}
    bad: set[int] = set()
    slots = {(abs(x), tuple(abs(y) for y in ys)) for x, ys in _paired_ints(probed, sized) if x}

    def fits(x, ys, with_subs):
        return all(resize_int(x, s) == y for s, y in zip(with_subs, ys))
    for x, ys in slots:
        if x in bad or fits(x, ys, pures):
            continue
        got = _explain(x, ys, subs_t)
        if got is None or (x in table and table[x] != got
                           and any(_value(table[x], s) != y for s, y in zip(subs, ys))):
            bad.add(x)
            table.pop(x, None)
        elif x not in table:
            table[x] = got
    # the table's factors re-size any other value too (Substitution): a static value they would
    # take apart (27 = W / 16 + 1 at the probe, a 3 x 3 x 3 kernel's stride) is kept as it is
    learned = [Substitution(s, table) for s in subs]
    for x, ys in slots:
        if x not in table and x not in bad and not fits(x, ys, learned):
            got = _explain(x, ys, subs_t)
            if got is None:
                bad.add(x)
            else:
                table[x] = got
    # a large static value (a float's count: 1e12 of a LayerNorm's 1e-12) kept as it is: its
    # float's neighbours that the table's factors take apart (1008**2 * 984190) are not read
    for x, ys in slots:
        if x >= 1 << 24 and x not in table and x not in bad and all(y == x for y in ys):
            table[x] = (x, ())
    # a value the table re-sizes wrongly in some other slot (W' = 1019 = H' + 6 at the probes)
    # cannot be told apart there: left out, so the caller's check refuses these probes
    for x, ys in slots:
        if x in table and any(_value(table[x], s) != y for s, y in zip(subs, ys)):
            del table[x]
    return table


def _value(entry, sub) -> int:
    c, factors = entry
    for p, m, a in factors:
        c *= m * int(sub[p]) + a
    return c


def same_graph(a: Graph, b: Graph) -> str | None:
    """None when ``a`` and ``b`` are the same graph (same inputs and outputs, node for node), else
    the first difference, in words."""
    if list(a.inputs) != list(b.inputs) or list(a.outputs) != list(b.outputs):
        return f"inputs/outputs differ: {list(a.inputs)}/{list(a.outputs)} vs " \
               f"{list(b.inputs)}/{list(b.outputs)}"
    for k in a.outputs:
        if a.outputs[k] is not b.outputs[k]:
            return f"output {k!r} is computed differently ({_first_diff(a.outputs[k], b.outputs[k])})"
    for k in a.inputs:
        if a.inputs[k] is not b.inputs[k]:
            return f"input {k!r} differs"
    return None


def _arg_text(a) -> str:
    """A node argument in a user's words: a view as its shape, strides and offset (its repr is
    ``View(shape=..., strides=..., offset=..., mask=...)``); the mask as its per-dim valid ranges,
    which may be all that tells two views apart."""
    if isinstance(a, View):
        return (f"shape {list(a.shape)}, strides {list(a.strides)}"
                + (f", offset {a.offset}" if a.offset else "")
                + (f", mask {[list(r) for r in a.mask]}" if a.mask is not None else ""))
    return repr(a)


def _first_diff(x: Node, y: Node) -> str:
    while True:
        if x.op != y.op or len(x.srcs) != len(y.srcs):
            return f"{x.op}{list(x.shape)} vs {y.op}{list(y.shape)}"
        if x.arg != y.arg and not (isinstance(x.arg, ConstArg) and x.arg == y.arg):
            return f"{x.op}: {_arg_text(x.arg)} vs {_arg_text(y.arg)}"
        nxt = [(s, t) for s, t in zip(x.srcs, y.srcs) if s is not t]
        if not nxt:
            return f"{x.op}{list(x.shape)}"
        x, y = nxt[0]
