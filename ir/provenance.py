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
    carry(n, out)
    return out


def carry(old: Node, new: Node) -> None:
    """What is recorded of ``old`` (its origin, its index scores) now holds for ``new``, which a
    pass built in its place (:func:`rebuilt`, ``lumc.ir.symbolic.Resizer``)."""
    if new is old:
        return
    o = _ORIGIN.get(old)
    if o is not None and new not in _ORIGIN:
        _ORIGIN[new] = o
    a = _ARG.get(old)
    if a is not None and new not in _ARG:
        _ARG[new] = a


# {an ArgMax/ArgMin index node: (the src positions leading from it to its float scores, axis,
# largest, keepdims)}: a path, not the node, so a pass that rebuilds the graph node for node
# (re-sizing a range's bucket) keeps it through :func:`carry`
_ARG: "weakref.WeakKeyDictionary[Node, tuple]" = weakref.WeakKeyDictionary()


def mark_arg_scores(index: Node, scores: Node, axis: int, largest: bool, keepdims: bool) -> None:
    """Record that ``index`` (built by ``lumc.ir.library.reduce.argmax``/``argmin``) picks along
    ``axis`` of ``scores``, for the quality gate to tell a near-tie from a wrong index."""
    paths, seen = [(index, ())], {id(index)}
    while paths:
        n, path = paths.pop(0)
        if n is scores:
            _ARG[index] = (path, axis, largest, keepdims)
            return
        for i, s in enumerate(n.srcs):
            if id(s) not in seen:
                seen.add(id(s))
                paths.append((s, path + (i,)))


def arg_scores(n: Node) -> tuple[Node, int, bool, bool] | None:
    """``(scores, axis, largest, keepdims)`` of an index node :func:`mark_arg_scores` recorded (or
    one rebuilt from it), ``axis`` non-negative, of ``scores``; None for every other node, or
    where a rebuild changed its structure."""
    rec = _ARG.get(n)
    if rec is None:
        return None
    path, axis, largest, keepdims = rec
    m = n
    for i in path:
        if i >= len(m.srcs):
            return None
        m = m.srcs[i]
    if not m.dtype.is_float or len(m.shape) != len(n.shape) + (0 if keepdims else 1) or \
            axis >= len(m.shape):
        return None
    return m, axis, largest, keepdims


def where(n: Node) -> dict:
    """Keyword arguments for a :class:`~lumc.ir.errors.LumcError` about ``n``: the model node and op
    that created it where known, else its primitive op."""
    o = _ORIGIN.get(n)
    if o is None:
        return {"op": n.op}
    return {"node": o[0], "op": o[1] if o[1] == n.op else f"{o[1]} (primitive {n.op})"}
