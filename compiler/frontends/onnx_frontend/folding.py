"""Import-time constant folding.

Any tensor the importer builds that does not depend on a graph input is known at import time. It is
evaluated by the reference executor (the same numpy semantics the compiled model is checked
against) and replaced by a ``Constant``, so shape subgraphs (``Shape -> Gather -> Concat ->
Reshape``...) collapse and the shapes they compute become plain ints for the handlers downstream.

Leaves and views of constant leaves stay as they are (a ``ConstantOfShape`` is one scalar plus a
broadcast view); they are evaluated only when a handler asks for their value.

An *index expression* stays as it is too: arithmetic, compares, selects, casts and views over
``Iota`` and scalar constants only (``arange(L)[:, None] >= arange(S)``, a causal mask;
``arange(n) * 2 + 1``; not ``sin``, ``exp`` or ``log`` of positions, which fold). A kernel
computes it from its indices for free, where a folded constant is an array to store in the artifact
and read on every call, and folding hides the structure downstream stages look for: the attention
form's mask evaluation sees an index expression as the causal triangle (SDPA runs it with
``is_causal``, FlashAttention skipping the masked key blocks), a folded mask as an opaque input.
Handlers still get its value through :meth:`ConstantFolder.value`; the e-graph's constant folding
(``lumc.compiler.core.constfold``) still folds the ones a gather index is computed from, and those
a contraction, reduction or gather reads (``eye(n) @ x``), which no kernel forms on load.
"""
from __future__ import annotations

import os

import numpy as np

from lumc.backends.reference import ReferenceExecutor
from lumc.ir.errors import ModelError
from lumc.ir.graph import Graph, Node, const_node
from lumc.ir.provenance import rebuilt
from lumc.ir.symbolic import held, held_values
from lumc.ir.tensor import Tensor

_LAZY_LEAVES = ("Constant", "Iota")
# what an index expression may compute: integer-like arithmetic, compares, selects (a kernel does
# them for free); a transcendental (sin/exp/log of positions: a RoPE table) is cheaper read
_INDEX_OPS = frozenset({"View", "Add", "Mul", "Mod", "Div", "LessThan", "Where", "Cast"})


def _machine_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _check_fold_size(n: Node, evaluated) -> None:
    """Refuse to evaluate a constant whose computation reads or writes a value larger than this
    machine's memory: a ``ConstantOfShape`` of [1e8, 1e8] is one scalar broadcast, and a
    ``ReduceSum`` of it ran numpy over 1e16 elements for hours, past the budget and deaf to
    SIGINT and SIGTERM (numpy's loop never returns to Python). The walk counts an ``evaluated``
    node (a held value, which a broadcast may hold cheaply at any size) but does not go past it,
    so folding a chain does not walk it again for each node.

    Raises:
        ModelError: naming the shape, dtype and bytes of the largest such value.
    """
    mem = _machine_bytes()
    if mem is None:
        return
    big, seen, stack = None, set(), [n]
    while stack:
        m = stack.pop()
        if id(m) in seen or m.op == "Constant":
            continue
        seen.add(id(m))
        if big is None or m.numel * m.dtype.np.itemsize > big.numel * big.dtype.np.itemsize:
            big = m
        if m not in evaluated:   # a held value (a cheap broadcast view, too) is read at its size
            stack.extend(m.srcs)
    need = big.numel * big.dtype.np.itemsize if big is not None else 0
    if need > mem:
        raise ModelError(f"a constant computed from a value of shape {list(big.shape)} "
                         f"({big.dtype.np}, {need / 1e9:.3g} GB) is too large to evaluate on "
                         f"this machine ({mem / 1e9:.3g} GB of memory)")


