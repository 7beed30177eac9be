"""Where a primitive node came from: the model node (ONNX node name and op type, or FX node name and
ATen op) whose lowering created it.

Primitive nodes are hash-consed and carry no model names (a name in the node would split equal
sub-graphs and change kernel content hashes). The frontends record each model node's new
primitive nodes here instead, in a table keyed weakly by node, so a run-time error found at a
primitive (a ``Gather`` index outside its table, an integer ``Mod`` by zero) names the model node a
user can find in Netron or in ``print(exported.graph)``:
``node 'embed_lookup', op Gather: gather index 12 out of range [0, 10)``.

Passes that rebuild a node with new operands keep its origin by building it with
:func:`rebuilt`. A node whose origin is not known (built by a rewrite) is reported by its
primitive op, as before.
"""
from __future__ import annotations

import weakref
from typing import Iterable

from lumc.ir.graph import Node, node

# {primitive node: (model node name, model op type)}
_ORIGIN: "weakref.WeakKeyDictionary[Node, tuple[str, str]]" = weakref.WeakKeyDictionary()
_LEAVES = ("Input", "Constant", "Iota")
# the primitives a run can refuse at: an index outside its table, an integer Mod by zero
RUNTIME_CHECKED = ("Gather", "Mod")


def record(outputs: Iterable[Node], stop: Iterable[Node], name: str, op: str) -> None:
    """Mark the nodes that produce ``outputs`` and were not there before as created by the model
    node ``name`` (op type ``op``): every node reachable from ``outputs`` without passing through
    ``stop`` (the model node's operands) or a node that already has an origin. Leaves (inputs,
    constants, iotas) get none: they belong to no one node. Cost: the new nodes only."""
    stop_ids = {id(s) for s in stop}
    todo = [o for o in outputs if o is not None]
    while todo:
        n = todo.pop()
        if id(n) in stop_ids or n.op in _LEAVES or n in _ORIGIN:
            continue
        _ORIGIN[n] = (name, op)
        todo.extend(n.srcs)


def set_origin(n: Node, name: str, op: str) -> None:
    """Mark ``n`` alone as created by the model node ``name`` (op type ``op``): a loaded
    artifact's recorded origins (:mod:`lumc.ir.serialize`)."""
    _ORIGIN[n] = (name, op)


def origin(n: Node) -> tuple[str, str] | None:
    """``(model node name, model op type)`` of the model node that created ``n``, or None."""
    return _ORIGIN.get(n)


def rebuilt(n: Node, srcs) -> Node:
    """``n``'s op and argument over new operands ``srcs``, keeping its origin (``n`` itself when
    the operands are the same nodes)."""
    srcs = tuple(srcs)
    if len(srcs) == len(n.srcs) and all(a is b for a, b in zip(srcs, n.srcs)):
        return n
    out = node(n.op, srcs, n.arg)
    o = _ORIGIN.get(n)
    if o is not None and out not in _ORIGIN:
        _ORIGIN[out] = o
    return out


def where(n: Node) -> dict:
    """Keyword arguments for a :class:`~lumc.ir.errors.LumcError` about ``n``: the model node and op
    that created it where known, else its primitive op."""
    o = _ORIGIN.get(n)
    if o is None:
        return {"op": n.op}
    return {"node": o[0], "op": o[1] if o[1] == n.op else f"{o[1]} (primitive {n.op})"}
