"""Constant folding before the e-graph: small input-independent values become constants.

Exporters compute index tensors from constants at run time: torch.export writes BERT's mask
preparation as ``where(arange < 0, arange + 128, arange)`` and a gather of the mask by it, two tiny
kernels before the first attention. Folded, the index is a constant; a gather of a 1-D table by
the constant ``arange(n)`` is the table itself (a reshape), so the mask reaches the attention
kernel as a view of the model input, and the attention form reads it in its prologue.

* An integer or boolean compute node over integer or boolean operands that a gather index is
  computed from (index arithmetic; every other constant expression is left to the e-graph's
  ``algebra`` folds, which keep the scalar spellings rules match), whose leaves are all constants
  (no ``Input``), and that has at most
  :data:`MAX_FOLD_ELEMS` elements is evaluated with the reference executor and replaced by a
  constant. Larger ones (a broadcast scalar expanded to a whole tensor) stay as they are: folding
  would only add bytes to read. A value whose elements are all the same (bit for bit) becomes a
  broadcast scalar, the spelling every rule matches.
* A compute node of iotas and scalars alone that a contraction, a reduction or a gather reads
  (through views), of at most :data:`MAX_OPERAND_ELEMS` elements (``eye(n)``, ``tril(ones)`` built
  from ``arange``, which import keeps as index expressions,
  ``lumc.compiler.frontends.onnx_frontend.folding``): no kernel forms it on load, so unfolded it
  would be a kernel of its own on every call. (A value of constant arrays, a weight dequantized
  from its stored form, stays: the contraction forms it on load, reading the narrow bytes.)
* A compute node with no elements (a softmax over ``[0, 5]``, the rows of a ``[3, 0]`` input) is
  an empty constant: a model whose outputs are all empty launches no kernel (it launched one per
  op, each over nothing).
* ``Gather(t, idx, 0)`` with ``t`` 1-D and a constant ``idx`` equal to ``arange(len(t))`` along its
  flattened order is ``reshape(t, idx.shape)``.
All are exact.
"""
from __future__ import annotations

import numpy as np

from lumc.backends.reference import ReferenceExecutor
from lumc.ir.graph import Graph, Node, const_node
from lumc.ir.symbolic import active_probes, held, held_values
from lumc.compiler.core.iota_facts import empty_at_zero, index_value, rebuild, used_probes
from lumc.ir.tensor import Tensor
from lumc.ir.provenance import rebuilt

MAX_FOLD_ELEMS = 1 << 16
MAX_OPERAND_ELEMS = 1 << 24      # a constant operand folded (64 MB of fp32), as import would have


def _identity_gather(table: Node, idx: np.ndarray) -> bool:
    return (len(table.shape) == 1 and idx.size == table.shape[0]
            and np.array_equal(idx.reshape(-1), np.arange(table.shape[0])))


def _folded(n: Node, val: np.ndarray) -> Node:
    """A constant for ``val``: a broadcast scalar when every element is the same (the spelling
    the rules match, ``lumc.rewrites.language``), else the whole array."""
    val = np.ascontiguousarray(val).astype(n.dtype.np, copy=False)
    flat = val.reshape(-1)
    if flat.size and (flat.view(np.uint8).reshape(flat.size, -1) == flat[:1].view(np.uint8)).all():
        scalar = Tensor(const_node(flat[0].copy()))
        return scalar.reshape((1,) * len(n.shape)).expand(n.shape).node if n.shape else scalar.node
    return const_node(val)


