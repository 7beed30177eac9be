"""Row statistics in a contraction's epilogue: a post-LN LayerNorm or RMSNorm formed on load where a
contraction reads it as its residual.

A post-LN block (BERT) writes ``y = LN(s)`` and reads it twice: as the next projection's operand and
as the residual of the contraction after it, ``z = h @ W + bias + y``. The first read is a
normalization formed on load in the operand (``norm_prologue``); this module is the second: the
contraction kernel reads ``s`` itself, computes the row statistics of its ``BLOCK_M`` rows of ``s``
in loops of their own over ``N`` before the main loop, and forms the normalized residual tile in
the epilogue, so ``y`` never reaches memory and the LayerNorm is not a kernel of its own.

Structure the renderer relies on (checked; anything else is a :class:`RenderError`):

* the contraction has no batch dims, and its ``M`` dims precede its ``N`` dims, so the output
  tile's flat position is ``m * N + n``;
* every reduction other than the contraction and its prologue's statistics is a *row statistic* of
  one shape ``S_Q = lead + trail`` with ``prod(lead) == M`` and ``prod(trail) == N``, over exactly
  the ``trail`` dims, and independent of the product;
* row values (the statistics and elementwise functions of them, such as ``rsqrt(var + eps)``) are
  read back only through broadcasts along ``trail``;
* every such broadcast (of the epilogue's statistics or of the prologue's, where the epilogue also
  reads the normalized operand) is reached, from the kernel's outputs or from a statistic's
  operand, only through elementwise ops and pure reshapes (:func:`aligned_reads`): those keep the
  flat position, so the row a broadcast reads is the tile's row, and it resolves to the
  statistic's ``[BLOCK_M, 1]`` column.

Statistics are summed in ``BLOCK_N`` chunks, then across the chunk: the reference's two-pass
``mean`` and ``var`` in another order (``reassociating`` in DESIGN.md's rule classes), as in the
prologue. Cost (``lumc.backends.simulator``): each program reads its ``BLOCK_M`` rows of ``s`` once
per statistic (from L2 after the first program of a row block) on CUDA cores, once per ``N_TILES``
column tiles.
"""
from __future__ import annotations

from lumc.ir.graph import Node
from lumc.ir.ops import ELEMENTWISE
from lumc.ir.views import prod
from lumc.backends.triton.codegen import RenderError
from lumc.backends.triton.contraction import Contraction
from lumc.backends.triton.indexing import is_pure_reshape
from lumc.backends.triton.norm_prologue import RowPrologue, check_row_reads, is_row_value


def plan_row_epilogue(c: Contraction, nodes: list[Node], stats: list[Node],
                      dep: set[Node]) -> RowPrologue:
    """Check the structure of the module docstring for the epilogue statistics ``stats`` (the
    meaning's reductions that are neither ``c`` nor its prologue's statistics) of contraction
    ``c``; ``nodes`` is the meaning in topological order, ``dep`` the nodes that depend on the
    product. Returns the plan over ``S_Q`` (its ``p`` is the first statistic's operand).

    Raises:
        RenderError: naming the node that does not fit.
    """
    if c.batch_dims:
        raise RenderError(f"node {c.node!r}: row statistics in a batched contraction's epilogue")
    if c.m_dims and c.n_dims and max(c.m_dims) > min(c.n_dims):
        raise RenderError(f"node {c.node!r}: the product's rows do not precede its columns, so "
                          "an output tile's rows are not rows of the epilogue's statistics")
    q = stats[0].srcs[0]
    shape = tuple(q.shape)
    split = next((t for t in range(len(shape) + 1)
                  if prod(shape[:t]) == c.M and prod(shape[t:]) == c.N), None)
    if split is None:
        raise RenderError(f"node {stats[0]!r}: a reduction in the epilogue over a {list(shape)} "
                          f"value, not [M={c.M}, N={c.N}] rows")
    trail_axes = {a for a in range(split, len(shape)) if shape[a] > 1}
    row_shape = shape[:split] + (1,) * (len(shape) - split)
    plan = RowPrologue(q, split, [])
    for r in stats:
        src = r.srcs[0]
        axes = {a for a in r.arg if src.shape[a] > 1}
        if tuple(src.shape) != shape or axes != trail_axes or tuple(r.shape) != row_shape:
            raise RenderError(f"node {r!r}: a reduction in the epilogue that is not a statistic "
                              f"of its rows over dims {sorted(trail_axes)}")
        if r in dep:
            raise RenderError(f"node {r!r}: a statistic of the product itself (it needs whole "
                              "output rows in one program)")
        plan.stats.append(r)
        plan.rows.add(r)
    stat_set = set(stats)
    for n in nodes:                   # topological: a function of statistics and scalars per row
        if n not in stat_set and is_row_value(n, plan.rows, row_shape, shape):
            plan.rows.add(n)
    check_row_reads(nodes, plan.rows, row_shape, shape)
    return plan


def row_broadcasts(nodes: list[Node], plans: list[RowPrologue]) -> set[Node]:
    """The views of ``nodes`` that broadcast a row value of one of ``plans`` along its rows."""
    rows = set().union(*(p.rows for p in plans)) if plans else set()
    return {n for n in nodes if n.op == "View" and n.srcs[0] in rows}


def aligned_reads(c: Contraction, roots: list[Node], broadcasts: set[Node],
                  stats: set[Node]) -> set[Node]:
    """Check that every row-value broadcast reached from ``roots`` (the kernel's outputs and the
    epilogue statistics' operands) is read at the tile's rows, and return those broadcasts.

    A node evaluated at a flat position ``f`` of an ``[M, L]``-numel value passes ``f`` unchanged
    to the operands of an elementwise op (same shape) and of a pure reshape; any other op (a view
    that moves elements, a gather) reads its operands elsewhere. The product (the accumulator)
    and the statistics (their own loops) are not entered.

    Raises:
        RenderError: a broadcast row value reached through an op that moves elements.
    """
    aligned: set[Node] = set()
    elsewhere: set[Node] = set()
    stack = [(r, True) for r in roots]
    while stack:
        x, al = stack.pop()
        seen = aligned if al else elsewhere
        if x in seen:
            continue
        seen.add(x)
        if x in broadcasts:
            if not al:
                raise RenderError(f"node {x!r}: a row value read in the epilogue at a position "
                                  "that is not the tile's row (through a view that moves "
                                  "elements)")
            continue
        if x is c.node or x in stats:
            continue
        for s in x.srcs:
            keep = al and s.numel == x.numel and (
                x.op in ELEMENTWISE or x.op == "Contiguous" or
                (x.op == "View" and is_pure_reshape(x.arg, s.shape)))
            stack.append((s, keep))
    return aligned & broadcasts
