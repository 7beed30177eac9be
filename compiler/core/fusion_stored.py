"""Readers of a contraction's tile through a view, stored by the contraction's kernel.

A contraction whose result is read through a view that moves elements (a slice, a permutation, a
split of heads) cannot take that reader as an ordinary epilogue: the epilogue runs on the output
tile in the product's order (``render_matmul``). Greedily, the product is written and a pointwise
kernel reads it back through the view: three projections merged into one contraction by the
e-graph and returned as three outputs (``q + bq``, ``k + bk``, ``v + bv``, each over a column slice
of the merged product), or a key and value returned as a cache (``[B, S, H*D]`` stored as
``[B, H, S, D]``), each cost a launch and a re-read of the product.

Here such a reader joins the contraction's kernel when (:meth:`StoredReaders._stored_readers`):

* the kernel is a contraction's (not a paired one, not a form's), a normalization formed on load
  in it or not;
* the reader is a realized node whose own kernel would be pointwise, reading the product only
  through one unmasked view of the reader's shape that
  :func:`~lumc.backends.triton.indexing.store_order` can invert (each product position is read by
  at most one index; a prefix ``p[0:1]`` too, which the program then serves from the buffer the
  kernel writes, ``program.output_source``), or only in the product's own order (``relu(p)``
  beside a stored ``p.T``: an epilogue output); and its other inputs are already in memory when
  the contraction runs.

The contraction's kernel then finds, for each tile position, the reader's index that reads it
(``store_through``: the view's strides as mixed-radix digits), computes the reader there and stores
it (``render_matmul.stored_view``); positions the view does not read are masked off. The product
itself is written only when anything else reads it. Each reader so stored removes a launch and a
re-read of its share of the product. The refusal lines that kept the product and its readers
apart are dropped; what a reader is still written for (a model output) stays or is said, and a
product still written says why (``--why-not``).
"""
from __future__ import annotations

from lumc.ir.graph import Node
from lumc.ir.ops import ELEMENTWISE

from lumc.backends.triton.codegen import RenderError
from lumc.backends.triton.indexing import is_pure_reshape, store_order
from lumc.backends.triton.render_matmul import render_matmul
from lumc.compiler.core.kernel_builder import build_call

COPY_REFUSAL = "an output view that is not a free reshape is a copy"     # fusion._decide
STORED_KEPT = ("read by other kernels too: its readers through views, which put it in memory, "
               "are stored by its own kernel (fusion_stored)")


