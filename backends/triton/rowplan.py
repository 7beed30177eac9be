"""The structure of a row kernel, derived from its meaning: rows, the reduced axes, and what depends
on which reduction.

Every reduction in a row kernel reduces the same axes of operands of the same shape ``S``. A *row* is
one position of the kept dims (``M = prod(S[kept])`` rows), each reducing ``K = prod(S[axes])``
elements. Nodes are classified:

* *free*: depends on no reduction; computable at any index (inputs, constants, prologue math);
* *row*: depends on a reduction and has one value per row (the reduction, the epilogue);
* *full*: depends on a reduction and has one value per element of ``S`` (softmax's ``exp(x - max)``);
  it reads row values through a broadcast view of the reduced shape.

A reduction's *level* is one more than the deepest reduction its operand depends on: softmax's max is
level 0 and its sum level 1, so a looped kernel that cannot keep the row in registers needs one pass
per level unless an online form merges two levels (``render_norm``).

A *prologue statistic* is a reduction of another shape whose value reaches the main reductions'
operands only as a normalization of their input: a decoding step's RMSNorm before a GEMV
(``sum(x * x)`` over the hidden dim of ``x [B, 1, C]``, the GEMV summing ``C`` for each of ``N``
columns). When the view ``V`` that reads the normalized input into the main shape ``S`` maps
the main reduced axes one-to-one onto the statistic's reduced (trailing) axes and the kept dims
only onto its rows, the statistic of the row a main row reads equals the same reduction taken over
the main tile, ``sum over K of V(x * x)``: the kernel computes it so, first, with the main row
structure (:attr:`RowPlan.prologue`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from lumc.ir.graph import Node
from lumc.ir.kernels import Kernel
from lumc.ir.ops import REDUCE
from lumc.ir.movement import compose_view
from lumc.ir.views import View, contiguous_strides, prod
from lumc.backends.triton.codegen import RenderError
from lumc.backends.triton.indexing import is_pure_reshape


@dataclass
class RowPlan:
    shape: tuple[int, ...]                  # S, the reduced operands' shape
    axes: tuple[int, ...]
    kept: tuple[int, ...]
    M: int
    K: int
    reduces: list[Node]                     # topological order
    level: dict[Node, int]
    kind: dict[Node, str]                   # "row" / "full" for nodes depending on a reduction
    outputs: dict[str, str] = field(default_factory=dict)   # out name -> "row" / "full"
    # prologue statistic -> the view reading its operand's shape into ``shape`` (module docstring)
    prologue: dict[Node, View] = field(default_factory=dict)

    @property
    def kept_shape(self) -> tuple[int, ...]:
        return tuple(self.shape[k] for k in self.kept)

    @property
    def red_shape(self) -> tuple[int, ...]:
        return tuple(self.shape[k] for k in self.axes)

    @property
    def reduced_shape(self) -> tuple[int, ...]:
        return tuple(1 if k in self.axes else d for k, d in enumerate(self.shape))

    @property
    def levels(self) -> list[list[Node]]:
        n = 1 + max(self.level.values(), default=-1)
        return [[r for r in self.reduces if self.level[r] == lv] for lv in range(n)]

    def is_row_broadcast(self, v: View) -> bool:
        """True when view ``v`` (over a row-valued tensor) gives each element of ``S`` its row's
        value: stride 0 along the reduced axes, the rows' row-major strides along the kept dims."""
        if tuple(v.shape) != self.shape or v.offset or v.mask is not None:
            return False
        cs = contiguous_strides(self.kept_shape)
        for j, k in enumerate(self.kept):
            if v.strides[k] != cs[j]:
                return False
        return all(v.strides[k] == 0 for k in self.axes)


def looped_passes(plan: RowPlan) -> int:
    """Loops over its rows the looped variant of ``plan``'s kernel runs
    (``render_reduction.RowKernel.write_looped``): one per prologue statistic, one per reduction
    (one for a pair an online form merges: softmax's max and sum, layer norm's moments;
    ``render_norm``), and one more where it writes values per element."""
    from lumc.backends.triton.render_norm import find_online_merges
    merges = {id(m) for m in find_online_merges(plan).values()}
    return max(1, len(plan.prologue) + len(plan.reduces) - len(merges)
               + ("full" in plan.outputs.values()))


