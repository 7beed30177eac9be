"""Normalizations formed on load, the part of greedy fusion (``lumc.compiler.core.fusion``) that
decides them: pre-LN (a layernorm/RMSNorm form read only as contractions' left operands is never
written: ``lumc.backends.triton.norm_prologue`` forms it in each) and post-LN (also where a
contraction's epilogue reads it, the residual: ``norm_epilogue``). Where several kernels form one
normalization, the first writes its row values (``mean``, ``rsqrt(var + eps)``) for the others.

:class:`NormOnLoad` is a mixin of :class:`~lumc.compiler.core.fusion.GreedyFusion`: it reads the
fusion's ``uses``, ``group``, ``forms``, ``realized`` and ``pos`` and records its decisions in
``prologue_exits``, ``norm_consumers``, ``row_outputs``, ``row_owned`` and ``must_write``.

Sandwich norms (Gemma-2/3, OLMo-2: ``h = x + N_post(s)`` read by the next pre-norm and the next
post-norm): a norm exit read inside another norm's kernel is formed on load there
(:meth:`NormOnLoad._nests`), one deep (its inputs are then written: ``must_write``); see
docs/triton-backend.md, "Sandwich norms".
"""
from __future__ import annotations

from lumc.ir.graph import Node
from lumc.ir.ops import ELEMENTWISE, REDUCE
from lumc.ir.views import prod

from lumc.backends.triton.contraction import as_contraction, as_contraction_squeezed
from lumc.backends.triton.norm_prologue import reads_operand_rows

# the note a fusion without ``kv_prologue`` leaves where the twin candidate would differ
KV_PROLOGUE_REFUSAL = "an attention key/value prologue is recomputed per query block (+kv-prologue)"


def _chain(x: Node) -> tuple[Node, list]:
    """``(base, views)``: follow a stack of views down to the node they read."""
    views = []
    while x.op == "View":
        views.append(x.arg)
        x = x.srcs[0]
    return x, views



def _row_plannable(r: Node, epilogue: bool) -> bool:
    """Contraction ``r``'s kernel can compute row statistics (what ``norm_prologue`` and
    ``norm_epilogue`` render): no batch dims, and in its epilogue its rows before its columns."""
    c = as_contraction_squeezed(r)
    if c is None or c.batch_dims:
        return False
    return not (epilogue and c.m_dims and c.n_dims) or max(c.m_dims) < min(c.n_dims)