class StoredReaders:
    """Mixin of ``GreedyFusion`` (see the module docstring); uses its ``uses``, ``realized``,
    ``group``, ``refusals`` and the kernel-cutting state of ``program``; none in the unfused
    program (one kernel per op)."""

    def _stored_readers(self, n: Node, call, boundary, done: set[int], excluded,
                        rows: tuple = (), push_views: bool | None = None) -> tuple | None:
        """``(call, readers)``: the kernel of realized node ``n`` (``call``: a contraction, with
        the row values ``rows`` it writes, cut with ``push_views``) also storing the readers found
        (see the module docstring), ``n`` among its outputs only when anything else reads it;
        None when there is none, or when the kernel with them does not render."""
        if self.unfused or call.kernel.form != "matmul" or call.kernel.attr("paired"):
            return None
        take = []
        for m in self._view_readers(n):
            if id(m) in done or excluded(m):
                continue
            trial = build_call([m], lambda x: id(x) in self.realized and x is not m)
            if trial.kernel.form == "pointwise" and all(
                    x is n or id(x) in done or x.op in ("Input", "Constant")
                    for x in trial.inputs) and _one_storable_view(trial, n):
                take.append(m)
        if not take:
            return None
        taken = {id(m) for m in take}
        keep = id(n) in self.outputs or not all(self._feeds_only(u, n, taken, {})
                                                for u, _ in self.uses[id(n)])
        out = build_call(([n] if keep else []) + list(rows) + take, boundary,
                         push_views=push_views)
        if out.kernel.form != "matmul" or not _renders(out):
            return None
        self._restate_refusals(n, take, keep)
        return out, take

    def _restate_refusals(self, n: Node, take: list[Node], keep: bool) -> None:
        """The refusals that kept ``n`` and the readers ``take`` apart no longer hold: ``n`` is
        in their kernel, and an output view among them is no copy (still written: a model
        output). What a reader is written for still holds, and so does ``n``'s write where
        ``keep``: said as such when no other refusal says why (``--why-not`` reads these lines per
        written value)."""
        gone = tuple(f"no fusion %{n.id}:{n.op} -> %{m.id}:" for m in take)
        copies = {f"no fusion %{m.id}:{m.op}: {COPY_REFUSAL}" for m in take}
        self.refusals = [r.replace(COPY_REFUSAL, "model output") if r in copies else r
                         for r in self.refusals if not r.startswith(gone)]
        if keep and not any(r.startswith(f"no fusion %{n.id}:{n.op}") for r in self.refusals):
            self._refuse(n, None, "model output" if id(n) in self.outputs else STORED_KEPT)

    def _feeds_only(self, u: Node, n: Node, taken: set[int], memo: dict) -> bool:
        """Nothing ``u`` computes needs ``n`` but through the taken readers: ``u`` is one; or a
        kernel of its own (realized, not a form's or a row value) that reads a taken reader, not
        ``n`` (an output view stored by ``n``'s kernel, read back by a later kernel); or an
        inlined node (not realized, not an output) whose every reader is one of these."""
        if id(u) in taken:
            return True
        if id(u) not in memo:
            memo[id(u)] = False      # a cycle cannot occur; this only bounds the recursion
            if id(u) in self.realized:
                memo[id(u)] = id(u) not in self.group and id(u) not in self.row_owned and all(
                    x is not n for x in build_call(
                        [u], lambda x: id(x) in self.realized and x is not u).inputs)
            else:
                memo[id(u)] = (id(u) not in self.outputs and id(u) not in self.group
                               and u.op != "View"
                               and all(self._feeds_only(v, n, taken, memo)
                                       for v, _ in self.uses.get(id(u), [])))
        return memo[id(u)]

    def _view_readers(self, n: Node) -> list[Node]:
        """Realized nodes reading ``n`` through views and inlined elementwise nodes, in graph
        order (the candidates of :meth:`_stored_readers`)."""
        found, seen, stack = [], set(), [u for u, _ in self.uses.get(id(n), [])]
        while stack:
            u = stack.pop()
            if id(u) in seen:
                continue
            seen.add(id(u))
            if id(u) in self.realized:
                found.append(u)
            elif (u.op in ELEMENTWISE or u.op == "View") and id(u) not in self.group:
                stack.extend(v for v, _ in self.uses.get(id(u), []))
        return sorted(found, key=lambda x: self.pos[id(x)])


def _one_storable_view(trial, n: Node) -> bool:
    """The pointwise kernel ``trial`` reads ``n`` (its placeholder) only through views, all one
    view of the kernel's output shape that moves elements and can be inverted; or only in
    ``n``'s own order (directly or through reshapes, the output as many elements as ``n``: an
    epilogue output of the contraction, ``relu(p)`` beside a stored ``p.T``)."""
    k = next((i for i, x in enumerate(trial.inputs) if x is n), None)
    if k is None:
        return False
    ph = trial.kernel.meaning.inputs[f"in{k}"]
    users = [x for x in trial.kernel.meaning.nodes() if any(s is ph for s in x.srcs)]
    out = next(iter(trial.kernel.meaning.outputs.values()))
    if users and all(u.op != "View" or is_pure_reshape(u.arg, ph.shape) for u in users):
        return out.numel == ph.numel          # in the product's order
    if not users or any(u.op != "View" for u in users) or len({u.arg for u in users}) != 1:
        return False
    v = users[0].arg
    return (v.shape == out.shape and not is_pure_reshape(v, ph.shape)
            and store_order(v) is not None)


def _renders(call) -> bool:
    """The contraction kernel ``call`` renders (``render_matmul``: each output an epilogue in the
    product's order or a :func:`~lumc.backends.triton.render_matmul.stored_view`)."""
    try:
        render_matmul(call.kernel)
    except RenderError:
        return False
    return True