class ConstantFolder:
    """Decides which tensors are constant and evaluates them (memoized per node)."""

    def __init__(self):
        self._dynamic: dict[Node, bool] = {}
        self._index: dict[Node, int] = {}
        self._values: dict[Node, np.ndarray] = {}

    def is_dynamic(self, n: Node) -> bool:
        """Whether ``n`` depends on an ``Input`` leaf."""
        memo = self._dynamic
        if n in memo:
            return memo[n]
        # iterative post-order walk that stops at nodes already decided
        stack = [(n, False)]
        while stack:
            m, ready = stack.pop()
            if m in memo:
                continue
            if ready:
                memo[m] = m.op == "Input" or any(memo[s] for s in m.srcs)
                continue
            stack.append((m, True))
            stack.extend((s, False) for s in m.srcs if s not in memo)
        return memo[n]

    def _scalar_operands(self, n: Node) -> Node:
        """``n`` over its operands with each one-valued constant operand as a broadcast scalar
        (a size read from a ``Shape``, ``[2, 61][1]``: a view of the whole shape array, which no
        re-size reads as the size it holds)."""
        srcs = []
        for x in n.srcs:
            # a view of a constant leaf only: its value is a cheap read
            xv = self.value(Tensor(x)) if x.op == "View" and x.srcs[0].op == "Constant" else None
            if xv is not None and xv.size and (xv == xv.flat[0]).all():
                one = Tensor(const_node(np.asarray(xv.flat[0], dtype=xv.dtype)))
                x = one.reshape((1,) * len(x.shape)).expand(x.shape).node if x.shape else one.node
                self._dynamic[x] = False
            srcs.append(x)
        return rebuilt(n, srcs)

    def is_index_expression(self, n: Node) -> bool:
        """Whether ``n`` is ``_INDEX_OPS`` over ``Iota`` leaves and scalar constants only, with at
        least one ``Iota`` (see the module docstring)."""
        # 0: something else; 1: scalar constants only (broadcast or not); 2: an index expression
        memo = self._index
        stack = [(n, False)]
        while stack:
            m, ready = stack.pop()
            if m in memo:
                continue
            if m.op == "Iota":
                memo[m] = 2
            elif m.op == "Constant":
                memo[m] = 1 if m.numel == 1 else 0
            elif m.op not in _INDEX_OPS:
                memo[m] = 0
            elif ready:
                kinds = [memo[s] for s in m.srcs]
                memo[m] = 0 if 0 in kinds else max(kinds)
            else:
                stack.append((m, True))
                stack.extend((s, False) for s in m.srcs if s not in memo)
        return memo[n] == 2

    def input_names(self, n: Node) -> list[str]:
        """Names of the graph inputs ``n`` depends on, in first-seen order."""
        names, seen, stack = [], set(), [n]
        while stack:
            m = stack.pop()
            if id(m) in seen or not self.is_dynamic(m):
                continue
            seen.add(id(m))
            if m.op == "Input":
                names.append(m.arg.name)
            stack.extend(m.srcs)
        return names

    def value(self, t: Tensor) -> np.ndarray | None:
        """The value of ``t`` if it is constant, else None."""
        n = t.node
        if n.op == "Constant":
            return n.arg.value
        if self.is_dynamic(n):
            return None
        v = self._values.get(n)
        if v is None:
            _check_fold_size(n, self._values)
            v = ReferenceExecutor(Graph({}, {"v": n}))({})["v"]
            self._values[n] = v
        return v

    def fold(self, t: Tensor) -> Tensor:
        """``t`` itself, or a ``Constant`` with its value when it is constant and not a lazy leaf."""
        n = t.node
        if n.op in _LAZY_LEAVES or self.is_dynamic(n):
            return t
        if n.op == "View" and n.srcs[0].op in _LAZY_LEAVES:
            return t
        if held(n.shape):      # its size is a probed dynamic dim: kept as a computation
            return Tensor(self._scalar_operands(n))
        if self.is_index_expression(n):
            return t
        v = self.value(t)
        if held_values(v):     # sizes of a probed dim (a batch's row offsets, iota(B) * L)
            return Tensor(self._scalar_operands(n))
        folded = Tensor(const_node(v))
        self._dynamic[folded.node] = False
        return folded
