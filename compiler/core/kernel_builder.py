"""Cut a kernel out of a model graph: its meaning over placeholders, its form and attrs.

Given the nodes a kernel computes (its roots) and a boundary test (which model nodes are already in
memory), :func:`build_call` walks from the roots down to the boundary and rebuilds that region over
placeholders ``in0..`` (one per boundary node, with that node's shape and dtype). Views are folded
into reads: a view over an elementwise result is pushed down to the placeholders it reads (exact for
unmasked views), so in pointwise, reduction and matmul meanings every ``View`` sits on a placeholder,
a scalar ``Constant`` or an ``Iota``. Scalar constants stay inside the meaning; larger constants are
placeholders bound to the model's ``Constant`` node.

Meaning contract per form (what a renderer may rely on):

* ``pointwise`` / ``gather``: elementwise ops, ``Gather``, ``Contiguous`` and views over leaves; every
  output has the same shape. ``gather`` when a ``Gather`` is inside.
* ``reduction``: one ``SumReduce``/``MaxReduce`` (attrs ``axes``, ``reduce``) with an elementwise
  prologue under it and an elementwise epilogue over its (keepdims) shape above it.
* ``matmul``: a reduction whose reduce is ``SumReduce(Mul(a, b))`` with ``a`` and ``b`` broadcast
  (stride-0) reads of two operands; attrs ``axes`` (the contracted axes), ``lhs``/``rhs`` (the
  placeholder names under ``a``/``b``, or None when an operand is a computed prologue).
* ``softmax``/``layernorm``/``rmsnorm``/``attention``: the form's primitive composition as the
  model wrote it (views over inner values stay where they are, e.g. the probabilities reach the
  value product through a reshape/expand view), plus any elementwise epilogue; attrs: ``axis`` and
  ``eps`` for norms, ``axis`` for softmax, ``masked`` and ``mask`` (``none``/``add``/``select``)
  for attention.
* ``scan``: one triangular-mask contraction (a cumsum's prefix sum,
  ``lumc.backends.scan_structure``) as written, its operand's elementwise prologue under it and an
  elementwise epilogue of its size above it; no attrs (the renderer reads the axis, ``exclusive``
  and ``reverse`` off the mask).
"""
from __future__ import annotations

from typing import Callable

from lumc.ir.graph import Graph, Node, input_node, view_node
from lumc.ir.kernels import Kernel
from lumc.ir.ops import ELEMENTWISE, REDUCE
from lumc.ir.views import View
from lumc.ir.movement import compose_view

from lumc.backends.triton.contraction import paired_contractions
from lumc.compiler.runtime.program import KernelCall
from lumc.ir.provenance import rebuilt


def is_buffer_leaf(n: Node) -> bool:
    """Leaves that live in memory: model inputs and non-scalar constants (weights, tables)."""
    return n.op == "Input" or (n.op == "Constant" and n.numel != 1)


def _apply_view(x: Node, v: View) -> Node:
    return view_node(x, lambda u: compose_view(u, v))


class _Cutter:
    def __init__(self, roots: list[Node], boundary: Callable[[Node], bool], push_views: bool = True):
        self.roots = {id(r) for r in roots}
        self.push_views = push_views
        self.boundary = boundary
        self.placeholders: dict[int, Node] = {}
        self.bound: list[Node] = []
        self.memo: dict[tuple, Node] = {}
        self.covers: list[Node] = []
        self._covered: set[int] = set()

    def _is_boundary(self, n: Node) -> bool:
        if id(n) in self.roots:
            return False
        return is_buffer_leaf(n) or self.boundary(n)

    def placeholder(self, n: Node) -> Node:
        p = self.placeholders.get(id(n))
        if p is None:
            p = input_node(f"in{len(self.bound)}", n.shape, n.dtype)
            self.placeholders[id(n)] = p
            self.bound.append(n)
        return p

    def build(self, n: Node, views: tuple[View, ...] = ()) -> Node:
        """The meaning of ``n`` read through ``views``, over placeholders.

        Iterative (an explicit stack, depth-first in source order, so placeholders and covers
        are numbered as a recursive walk would number them): a region may be thousands of nodes
        deep (a ``Sum`` of 1,000 inputs is a chain of 999 adds).
        """
        stack = [(n, views)]
        while stack:
            n, views = stack[-1]
            key = (id(n), views)
            if key in self.memo:
                stack.pop()
                continue
            out = self._step(n, views, stack)
            if out is None:          # sources pushed: come back when they are built
                continue
            self.memo[key] = out
            stack.pop()
        return self.memo[(id(n), views)]

    def _step(self, n: Node, views: tuple[View, ...], stack: list) -> Node | None:
        """Build ``n`` through ``views`` if what it needs is in the memo; else push that and
        return None."""
        def need(*frames):
            missing = [f for f in frames if (id(f[0]), f[1]) not in self.memo]
            stack.extend(reversed(missing))
            return not missing

        if self._is_boundary(n):
            out = self.placeholder(n)
            for v in views:
                out = _apply_view(out, v)
            return out
        if n.op == "View":
            src = (n.srcs[0], (n.arg,) + views)
            return self.memo[(id(src[0]), src[1])] if need(src) else None
        if n.op in ("Constant", "Iota", "Input"):
            out = n
            for v in views:
                out = _apply_view(out, v)
            return out
        if id(n) not in self._covered:
            self._covered.add(id(n))
            self.covers.append(n)
        pushable = (self.push_views and n.op in ELEMENTWISE
                    and all(v.mask is None for v in views))
        if views and not pushable:
            if not need((n, ())):
                return None
            out = self.memo[(id(n), ())]
            for v in views:
                out = _apply_view(out, v)
            return out
        srcs = [(s, views) for s in n.srcs]
        if not need(*srcs):
            return None
        return rebuilt(n, [self.memo[(id(s), v)] for s, v in srcs])