def plan_rows(kernel: Kernel) -> RowPlan | None:
    """The row structure of ``kernel``'s meaning, or None when it has no reduction.

    Raises:
        RenderError: reductions over different axes or operand shapes, or a dependency on a row
            value that is not a plain broadcast back over the reduced axes.
    """
    nodes = kernel.meaning.nodes()
    reduces = [n for n in nodes if n.op in REDUCE]
    if not reduces:
        return None
    split = main_reductions(nodes, reduces)
    if split is None:
        keys = sorted({(tuple(r.srcs[0].shape), tuple(sorted(r.arg))) for r in reduces})
        raise RenderError(f"node {reduces[-1]!r}: reductions of one row kernel must share operand "
                          f"shape and axes, or read the row statistics of their input; got "
                          f"{keys[0]} and {keys[1]}")
    mains, stats = split
    if not stats:
        return plan_rows_of(nodes, reduces, kernel.meaning.outputs)
    prologue = prologue_statistics(nodes, mains, stats, kernel.meaning.outputs)
    plan = plan_rows_of(nodes, mains, kernel.meaning.outputs)
    plan.prologue = prologue
    return plan


def main_reductions(nodes: list[Node], reduces: list[Node]
                    ) -> tuple[list[Node], list[Node]] | None:
    """``(mains, statistics)``: the reductions of one operand shape and axes that read every
    other reduction (the statistics of the input they normalize, :attr:`RowPlan.prologue`), and
    the others; every reduction is a main one when all share their shape and axes. None when no
    one group reads all the others (two unrelated reductions). ``nodes`` topological."""
    key = {r: (tuple(r.srcs[0].shape), tuple(sorted(r.arg))) for r in reduces}
    keys = set(key.values())
    if len(keys) == 1:
        return list(reduces), []
    above: dict[Node, set] = {}
    for n in nodes:
        got = set().union(*(above[s] for s in n.srcs)) if n.srcs else set()
        above[n] = got | {key[n]} if n in key else got
    sinks = [k for k in keys if all(above[r] >= keys - {k} for r in reduces if key[r] == k)]
    if len(sinks) != 1:
        return None
    return ([r for r in reduces if key[r] == sinks[0]],
            [r for r in reduces if key[r] != sinks[0]])


def _row_map_ok(v: View, stat_shape: tuple[int, ...], stat_axes: tuple[int, ...],
                axes: tuple[int, ...]) -> bool:
    """View ``v`` (of a contiguous ``stat_shape`` source, into the main shape) sends the main
    reduced ``axes`` one-to-one onto the statistic's trailing reduced ``stat_axes`` (row-major over
    ``L`` elements) and every kept dim to whole rows of ``L``: so the main row ``i`` reads the
    statistic's row ``(offset + sum of its kept strides) // L`` only."""
    n = len(stat_shape)
    if v.mask is not None or tuple(stat_axes) != tuple(range(n - len(stat_axes), n)):
        return False
    length = prod(stat_shape[a] for a in stat_axes)
    red = [(v.shape[a], v.strides[a]) for a in axes if v.shape[a] != 1]
    want = 1
    for d, st in reversed(red):
        if st != want:
            return False
        want *= d
    if want != length:
        return False
    kept = [k for k in range(len(v.shape)) if k not in axes]
    return v.offset % length == 0 and all(v.strides[k] % length == 0 for k in kept)


def prologue_statistics(nodes: list[Node], mains: list[Node], stats: list[Node],
                        outputs: dict[str, Node]) -> dict[Node, View]:
    """``{statistic: V}`` for the reductions ``stats`` (one operand shape and axes: a layer norm's
    mean and variance) that are prologue statistics of ``mains`` (module docstring).

    Raises:
        RenderError: statistics that are not (of two shapes, written as an output, read by a main
            reduction otherwise than through one row-mapping view, or normalized across rows).
    """
    shape, axes = tuple(mains[0].srcs[0].shape), tuple(sorted(mains[0].arg))
    keys = {(tuple(r.srcs[0].shape), tuple(sorted(r.arg))) for r in stats}
    if len(keys) != 1:
        raise RenderError(f"node {stats[0]!r}: reductions of one row kernel must share operand "
                          f"shape and axes ({shape}, {axes}), or be the row statistics of one "
                          f"normalization of their input; got {sorted(keys)}")
    (stat_shape, stat_axes), = keys
    # the normalization: nodes depending on a statistic, up to the views into the main shape
    # (a view into the main space, or into a shape the main operand reshapes: the squeezed GEMV)
    dep, crossing, views = set(stats), [], set()
    for n in nodes:
        if n in dep or not any(s in dep for s in n.srcs):
            continue
        if n.op == "View" and prod(n.shape) == prod(shape) and tuple(n.shape) != stat_shape \
                and tuple(n.srcs[0].shape) == stat_shape:
            crossing.append(n)
            views.add(n.arg if tuple(n.shape) == shape
                      else compose_view(n.arg, View.contiguous(shape)))
        elif n.op in REDUCE:
            raise RenderError(f"node {n!r}: a main reduction reads a row statistic's value "
                              "other than through the view of its normalized input")
        else:
            dep.add(n)
    if any(o in dep for o in outputs.values()):
        raise RenderError(f"node {stats[0]!r}: a row statistic of another shape is written")
    beyond = set(crossing)
    for n in nodes:
        if any(s in beyond for s in n.srcs):
            beyond.add(n)
    plan_rows_of([n for n in nodes if n not in beyond], stats, {})   # raises: crosses rows
    if len(views) != 1 or None in views or \
            not _row_map_ok(next(iter(views)), stat_shape, stat_axes, axes):
        raise RenderError(f"node {stats[0]!r}: a row statistic read into the main reductions "
                          f"through {len(views)} views, not one that maps whole rows "
                          f"({stat_shape} reduced over {stat_axes} into {shape} over {axes})")
    shapes = {tuple(n.shape) for n in crossing}
    if len(shapes) != 1 or not _reshaped_elementwise(mains, crossing, dep | beyond, shapes.pop(),
                                                     shape):
        raise RenderError(f"node {stats[0]!r}: the normalized input reaches the main reductions "
                          "through views other than one reshape into their operand shape")
    v = next(iter(views))
    return {r: v for r in stats}


