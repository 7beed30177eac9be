"""Greedy fusion: a kernel list for any primitive graph, without the e-graph.

This is the ``--no-egraph`` baseline and the fallback that gives every model a program. It decides
which nodes are *realized* (written to memory by a kernel) and fuses everything else into the kernel
that reads it:

* A ``View`` is never a kernel: it is folded into the reads of its consumer. ``Contiguous`` is a copy
  kernel.
* Elementwise ops and ``Gather`` are inlined into their consumers (pointwise chains fuse; a reduction
  takes them as its prologue). One with several consumers is recomputed in each when that reads no
  more than one large buffer and is short, else realized.
* A reduction (``SumReduce``/``MaxReduce``) starts a kernel; ``SumReduce(Mul(views))`` contractions
  are matmul kernels. Elementwise ops over the reduction's result (same shape, sole consumer) fuse
  as its epilogue. A result read through a view (a broadcast back) is realized.
* Contraction operands must be buffers or cheap single-read prologues (a cast, a scale): recomputing
  a longer chain once per output column would cost more than storing it. A *weight prologue* is the
  exception: an expression of constants alone (a weight stored quantized, its scales, a decode
  table: ``compiler/core/weight_quant.py``) that feeds only contraction operands is fused up to
  :data:`MAX_WEIGHT_PROLOGUE_OPS` ops, gathers included; realizing it would write the full-precision
  weight to memory, the bytes its narrow storage saves.
* A layer norm or RMSNorm form (from the e-graph) read only as contractions' left operands is
  formed on load in them (``norm_prologue``, pre-LN); with ``norm_epilogue`` also where it is read
  by an elementwise op of a contraction's epilogue (post-LN: the residual), decided after every
  kernel's epilogue is known. The first kernel that forms it writes its row values for the others
  (``lumc.compiler.core.fusion_norms``). A norm read inside another norm's kernel (a sandwich
  norm's ``x + N(s)`` under the next pre-norm and post-norm) is formed on load there too, one deep.
* An elementwise value read through a pad (a concatenation's part: RoPE's ``-x2``) by an
  elementwise reader is computed there, zero outside the view's box.
* An attention form's query operand may be any elementwise expression (RoPE): the kernel loads the
  query tile once. Its keys' and values' expressions only with ``kv_prologue`` (recomputed per query
  block; the ``+kv-prologue`` candidates).
* With ``attention`` (the ``+attention`` candidates), a softmax form between a score contraction
  (through an elementwise score function no attention rule spells: Gemma-2's soft cap) and the
  value contraction is assembled into one attention form (``lumc.compiler.core.fusion_attention``).
* Two contractions of one left operand whose epilogues meet (a gated MLP's ``silu(g) * u``) are one
  *paired* matmul kernel with two accumulators (``fusion_chain``, :meth:`ChainFusion._pairs`).
* A realized pointwise reader of a contraction's tile through a view that moves elements (a
  column slice of merged projections, a key cache's split of heads) is computed and stored by the
  contraction's kernel through the view (``lumc.compiler.core.fusion_stored``).
* Independent pointwise kernels of one element count, close in launch order, are one kernel with
  several outputs (horizontal fusion: a decoding step's key and value cache concatenations), when
  every input of the later one is written before the first
  (:meth:`GreedyFusion._pointwise_partners`).
* With ``rows`` (the ``+rows`` candidates), a reduction whose row values are read back over its
  rows (``x - max(x)``), the later reductions of the same rows that read them and the readers of
  one value per row or per element are one row kernel (``lumc.compiler.core.fusion_rows``):
  LogSoftmax, an L2 normalization, a layer norm no rule spells.

Each refused fusion is logged once, naming both nodes and the reason (Inductor's ``WhyNoFuse``).
"""
from __future__ import annotations

import dataclasses
import logging

from lumc.ir.graph import Graph, Node
from lumc.ir.ops import ELEMENTWISE, REDUCE
from lumc.ir.views import prod

from lumc.backends.scan_structure import scan_of
from lumc.compiler.core.fusion_attention import AttentionAssembly
from lumc.compiler.core.fusion_chain import ChainFusion
from lumc.compiler.core.fusion_scan import ScanFusion
from lumc.compiler.core.fusion_stored import COPY_REFUSAL, StoredReaders
from lumc.compiler.core.fusion_norms import (KV_PROLOGUE_REFUSAL, HeadNormInAttention, NormOnLoad,
                                              _chain)
