"""Row statistics in a contraction's prologue: a LayerNorm or RMSNorm formed on load (pre-LN fusion).

A pre-LN block normalizes the rows of ``x`` and multiplies the result by a weight:
``(LN(x) * g + b) @ W``. Fused, the matmul kernel reads ``x`` itself and forms the normalized
``BLOCK_M x BLOCK_K`` tile on load, so the normalized activations never reach memory.

Structure the renderer relies on (checked; anything else is a :class:`RenderError`):

* the contraction's ``a`` operand is a stack of views over one computed node ``P`` of shape
  ``S_P = lead + trail``, read row-major as a ``[M, K]`` matrix: ``prod(lead) == M``,
  ``prod(trail) == K``, the composed view's strides are ``K * row-major(lead)`` along the ``M``
  dims, ``row-major(trail)`` along the ``K`` dims and 0 elsewhere (no offset, no mask);
* every other reduction of the meaning is a *row statistic*: a ``SumReduce``/``MaxReduce`` of an
  ``S_P``-shaped expression over exactly the ``trail`` dims (``sum(x)``, ``sum(d * d)``);
* *row values* (shape ``lead + 1s``: the statistics and elementwise functions of them, such as
  ``rsqrt(var + eps)``) are read back only through broadcasts along ``trail``.

Code: before the main ``K`` loop, each statistic (in topological order, so the variance sees the
mean) gets its own loop over ``K`` that accumulates its ``S_P`` expression at the tile's rows and
sums it to a ``[BLOCK_M, 1]`` column; row values are computed once from those columns. The main
loop evaluates ``P`` at ``(rows, k)``, and every broadcast row value resolves to its column. The
statistics are summed in ``BLOCK_K`` chunks, then across the chunk: the same sums as the reference's
two-pass ``mean`` and ``var`` in another order (``reassociating`` in DESIGN.md's rule classes).

Cost (``lumc.backends.simulator``): each program reads its ``BLOCK_M`` rows of ``x`` once per
statistic and once in the main loop (from L2 after the first program of a row block), and
recomputes the prologue for its column tile.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from lumc.ir.graph import Node
from lumc.ir.ops import ELEMENTWISE, REDUCE
from lumc.ir.views import View, contiguous_strides, prod
from lumc.ir.movement import compose_views
from lumc.backends.row_moments import Moments, find_means, find_moments
from lumc.backends.triton import exprs
from lumc.backends.triton.chan import ChanLoop, ShiftedSum
from lumc.backends.triton.codegen import Evaluator, RenderError, SourceWriter
from lumc.backends.triton.contraction import Contraction
from lumc.backends.triton.indexing import unravel


@dataclass
class RowPrologue:
    """The checked structure of a contraction operand with row statistics (module docstring)."""
    p: Node                      # the computed operand, shape lead + trail
    split: int                   # S_P[:split] is lead, S_P[split:] is trail
    stats: list[Node]            # row statistics, topological
    rows: set = field(default_factory=set)   # row-valued nodes (stats included)

    @property
    def lead(self) -> tuple[int, ...]:
        return tuple(self.p.shape[:self.split])

    @property
    def trail(self) -> tuple[int, ...]:
        return tuple(self.p.shape[self.split:])


def _scalar(x: Node) -> bool:
    """A scalar, or a broadcast of one (``eps``, ``1/K``)."""
    return x.numel == 1 or (x.op == "View" and x.srcs[0].numel == 1)


def _strip(x: Node) -> tuple[Node, list[View]]:
    views = []
    while x.op == "View":
        views.append(x.arg)
        x = x.srcs[0]
    return x, views[::-1]          # innermost first


def _reads_rows(v: View, c: Contraction, m_size: int, k_size: int) -> bool:
    """``v`` (product space -> ``P``'s contiguous space) reads ``P`` as a row-major ``[M, K]``."""
    if v.mask is not None or v.offset != 0 or tuple(v.shape) != tuple(c.full):
        return False
    want = [0] * len(c.full)
    for d, st in zip(c.m_dims, contiguous_strides(c.shape_of(c.m_dims))):
        want[d] = st * k_size
    for d, st in zip(c.k_dims, contiguous_strides(c.shape_of(c.k_dims))):
        want[d] = st
    return all(size == 1 or st == w for st, w, size in zip(v.strides, want, c.full)) and \
        m_size == c.M and k_size == c.K


def _is_row_broadcast(v: View, row_shape: tuple, p_shape: tuple) -> bool:
    """``v`` broadcasts a contiguous ``row_shape`` value along the trailing dims to ``p_shape``."""
    if v.mask is not None or v.offset != 0 or tuple(v.shape) != tuple(p_shape):
        return False
    want = View.contiguous(row_shape).expand(p_shape)
    return all(size == 1 or a == b for a, b, size in zip(v.strides, want.strides, p_shape))


def reads_operand_rows(c: Contraction, row: int | None = None) -> bool:
    """Whether contraction ``c`` reads its left operand as ``[M, K]`` rows of a computed value (a
    view that splits its dims into M then K): what :func:`plan_row_prologue` needs before a
    normalization can be formed on load there (a convolution's sliding window cannot); with
    ``row``, the normalization's row length, only where K is that row (its statistics reduce
    over exactly the K dims)."""
    if row is not None and c.K != row:
        return False
    p, views = _strip(c.a)
    if p.op in ("Input", "Constant", "Iota") or not views:
        return False
    shape = tuple(p.shape)
    split = next((t for t in range(len(shape) + 1)
                  if prod(shape[:t]) == c.M and prod(shape[t:]) == c.K), None)
    v = compose_views(views)
    return split is not None and v is not None and _reads_rows(v, c, c.M, c.K)


def plan_row_prologue(c: Contraction, nodes: list[Node]) -> RowPrologue:
    """Check the structure of the module docstring for contraction ``c`` of a meaning.

    Raises:
        RenderError: naming the node that does not fit.
    """
    if c.batch_dims:
        raise RenderError(f"node {c.node!r}: row statistics in a batched contraction's prologue")
    p, views = _strip(c.a)
    if p.op in ("Input", "Constant", "Iota") or not views:
        raise RenderError(f"node {c.a!r}: the operand with row statistics is not a view of a "
                          "computed value")
    shape = tuple(p.shape)
    split = next((t for t in range(len(shape) + 1)
                  if prod(shape[:t]) == c.M and prod(shape[t:]) == c.K), None)
    v = compose_views(views)
    if split is None or v is None or not _reads_rows(v, c, c.M, c.K):
        raise RenderError(f"node {c.a!r}: the contraction does not read its operand {p!r} as "
                          f"[M={c.M}, K={c.K}] rows")
    trail_axes = {a for a in range(split, len(shape)) if shape[a] > 1}
    row_shape = shape[:split] + (1,) * (len(shape) - split)
    plan = RowPrologue(p, split, [])
    inside: set = set()
    stack = [p]
    while stack:                      # P's subtree
        x = stack.pop()
        if x in inside:
            continue
        inside.add(x)
        stack.extend(x.srcs)
    for n in nodes:                   # topological
        if n not in inside:
            continue
        if n.op in REDUCE:
            src = n.srcs[0]
            axes = {a for a in n.arg if src.shape[a] > 1}
            if tuple(src.shape) != shape or axes != trail_axes or tuple(n.shape) != row_shape:
                raise RenderError(f"node {n!r}: a reduction in the operand's prologue that is not "
                                  f"a statistic of its rows over dims {sorted(trail_axes)}")
            plan.stats.append(n)
            plan.rows.add(n)
        elif is_row_value(n, plan.rows, row_shape, shape):
            plan.rows.add(n)          # a function of the statistics (and scalars) per row
    if not plan.stats:
        raise RenderError(f"node {p!r}: no row statistic in the operand's prologue")
    for n in nodes:
        if n not in inside and any(s in plan.rows for s in n.srcs):
            raise RenderError(f"node {n!r}: a row statistic read outside the operand's prologue")
    check_row_reads([n for n in nodes if n in inside], plan.rows, row_shape, shape)
    return plan


def is_row_value(n: Node, rows: set, row_shape: tuple, shape: tuple) -> bool:
    """``n`` is an elementwise function of row values (and scalars) with one value per row."""
    return (n.op in ELEMENTWISE and tuple(n.shape) == tuple(row_shape) and n.numel < prod(shape)
            and any(s in rows for s in n.srcs) and all(s in rows or _scalar(s) for s in n.srcs))


def check_row_reads(nodes: list[Node], rows: set, row_shape: tuple, shape: tuple) -> None:
    """Row values are read back only through broadcasts along the rows' trailing dims.

    Raises:
        RenderError: naming the node that reads one otherwise.
    """
    for n in nodes:
        for s in n.srcs:
            if s in rows and n not in rows and not (
                    n.op == "View" and _is_row_broadcast(n.arg, row_shape, shape)):
                raise RenderError(f"node {n!r}: reads row value {s!r} other than through a "
                                  "broadcast along its rows")


class RowStatistics:
    """Emits the statistics loops and resolves row values (see the module docstring).

    Args:
        plan: the checked structure.
        w, ev: the kernel's writer and evaluator.
        lead: index names (bound at level 0) of ``P``'s leading dims for the tile's rows.
    """

    def __init__(self, plan: RowPrologue, w: SourceWriter, ev: Evaluator, lead: list[str],
                 aligned: set | frozenset = frozenset()):
        self.plan, self.w, self.ev, self.lead = plan, w, ev, list(lead)
        # broadcasts of row values checked to be read at the tile's rows wherever they are read
        # (``norm_epilogue.aligned_reads``): resolved without comparing index expressions
        self.aligned = aligned
        self.vars: dict[Node, str] = {}
        self.row_idx = tuple(self.lead) + ("0",) * len(plan.trail)

    def p_index(self, k: str, prefix: str, level: int) -> list[str]:
        """The index of ``P`` at the tile's rows and the K positions ``k`` (a ``[1, BLOCK_K]``
        expression)."""
        trail = [e if (e == "0" or e.isidentifier()) else self.w.bind(e, prefix, level)
                 for e in unravel(k, self.plan.trail)]
        return self.lead + trail

    def emit(self, K: int | str, i64: str, block: str = "BLOCK_K") -> None:
        """One loop per statistic over the row length ``K`` in ``block`` chunks, before the main
        loop (level 0)."""
        w, ev = self.w, self.ev
        pairs = {m.s1: m for m in find_moments(self.plan.stats)}
        second = {m.s2 for m in pairs.values()}
        # a row mean whose squared deviations are not summed here (``E[x^2] - mean^2`` spellings):
        # on shifted data too (``lumc.backends.row_moments.find_means``)
        lone = {s1: mean for s1, mean, _ in find_means(list(self.plan.rows))
                if s1 in self.plan.stats and s1 not in pairs}
        for r in self.plan.stats:
            if r in pairs:
                self._emit_moments(pairs[r], K, i64, block)
                continue
            if r in second:
                continue
            shifted = None if r not in lone else ShiftedSum(
                w, *self._first_chunk(r.srcs[0], K, i64, block), "tl.float32", True)
            acc = w.fresh("stat_acc")
            is_max = r.op == "MaxReduce"
            init = "float('-inf')" if is_max else "0.0"
            w.line(f"{acc} = tl.full([BLOCK_M, {block}], {init}, tl.float32)")
            w.open(f"for s_start in range(0, {K}, {block}):")
            w.line(f"rs = (s_start + tl.arange(0, {block})){i64}")
            w.line(f"s_mask = rs[None, :] < {K}")
            val = ev.value(r.srcs[0], self.p_index("rs[None, :]", "sk", 1), "s_mask", 1)
            fill = "float('-inf')" if is_max else "0.0"
            val = w.bind(f"tl.where(s_mask, {val}.to(tl.float32), {fill})", "t", 1)
            w.line(f"{acc} = tl.maximum({acc}, {val})" if is_max else f"{acc} = {acc} + {val}")
            if shifted is not None:
                shifted.add(val, "s_mask")
            w.close()
            red = "tl.max" if is_max else "tl.sum"
            name = w.fresh("stat")
            w.line(f"{name} = {red}({acc}, axis=1)[:, None]")
            if r.dtype.name != "f32":
                name = w.bind(f"{name}.to({exprs.tl_dtype(r.dtype)})", "stat", 0)
            self.vars[r] = name
            if shifted is not None:
                mean = shifted.mean(f"(tl.zeros([BLOCK_M, 1], tl.float32) + {K})")
                self.vars[lone[r]] = mean if lone[r].dtype.name == "f32" else w.bind(
                    f"{mean}.to({exprs.tl_dtype(lone[r].dtype)})", "stat", 0)

    def _first_chunk(self, x_node: Node, K: int | str, i64: str, block: str) -> tuple[str, str]:
        """``(tile, mask)``: ``x_node`` over the rows' first ``block`` positions (level 0), under
        index names of its own (``rs``/``s_mask`` are rebound per chunk, and a level-0 value under
        those names would be reused inside the loop)."""
        w = self.w
        rs, mask = w.fresh("rs_first"), w.fresh("s_mask_first")
        w.line(f"{rs} = tl.arange(0, {block}){i64}", 0)
        w.line(f"{mask} = {rs}[None, :] < {K}", 0)
        return self.ev.value(x_node, self.p_index(f"{rs}[None, :]", "skf", 0), mask, 0), mask

    def _emit_moments(self, mo: Moments, K: int | str, i64: str, block: str) -> None:
        """``mo.s1`` (the row sum), ``mo.s2`` (the sum of squared deviations) and ``mo.mean`` in one
        loop over the row, on data shifted by the mean of its first chunk (``chan.ChanLoop``)."""
        w, ev = self.w, self.ev
        x_node = mo.s1.srcs[0]
        loop = ChanLoop(w, ShiftedSum(w, *self._first_chunk(x_node, K, i64, block), "tl.float32",
                                      True))
        w.open(f"for s_start in range(0, {K}, {block}):")
        w.line(f"rs = (s_start + tl.arange(0, {block})){i64}")
        w.line(f"s_mask = rs[None, :] < {K}")
        x = ev.value(x_node, self.p_index("rs[None, :]", "sk", 1), "s_mask", 1)
        loop.update(w.bind(f"tl.where(s_mask, {x}.to(tl.float32), 0.0)", "t", 1), "s_mask")
        w.close()
        mean = loop.row_mean()
        for r, expr in ((mo.s1, f"{mean} * {K}"), (mo.s2, loop.m2), (mo.mean, mean)):
            name = w.bind(expr if r.dtype.name == "f32" else
                          f"({expr}).to({exprs.tl_dtype(r.dtype)})", "stat", 0)
            self.vars[r] = name

    def resolve(self, ev: Evaluator, n: Node, idx: tuple, mask, level: int) -> str | None:
        """Statistics by name; a broadcast row value by its ``[BLOCK_M, 1]`` column."""
        if n in self.vars:
            if tuple(idx[:len(self.lead)]) != tuple(self.lead):
                raise RenderError(f"node {n!r}: a row statistic read at another row")
            return self.vars[n]
        if n.op == "View" and n.srcs[0] in self.plan.rows:
            if n not in self.aligned and tuple(idx[:len(self.lead)]) != tuple(self.lead):
                raise RenderError(f"node {n!r}: a row value read at another row")
            return ev.value(n.srcs[0], self.row_idx, None, 0)
        return None
