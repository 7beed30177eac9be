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
"""
from __future__ import annotations

from dataclasses import dataclass, field

from lumc.ir.graph import Node
from lumc.ir.kernels import Kernel
from lumc.ir.ops import REDUCE
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
    return plan_rows_of(nodes, reduces, kernel.meaning.outputs)


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