from lumc.compiler.core.fusion_rows import ROWS_REFUSAL, RowFusion, launch_order  # noqa: F401
from lumc.compiler.core.kernel_builder import build_call, is_buffer_leaf
from lumc.compiler.runtime.program import Program

log = logging.getLogger("lumc.fusion")

MAX_RECOMPUTE_OPS = 48   # longest elementwise chain recomputed in each of several consumers
CHEAP_OPERAND_OPS = 2    # longest prologue fused under a contraction operand
MAX_WEIGHT_PROLOGUE_OPS = 8   # longest dequantization of stored weights fused under one (NVFP4: 6)
MAX_EPILOGUE_OPS = 256   # fusible descendants of a reduction searched for its epilogue
HORIZONTAL_LOOKAHEAD = 4  # later kernels a pointwise kernel looks at for independent partners


class GreedyFusion(NormOnLoad, HeadNormInAttention, AttentionAssembly, ChainFusion, RowFusion,
                   ScanFusion, StoredReaders):
    """Realization decisions for one graph; :meth:`program` cuts the kernels.

    Attributes:
        realized: ids of nodes a kernel writes.
        group: ``{id(node): id(reduce)}`` for a reduction and the epilogue fused onto it.
        row_groups: ``{id(root): member ids}`` of the row groups claimed (``fusion_rows``).
        refusals: one line per refused fusion.
    """

    def __init__(self, graph: Graph, realize: set[int] | None = None, forms: dict | None = None,
                 norm_prologue: bool = False, norm_epilogue: bool = False,
                 kv_prologue: bool = False, attention: bool = False, mlp: bool = False,
                 rows: bool = False):
        self.graph = graph
        self.rows = rows
        self.attention = attention
        self.mlp = mlp
        self.chain_root: dict[int, int] = {}    # chained contractions (fusion_chain)
        self.norm_prologue = norm_prologue or norm_epilogue
        self.norm_epilogue = norm_epilogue
        self.kv_prologue = kv_prologue
        self.pending: dict[int, Node] = {}   # norm exits decided after the walk (post-LN)
        # {id(kernel exit): row values that kernel also writes}: a normalization formed on load in
        # several kernels has its statistics computed by the first, the others read them
        self.row_outputs: dict[int, list[Node]] = {}
        self.row_owned: set[int] = set()
        self.row_claims: dict[int, set[int]] = {}   # attention form -> row values it computes
        self.prologue_exits: set[int] = set()     # norm kernels fused into their contractions
        self.norm_consumers: set[int] = set()     # contractions (SumReduce ids) that fuse one
        self.head_pending: dict[int, Node] = {}   # QK-norms formed in attention (decided last)
        self.must_write: set[int] = set()    # inputs of a norm formed on load inside another
        self._exits: dict[int, Node] = {}
        self.order = graph.nodes()
        self.byid = {id(n): n for n in self.order}
        self.pos = {id(n): i for i, n in enumerate(self.order)}   # topological position
        self.outputs = {id(n) for n in graph.outputs.values()}
        self.users: dict[int, list[Node]] = {}
        for n in self.order:
            for s in n.srcs:
                self.users.setdefault(id(s), []).append(n)
        self.uses = {id(n): self._effective_uses(n) for n in self.order if n.op != "View"}
        self.realized: set[int] = set(realize or ())
        self.group: dict[int, int] = {}
        self.refusals: list[str] = []
        self._closed: dict[int, tuple] = {}
        self._data_free_memo: dict[int, bool] = {}
        self.forms = self._form_groups(self._with_attention(forms or {}))
        self.row_groups: dict[int, set[int]] = {}
        self.row_groups_found: list[frozenset[int]] = []   # Node.ids of each group's members
        self.unfused = bool(realize)
        if not realize:          # the unfused program cuts every op
            self._row_groups()
        self._decide()

    # ---- analysis --------------------------------------------------------------------------
    def _effective_uses(self, n: Node) -> list[tuple[Node, list]]:
        """Users of ``n`` seen through views: ``[(user, [views from n up to the user])]``."""
        out, stack = [], [(n, [])]
        while stack:
            x, chain = stack.pop()
            for u in self.users.get(id(x), []):
                if u.op == "View":
                    stack.append((u, chain + [u.arg]))
                else:
                    out.append((u, chain))
            if x is not n and id(x) in self.outputs:
                out.append((x, chain))
        return out

    def _refuse(self, n: Node, user: Node | None, reason: str) -> None:
        line = (f"no fusion %{n.id}:{n.op} -> %{user.id}:{user.op}: {reason}" if user is not None
                else f"no fusion %{n.id}:{n.op}: {reason}")
        self.refusals.append(line)
        log.debug(line)

    def _realize(self, n: Node, user: Node | None, reason: str) -> None:
        if id(n) not in self.realized and not is_buffer_leaf(n):
            self.realized.add(id(n))
            self._refuse(n, user, reason)

    def _is_compute(self, n: Node) -> bool:
        return n.op not in ("View", "Input", "Constant", "Iota")

    def _inline_region(self, n: Node) -> tuple[list[Node], int, bool]:
        """Buffers read by ``n``'s inlined expression, its op count, and whether a Gather is inside."""
        reads, ops, gather, seen = [], 0, False, set()
        stack = [n]
        while stack:
            x = stack.pop()
            if id(x) in seen:
                continue
            seen.add(id(x))
            if x is not n and (is_buffer_leaf(x) or id(x) in self.realized):
                reads.append(x)
                continue
            if x.op in ("Constant", "Iota", "Input"):
                continue
            if x.op != "View":
                ops += 1
                # a gather of an iota is its index (a scatter's range check, ir.library.scatter):
                # elementwise, read through views like any
                gather |= x.op == "Gather" and x.srcs[0].op != "Iota"
            stack.extend(x.srcs)
        return reads, ops, gather

    def _attention_prologue(self, n: Node, user: Node) -> bool:
        """True when the elementwise expression ``n`` may be computed inside the attention kernel
        whose contraction ``user`` reads it as an operand (``render_attention`` evaluates operand
        tiles through the ``Evaluator``):

        * the query (the score product's left operand): the kernel loads its tile once per program,
          so the expression (RoPE's ``q * cos + rotate_half(q) * sin``) is computed once per
          element, as its own kernel would, without writing and re-reading the result; always;
        * the keys and values: their tiles are loaded once per query block, so the expression is
          recomputed ``ceil(Lq / BLOCK_M)`` times (priced by
          ``simulator.attention_prologue_seconds``);
          only with ``kv_prologue`` (the ``+kv-prologue`` candidate, which the search times
          against the twin that writes them). Without it, the refusal says so.
        """
        rec = self.forms.get(self.group.get(id(user)))
        if rec is None or rec.form != "attention":
            return False
        if _chain(user.srcs[0])[0] is n:
            return True
        if self.kv_prologue:
            return True
        self._refuse(n, user, KV_PROLOGUE_REFUSAL)
        return False

    def _pads_elementwise(self, user: Node) -> bool:
        """True when ``user`` may read an inlined expression through a masked view (a pad, a
        concatenation's part): it is an elementwise op outside any reduction's group and not a
        contraction operand. The expression is then computed at the view's source index and set to
        zero outside the view's valid box (``Evaluator._view``), which is the pad of the value
        whatever the expression gives at zero (``Neg(0)`` is ``-0.0``, ``Exp(0)`` is 1)."""
        return (user.op in ELEMENTWISE and id(user) not in self.group
                and not (user.op == "Mul" and self._contraction_operand(user)))

    def _contraction_operand(self, user: Node) -> bool:
        uses = self.uses[id(user)]
        return bool(uses) and all(u.op == "SumReduce" for u, _ in uses)

    def _weight_prologue(self, n: Node, reads: list[Node], ops: int) -> bool:
        """``n`` dequantizes stored weights: it reads constants only, is at most
        :data:`MAX_WEIGHT_PROLOGUE_OPS` ops, and every path from it reaches a contraction operand
        through elementwise ops and views (see the module docstring)."""
        if ops > MAX_WEIGHT_PROLOGUE_OPS or not reads or any(r.op != "Constant" for r in reads):
            return False
        stack, seen = [n], {id(n)}
        while stack:
            x = stack.pop()
            uses = self.uses.get(id(x), [])
            if not uses or id(x) in self.outputs:
                return False
            for u, _ in uses:
                if u.op == "Mul" and self._contraction_operand(u):
                    continue
                if u.op not in ELEMENTWISE or id(u) in self.group:
                    return False
                if id(u) not in seen:
                    seen.add(id(u))
                    stack.append(u)
        return True

    # ---- forms -----------------------------------------------------------------------------
    def _form_groups(self, forms: dict) -> dict:
        """Claim each form's inside (root down to its inputs) as one group. A form whose inside is
        read from outside, or overlaps another form, is dropped (its nodes fuse greedily)."""
        kept = {}
        for rid, rec in sorted(forms.items(), key=lambda kv: -len(self._members(kv[0], kv[1]))):
            if rid not in self.byid:
                continue
            members = self._members(rid, rec)
            root = self.byid[rid]
            inside = members | {rid}
            rows = self._attention_row_values(root, members) if rec.form == "attention" else set()
            inside |= rows
            leak = [m for m in members if id(m) in self.outputs or any(
                id(u) not in inside for u, _ in self.uses.get(m, []))]
            if leak or any(m in self.group for m in inside):
                self._refuse(root, None, f"{rec.form} form dropped: its inside is read elsewhere")
                continue
            if rec.form == "scan" and scan_of(root) is None:
                self._refuse(root, None, "scan form dropped: not a triangular contraction of a "
                                         "finite operand (lumc.backends.scan_structure)")
                continue
            if rec.form == "scan":    # checked here, where the operand's expression is visible
                rec = dataclasses.replace(rec, attrs=tuple(sorted(rec.attrs + (
                    ("finite_operand", True),))))
            for m in inside:
                self.group[m] = rid
            if rows:
                self.row_claims[rid] = rows
            kept[rid] = rec
        return kept

    def _members(self, rid: int, rec) -> set[int]:
        # compute nodes between the root and the form's inputs (views are reads, shared freely)
        stop = {id(x) for x in rec.inputs} | {id(_chain(x)[0]) for x in rec.inputs}
        out, seen = set(), set()
        stack = [self.byid[rid]] if rid in self.byid else []
        while stack:
            x = stack.pop()
            for s in x.srcs:
                if id(s) in stop or id(s) in seen or s.op in ("Input", "Constant", "Iota"):
                    continue
                if rec.form == "scan" and self._data_free(s):
                    continue    # the scan's mask: never computed, shared by the scans of one row
                seen.add(id(s))
                if s.op != "View":
                    out.add(id(s))
                stack.append(s)
        return out

    # ---- decisions -------------------------------------------------------------------------
    def _free_reshape(self, views: list) -> bool:
        return all(v.is_contiguous for v in views)

    def _fusible_descendants(self, roots: list[Node]) -> list[Node]:
        """The elementwise nodes of the first root's size reached from ``roots`` through free
        reshapes, outside any group, breadth first (at most :data:`MAX_EPILOGUE_OPS`)."""
        size = roots[0].numel
        desc, order, frontier = {id(x) for x in roots}, [], list(roots)
        while frontier and len(order) < MAX_EPILOGUE_OPS:
            x = frontier.pop(0)
            for u, views in self.uses.get(id(x), []):
                if id(u) not in desc and u.op in ELEMENTWISE and id(u) not in self.group \
                        and u.numel == size and self._free_reshape(views):
                    desc.add(id(u))
                    order.append(u)
                    frontier.append(u)
        return order

    def _epilogue_region(self, r: Node, partner: Node | list | None = None
                         ) -> tuple[set[int], Node]:
        """The elementwise epilogue of reduction ``r``: the largest set of same-size elementwise
        consumers in which every node but one (the exit, which the kernel writes) has all its
        consumers inside the set. Returns ``(member ids, exit)``.

        Each candidate exit ``e`` among the fusible descendants of ``r`` (elementwise, same size,
        read through free reshapes) defines the region of the nodes between ``r`` and ``e``; the
        largest valid one wins. A descendant that feeds something else (``x * x`` for a second
        reduction) is simply left out, instead of stopping the growth. With a ``partner`` (a paired
        contraction, :meth:`_pairs`; or a list: scans of one row, :meth:`_scan_partners`) the
        region must hold them all."""
        roots = [r] if partner is None else [r, *partner] if isinstance(partner, list) \
            else [r, partner]
        order = sorted(self._fusible_descendants(roots), key=lambda n: self.pos[id(n)])
        best = ({id(r)}, r)
        # region(e): everything in desc that e depends on, built once per node in topological order
        deps: dict[int, frozenset] = {id(x): frozenset((id(x),)) for x in roots}
        for e in order:
            acc = {id(e)}
            for s_ in e.srcs:
                b = _chain(s_)[0]
                if id(b) in deps:
                    acc |= deps[id(b)]
            region = deps[id(e)] = frozenset(acc)
            if not all(id(x) in region for x in roots) or len(region) < len(best[0]):
                continue
            if all(k == id(e) or self._closed_in(k, region) for k in region):
                best = (set(region), e)
        return best

    def _closed_in(self, k: int, region: frozenset) -> bool:
        """Node ``k`` is not a model output and every use of it is in ``region``, through free
        reshapes (it need not be written when the region is one kernel)."""
        hit = self._closed.get(k)
        if hit is None:
            uses = self.uses[k]
            hit = self._closed[k] = (k not in self.outputs and all(
                self._free_reshape(v) for _, v in uses), frozenset(id(u) for u, _ in uses))
        return hit[0] and hit[1] <= region

    def _why_not_epilogue(self, b: Node, user: Node, views: list) -> str:
        if views and not self._free_reshape(views):
            return "read through a view (broadcast back)"
        if user.op not in ELEMENTWISE:
            return f"{user.op} is not an elementwise epilogue"
        if id(user) in self.group:
            return "the consumer already fuses another reduction"
        return "the epilogue would have several outputs"

    def _decide(self) -> None:
        for o in self.graph.outputs.values():
            if o.op != "View":
                continue
            if _alias_output(o):
                self._realize(o.srcs[0], o, "a model output is a free reshape of it")
            else:
                self.realized.add(id(o))
                self._refuse(o, None, COPY_REFUSAL)
        exits: dict[int, Node] = {}
        pairs = self._pairs()
        for n in self.order:
            if not self._is_compute(n):
                continue
            mine = self.group.get(id(n))
            if id(n) in self.forms:
                partners = self._scan_partners(n)
                members, exit_ = self._epilogue_region(n, partners or None)
                if partners and not all(id(p) in members for p in partners):
                    members, exit_ = self._epilogue_region(n)     # no epilogue closes over all
                elif partners:
                    self._merge_scans(n, partners)
                for k in members:
                    self.group[k] = id(n)
                exits[id(n)] = exit_
            elif n.op in REDUCE and mine is None:
                b, _ = _chain(n.srcs[0])
                if id(b) in self.group:
                    self._realize(b, n, "a reduction reads another reduction's result")
                self.group[id(n)] = id(n)
                partner = pairs.get(id(n))
                if partner is not None and id(partner) not in self.group:
                    self.group[id(partner)] = id(n)
                    members, exit_ = self._epilogue_region(n, partner)
                    if id(partner) not in members:     # no epilogue closes over both: apart
                        del self.group[id(partner)]
                        members, exit_ = self._epilogue_region(n)
                    else:
                        self._refuse(partner, n, "paired with a contraction of the same left "
                                                 "operand: one kernel, two accumulators")
                else:
                    members, exit_ = self._epilogue_region(n)
                for k in members:
                    self.group[k] = id(n)
                exits[id(n)] = exit_
            else:
                for k, s in enumerate(n.srcs):
                    b, views = _chain(s)
                    if id(b) in self.group and self.group[id(b)] != mine and id(b) not in self.realized:
                        if id(b) in self.head_pending or self._head_norm_candidate(b, exits):
                            continue
                        if self.norm_epilogue and self._norm_exit(b, exits) is not None:
                            self.pending.setdefault(id(b), b)   # decided after the walk
                            continue
                        if k == 0 and self._fuse_norm_prologue(b, exits):
                            self.norm_consumers.update(id(u) for u, _ in self.uses[id(n)])
                            continue
                        if k == 0 and n.op == "Mul" and self._chain_contraction(b, n, exits):
                            continue
                        self._realize(b, n, self._why_not_epilogue(b, n, views))
                    elif n.op == "Gather" and k == 0 and self._is_compute(b):
                        self._realize(b, n, "a gather table must be in memory")
                if n.op == "Contiguous":
                    self._realize(n, None, "Contiguous materializes")
                if id(n) in self.row_groups:
                    exits[id(n)] = n       # a row group's root: the kernel's (first) output
            if id(n) in self.outputs:
                self._realize(n, None, "model output")
        self._exits = exits
        # consumers first: a norm read inside another norm's kernel knows that kernel's fate
        for b in sorted(self.pending.values(), key=lambda x: -self.pos[id(x)]):
            self._fuse_norm_on_load(b, exits)
        for g, exit_ in exits.items():   # a chained contraction's exit is computed on chip
            if id(exit_) not in self.prologue_exits and id(exit_) not in self.head_pending \
                    and g not in self.chain_root:
                self._realize(exit_, None, "end of a reduction kernel")
        # inlined nodes with several consumers: recompute when cheap, else realize
        for n in self.order:
            if not self._is_compute(n) or id(n) in self.group or id(n) in self.realized:
                continue
            uses = self.uses[id(n)]
            if len({id(u) for u, _ in uses}) <= 1 and not any(
                    views or u.op == "Mul" for u, views in uses):
                continue   # one plain consumer: nothing below applies (and a chain stays linear)
            reads, ops, gather = self._inline_region(n)
            big = [r for r in reads if r.numel > 1 and 2 * r.numel >= n.numel]
            weight = self._weight_prologue(n, reads, ops)
            for u, views in uses:
                if any(v.mask is not None for v in views) and not self._pads_elementwise(u):
                    self._realize(n, u, "read through a masked view (padding)")
                    break
                if views and gather and not weight:
                    self._realize(n, u, "a view over a gather result")
                    break
                if u.op == "Mul" and self._contraction_operand(u) and not weight and not (
                        ops <= CHEAP_OPERAND_OPS and len(big) <= 1 and not gather) and not (
                        ops <= MAX_RECOMPUTE_OPS and self._attention_prologue(n, u)) and not (
                        ops <= MAX_RECOMPUTE_OPS and not gather and self._scan_operand(u)):
                    self._realize(n, u, "contraction operand is not a cheap prologue")
                    break
            if id(n) in self.realized:
                continue
            # consumers inside one form kernel (a layer norm's mean and x - mean) read it in one
            # kernel: recomputed there per pass, not per kernel
            consumers = {self.group[id(u)] if self.group.get(id(u)) in self.forms
                         or self.group.get(id(u)) in self.row_groups else id(u) for u, _ in uses}
            if len(consumers) > 1 and (len(big) > 1 or ops > MAX_RECOMPUTE_OPS):
                self._realize(n, uses[0][0], f"{len(consumers)} consumers and recompute reads "
                                             f"{len(big)} large buffers / {ops} ops")
        self._fuse_head_norms(exits)
        self._write_attention_row_values(exits)
        self._row_writes()

    # ---- kernels ---------------------------------------------------------------------------
    def program(self, label: str = "greedy") -> Program:
        """The kernel calls in topological order of their outputs."""
        calls = []
        done: set[int] = set()

        def boundary(x: Node) -> bool:
            # a row value a later kernel writes (a row group's, a norm's) is read, not recomputed
            return id(x) in done or id(x) in self.row_owned

        form_of = {}
        for rid, rec in self.forms.items():
            for k, g in self.group.items():
                if g == rid:
                    form_of[k] = rec

        def excluded(m: Node) -> bool:      # kernels that cannot be a contraction's reader
            return bool(id(m) in form_of or id(m) in self.row_owned or self.row_outputs.get(id(m))
                        or self.group.get(id(m)) in self.norm_consumers
                        or self.group.get(id(m)) in self.row_groups)
        for n in self.order:
            if id(n) in self.realized and id(n) not in self.row_owned:
                rec = form_of.get(id(n))
                rows = self.row_outputs.get(id(n), [])
                if id(n) in done:
                    continue
                if rec is not None:     # an attention kernel may write row values too
                    calls.append(build_call([n] + rows, boundary, rec.form, rec.attrs))
                elif self.group.get(id(n)) in self.chain_root.values():
                    # two contractions, the first's epilogue on chip (fusion_chain); views kept
                    # where the model wrote them, as for a normalization formed on load
                    r2 = self.byid[self.group[id(n)]]
                    calls.append(build_call([n] + rows, boundary, "mlp",
                                            (("axes", tuple(r2.arg)), ("reduce", "sum")),
                                            push_views=False))
                elif id(n) in self.row_groups:
                    # the row group as written: views over row values stay broadcasts of rows
                    calls.append(build_call([n] + rows, boundary, push_views=False))
                elif self.group.get(id(n)) in self.norm_consumers:
                    # the normalization stays as written: its renderer reads the rows of its input
                    # (and writes the row values other kernels read)
                    call = build_call([n] + rows, boundary, push_views=False)
                    stored = self._stored_readers(n, call, boundary, done, excluded, rows, False)
                    calls.append(call if stored is None else stored[0])
                    done.update(id(m) for m in (stored[1] if stored else ()))
                else:
                    call = build_call([n], boundary)
                    stored = self._stored_readers(n, call, boundary, done, excluded)
                    if stored is not None:       # readers through a view (fusion_stored)
                        call, more = stored[0], []
                        done.update(id(m) for m in stored[1])
                    else:
                        more = self._pointwise_partners(n, call, done, form_of) \
                            if call.kernel.form == "pointwise" else []
                    calls.append(build_call([n] + more, boundary) if more else call)
                    done.update(id(m) for m in more)
                done.add(id(n))
                done.update(id(r) for r in rows)
        outputs = {}
        for name, n in self.graph.outputs.items():
            outputs[name] = n
        prog = Program(launch_order(calls), outputs, label=label, notes=list(self.refusals),
                       graph=self.graph, row_groups=list(self.row_groups_found))
        return prog


    def _pointwise_partners(self, n: Node, call, done: set[int], form_of: dict) -> list[Node]:
        """Later realized nodes whose pointwise kernels join ``n``'s (``call``): the same element
        count, every input written already (``done``) or a leaf, so the joint kernel may run at
        ``n``'s place; among the next :data:`HORIZONTAL_LOOKAHEAD` kernels in launch order."""
        out: list[Node] = []
        seen = 0
        for m in self.order[self.pos[id(n)] + 1:]:
            if seen >= HORIZONTAL_LOOKAHEAD:
                break
            if id(m) not in self.realized or id(m) in self.row_owned or id(m) in done:
                continue
            seen += 1
            if id(m) in form_of or self.group.get(id(m)) in self.norm_consumers \
                    or self.group.get(id(m)) in self.row_groups \
                    or self.row_outputs.get(id(m)) or m.numel != n.numel:
                continue
            trial = build_call([m], lambda x: id(x) in self.realized and x is not m)
            if trial.kernel.form == "pointwise" and all(
                    id(x) in done or x.op in ("Input", "Constant") for x in trial.inputs):
                out.append(m)
        return out


