"""The immutable, hash-consed primitive graph.

Nodes are created only through :func:`node` (or the helpers below), which interns them: two requests
for the same op, operands and argument return the same object, so common subexpressions are shared
by construction (CSE). Nodes never change after creation; a :class:`Graph` names its inputs and
outputs and iterates its nodes in topological order.
"""
from __future__ import annotations

import hashlib
import itertools
import weakref
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from lumc.ir import dtypes as dt
from lumc.ir.errors import ShapeError
from lumc.ir.ops import OPS
from lumc.ir.views import View, prod

Shape = tuple[int, ...]


@dataclass(frozen=True)
class InputArg:
    """Arg of an ``Input`` leaf: its name, concrete shape and dtype."""
    name: str
    shape: Shape
    dtype: dt.DType


@dataclass(frozen=True)
class IotaArg:
    """Arg of an ``Iota`` leaf: the index along ``axis`` of a tensor of ``shape``."""
    shape: Shape
    axis: int
    dtype: dt.DType


class ConstArg:
    """Arg of a ``Constant`` leaf: an immutable numpy array, hashed by content."""
    __slots__ = ("value", "digest", "shape", "dtype")

    def __init__(self, value: np.ndarray):
        value = np.asarray(value, order="C")
        value.setflags(write=False)
        self.value = value
        self.dtype = dt.from_numpy(value.dtype)
        self.shape = tuple(value.shape)
        h = hashlib.blake2b(digest_size=16)
        h.update(repr((self.dtype.name, self.shape)).encode())
        if value.size:     # the bytes in place (C order): tobytes copied every weight once more
            h.update(value.reshape(-1).view(np.uint8).data)
        self.digest = h.hexdigest()

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other) -> bool:
        return isinstance(other, ConstArg) and self.digest == other.digest

    def __repr__(self) -> str:
        if self.value.size <= 4:
            return f"{self.value.tolist()!r}"
        return f"<{self.dtype}{list(self.shape)} #{self.digest[:8]}>"


_ids = itertools.count()
_INTERN: "weakref.WeakValueDictionary[tuple, Node]" = weakref.WeakValueDictionary()


class Node:
    """One primitive op application. Immutable; create with :func:`node`.

    Attributes:
        op: name of a row of ``lumc.ir.ops.OPS``.
        srcs: operand nodes.
        arg: op argument (axes, dtype, view, leaf arg...), hashable.
        dtype: result dtype, from the op's dtype rule.
        shape: result shape (concrete ints), from the op's shape rule.
        id: creation order; stable within a process, used in dumps.
    """
    __slots__ = ("op", "srcs", "arg", "dtype", "shape", "id", "_key", "__weakref__")

    op: str
    srcs: tuple["Node", ...]
    arg: Any
    dtype: dt.DType
    shape: Shape

    def __setattr__(self, k, v):
        raise AttributeError("Node is immutable")

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"%{self.id}:{self.op}{list(self.shape)}{self.dtype}"


def node(op: str, srcs: tuple[Node, ...] | list[Node] = (), arg: Any = None) -> Node:
    """Create (or find) the node ``op(srcs; arg)``.

    Raises:
        ShapeError: when the op's dtype or shape rule rejects the operands; the message names the op.
        KeyError: for an op that is not in the table.
    """
    row = OPS[op]
    srcs = tuple(srcs)
    if len(srcs) != row.arity:
        raise ShapeError(f"expects {row.arity} operands, got {len(srcs)}", op=op)
    key = (op, tuple(id(s) for s in srcs), arg)
    found = _INTERN.get(key)
    if found is not None:
        return found
    try:
        dtype = row.dtype_rule(tuple(s.dtype for s in srcs), arg)
        shape = tuple(int(d) for d in row.shape_rule(tuple(s.shape for s in srcs), arg))
    except ShapeError as e:
        raise ShapeError(e.reason, op=op, node=e.node) from None
    if any(d < 0 for d in shape):
        raise ShapeError(f"negative dim in {shape}", op=op)
    n = object.__new__(Node)
    for k, v in (("op", op), ("srcs", srcs), ("arg", arg), ("dtype", dtype), ("shape", shape),
                 ("id", next(_ids)), ("_key", key)):
        object.__setattr__(n, k, v)
    _INTERN[key] = n
    return n