def _base(x: Node) -> Node:
    while x.op in ("View", "Cast"):
        x = x.srcs[0]
    return x


def _is_broadcast_read(x: Node, depth: int = 0) -> bool:
    """A contraction operand a tile can be loaded from: a broadcast (stride-0) view, under casts or
    an elementwise prologue of such reads and scalars (a weight dequantized in the prologue:
    ``Cast(q) * scale``), at most a few ops deep."""
    while x.op == "Cast":
        x = x.srcs[0]
    if x.op == "View":
        return any(st == 0 and d > 1 for st, d in zip(x.arg.strides, x.arg.shape))
    if x.op in ELEMENTWISE and x.srcs and depth < 3:
        reads = [s for s in x.srcs if not (s.op in ("Constant", "View") and s.numel == 1)]
        return bool(reads) and all(_is_broadcast_read(s, depth + 1) for s in reads)
    return False


def _reads_product(nodes: list[Node], r: Node, reds: list[Node]) -> bool:
    """True when a reduction other than ``r`` depends on ``r`` (``nodes`` topological)."""
    dep = {id(r)}
    for n in nodes:
        if any(id(s) in dep for s in n.srcs):
            dep.add(id(n))
    return any(id(x) in dep for x in reds if x is not r)


def classify(meaning: Graph) -> tuple[str, tuple]:
    """``(form, attrs)`` of a pointwise/gather/reduction/matmul meaning (see the module docstring)."""
    nodes = meaning.nodes()
    reds = [n for n in nodes if n.op in REDUCE]
    if not reds:
        return ("gather" if any(n.op == "Gather" for n in nodes) else "pointwise"), ()
    products = [x for x in reds if x.op == "SumReduce" and x.srcs[0].op == "Mul" and all(
        _is_broadcast_read(s) for s in x.srcs[0].srcs)]
    # one contraction, the other reductions row statistics of its operand or of a residual, none
    # reading the product (a normalization formed on load, ``lumc.backends.triton.norm_prologue``
    # and ``norm_epilogue``; the renderer checks the structure)
    # or two that share the left operand and iteration space (``paired_contractions``: a gated
    # MLP's gate and up, one kernel with two accumulators), neither reading the other
    pair = paired_contractions(nodes) if len(products) == 2 else None
    mains = ([c.node for c in pair] if pair is not None
             else products if len(products) == 1 else [])
    r = mains[0] if mains else reds[0]
    attrs = [("axes", tuple(r.arg)), ("reduce", "sum" if r.op == "SumReduce" else "max")]
    if mains and not any(_reads_product(nodes, x, reds) for x in mains):
        a, b = (_base(s) for s in r.srcs[0].srcs)
        lhs = a.arg.name if a.op == "Input" else None
        rhs = b.arg.name if b.op == "Input" and pair is None else None   # paired: two rhs
        extra = [("paired", True)] if pair is not None else []
        return "matmul", tuple(sorted(attrs + extra + [("lhs", lhs), ("rhs", rhs)]))
    return "reduction", tuple(sorted(attrs))


def build_call(roots: list[Node], boundary: Callable[[Node], bool], form: str | None = None,
               attrs: tuple = (), meaning_roots: list[Node] | None = None,
               push_views: bool | None = None) -> KernelCall:
    """The kernel computing ``roots`` from the boundary nodes, bound to the model graph.

    Args:
        roots: model nodes the kernel writes (``out0..`` in order).
        boundary: True for model nodes already in memory (outputs of earlier kernels); model inputs
            and non-scalar constants always are.
        form: the kernel form; None classifies the meaning (pointwise/gather/reduction/matmul).
        attrs: the form's attrs when ``form`` is given.
        meaning_roots: alternative primitive expressions for the roots (same shapes and dtypes),
            used in place of the model's own subgraph (a form's canonical composition).
        push_views: push views down onto the placeholders (default: only when ``form`` is None);
            False keeps a normalization prologue as written (its renderer reads its rows).
    """
    # a named form keeps its composition as written (its renderer matches that structure);
    # pointwise/reduction/matmul meanings get their views pushed down onto the placeholders
    cut = _Cutter(roots, boundary, push_views=(form is None) if push_views is None else push_views)
    exprs = meaning_roots if meaning_roots is not None else roots
    outs = []
    for r, e in zip(roots, exprs):
        if e is r and r.op == "View":
            outs.append(cut.build(r.srcs[0], (r.arg,)))
        elif e is r:
            outs.append(rebuilt(r, [cut.build(s) for s in r.srcs]) if r.op not in (
                "Input", "Constant", "Iota") else r)
            if id(r) not in cut._covered:
                cut._covered.add(id(r))
                cut.covers.append(r)
        else:
            outs.append(cut.build(e))
    inputs = {f"in{k}": cut.placeholders[id(n)] for k, n in enumerate(cut.bound)}
    meaning = Graph(inputs, {f"out{j}": o for j, o in enumerate(outs)})
    if form is None:
        form, attrs = classify(meaning)
    covers = tuple(str(n.id) for n in sorted(cut.covers, key=lambda n: n.id))
    return KernelCall(Kernel(form, meaning, tuple(attrs), covers), list(cut.bound), list(roots))
