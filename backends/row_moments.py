"""A layer norm's mean and variance statistics, recognized so one pass over a row computes both.

A LayerNorm formed on load (``lumc.backends.triton.norm_prologue`` / ``norm_epilogue``) has two
row statistics, as the library and the e-graph spell it in primitives::

    s1 = SumReduce(X)                         over the row's L elements
    m  = s1 * c                               c = 1/L: the mean
    s2 = SumReduce(D * D)                     D = X + broadcast(m) * (-1)

Two loops over the row read it twice; :func:`moment_pairs` finds the ``(s1, s2)`` pairs of this
shape so a renderer reads it once: per chunk of the row, the chunk's mean and its sum of squared
deviations (two passes over the chunk, in registers), merged into the running values of the row by
the pairwise update of Chan, Golub & LeVeque ("Algorithms for computing the sample variance",
1979/1983), for counts ``na``, ``nb``, means ``ma``, ``mb`` and sums of squared deviations
``Ma``, ``Mb``::

    n = na + nb,   d = mb - ma,   mean = ma + d * nb / n,   M = Ma + Mb + d * d * na * nb / n

then ``s1 = mean * L`` and ``s2 = M``. The values are the reference's up to rounding (the
``reassociating`` class of DESIGN.md); the update is as stable as the two-pass formula (it never
subtracts two large sums of squares). Only the exact shape above pairs: a scale ``c`` other than
``1/L`` (fp32-rounded) or another spelling keeps its two loops.
"""
from __future__ import annotations

import numpy as np

from lumc.ir.graph import Node


def _scalar_value(x: Node) -> float | None:
    """The value of a scalar constant, or of a view of one; None otherwise."""
    while x.op == "View":
        x = x.srcs[0]
    if x.op == "Constant" and x.numel == 1:
        return float(np.asarray(x.arg.value).reshape(-1)[0])
    return None


def _scaled(x: Node) -> tuple[Node, float] | None:
    """``(a, c)`` when ``x`` is ``a * c`` with ``c`` a scalar constant (either order)."""
    if x.op != "Mul":
        return None
    a, b = x.srcs
    cb = _scalar_value(b)
    if cb is not None:
        return a, cb
    ca = _scalar_value(a)
    if ca is not None:
        return b, ca
    return None


def _broadcast_of(x: Node) -> Node | None:
    """The node a stack of views reads (None if ``x`` is no view)."""
    if x.op != "View":
        return None
    while x.op == "View":
        x = x.srcs[0]
    return x


def _centered(d: Node, xnode: Node) -> Node | None:
    """The mean node ``m`` when ``d`` is ``xnode - broadcast(m)``, spelt ``Add(X, Mul(V(m), -1))``
    in either operand order."""
    if d.op != "Add":
        return None
    for a, b in (d.srcs, d.srcs[::-1]):
        if a is not xnode:
            continue
        neg = _scaled(b)
        if neg is None or neg[1] != -1.0:
            continue
        m = _broadcast_of(neg[0])
        if m is not None:
            return m
    return None


def moment_pairs(stats: list[Node]) -> dict[Node, Node]:
    """``{s1: s2}`` for the statistics (reductions over one row shape, topological) that are a
    sum and a sum of squared deviations from the mean it gives (see the module docstring)."""
    sums = {}
    for s in stats:
        if s.op != "SumReduce":
            continue
        src = s.srcs[0]
        length = int(np.prod([src.shape[a] for a in s.arg])) if s.arg else 1
        sums[s] = length
    pairs: dict[Node, Node] = {}
    taken: set[int] = set()
    for s2 in stats:
        sq = s2.srcs[0]
        if s2 not in sums or sq.op != "Mul" or sq.srcs[0] is not sq.srcs[1]:
            continue
        for s1, length in sums.items():
            if s1 is s2 or id(s1) in taken or sums[s2] != length or length == 0:
                continue
            m = _centered(sq.srcs[0], s1.srcs[0])
            scaled = _scaled(m) if m is not None else None
            if scaled is None or scaled[0] is not s1:
                continue
            if np.float32(scaled[1]) != np.float32(1.0 / length):
                continue
            pairs[s1] = s2
            taken.add(id(s1))
            break
    return pairs
