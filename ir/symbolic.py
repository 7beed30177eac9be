"""Symbolic sizes by probing: a graph imported with each dynamic dim at a large prime, re-sized to
any value of that dim by rewriting every integer the dim's prime divides.

A dynamic dim ``d`` is imported at a *probe* size ``P_d``, a prime in the dim's range (in units of
its step: ``H = 32 * P``), distinct per dim (``lumc.compiler.core.buckets``). Every size, stride, offset and mask bound that depends on ``d``
polynomially is then ``c * P_d**k`` with ``c`` not divisible by ``P_d``, and that factorization is
unique; :func:`resize_int` rewrites it to ``c * n**k``. Scalar constants that are such a product or
its reciprocal (``1/L`` of a mean over tokens, a float ``L``) are rewritten the same way, in their
dtype. So :func:`resize` turns the probed graph (or program, or kernel meaning) into the one at
``d = n`` without importing again.

This is sound only where the model's size arithmetic is such products, and where no static size
is a multiple of a probe. It is *checked*, never assumed: :func:`same_graph` compares the probed
graph re-sized to a second prime with the graph imported there (node for node: nodes are hash-consed, so equal graphs are the same objects), and
the compiler checks each size bucket's numerics at its smallest and largest size. A constant array
with a probed dim (a folded position table, a gather index computed from the size), or an integer
that is not such a product (``L - 1``, ``min(L, 512)``), makes the check fail, and the range is
then refused in one line rather than served wrong (:class:`NotSymbolic`).

Only numpy and :mod:`lumc.ir` are used (the ``ir`` layer).
"""
from __future__ import annotations

import contextlib
import contextvars

import numpy as np

from lumc.ir.graph import ConstArg, Graph, InputArg, IotaArg, Node, node, toposort
from lumc.ir.views import View

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


def held(shape) -> bool:
    """True when a probe is active and divides a dim of ``shape`` (see :func:`probing`)."""
    probes = _PROBES.get()
    return bool(probes) and any(d and any(int(d) % p == 0 for p in probes) for d in shape)


class NotSymbolic(ValueError):
    """A value of the probed graph that cannot be re-sized (names it and why)."""


def _split(v: int, p: int) -> tuple[int, int]:
    """``(c, k)`` with ``v == c * p**k`` and ``p`` not dividing ``c`` (``(0, 0)`` for 0)."""
    if v == 0:
        return 0, 0
    k = 0
    while v % p == 0:
        v //= p
        k += 1
    return v, k


def resize_int(v: int, sub: dict[int, int]) -> int:
    """``v`` with every factor ``p**k`` of a probe ``p`` in ``sub`` replaced by ``sub[p]**k``."""
    v = int(v)
    sign = -1 if v < 0 else 1
    v = abs(v)
    for p, n in sub.items():
        c, k = _split(v, p)
        if k:
            v = c * int(n) ** k
    return sign * v


def _resize_tuple(t, sub):
    return tuple(resize_int(x, sub) for x in t)


def _resize_float(x: float, sub: dict[int, int], dtype) -> float | None:
    """A float constant that is a probe product ``c * P**k`` (exactly) or its reciprocal rounded
    to ``dtype``, re-sized; None when it is neither (it does not depend on the probed dims)."""
    if not np.isfinite(x) or x == 0:
        return None
    r = float(x)
    if r == round(r) and abs(r) < 2 ** 53:
        v = int(round(r))
        w = resize_int(v, sub)
        if w != v:
            return float(w)
    inv = 1.0 / r
    if abs(inv) < 2 ** 53:
        v = int(round(inv))
        if v != 0 and resize_int(v, sub) != v and dtype.type(1.0 / v) == dtype.type(r):
            return 1.0 / resize_int(v, sub)
    return None


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

    def __init__(self, sub: dict[int, int]):
        self.sub = {int(p): int(n) for p, n in sub.items()}
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


def _first_diff(x: Node, y: Node) -> str:
    while True:
        if x.op != y.op or len(x.srcs) != len(y.srcs):
            return f"{x.op}{list(x.shape)} vs {y.op}{list(y.shape)}"
        if x.arg != y.arg and not (isinstance(x.arg, ConstArg) and x.arg == y.arg):
            return f"{x.op} {x.arg!r} vs {y.arg!r}"
        nxt = [(s, t) for s, t in zip(x.srcs, y.srcs) if s is not t]
        if not nxt:
            return f"{x.op}{list(x.shape)}"
        x, y = nxt[0]
