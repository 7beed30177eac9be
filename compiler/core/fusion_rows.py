"""Row groups: a chain of reductions over the same rows, and the values that read them back over
those rows, in one row kernel (the part of greedy fusion, ``lumc.compiler.core.fusion``, that
decides them).

Greedy fusion cuts a kernel at every reduction whose result is read back through a broadcast
(``x - max(x)``): LogSoftmax is three kernels, an L2 normalization ``x / sqrt(sum(x * x))`` two, a
layer norm no e-graph rule spells three, where one row kernel (``lumc.backends.triton.rowplan``:
reductions of one operand shape ``S`` and axes, by levels, looped per level when a row does not fit
in registers) reads the rows once and writes only the results. A *row group* is claimed here, the
way a form's inside is (``GreedyFusion._form_groups``), from the model's primitives alone:

* a *seed*: a ``SumReduce``/``MaxReduce`` outside any form, not a tensor-core contraction, with
  at least one row of at least one element (rows of one element make an elementwise kernel);
* grown forward (:meth:`RowFusion._row_edge`) through its readers: elementwise ops of one value per
  row (``M`` values, read through free reshapes), elementwise ops of one value per element of ``S``
  (``M x K``, reading row values through a broadcast back over the reduced axes, full values
  through free reshapes), and further reductions of the same operand shape and axes; a reader
  outside these (a contraction, a gather, another shape) reads what the kernel writes;
* seeds whose groups meet (a layer norm spelled ``E[x^2] - E[x]^2``: two sums, one reader) are one
  group; a group must read at least one row value back over its rows, or hold two reductions
  (rows of one element need no broadcast): else it is a reduction with an epilogue, which greedy
  fusion already makes one kernel;
* accepted when the kernel it would be plans as rows (``plan_rows`` of the kernel cut at the
  group's edge: every output one value per row or per element) and no value leaves the group and
  is read back in it, directly or through a kernel claimed before it (a form, another row group:
  the kernels would wait on each other).

Members read outside the group (a row statistic that is also a model output) are written by the
group's kernel as more outputs (``row_outputs``), which the launch order (:func:`launch_order`)
places before their readers.

Whether one kernel is faster is the search's to judge: a looped kernel reads its rows once per
reduction level (``lumc.backends.simulator`` prices each pass), the kernels it replaces write and
read back only row values. So the decision is a flag, ``rows``: without it the groups are noted
(:data:`ROWS_REFUSAL`), which makes ``egraph_pipeline`` decode the ``+rows`` twin of the candidate,
and the search times both.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from lumc.ir.graph import Node
from lumc.ir.ops import ELEMENTWISE, REDUCE
from lumc.ir.movement import compose_views
from lumc.ir.views import prod

from lumc.backends.triton.codegen import RenderError
from lumc.backends.triton.contraction import as_contraction_squeezed, is_tensor_core
from lumc.backends.triton.rowplan import RowPlan, plan_rows
from lumc.compiler.core.kernel_builder import build_call

# the note a fusion without ``rows`` leaves on each row value a row group would keep on chip
ROWS_REFUSAL = ("a row value read back over its rows: one row kernel computes it with its readers "
                "(the +rows candidate)")
# the note where a group is found but cannot be one row kernel (the reason follows)
ROWS_UNPLANNED = "no row kernel for this row value and its readers: "


@dataclass
class RowGroup:
    """One row group: its key (operand shape, reduced axes), members by id, and the row values
    read back through a broadcast (``bcast``)."""
    key: tuple
    members: dict = field(default_factory=dict)
    bcast: list = field(default_factory=list)


def _row_key(r: Node) -> tuple | None:
    """``(S, axes, M, K)`` of a seed reduction ``r``, or None when it seeds no row group (a
    tensor-core contraction, no rows or empty rows)."""
    c = as_contraction_squeezed(r)
    if c is not None and is_tensor_core(c):
        return None
    shape, axes = tuple(r.srcs[0].shape), tuple(sorted(r.arg))
    k = prod(shape[a] for a in axes)
    if k == 0 or prod(shape) == 0:
        return None
    return shape, axes, prod(shape) // k, k


class RowFusion:
    """Row-group decisions for :class:`~lumc.compiler.core.fusion.GreedyFusion` (module
    docstring). State: ``row_groups`` (``{id(root): member ids}``; the root is the member last in
    topological order, the kernel's first output)."""

    def _row_groups(self) -> None:
        """Find the row groups; with ``rows`` claim them (``group``), else note them."""
        self.row_groups: dict[int, set[int]] = {}
        # {id(member): id(root)} of the groups accepted so far, claimed or (without ``rows``)
        # noted: a later group that would wait on one is refused alike in both programs
        self._row_owner: dict[int, int] = {}
        for g in self._find_row_groups():
            # a row value read back over its rows, or (rows of one element, where that needs no
            # broadcast) a reduction reading another: else greedy fusion already makes it one
            if not g.bcast and sum(n.op in REDUCE for n in g.members.values()) < 2:
                continue
            root = max(g.members.values(), key=lambda n: self.pos[id(n)])
            self.row_groups_found.append(frozenset(n.id for n in g.members.values()))
            why = self._row_refusal(g, root)
            srcs = list({id(d): d for d in g.bcast}.values()) or [
                n for n in g.members.values() if n.op in REDUCE]
            if why is not None:
                for d in srcs:
                    self._refuse(d, None, ROWS_UNPLANNED + why)
                continue
            self._row_owner.update((k, id(root)) for k in g.members)
            if not self.rows:
                for d in srcs:
                    self._refuse(d, None, ROWS_REFUSAL)
                continue
            self.row_groups[id(root)] = set(g.members)
            for k in g.members:
                self.group[k] = id(root)

    def _find_row_groups(self) -> list[RowGroup]:
        """Row groups grown from each seed in topological order; a group that reaches a node of
        an earlier group of the same key joins it (module docstring)."""
        owner: dict[int, int] = {}
        groups: list[RowGroup | None] = []
        for r in self.order:
            if r.op not in REDUCE or id(r) in self.group or id(r) in owner:
                continue
            key = _row_key(r)
            if key is None:
                continue
            g, meets, stack = RowGroup(key, {id(r): r}), set(), [r]
            while stack:
                d = stack.pop()
                for u, views in self.uses.get(id(d), []):
                    if id(u) in g.members:
                        continue
                    edge = self._row_edge(d, u, views, key)
                    if edge is None:
                        continue
                    o = owner.get(id(u))
                    if o is not None and groups[o].key != key:
                        continue
                    if edge == "bcast":
                        g.bcast.append(d)
                    if o is not None:
                        meets.add(o)
                        continue
                    g.members[id(u)] = u
                    stack.append(u)
            if not meets:
                gid = len(groups)
                groups.append(g)
            else:                   # g and the earlier groups it reached are one
                gid = min(meets)
                for src in [g] + [groups[o] for o in sorted(meets) if o != gid]:
                    groups[gid].members.update(src.members)
                    groups[gid].bcast += src.bcast
                for o in meets - {gid}:
                    groups[o] = None
            for k in groups[gid].members:
                owner[k] = gid
        return [g for g in groups if g is not None]

    def _row_edge(self, d: Node, u: Node, views: list, key: tuple) -> str | None:
        """How ``u`` may read group member ``d`` through ``views`` inside one row kernel of
        ``key``: ``"same"`` (a free reshape of a row or full value), ``"bcast"`` (a row value
        broadcast back over the reduced axes), or None (``u`` stays outside the group)."""
        shape, axes, m, k = key
        if id(u) in self.group or u.op == "View":
            return None
        if u.op in REDUCE:
            if (tuple(u.srcs[0].shape), tuple(sorted(u.arg))) != (shape, axes):
                return None
            c = as_contraction_squeezed(u)
            if c is not None and is_tensor_core(c):
                return None
        elif u.op not in ELEMENTWISE or u.numel not in (m, m * k):
            return None
        full = u.numel == m * k if u.op not in REDUCE else True
        v = compose_views(views) if views and d.numel == m and full else None
        if v is not None and tuple(v.shape) == shape:   # a row value read back over its rows
            kept = tuple(j for j in range(len(shape)) if j not in axes)
            if RowPlan(shape, axes, kept, m, k, [], {}, {}).is_row_broadcast(v):
                return "bcast"
        # else a value per element (or per row) read as it is (rows of one element, K = 1, are
        # both: their kernel is elementwise, ``render_row``)
        same = d.numel == m * k if u.op in REDUCE else d.numel == u.numel
        return "same" if same and self._free_reshape(views) else None

    def _row_outputs_of(self, members: dict, root: Node) -> list[Node]:
        """The root, then the members read outside the group (or model outputs), in order."""
        out = [root]
        for n in sorted(members.values(), key=lambda n: self.pos[id(n)]):
            if n is not root and (id(n) in self.outputs or any(
                    id(u) not in members for u, _ in self.uses[id(n)])):
                out.append(n)
        return out

    def _row_refusal(self, g: RowGroup, root: Node) -> str | None:
        """Why group ``g`` cannot be one row kernel, or None: a value that leaves the group and
        is read back in it (also through a kernel claimed before: a form, an earlier row group),
        or a kernel ``plan_rows`` refuses (module docstring)."""
        outs = self._row_outputs_of(g.members, root)
        # kernels claimed so far (forms, earlier row groups): a value that reaches one member
        # reaches the whole kernel, so the readers of all its members come after it too (two
        # groups that each read the other's written value wait on each other with no path
        # between the nodes); past the last node of any of them, nothing leads back
        owner = {**self.group, **self._row_owner}
        kernels: dict[int, list[Node]] = {}
        for k, gid in owner.items():
            kernels.setdefault(gid, []).append(self.byid[k])
        limit = max([self.pos[id(root)]] + [self.pos[id(n)] for ms in kernels.values()
                                              for n in ms])
        # readers seen through views (a view is a read, not a value leaving the kernel)
        stack = [u for n in outs for u, _ in self.uses[id(n)] if id(u) not in g.members]
        seen: set[int] = set()
        while stack:
            x = stack.pop()
            if id(x) in seen or self.pos.get(id(x), limit + 1) > limit:
                continue
            seen.add(id(x))
            if id(x) in g.members:
                return f"%{x.id} reads it back through a value computed outside the kernel"
            stack.extend(u for u, _ in self.uses.get(id(x), []))
            stack.extend(kernels.pop(owner.get(id(x)), []))
        members = g.members
        try:
            call = build_call(outs, lambda x: x.op not in ("View", "Constant", "Iota")
                              and id(x) not in members, push_views=False)
            plan = plan_rows(call.kernel)
        except RenderError as e:
            return str(e)
        _, _, m, k = g.key
        if call.kernel.form != "reduction" or plan is None:
            return f"it plans as a {call.kernel.form} kernel"
        for o in call.kernel.meaning.outputs.values():
            if o.numel not in (m, m * k):
                return f"an output of shape {o.shape} is neither per row nor per element"
        return None

    def _row_writes(self) -> None:
        """After the walk: each group's members read outside it are written by its kernel
        (``row_outputs`` of its root, ``row_owned``)."""
        for rid, ids in self.row_groups.items():
            members = {k: self.byid[k] for k in ids}
            for n in self._row_outputs_of(members, self.byid[rid])[1:]:
                self._realize(n, None, "read outside its row kernel, which writes it too")
            extra = sorted((self.byid[k] for k in ids if k != rid and k in self.realized),
                           key=lambda n: self.pos[id(n)])
            if extra:
                self.row_outputs.setdefault(rid, []).extend(extra)
                self.row_owned.update(id(n) for n in extra)


def launch_order(calls: list) -> list:
    """``calls`` in an order where each runs after the calls that write its inputs, the given
    order kept wherever it already is one (a row group's kernel may write a row value that a
    kernel cut earlier in node order reads).

    Raises:
        ValueError: the kernels read each other's outputs in a cycle.
    """
    import networkx as nx
    writer = {id(n): i for i, c in enumerate(calls) for n in c.outputs}
    deps = [{writer[id(n)] for n in c.inputs if id(n) in writer} - {i}
            for i, c in enumerate(calls)]
    if all(j < i for i, d in enumerate(deps) for j in d):
        return calls
    g = nx.DiGraph()
    g.add_nodes_from(range(len(calls)))
    g.add_edges_from((j, i) for i, d in enumerate(deps) for j in d)
    try:     # Kahn's order, the smallest ready index first: the given order where it is one
        return [calls[i] for i in nx.lexicographical_topological_sort(g)]
    except nx.NetworkXUnfeasible:
        raise ValueError("kernels read each other's outputs in a cycle (row groups)") from None