def _reshaped_elementwise(mains: list[Node], crossing: list[Node], tainted: set, shape,
                          main_shape) -> bool:
    """Every main reduction reads (through a contiguous reshape, when ``shape`` is not the main
    ``main_shape``) a value of ``shape`` computed elementwise from the ``crossing`` views and from
    values that do not depend on the statistics (not ``tainted``): so its operand reads the
    normalized input through a crossing view (then the reshape), the view
    :func:`prologue_statistics` checks, and through no other."""
    cross = set(crossing)
    for r in mains:
        op = r.srcs[0]
        if shape != tuple(main_shape):
            if op.op != "View" or not op.arg.is_contiguous or tuple(op.srcs[0].shape) != shape:
                return False
            op = op.srcs[0]
        stack, seen = [op], set()
        while stack:
            n = stack.pop()
            if n in seen or n in cross:
                continue
            seen.add(n)
            if n.op == "View" or n.op in REDUCE or tuple(n.shape) != shape:
                if n in tainted:
                    return False
                continue
            stack.extend(n.srcs)
    return True



def plan_rows_of(nodes: list[Node], reduces: list[Node], outputs: dict[str, Node]) -> RowPlan:
    """:func:`plan_rows` over ``nodes`` (topological) for the given reductions only; any other
    reduction among ``nodes`` is treated as a free value (attention's ``tl.dot`` scores)."""
    is_red = set(reduces)
    r0 = reduces[0]
    shape, axes = tuple(r0.srcs[0].shape), tuple(sorted(r0.arg))
    for r in reduces[1:]:
        if tuple(r.srcs[0].shape) != shape or tuple(sorted(r.arg)) != axes:
            raise RenderError(f"node {r!r}: reductions of one row kernel must share operand shape "
                              f"and axes ({shape}, {axes}); got {r.srcs[0].shape}, {r.arg}")
    kept = tuple(k for k in range(len(shape)) if k not in axes)
    plan = RowPlan(shape, axes, kept, prod(shape[k] for k in kept), prod(shape[k] for k in axes),
                   reduces, {}, {})
    below: dict[Node, int] = {}              # deepest reduction level a node depends on (-1: none)
    for n in nodes:
        if n in is_red:
            lv = 1 + below[n.srcs[0]]
            plan.level[n] = lv
            below[n] = lv
            plan.kind[n] = "row"
            continue
        below[n] = max((below[s] for s in n.srcs), default=-1)
        deps = [s for s in n.srcs if s in plan.kind]
        if not deps:
            continue
        if n.op == "View":
            src = n.srcs[0]
            if plan.kind[src] == "row":
                if plan.is_row_broadcast(n.arg):
                    plan.kind[n] = "full"
                elif is_pure_reshape(n.arg, src.shape):
                    plan.kind[n] = "row"
                else:
                    raise RenderError(f"node {n!r}: a row value is read through a view that is "
                                      "not a broadcast over the reduced axes")
            elif is_pure_reshape(n.arg, src.shape):
                plan.kind[n] = "full"
            else:
                raise RenderError(f"node {n!r}: a view that moves elements across rows")
        elif n.op == "Gather":
            raise RenderError(f"node {n!r}: a gather of a reduced value inside a row kernel")
        else:
            plan.kind[n] = "full" if any(plan.kind[s] == "full" for s in deps) else "row"
    for r in reduces:
        src = r.srcs[0]
        if plan.kind.get(src) == "row" and plan.K != 1:
            raise RenderError(f"node {r!r}: reduces a row value")
    for name, o in outputs.items():
        k = plan.kind.get(o)
        if k is None:
            k = "row" if o.numel == plan.M and plan.K != 1 else "full"
        plan.outputs[name] = k
    return plan
