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
``1/L`` (rounded to the statistics' dtype) or another spelling keeps its two loops.

**The mean of a pair is computed on shifted data** (Chan, Golub & LeVeque, section 3, "shifted
data"; the same paper): ``m = K0 + sum(X - K0) / L`` for a shift ``K0`` near the mean. The spelling
``s1 * fl(1/L)`` rounds twice away from the mean (the sum to ``fl(L * c)``, then the product by a
rounded ``1/L``), so a constant row of ``c = -3.7`` got ``m - c ~ 1e-7 * c``, and with BERT's
``eps = 1e-12`` its normalized values ``(x - m) / sqrt(var + eps)`` came out near 0.4 where eager's
Welford mean gives 0 exactly. With ``K0`` within an ulp or two of ``c``, every ``X - K0`` is exact
(Sterbenz's lemma), their sum is exact, and ``m == c``. Kernels (``lumc.backends.triton.chan``)
take ``K0`` = the mean of the row's first chunk (the whole row in a one-pass kernel: a corrected
two-pass mean), and the result is within an ulp of the correctly rounded mean otherwise too. The
same holds for a row mean on its own (:func:`find_means`: a LayerNorm whose variance the search put
in another kernel, a ``ReduceMean``), in the row, looped and split kernels. The reference executor
(:func:`shifted_mean`) sums float32 rows in float64 (exact on a constant row without a shift) and
float64 rows from ``K0`` = their first element, so the check compares like with like; the torch
replay (``graph_torch.shifted_mean_op``) shifts by the row's first element (no extra pass). The
sum ``s1`` keeps its spelling.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lumc.ir.graph import Node


@dataclass(frozen=True)
class Moments:
    """A recognized pair: ``s1 = SumReduce(x)``, ``mean = s1 * (1/L)`` and
    ``s2 = SumReduce(d * d)``, ``d = x - broadcast(mean)``, over ``length`` elements per row;
    ``s2`` None for a mean whose squared deviations another kernel sums
    (``render_norm.lone_means``)."""
    s1: Node
    s2: Node | None
    mean: Node
    length: int


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
    """``{s1: s2}`` of :func:`find_moments`."""
    return {m.s1: m.s2 for m in find_moments(stats)}


def find_moments(stats: list[Node]) -> list[Moments]:
    """The pairs among ``stats`` (reductions, topological; other nodes are skipped) that are a sum
    and a sum of squared deviations from the mean it gives (see the module docstring)."""
    sums = {}
    for s in stats:
        if s.op != "SumReduce":
            continue
        src = s.srcs[0]
        length = int(np.prod([src.shape[a] for a in s.arg])) if s.arg else 1
        sums[s] = length
    pairs: list[Moments] = []
    taken: set[int] = set()
    for s2 in stats:
        sq = s2.srcs[0]
        if s2 not in sums or sq.op != "Mul" or sq.srcs[0] is not sq.srcs[1]:
            continue
        for s1, length in sums.items():
            if (s1 is s2 or id(s1) in taken or sums[s2] != length or length == 0
                    or tuple(s1.arg) != tuple(s2.arg)):
                continue
            m = _centered(sq.srcs[0], s1.srcs[0])
            scaled = _scaled(m) if m is not None else None
            if scaled is None or scaled[0] is not s1:
                continue
            # c is 1/L rounded to the statistics' dtype (an f16 form's means stay f16)
            if not is_reciprocal(scaled[1], length, s2.dtype.np):
                continue
            pairs.append(Moments(s1, s2, m, length))
            taken.add(id(s1))
            break
    return pairs


def is_reciprocal(c: float, length: int, dtype) -> bool:
    """Whether ``c`` is ``1/length`` rounded to ``dtype`` (directly, or through float32 for a
    narrower type: an f32 constant cast down). Exactly, not within a tolerance: a relative
    ``2 eps`` let ``fl(1/(L-1))`` pass in f16 (L <= ~1024) and bf16 (L <= 64), and the mean on
    shifted data then replaced ``sum * fl(1/63)`` by ``sum / 64``, 1.6% off in bf16."""
    d = np.dtype(dtype)
    want = {float(np.array(1.0 / length, d))}
    if d.itemsize < 4:
        want.add(float(np.array(np.float32(1.0 / length), d)))
    return float(np.array(c, d)) in want


def find_means(nodes: list[Node]) -> list[tuple[Node, Node, int]]:
    """``(s1, mean, length)`` for each ``mean = s1 * c`` among ``nodes`` (either operand order),
    ``s1 = SumReduce(x)`` over ``length >= 1`` elements and ``c`` = ``1/length`` rounded to the
    sum's dtype: a row mean on its own, as a kernel holding only the first statistic of a LayerNorm
    (its sum of squared deviations in another kernel) computes it. A mean of squares ``x * x`` (a
    variance, an RMSNorm's statistic) is no such mean: it keeps its spelling."""
    out = []
    for m in nodes:
        sc = _scaled(m)
        if sc is None or sc[0].op != "SumReduce" or not sc[0].dtype.is_float:
            continue
        s1 = sc[0]
        sq = s1.srcs[0]
        if sq.op == "Mul" and sq.srcs[0] is sq.srcs[1]:
            continue
        length = int(np.prod([s1.srcs[0].shape[a] for a in s1.arg])) if s1.arg else 1
        if length and is_reciprocal(sc[1], length, s1.dtype.np):
            out.append((s1, m, length))
    return out


def shifted_mean(x: np.ndarray, axes: tuple[int, ...], out: np.dtype) -> np.ndarray:
    """The mean of ``x`` over ``axes`` (kept as size-1 dims), rounded once to ``out``: a float64
    row on shifted data, ``K0 + sum(x - K0) / L`` with ``K0`` its first element (0 where not
    finite); a float32/16 row summed in float64 as it is (exact enough that no shift is needed).
    The correctly rounded mean of a float32 row up to float64's rounding, exact on a constant row
    of any float dtype, finite where only the float32 sum would overflow; a row holding inf or NaN
    gives the plain mean's inf or NaN.

    Args:
        x: float array (float32 or float64); ``axes`` non-empty, of total length ``L >= 1``.
    """
    length = int(np.prod([x.shape[a] for a in axes]))
    with np.errstate(all="ignore"):
        if x.dtype != np.float64:
            # float32/16 values summed in float64 (numpy casts chunk by chunk: no float64 copy of
            # x): exact up to 2**-53 of the terms, and exactly L * c on a constant row (L < 2**29)
            m = np.sum(x, axis=axes, keepdims=True, dtype=np.float64) / length
        else:
            first = x[tuple(slice(0, 1) if d in axes else slice(None) for d in range(x.ndim))]
            k0 = np.where(np.isfinite(first), first, 0)
            m = k0 + np.sum(x - k0, axis=axes, keepdims=True) / length
        return m.astype(out)