def fold_constants(graph: Graph, mapping: dict | None = None) -> Graph:
    """``graph`` with small constant sub-expressions folded and identity gathers removed (see the
    module docstring); the same graph object when nothing changes. ``mapping`` (if given) gets
    ``{id(node of graph): node of the result}``: the two hold the same value."""
    order = graph.nodes()
    index: set[int] = set()   # nodes a gather index is computed from
    stack = [n.srcs[1] for n in order if n.op == "Gather"]
    while stack:
        x = stack.pop()
        if id(x) not in index:
            index.add(id(x))
            stack.extend(x.srcs)
    # the value nodes (below views) a contraction, reduction or gather reads: a constant one is an
    # array to read, not work for a kernel that has no prologue for it (``eye(n) @ x``)
    operand: set[int] = set()
    for n in order:
        reads = (n.srcs[0].srcs if n.op == "SumReduce" and n.srcs[0].op == "Mul" else
                 n.srcs[:1] if n.op in ("SumReduce", "MaxReduce", "Gather") else ())
        for r in reads:
            while r.op == "View":
                r = r.srcs[0]
            operand.add(id(r))
    new: dict[int, Node] = {}
    constant: dict[int, bool] = {}
    # 2: computed from iotas (and scalars) alone; 1: scalars alone; 0: reads an array or an input
    # (a weight dequantized in a contraction's prologue stays there: only index values fold)
    iota_only: dict[int, int] = {}
    # at probe sizes: index values proved the same form at every size (iota_facts)
    probes = active_probes()
    facts: dict[int, tuple | None] = {}
    used: dict[int, frozenset] = {}      # the probes each fact was decided over
    changed = False
    for n in order:
        srcs = tuple(new[id(s)] for s in n.srcs)
        if probes:
            facts[id(n)] = index_value(n, [facts.get(id(s)) for s in n.srcs], probes)
            if facts[id(n)] is not None:
                used[id(n)] = used_probes(facts[id(n)], n.shape,
                                          [used.get(id(s), frozenset()) for s in n.srcs], probes)
        if n.op in ("Constant", "Iota"):
            constant[id(n)] = True
            iota_only[id(n)] = 2 if n.op == "Iota" else (1 if n.numel == 1 else 0)
            new[id(n)] = n
            continue
        if n.op == "Input":
            constant[id(n)] = False
            iota_only[id(n)] = 0
            new[id(n)] = n
            continue
        if n.numel == 0 and not held(n.shape):   # an empty value: no kernel computes anything
            constant[id(n)] = True
            iota_only[id(n)] = 0
            new[id(n)] = const_node(np.zeros(n.shape, n.dtype.np))
            changed = True
            continue
        is_const = all(constant[id(s)] for s in n.srcs)
        kinds = [iota_only[id(s)] for s in n.srcs]
        iota_only[id(n)] = 0 if not kinds or 0 in kinds else max(kinds)
        x = rebuilt(n, srcs)
        proved = (facts.get(id(n)) is not None and held(n.shape) and
                  n.op not in ("Iota", "Constant", "View", "Contiguous") and
                  empty_at_zero(n.shape, used[id(n)]))
        if proved and (r := rebuild(n, facts[id(n)], probes)) is not None:
            x = r
        elif is_const and id(n) in index and n.op != "View" and n.numel <= MAX_FOLD_ELEMS and not any(
                t.dtype.is_float for t in (n, *n.srcs)) and not held(n.shape) and \
                not held_values(v := ReferenceExecutor(Graph({}, {"v": x}))({})["v"]):
            x = _folded(x, v)
        elif iota_only[id(n)] == 2 and id(n) in operand and n.op not in ("View", "Contiguous") and \
                n.numel <= MAX_OPERAND_ELEMS and not held(n.shape) and \
                not held_values(v := ReferenceExecutor(Graph({}, {"v": x}))({})["v"]):
            x = _folded(x, v)
        elif n.op == "Gather" and int(n.arg) == 0 and srcs[1].op == "Constant" and \
                _identity_gather(srcs[0], srcs[1].arg.value):
            x = Tensor(srcs[0]).reshape(n.shape).node
        constant[id(n)] = is_const
        changed |= x is not n
        new[id(n)] = x
    if not changed:
        return graph
    if mapping is not None:
        mapping.update(new)
    return Graph(graph.inputs, {k: new[id(o)] for k, o in graph.outputs.items()})