class NormOnLoad:
    """Pre-LN and post-LN fusion decisions (see the module docstring)."""

    def _fuse_norm_prologue(self, b: Node, exits: dict) -> bool:
        """Pre-LN fusion (``norm_prologue``): ``b`` ends a layernorm/rmsnorm form kernel and every
        use of it is the left operand of a contraction, so the contractions form the normalized
        tile on load (``lumc.backends.triton.norm_prologue``) and ``b`` is never written."""
        rec = self._norm_exit(b, exits) if self.norm_prologue else None
        if rec is None:
            return False
        ok = all(self._operand_readers(b, u) is not None for u, _ in self.uses[id(b)])
        if ok:
            if id(b) not in self.prologue_exits:
                self.prologue_exits.add(id(b))
                self._refuse(b, None, f"{rec.form} fused as the prologue of its contractions")
        return ok

    def _norm_exit(self, b: Node, exits: dict):
        """The layernorm/rmsnorm form record whose kernel ends at ``b`` (not a model output)."""
        if id(b) in self.outputs:
            return None
        rec = self.forms.get(self.group.get(id(b)))
        if rec is None or rec.form not in ("layernorm", "rmsnorm") or \
                exits.get(self.group[id(b)]) is not b:
            return None
        return rec

    def _on_load_readers(self, b: Node, u: Node, views: list, depth: int = 0) -> list[int] | None:
        """The contractions (ids of their ``SumReduce``) that form ``b`` on load where ``u`` reads
        it: ``u`` is their left operand (prologue), or an elementwise op of one's epilogue reading
        ``b`` through free reshapes (a post-LN residual), or an elementwise op inlined into such
        epilogues (``0.5 * y``, ``relu(y)``, ``-y``: every use of it is one); ``[]`` where ``u`` is
        inside another norm's kernel that forms ``b`` too (:meth:`_nests`); None for any other
        reader, or a contraction whose kernel cannot compute row statistics."""
        g = self.group.get(id(u))
        if depth == 0 and g in self.forms:      # inside another norm's kernel
            whole = u.numel == b.numel or (u.op in REDUCE and _chain(u.srcs[0])[0] is b)
            nests = whole and self._free_reshape(views) and self._nests(b, g)
            return [] if nests else None
        if depth == 0 and u.op == "Mul" and self._contraction_operand(u):
            return self._operand_readers(b, u)
        if u.op not in ELEMENTWISE or u.numel != b.numel or not self._free_reshape(views):
            return None
        r = self.byid.get(g) if g is not None else None
        if (r is not None and g not in self.forms and r.op == "SumReduce" and r.srcs[0].op == "Mul"):
            return [g] if _row_plannable(r, True) else None
        if g is not None or id(u) in self.realized or id(u) in self.outputs or depth >= 8:
            return None
        out = []
        for u2, v2 in self.uses[id(u)]:
            got = self._on_load_readers(u, u2, v2, depth + 1)
            if got is None:
                return None
            out += got
        return out or None

    def _operand_readers(self, b: Node, u: Node) -> list[int] | None:
        """The contractions (ids of their ``SumReduce``) whose left operand ``u`` reads ``b``, when
        their kernels can compute ``b``'s row statistics in the prologue; else None."""
        rs = self._sums_of(u) if u.op == "Mul" and id(u) not in self.group else None
        if not rs or _chain(u.srcs[0])[0] is not b:
            return None
        row = self._norm_row(b)
        ok = row is not None and all(
            _row_plannable(x, False) and reads_operand_rows(as_contraction_squeezed(x), row)
            for x in rs)
        return [id(x) for x in rs] if ok else None

    def _norm_row(self, b: Node) -> int | None:
        """The elements of one row of the normalization ``b`` ends (what its statistics reduce
        over): a contraction forms it on load only where its K is exactly that row (a norm over
        16 values read as rows of 64 is four rows per K row)."""
        g = self.group.get(id(b))
        rec = self.forms.get(g)
        if rec is None:
            return None
        rows = {prod(n.srcs[0].shape[a] for a in n.arg) for n in
                (self.byid[m] for m in self._members(g, rec)) if n.op in REDUCE}
        return rows.pop() if len(rows) == 1 else None

    def _sums_of(self, u: Node) -> list[Node] | None:
        """The sums that read product ``u`` whole: directly, or through a reshape that drops its
        leading 1s (a GEMV's batch-of-one spelling, ``as_contraction_squeezed``); else None."""
        out = []
        for x, _ in self.uses[id(u)]:
            if x.op == "View" and x.arg.is_contiguous and id(x) not in self.group:
                more = [y for y, _ in self.uses[id(x)]]
                if not more or any(as_contraction_squeezed(y) is None for y in more):
                    return None
                out += more
            elif x.op == "SumReduce":
                out.append(x)
            else:
                return None
        return out or None

    def _fuse_norm_on_load(self, b: Node, exits: dict) -> None:
        """Post-LN fusion (``norm_epilogue``), decided once every kernel's epilogue is known: ``b``
        ends a normalization whose every reader forms it on load (:meth:`_on_load_readers`), so
        ``b`` is never written; else it is realized, naming the first reader that cannot.

        Where several kernels read it, the first to run computes the row statistics and also
        writes the row values the normalized value reads (``mean``, ``rsqrt(var + eps)``: ``M``
        values each); the others read those instead of re-reading whole rows."""
        if id(b) in self.realized:
            return
        if id(b) in self.must_write:
            self._realize(b, None, "read by a normalization formed on load in another kernel "
                                   "(on-load normalizations nest one deep)")
            return
        readers, nested = [], False
        for u, views in self.uses[id(b)]:
            got = self._on_load_readers(b, u, views)
            if got is None:
                self._realize(b, u, "normalization not formed on load: the reader is neither a "
                                    "contraction's left operand, an elementwise op of its "
                                    "epilogue, nor a norm over the same rows")
                return
            nested |= not got
            readers += got
        if nested:
            self.must_write.update(self._norm_inputs(b))
        self.prologue_exits.add(id(b))
        self.norm_consumers.update(readers)
        self._refuse(b, None, "normalization formed on load in its contractions' prologues and "
                              "epilogues" + (" and inside the norm kernels that read it"
                                             if nested else ""))
        # a paired contraction reads it in its partner's kernel (the group's root)
        kernels = sorted({id(exits[self._kernel_root(self.group.get(g, g))]) for g in readers},
                         key=lambda k: self.pos[k])
        # shared only between contraction kernels: a GEMV (one row, rendered as a row kernel)
        # cannot write a statistic of another shape (``rowplan.prologue_statistics``)
        share = len(kernels) > 1 and not nested and all(
            (c := as_contraction_squeezed(self.byid[g])) is not None and c.M > 1 for g in readers)
        rows = self._row_values(b) if share else []
        if rows:
            self.row_outputs.setdefault(kernels[0], []).extend(
                r for r in rows if id(r) not in self.row_owned)
            for r in rows:
                if id(r) not in self.row_owned:
                    self.realized.add(id(r))
                    self.row_owned.add(id(r))
                    self._refuse(r, None, "row values of a normalization formed on load, written "
                                          "by the first kernel that forms it for the others")

    def _nests(self, b: Node, g: int) -> bool:
        """Norm exit ``b`` is read inside the norm form kernel ``g``, which reduces operands of the
        same shape over the same axes, and that kernel is written (a row kernel: it takes ``b``'s
        statistics as more row reductions) or formed on load in contractions' prologues (their
        statistics loops take ``b``'s first)."""
        rec = self.forms[g]
        if rec.form not in ("layernorm", "rmsnorm"):
            return False
        e = self._exits.get(g)
        if e is None or id(e) in self.head_pending:
            return False
        if self._reduce_keys(self.group[id(b)]) != self._reduce_keys(g):
            return False
        # pending exits after ``b`` are decided (consumers first); any other is written
        return id(e) in self.prologue_exits or id(e) in self.realized or id(e) not in self.pending

    def _reduce_keys(self, g: int) -> set:
        return {(tuple(n.srcs[0].shape), tuple(sorted(n.arg))) for k, gg in self.group.items()
                if gg == g and (n := self.byid[k]).op in REDUCE}

    def _norm_inputs(self, b: Node) -> list[int]:
        """Ids of the computed nodes outside ``b``'s norm kernel that its members read."""
        g = self.group[id(b)]
        out = []
        for k, gg in self.group.items():
            if gg != g:
                continue
            for s_ in self.byid[k].srcs:
                x = _chain(s_)[0]
                if self.group.get(id(x)) != g and self._is_compute(x):
                    out.append(id(x))
        return out

    def _row_values(self, b: Node) -> list[Node]:
        """The computed row values (statistics and functions of them) that the normalized value
        ``b`` reads through broadcasts, reached from ``b`` through full-size ops and views."""
        rid = self.group[id(b)]
        out, seen, stack = [], set(), [b]
        while stack:
            x = stack.pop()
            if id(x) in seen:
                continue
            seen.add(id(x))
            for s_ in x.srcs:
                if s_.op != "View" and self.group.get(id(s_)) != rid:
                    continue            # the normalization's input (or a weight): not a row value
                if s_.numel == b.numel:
                    stack.append(s_)
                    continue
                r = _chain(s_)[0]       # a broadcast (of a reshape) of a row value
                if x.op == "View" and self._is_compute(r) and self.group.get(id(r)) == rid \
                        and id(r) not in seen:
                    seen.add(id(r))
                    out.append(r)
        return sorted(out, key=lambda n: self.pos[id(n)])