def _alias_output(n: Node) -> bool:
    return n.op == "View" and n.arg.is_contiguous and prod(n.shape) == prod(n.srcs[0].shape)


def greedy_program(graph: Graph, label: str = "greedy", forms: dict | None = None,
                   norm_prologue: bool = False, norm_epilogue: bool = False,
                   kv_prologue: bool = False, attention: bool = False,
                   mlp: bool = False, rows: bool = False) -> Program:
    """Greedy fusion of ``graph`` into a :class:`Program` (see the module docstring).

    Model outputs that are model inputs, constants, or free reshapes of a realized node are not
    copied; every other output is written by a kernel.

    ``forms`` (from e-graph extraction) maps ``id(root node)`` to a record with ``form``,
    ``attrs`` and ``inputs``: the nodes between the root and its inputs become one kernel of that
    form (plus any elementwise epilogue), instead of being fused greedily. ``norm_prologue``
    fuses a layernorm/rmsnorm form read only by contractions into them (pre-LN fusion);
    ``norm_epilogue`` also where a contraction's epilogue reads it (post-LN: the residual);
    ``kv_prologue`` computes elementwise key and value operands of attention inside it (the query's
    always is); ``attention`` assembles attention forms around score functions no rule spells
    (``fusion_attention``); ``mlp`` computes a contraction's epilogue that only the next
    contraction reads in that contraction's kernel (``fusion_chain``); ``rows`` computes chains of
    reductions over the same rows and their readers in one row kernel (``fusion_rows``).

    Raises:
        ValueError: the kernels read each other's outputs in a cycle (``fusion_rows.launch_order``).
    """
    return GreedyFusion(graph, forms=forms, norm_prologue=norm_prologue,
                        norm_epilogue=norm_epilogue, kv_prologue=kv_prologue,
                        attention=attention, mlp=mlp, rows=rows).program(label)