def input_node(name: str, shape: Shape, dtype: dt.DType) -> Node:
    return node("Input", (), InputArg(name, tuple(int(d) for d in shape), dtype))


def const_node(value) -> Node:
    return node("Constant", (), ConstArg(np.asarray(value)))


def iota_node(shape: Shape, axis: int, dtype: dt.DType = dt.i64) -> Node:
    return node("Iota", (), IotaArg(tuple(int(d) for d in shape), axis, dtype))


def view_node(src: Node, fn) -> Node:
    """Apply a view transformation ``fn: View -> View | None`` to ``src``.

    Composes with an existing view on ``src`` when possible (one view node), else stacks a new view
    over ``src``. A view that reads ``src`` unchanged returns ``src`` itself.
    """
    if src.op == "View":
        merged = fn(src.arg)
        if merged is not None:
            base = src.srcs[0]
            return base if merged.is_identity_of(base.shape) else node("View", (base,), merged)
    v = fn(View.contiguous(src.shape))
    assert v is not None, "a view of a contiguous tensor is always expressible"
    return src if v.is_identity_of(src.shape) else node("View", (src,), v)


def toposort(roots, stop=()) -> list[Node]:
    """Every node reachable from ``roots``, operands before users (iterative; deep graphs are fine).
    A node in ``stop`` (a collection of nodes) is listed but its operands are not followed."""
    stop_ids = {id(x) for x in stop}
    order, seen = [], set()
    for root in roots:
        if id(root) in seen:
            continue
        stack = [(root, False)]
        while stack:
            n, done = stack.pop()
            if done:
                order.append(n)
                continue
            if id(n) in seen:
                continue
            seen.add(id(n))
            stack.append((n, True))
            if id(n) in stop_ids:
                continue
            for s in reversed(n.srcs):
                if id(s) not in seen:
                    stack.append((s, False))
    return order


class Graph:
    """A primitive graph: named inputs, named outputs, and the nodes between them.

    Attributes:
        inputs: ``{name: Input node}`` in model order.
        outputs: ``{name: node}`` in model order.
    """

    def __init__(self, inputs: dict[str, Node], outputs: dict[str, Node]):
        self.inputs = dict(inputs)
        self.outputs = dict(outputs)
        self._order: tuple[tuple, list[Node]] | None = None

    def nodes(self) -> list[Node]:
        """All nodes in topological order (a new list; the order is computed once per set of
        outputs: nodes are immutable, so it only changes when ``outputs`` does)."""
        roots = list(self.outputs.values())
        key = tuple(id(o) for o in roots)
        if self._order is None or self._order[0] != key:
            self._order = (key, toposort(roots))
        return list(self._order[1])

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes())

    def __len__(self) -> int:
        return len(self.nodes())

    def users(self) -> dict[int, list[Node]]:
        """``{id(node): [users]}`` for every node."""
        out: dict[int, list[Node]] = {}
        for n in self.nodes():
            for s in n.srcs:
                out.setdefault(id(s), []).append(n)
        return out

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes():
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    def dump(self) -> str:
        """A readable text form: one line per node, ``%id = Op(%a, %b; arg) : dtype[shape]``."""
        names = {id(n): k for k, n in self.outputs.items()}
        lines = []
        for n in self.nodes():
            args = ", ".join(f"%{s.id}" for s in n.srcs)
            a = _fmt_arg(n)
            if a:
                args = f"{args}; {a}" if args else a
            out = f"  -> {names[id(n)]}" if id(n) in names else ""
            lines.append(f"%{n.id} = {n.op}({args}) : {n.dtype}{list(n.shape)}{out}")
        return "\n".join(lines)


def _fmt_arg(n: Node) -> str:
    a = n.arg
    if a is None:
        return ""
    if isinstance(a, InputArg):
        return repr(a.name)
    if isinstance(a, View):
        s = f"strides={list(a.strides)}"
        if a.offset:
            s += f" offset={a.offset}"
        if a.mask is not None:
            s += f" mask={[list(m) for m in a.mask]}"
        return s
    if isinstance(a, IotaArg):
        return f"axis={a.axis}"
    return repr(a)