def _keeps_rows(v, src_shape, ax: int = -1) -> bool:
    """View ``v`` over a contiguous source of shape ``src_shape`` reads, along its axis ``ax``, one
    run of the source's last axis (stride 1, never crossing into another source row), and its other
    dims move by whole source rows: a row of the view along ``ax`` (within its valid box) lies in
    one row of the source, the same for every element of it."""
    if not v.shape or not src_shape:
        return False
    L = src_shape[-1]
    ax = ax % len(v.shape)
    if v.shape[ax] > 1 and v.strides[ax] != 1:
        return False
    if any(st % L for k, st in enumerate(v.strides) if k != ax):
        return False
    lo, hi = v.mask[ax] if v.mask is not None else (0, v.shape[ax])
    if hi <= lo:
        return True
    return (v.offset + lo) // L == (v.offset + hi - 1) // L


class HeadNormInAttention:
    """QK-norm formed inside attention: a layernorm/RMSNorm form over the last axis (the head dim)
    whose result is read only by elementwise expressions (RoPE) of an attention kernel's operands.
    The attention kernel loads each q (k, v) tile with its whole head dim, so it computes the row
    statistics from the tile it loaded and normalizes it there (``render_attention``), instead of a
    norm kernel writing the normalized heads and attention re-reading them. The query's norm is
    always fused; the keys' and values' only with ``kv_prologue`` (recomputed per query block).
    A mixin of ``GreedyFusion``, like :class:`NormOnLoad`."""

    def _head_norm_candidate(self, b: Node, exits: dict) -> bool:
        """During the walk: ``b`` may be formed inside attention (decided by
        :meth:`_fuse_head_norms` once every other realization is known). Without ``kv_prologue``,
        a keys' or values' norm that would be is noted, so the ``+kv-prologue`` twin is made."""
        if self._head_norm_reaches(b, exits, self.kv_prologue):
            self.head_pending[id(b)] = b
            return True
        if not self.kv_prologue and self._head_norm_reaches(b, exits, True):
            self._refuse(b, None, KV_PROLOGUE_REFUSAL)
        return False

    def _fuse_head_norms(self, exits: dict) -> None:
        """Form each pending norm inside the attention that reads it when its paths there are
        still all inlined; else write it (its form kernel stays)."""
        for b in self.head_pending.values():
            if not self._head_norm_reaches(b, exits, self.kv_prologue):
                self._realize(b, None, "a reader between the norm and attention is written")
                continue
            rid = self.group[id(b)]
            form = self.forms.pop(rid).form
            for k in [k for k, g in self.group.items() if g == rid]:
                del self.group[k]
            self.prologue_exits.add(id(b))
            self._refuse(b, None, f"{form} over the head dim formed inside the attention kernel "
                                  "that reads it (QK-norm)")

    def _head_norm_reaches(self, b: Node, exits: dict, kv: bool) -> bool:
        """Every reader of norm exit ``b`` is a path of inlined elementwise ops and row-keeping
        views (:func:`_keeps_rows`) ending on the head dim of an attention operand: the query's,
        or with ``kv`` a key's or value's. ``b``'s normalization must run over its last axis."""
        rec = self._norm_exit(b, exits)
        if rec is None or dict(rec.attrs).get("axis") not in (len(b.shape) - 1, -1):
            return False
        L = b.shape[-1]
        seen: set[int] = set()
        stack = [b]
        while stack:
            x = stack.pop()
            for u, views in self.uses[id(x)]:
                ax = -1
                if u.op == "Mul" and id(u) in self.group:
                    ax = self._attention_side(u, x, L, views, kv)
                    if ax is None:
                        return False
                shape = x.shape
                for k, v in enumerate(views):
                    if not _keeps_rows(v, shape, ax if k == len(views) - 1 else -1):
                        return False
                    shape = v.shape
                if u.op == "Mul" and id(u) in self.group:
                    continue
                if (u.op not in ELEMENTWISE or id(u) in self.group or id(u) in self.realized
                        or id(u) in self.outputs):
                    return False
                if id(u) not in seen:
                    seen.add(id(u))
                    stack.append(u)
        return True

    def _attention_side(self, u: Node, x: Node, L: int, views: list, kv: bool) -> int | None:
        """The axis of the head dim in the operand where ``x`` reaches ``u`` (through ``views``),
        when ``u`` is the product ``Mul(a, b)`` of an attention form's contraction and ``x`` is its
        query (``a`` of the scores) or, with ``kv``, its keys (``b`` of the scores) or
        values (``b`` of the value product), and that axis, of length ``L``, is one the kernel
        loads whole (the scores' summed dim, the values' output dim); else None."""
        rec = self.forms.get(self.group.get(id(u)))
        if rec is None or rec.form != "attention" or not views:
            return None
        r = [s for s, _ in self.uses[id(u)] if s.op == "SumReduce"]
        c = as_contraction(r[0]) if len(r) == 1 else None
        side = [k for k, s in enumerate(u.srcs) if _chain(s)[0] is x]
        if c is None or not side:
            return None
        if side == [0]:
            dims = c.k_dims
        elif not kv:
            return None
        else:   # the scores' keys (the product the other one reads) or the values
            dims = c.k_dims if self._feeds_contraction(r[0]) else c.n_dims
        if len(dims) != 1 or c.full[dims[0]] != L:
            return None
        return dims[0]

    def _feeds_contraction(self, r: Node) -> bool:
        """Another contraction of ``r``'s form reads ``r`` (``r`` is attention's score product)."""
        g, seen, stack = self.group.get(id(r)), {id(r)}, [r]
        while stack:
            x = stack.pop()
            for u, _ in self.uses.get(id(x), []):
                if id(u) in seen or self.group.get(id(u)) != g:
                    continue
                if as_contraction(u) is not None:
                    return True
                seen.add(id(u))
                stack.append(u)
        return False
