"""Contractions ``SumReduce(Mul(a, b))`` found in a meaning, with their dims classified.

A matmul (and a convolution through its window views, and attention's two products) is written in
primitives as a broadcast product summed over some axes: over a full shape ``F``, ``a`` varies along
some dims and is broadcast (stride 0) along others, and so is ``b``. That pattern alone fixes the GEMM:

* ``K`` dims: the summed axes;
* ``M`` dims: kept dims only ``a`` varies along (rows of the output);
* ``N`` dims: kept dims only ``b`` varies along (columns);
* batch dims: kept dims both vary along (or neither: the result is broadcast there).

Dims of size 1 belong to no group. Each group is flattened row-major, so ``[B, M, K] @ [K, N]``
(``b`` broadcast over ``B``) becomes one ``(B*M) x N`` GEMM and a convolution's ``(N, OH, OW)`` are
its ``M`` and ``(C, KH, KW)`` its ``K``.
"""
from __future__ import annotations

from dataclasses import dataclass

from lumc.ir.graph import Node, node
from lumc.ir.ops import ELEMENTWISE
from lumc.ir.views import prod


def dims_used(n: Node, memo: dict | None = None) -> frozenset[int]:
    """Dims of ``n.shape`` that ``n``'s value depends on (a superset where unsure)."""
    memo = {} if memo is None else memo
    hit = memo.get(n)
    if hit is not None:
        return hit
    shape = n.shape
    if n.op == "Constant" and n.numel == 1:
        out = frozenset()
    elif n.op == "Iota":
        out = frozenset({n.arg.axis}) if shape[n.arg.axis] > 1 else frozenset()
    elif n.op == "View":
        v = n.arg
        out = set()
        for j, (d, st) in enumerate(zip(v.shape, v.strides)):
            if d > 1 and st != 0:
                out.add(j)
            if v.mask is not None and v.mask[j] != (0, d) and d > 1:
                out.add(j)
        src = n.srcs[0]
        if src.op == "Constant" and src.numel == 1 and v.mask is None:
            out = set()
        out = frozenset(out)
    elif n.op in ELEMENTWISE or n.op == "Contiguous":
        out = frozenset().union(*(dims_used(s, memo) for s in n.srcs))
    else:
        out = frozenset(j for j, d in enumerate(shape) if d > 1)
    memo[n] = out
    return out


@dataclass
class Contraction:
    """A ``SumReduce(Mul(a, b))`` node with its dims grouped (see module docstring)."""
    node: Node
    a: Node
    b: Node
    full: tuple[int, ...]
    m_dims: tuple[int, ...]
    n_dims: tuple[int, ...]
    k_dims: tuple[int, ...]
    batch_dims: tuple[int, ...]

    def extent(self, dims) -> int:
        return prod(self.full[d] for d in dims)

    @property
    def M(self) -> int:
        return self.extent(self.m_dims)

    @property
    def N(self) -> int:
        return self.extent(self.n_dims)

    @property
    def K(self) -> int:
        return self.extent(self.k_dims)

    @property
    def batch(self) -> int:
        return self.extent(self.batch_dims)

    def shape_of(self, dims) -> tuple[int, ...]:
        return tuple(self.full[d] for d in dims)


def as_contraction(n: Node) -> Contraction | None:
    """Classify ``n`` if it is ``SumReduce(Mul(a, b))``, else None."""
    if n.op != "SumReduce" or n.srcs[0].op != "Mul":
        return None
    a, b = n.srcs[0].srcs
    full = tuple(a.shape)
    axes = set(n.arg)
    memo: dict = {}
    ua, ub = dims_used(a, memo), dims_used(b, memo)
    m, nn, k, batch = [], [], [], []
    for d, size in enumerate(full):
        if size == 1:
            continue
        if d in axes:
            k.append(d)
        elif d in ua and d not in ub:
            m.append(d)
        elif d in ub and d not in ua:
            nn.append(d)
        else:
            batch.append(d)
    return Contraction(n, a, b, full, tuple(m), tuple(nn), tuple(k), tuple(batch))


def as_contraction_squeezed(n: Node) -> Contraction | None:
    """:func:`as_contraction`, also when the product reaches the sum through a reshape that only
    drops leading 1s (``SumReduce(reshape(Mul(a, b)))``: the e-graph's batch-of-one spelling,
    ``views/SumReduce`` in ``lumc.rewrites.rules_views``). Dims are those of the product; ``node``
    is ``n`` itself. Graph-level decisions use it (which contractions pair); a kernel's meaning
    has the reshape composed into the operands' views, where :func:`as_contraction` sees it."""
    c = as_contraction(n)
    if c is not None or n.op != "SumReduce" or n.srcs[0].op != "View":
        return c
    v, p = n.srcs[0], n.srcs[0].srcs[0]
    lead = len(p.shape) - len(v.shape)
    if p.op != "Mul" or lead < 1 or tuple(p.shape[lead:]) != tuple(v.shape) or \
            any(d != 1 for d in p.shape[:lead]) or not v.arg.is_contiguous:
        return None
    c = as_contraction(node("SumReduce", [p], tuple(a + lead for a in n.arg)))
    return None if c is None else Contraction(n, c.a, c.b, c.full, c.m_dims, c.n_dims,
                                              c.k_dims, c.batch_dims)


def find_contractions(nodes: list[Node]) -> list[Contraction]:
    out = []
    for n in nodes:
        c = as_contraction(n)
        if c is not None:
            out.append(c)
    return out


def same_iteration(c1: Contraction, c2: Contraction) -> bool:
    """``c1`` and ``c2`` read the same left operand (one node: the same view of the same value) over
    the same iteration space: one program can load each ``a`` tile once and multiply it by both
    right operands (a gated MLP's gate and up projections)."""
    return (c1.a is c2.a and c1.full == c2.full and c1.m_dims == c2.m_dims
            and c1.n_dims == c2.n_dims and c1.k_dims == c2.k_dims
            and c1.batch_dims == c2.batch_dims and c1.node.dtype == c2.node.dtype
            and c1.b.dtype == c2.b.dtype)


def is_tensor_core(c: Contraction) -> bool:
    """``c`` is computed with ``tl.dot``: its product space has an ``M`` or ``N`` dim and its two
    operands are distinct. A normalization's row statistic (``SumReduce(Mul(d, d))``,
    ``sum(x * x)``: no broadcast operand) is summed on CUDA cores in fp32 at every ``PRECISION``."""
    return bool(c.m_dims or c.n_dims) and c.a is not c.b


def tensor_core_contractions(nodes: list[Node]) -> list[Contraction]:
    """The contractions of ``nodes`` a kernel computes with ``tl.dot`` (:func:`is_tensor_core`)."""
    return [c for c in find_contractions(nodes) if is_tensor_core(c)]


def paired_contractions(nodes: list[Node]) -> tuple[Contraction, Contraction] | None:
    """The two contractions of a paired matmul kernel (:func:`same_iteration`), in the order of
    ``nodes``; None unless the meaning has exactly two contractions and they pair. A normalization's
    sum of squares (``SumReduce(Mul(d, d))``, no broadcast operand) is not a contraction here."""
    cs = tensor_core_contractions(nodes)
    if len(cs) == 2 and same_iteration(cs[0], cs[1]):
        return cs[0], cs[1]
    return None
