"""Attention kernels: flash-style, the score matrix never leaves registers.

The meaning is ``out = softmax(f(q @ k^T)) @ v`` in primitives: a score contraction ``C1``, any
elementwise ``f`` (scale, boolean mask through ``Where``, additive bias, causal mask from ``Iota``),
the softmax's ``MaxReduce``/``SumReduce`` pair over the key axes, and a value contraction ``C2`` whose
left operand is ``E * G``: the softmax numerator ``E = exp2((x - max) * c)`` times a factor ``G``
that is constant along the keys (``1 / sum``). All of it is found in the graph:

* ``C1`` and ``C2`` are classified by ``contraction`` (batch, query, key and head dims);
* the softmax domain ``T`` (the max's operand shape) is matched dim by dim to ``C1``'s output
  (a reshape) and to ``C2``'s left operand view (stride matching), so the batch, query and key
  groups agree across the three;
* the max/sum pair must be the online-softmax pattern of ``render_norm``;
* the scores and the row statistics are read (from T, or from C2's domain) only through views that
  keep every batch, query and key position (a transposed read is refused, not resolved by tile).

The probabilities reach ``C2`` in one of two ways. The meaning contract keeps ``View(E * G)`` (the
softmax in T, then a reshape/expand into C2's full shape). When views were pushed through the
elementwise math instead, ``C2``'s left operand is ``E2 * G2`` over C2's full shape
``[.., Lq, Lk, Dv]`` (constant along ``Dv``): a copy of the numerator ``E2 = exp2((x2 - max) * c)``
with the same max and scale, and a factor ``G2`` constant along the keys. The loop then evaluates
``E2`` at head index 0 for the value product (textually equal loads and ops are shared with ``E``,
which still feeds the running sum), and ``G2`` at the end from the final statistics.

A program owns ``BLOCK_M`` queries of one batch, loads its ``q`` tile once, and walks the keys in
``BLOCK_N`` blocks: scores by ``tl.dot``, ``f`` on the tile, running max and sum (Milakov &
Gimelshein 2018), ``acc = acc * alpha + E @ v`` (Dao et al., FlashAttention, 2022). ``G`` is applied
once at the end, then the epilogue. Bytes: q, k, v and out once per query block (k, v re-read per
query block from L2); FLOPs ``4 * B * Lq * Lk * D``.
"""
from __future__ import annotations

from lumc.ir import dtypes as dt
from lumc.ir.graph import Node, toposort
from lumc.ir.kernels import Kernel
from lumc.ir.views import contiguous_strides
from lumc.backends.triton import exprs
from lumc.backends.triton.attention_mask import key_limit_offset, sized_key_limit
from lumc.backends.triton.size_generic import rendering_sized, sized_substitution
from lumc.backends.triton.codegen import Evaluator, RenderError, SourceWriter, reads_of
from lumc.backends.triton.configs import next_pow2, score_bytes
from lumc.backends.triton.contraction import dims_used, tensor_core_contractions
from lumc.backends.triton.dot_precision import attention_dot, dot_dtype
from lumc.backends.triton.indexing import flat_index, needs_int64, reshape_index, unravel
from lumc.backends.triton.render_matmul import DOT_DTYPES, bind_all, check_epilogue, dependents, place
from lumc.backends.triton.render_norm import OnlineSoftmax, _match_softmax
from lumc.backends.triton.rowplan import RowPlan, plan_rows_of
from lumc.backends.triton.source import KernelParts, make_params

MAX_HEAD = 256


def _strip_cast(n: Node) -> Node:
    return n.srcs[0] if n.op == "Cast" else n


def _t_to_f1(t_shape, fr1) -> list[int]:
    """For each non-1 dim of ``T``, the dim of ``C1``'s output it is (a reshape adding/dropping 1s)."""
    a = [k for k, d in enumerate(t_shape) if d != 1]
    b = [k for k, d in enumerate(fr1) if d != 1]
    if [t_shape[k] for k in a] != [fr1[k] for k in b]:
        raise RenderError(f"scores {tuple(fr1)} reach the softmax as {tuple(t_shape)}, not by a "
                          "reshape that keeps every dim")
    out = [-1] * len(t_shape)
    for ka, kb in zip(a, b):
        out[ka] = kb
    return out


def _f2_to_t(view, t_shape) -> list[int]:
    """For each dim of ``C2``'s full shape, the ``T`` dim its left operand view reads (-1: broadcast)."""
    if view.offset or view.mask is not None:
        raise RenderError("the probabilities are read through a shifted or masked view")
    cs = contiguous_strides(t_shape)
    out, used = [], set()
    for d, st in zip(view.shape, view.strides):
        if st == 0 or d == 1:
            out.append(-1)
            continue
        cands = [j for j in range(len(t_shape)) if cs[j] == st and t_shape[j] == d and j not in used]
        if not cands:
            raise RenderError("the probabilities are read through a view that is not a broadcast "
                              "of their own dims")
        used.add(cands[0])
        out.append(cands[0])
    return out


class AttentionPlan:
    """The structure of an attention meaning (see module docstring)."""

    def __init__(self, kernel: Kernel):
        nodes = kernel.meaning.nodes()
        cs = tensor_core_contractions(nodes)     # a QK-norm's sum(x * x) is not one of them
        if len(cs) != 2:
            raise RenderError(f"attention needs two contractions (scores, values), found {len(cs)}")
        c1, c2 = cs
        if c1.node in dependents(nodes, c2.node):
            c1, c2 = c2, c1
        self.c1, self.c2 = c1, c2
        after = dependents(nodes, c2.node)
        left = c2.a
        # the probabilities reach the value product through a view of the softmax (the meaning
        # contract), or, where views were pushed through them, as elementwise math in C2's domain
        self.pushed = _strip_cast(left).op != "View"
        under = [left.srcs[0]] if not self.pushed else [
            n for n in nodes if n.op in ("SumReduce", "MaxReduce") and n not in after]
        before = toposort(under)                    # the softmax and everything under it
        # a normalization formed on an operand's load (QK-norm) reduces inside the operand
        self.operand_nodes = set(toposort([c1.a, c1.b, c2.b]))
        reds = [n for n in before if n.op in ("SumReduce", "MaxReduce") and n is not c1.node
                and n not in self.operand_nodes]
        self.plan: RowPlan = plan_rows_of(before, reds, {})
        merges = [_match_softmax(r, self.plan) for r in reds]
        merges = [m for m in merges if m is not None]
        if len(reds) != 2 or len(merges) != 1:
            raise RenderError("attention needs exactly one softmax (max and sum of exp2) between "
                              "its two contractions")
        self.softmax: OnlineSoftmax = merges[0]
        # row values of the softmax's max the kernel also writes (``fusion_attention``): outputs
        # that do not read the values' product, each of the statistics' own (reduced) shape
        self.row_outputs = [o for o in kernel.meaning.outputs.values() if o not in after
                            and o is not c2.node]
        stats = {self.softmax.m, self.softmax.s}
        for o in self.row_outputs:
            if tuple(o.shape) != tuple(self.plan.reduced_shape) or not stats & set(toposort([o])):
                raise RenderError(f"output {o!r} is neither the values' product nor a row value of "
                                  "the softmax's statistics")
        check_epilogue(nodes, after, c2.node)
        self.e = self.softmax.s.srcs[0]             # exp2((x - max) * c): the sum's operand
        self._match_dims()
        self._check_score_views(nodes)
        if self.pushed:
            self._match_pushed(left)
            return
        # C2's left operand is View(E * G) (maybe cast): find G
        if left.op != "View":
            raise RenderError("the probabilities must reach the value product through a view")
        self.p_view = left
        prod_ = _strip_cast(left.srcs[0])
        if prod_.op != "Mul" or self.e not in prod_.srcs:
            raise RenderError("the value product's left operand is not exp(...) times a row factor")
        self.g = prod_.srcs[1] if prod_.srcs[0] is self.e else prod_.srcs[0]
        if dims_used(self.g) & set(self.plan.axes):
            raise RenderError("the softmax's normalizer varies along the keys")
        self._check_p_view()

    def _check_score_views(self, nodes: list[Node]) -> None:
        """Every view between the scores and the softmax's input, of a value computed from the
        scores, only reshapes: the flash loop (and SDPA, ``backends/extern.py``) evaluates the
        score function on the score tile in C1's element order, so ``((k @ q^T) * c)^T``, the
        transpose after the scale, would pair each query with the wrong keys (0.93 off). And every
        view of the scores or of the softmax's statistics keeps each query's (and key's) position
        (:meth:`tile_view_ok`): scores written ``(k @ q^T)^T`` pair them the other way round."""
        sm = self.softmax
        for n in nodes:
            if n.op == "View" and n.srcs[0] in (self.c1.node, sm.m, sm.s) and \
                    not self.tile_view_ok(n):
                raise RenderError(f"node {n!r}: the scores or the softmax statistics are read "
                                  "through a view that does not keep each query's (and key's) "
                                  "position")
        reads = {id(self.c1.node)}
        for n in toposort([self.softmax.m.srcs[0]], stop=[self.c1.node]):
            if any(id(s) in reads for s in n.srcs):
                reads.add(id(n))
                if n.op == "View" and n.srcs[0] is not self.c1.node and not _order_kept(n):
                    raise RenderError(f"node {n!r}: the score function moves elements of the "
                                      "scores through a view")

    def _match_pushed(self, left: Node) -> None:
        """``C2.a = E2 * G2`` over C2's full shape: ``E2 = exp2((x2 - max) * c)`` (the softmax's
        numerator, its max read through a row broadcast) and ``G2`` constant along the keys."""
        c2, sm = self.c2, self.softmax
        prod_ = _strip_cast(left)
        if prod_.op != "Mul":
            raise RenderError("the value product's left operand is not exp(...) times a row factor")
        if dims_used(left) & set(c2.n_dims):
            raise RenderError("the probabilities vary along the value's head dims")
        keys = set(c2.k_dims)
        a, b = prod_.srcs
        if not dims_used(b) & keys and _is_exp_of_row(a, sm):
            self.e2, self.g2 = a, b
        elif not dims_used(a) & keys and _is_exp_of_row(b, sm):
            self.e2, self.g2 = b, a
        else:
            raise RenderError("the value product's left operand is not exp2((x - max) * c) "
                              "times a factor constant along the keys")

    def _match_dims(self) -> None:
        c1, c2, plan = self.c1, self.c2, self.plan
        t = plan.shape
        fr1 = tuple(1 if d in c1.k_dims else s for d, s in enumerate(c1.full))
        self.t2f1 = _t_to_f1(t, fr1)
        group1 = {}
        for g, dims in (("batch", c1.batch_dims), ("query", c1.m_dims), ("key", c1.n_dims)):
            for d in dims:
                group1[d] = g
        self.t_groups = {"batch": [], "query": [], "key": []}
        for j, f in enumerate(self.t2f1):
            if f >= 0:
                self.t_groups[group1[f]].append(j)
        if sorted(self.t_groups["key"]) != sorted(k for k in plan.axes if t[k] != 1):
            raise RenderError("the softmax does not run over the key dims of the scores")
        for name, a, b in (("batch", c1.batch_dims, c2.batch_dims), ("query", c1.m_dims, c2.m_dims),
                           ("key", c1.n_dims, c2.k_dims)):
            if c1.shape_of(a) != c2.shape_of(b):
                raise RenderError(f"{name} dims differ between the two products: "
                                  f"{c1.shape_of(a)} vs {c2.shape_of(b)}")
        if c1.shape_of(c1.batch_dims) != tuple(t[j] for j in self.t_groups["batch"]):
            raise RenderError("batch dims of the softmax and the scores differ")
        # which dim of the scores (C1's output) and of T each dim of C2's full shape stands for
        self.c2_to_f1: dict[int, int] = {}
        self.c2_to_t: dict[int, int] = {}
        for g, d1, d2 in (("batch", c1.batch_dims, c2.batch_dims), ("query", c1.m_dims, c2.m_dims),
                          ("key", c1.n_dims, c2.k_dims)):
            self.c2_to_f1.update(zip(d2, d1))
            self.c2_to_t.update(zip(d2, self.t_groups[g]))

    def _check_p_view(self) -> None:
        """The view from C2's left operand into T pairs queries, keys and batches as the scores."""
        c2, t = self.c2, self.plan.shape
        f2t = _f2_to_t(self.p_view.arg, t)
        group2 = {}
        for g, dims in (("batch", c2.batch_dims), ("query", c2.m_dims), ("key", c2.k_dims),
                        ("head", c2.n_dims)):
            for d in dims:
                group2[d] = g
        for i, j in enumerate(f2t):
            if j < 0:
                continue
            want = next(g for g, js in self.t_groups.items() if j in js)
            if group2.get(i) != want:
                raise RenderError("the value product does not pair queries, keys and batches the "
                                  "way the scores do")

    def tile_view_ok(self, n: Node) -> bool:
        """True when view ``n`` over the scores (C1) or a softmax row value reads, at each element
        of T or of C2's full shape, the element of the same batch, query (and key) position; a
        view into any other shape is trusted (the renderer resolves the source by tile, not by
        index)."""
        v, src = n.arg, n.srcs[0]
        if v.offset or v.mask is not None:
            return False
        cs = contiguous_strides(src.shape)
        if tuple(v.shape) == tuple(self.c2.full):
            corr = self.c2_to_f1 if src is self.c1.node else {
                d: j for d, j in self.c2_to_t.items() if d not in self.c2.k_dims}
        elif tuple(v.shape) == tuple(self.plan.shape):
            if src is not self.c1.node:
                return self.plan.is_row_broadcast(v)
            corr = {j: f for j, f in enumerate(self.t2f1) if f >= 0}
        else:
            return True
        for i, (d, st) in enumerate(zip(v.shape, v.strides)):
            if d == 1:
                continue
            j = corr.get(i)
            if j is None:
                if st != 0:
                    return False
            elif src.shape[j] != d or st != cs[j]:
                return False
        return True


def _order_kept(n: Node) -> bool:
    """Whether view ``n`` reads its source in its own element order (a reshape)."""
    v, src = n.arg, n.srcs[0]
    if v.offset or v.mask is not None or n.numel != src.numel:
        return False
    return all(d == 1 or st == cs for d, st, cs in zip(v.shape, v.strides, contiguous_strides(v.shape)))


def _is_exp_of_row(e: Node, sm: OnlineSoftmax) -> bool:
    """``e == exp2((x - view(max)) * c)`` with the softmax's own max and scale ``c``: the form whose
    running-max rescaling the flash loop applies."""
    from lumc.backends.triton.render_norm import _split_scaled
    if e.op != "Exp2":
        return False
    sc = _split_scaled(e.srcs[0])
    if sc is None or sc[1] != sm.scale or sc[0].op != "Add":
        return False
    for x, y in (sc[0].srcs, reversed(sc[0].srcs)):
        neg = _split_scaled(y)
        if neg is not None and neg[1] == -1.0 and neg[0].op == "View" and neg[0].srcs[0] is sm.m:
            under = toposort([x])
            return sm.m not in under and sm.s not in under
    return False


def render_attention(kernel: Kernel) -> KernelParts:
    """Render a flash-attention kernel (see module docstring).

    Raises:
        RenderError: when the meaning is not ``softmax(f(q k^T)) v`` in the form described above.
    """
    ap = AttentionPlan(kernel)
    c1, c2, plan, sm = ap.c1, ap.c2, ap.plan, ap.softmax
    if c1.a.dtype not in DOT_DTYPES or c2.b.dtype not in DOT_DTYPES:
        raise RenderError(f"attention products need f16/bf16/f32 operands, got {c1.a.dtype}")
    D, DV = c1.K, c2.N
    if D > MAX_HEAD or DV > MAX_HEAD:
        raise RenderError(f"head dims {D}/{DV} exceed {MAX_HEAD} (the q and acc tiles must fit)")
    LQ, LK, B = c1.M, c1.N, c1.batch
    BD, BDV = max(16, next_pow2(D)), max(16, next_pow2(DV))
    nodes = kernel.meaning.nodes()
    reads = reads_of(nodes)
    params, ptrs, consts = make_params(kernel, reads)
    big = needs_int64(nodes, (B * LQ * LK,), (c1.full, c2.full))
    w = SourceWriter()
    state = {"scores": None, "row_eval": False, "in_loop": False}
    row_vals: dict[Node, str] = {}
    overrides: dict[Node, str] = {}

    def resolve(ev, n, idx, mask, level):
        if n.op in ("SumReduce", "MaxReduce") and n in ap.operand_nodes:
            return operand_row_reduce(ev, n, idx, level)
        if n is c1.node:
            return state["scores"]
        if n is c2.node:
            return state["out"]
        if n.op == "View" and n.srcs[0] is c1.node:
            return state["scores"]
        if ap.pushed and n.op == "View" and n.srcs[0] in (sm.m, sm.s) and tuple(n.shape) == c2.full:
            # a row statistic broadcast over C2's (query, key) tile
            if state["row_eval"]:
                return row_vals[n.srcs[0]]
            if n.srcs[0] is sm.m and state["in_loop"]:
                return w.bind("m_safe[:, None]", "b", level)
            raise RenderError(f"node {n!r}: the softmax's sum is read inside the key loop")
        if n in overrides:
            return w.bind(f"{overrides[n]}[:, None]", "b", level)
        if n in row_vals:   # a statistic per query: a column of the [BLOCK_M, BLOCK_DV] tile
            return row_vals[n] if state["row_eval"] else w.bind(f"{row_vals[n]}[:, None]", "b",
                                                                 level)
        if n.op == "View" and plan.kind.get(n) == "full" and plan.kind.get(n.srcs[0]) == "row":
            src = n.srcs[0]
            rv = ev.value(src, reshape_index(row_idx, plan.reduced_shape, src.shape), "rmask", 0)
            return rv if state["row_eval"] else w.bind(f"{rv}[:, None]", "b", level)
        return None

    # the operand being loaded: (its head-dim index, its mask, the tile axis of the head dim)
    operand: dict = {}
    row_reduced: dict = {}

    def operand_row_reduce(ev, n, idx, level):
        """A row statistic of a normalization formed on an operand's load (QK-norm): the operand
        tile holds its rows whole along the head dim, so the statistic is reduced from the
        tile's own elements (``fusion_norms.HeadNormInAttention`` admits only a norm over the last
        axis whose rows reach the tile along its head dim)."""
        if not operand:
            raise RenderError(f"node {n!r}: a reduction under an operand, outside its load")
        (ax,) = n.arg if len(n.arg) == 1 else (None,)
        if ax is None or n.srcs[0].shape[ax] > operand["width"]:
            raise RenderError(f"node {n!r}: an operand's reduction must run over its head dim")
        key = (n, tuple(i for k, i in enumerate(idx) if k != ax), operand["d"])
        if key in row_reduced:
            return row_reduced[key]
        full = list(idx)
        full[ax] = operand["d"]
        x = ev.value(n.srcs[0], full, operand["mask"], level)
        acc = exprs.tl_dtype(n.dtype.accumulator)
        fn, other = ("tl.sum", "0.0") if n.op == "SumReduce" else ("tl.max", "float('-inf')")
        axis = operand["axis"]
        keep = "[:, None]" if axis == 1 else "[None, :]"
        red = w.bind(f"{fn}(tl.where({operand['mask']}, {x}.to({acc}), {other}), axis={axis})"
                     f"{keep}.to({exprs.tl_dtype(n.dtype)})", "r", level)
        row_reduced[key] = red
        return red

    ev = Evaluator(w, ptrs, resolve, "tl.int64" if big else "tl.int32")

    def load_operand(node, idx, mask, level, d, axis, width):
        """An operand tile (``node`` at ``idx``), with its head-dim index ``d`` along tile
        ``axis`` (``width`` wide) known to :func:`operand_row_reduce` while it is evaluated."""
        operand.update(d=d, mask=mask, axis=axis, width=width)
        try:
            return ev.value(node, idx, mask, level)
        finally:
            operand.clear()

    i64 = ".to(tl.int64)" if big else ""
    w.line("pid_m = tl.program_id(0)")
    w.line(f"pid_b = tl.program_id(1){i64}")
    w.line(f"rm = pid_m{i64} * BLOCK_M + tl.arange(0, BLOCK_M)      # this program's queries")
    w.line(f"rmask = rm < {LQ}")
    w.line("rd = tl.arange(0, BLOCK_D)")
    w.line("rdv = tl.arange(0, BLOCK_DV)")
    bidx = bind_all(w, unravel("pid_b", c1.shape_of(c1.batch_dims)), "bb")
    ev.scalar_names |= {b for b in bidx if b.isidentifier()} | {"pid_b"}
    t = plan.shape

    def t_index(rows: str, keys: str | None) -> list[str]:
        idx = ["0"] * len(t)
        for j, e in zip(ap.t_groups["batch"], bidx):
            idx[j] = e
        qs = bind_all(w, unravel(rows, tuple(t[j] for j in ap.t_groups["query"])), "tq")
        for j, e in zip(ap.t_groups["query"], qs):
            idx[j] = e
        if keys is not None:
            ks = bind_all(w, unravel(keys, tuple(t[j] for j in ap.t_groups["key"])), "tk", 1)
            for j, e in zip(ap.t_groups["key"], ks):
                idx[j] = e
        return idx

    row_idx = t_index("rm", None)
    # the q tile, loaded once
    q_idx = place(c1, {c1.batch_dims: bidx,
                       c1.m_dims: bind_all(w, unravel("rm[:, None]", c1.shape_of(c1.m_dims)), "qm"),
                       c1.k_dims: bind_all(w, unravel("rd[None, :]", c1.shape_of(c1.k_dims)), "qd")})
    w.line(f"q_mask = rmask[:, None] & (rd[None, :] < {D})")
    q = load_operand(c1.a, q_idx, "q_mask", 0, "rd[None, :]", 1, D)
    md = exprs.tl_dtype(sm.m.dtype)
    sd = exprs.tl_dtype(sm.s.dtype.accumulator)
    w.line(f"m_run = tl.full([BLOCK_M], float('-inf'), {md})")
    w.line(f"l_run = tl.zeros([BLOCK_M], {sd})")
    w.line("acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)")
    if rendering_sized():   # one source for every size of a bucket: the offset must hold at all
        lim = sized_key_limit(sm.m.srcs[0], c1.node, ap.t_groups, LK, sized_substitution)
    else:
        lim = key_limit_offset(sm.m.srcs[0], c1.node, ap.t_groups, LK)
    if lim is None:
        w.open(f"for n_start in range(0, {LK}, BLOCK_N):")
    else:   # a static (causal) mask: key blocks past the last one any of these queries sees
        w.line(f"n_end = tl.minimum({LK}, (pid_m + 1) * BLOCK_M + {lim})   # later keys: masked")
        w.open("for n_start in range(0, n_end, BLOCK_N):")
    w.line(f"rn = (n_start + tl.arange(0, BLOCK_N)){i64}" if big else
           "rn = n_start + tl.arange(0, BLOCK_N)")
    w.line(f"nmask = rn < {LK}")
    w.line("mask2 = rmask[:, None] & nmask[None, :]")
    kt_idx = place(c1, {c1.batch_dims: bidx,
                        c1.k_dims: bind_all(w, unravel("rd[:, None]", c1.shape_of(c1.k_dims)), "kd", 1),
                        c1.n_dims: bind_all(w, unravel("rn[None, :]", c1.shape_of(c1.n_dims)), "kn", 1)})
    w.line(f"k_mask = (rd[:, None] < {D}) & nmask[None, :]")
    kt = load_operand(c1.b, kt_idx, "k_mask", 1, "rd[:, None]", 0, D)
    s = attention_dot(w, w.fresh("s"), q, kt, c1.a.dtype, 1)
    if c1.node.dtype != dt.f32:
        s = w.bind(f"{s}.to({exprs.tl_dtype(c1.node.dtype)})", "s", 1)
    state["scores"] = s
    full = t_index("rm[:, None]", "rn[None, :]")
    if ap.pushed:
        q2 = bind_all(w, unravel("rm[:, None]", c2.shape_of(c2.m_dims)), "pq")
        k2 = bind_all(w, unravel("rn[None, :]", c2.shape_of(c2.k_dims)), "pk", 1)
    x = ev.value(sm.m.srcs[0], full, "mask2", 1)
    xm = w.bind(f"tl.where(mask2, {x}, float('-inf'))", "a", 1)
    w.line(f"m_blk = tl.max({xm}, axis=1)")
    if all(u is sm.bcast for u in nodes if sm.m in u.srcs):
        # the row max reaches the outputs only through the exponent: a NaN score already makes
        # its row's l and acc NaN (exp2(NaN) = NaN, summed and multiplied in), so the max need
        # not carry it and the block's NaN reduction is dropped
        w.line(f"m_new = tl.maximum(m_run, m_blk).to({md})")
    else:   # the max is an output or feeds the epilogue: it propagates NaN as ReduceMax does
        w.line(f"nan_blk = tl.max(({xm} != {xm}).to(tl.int8), axis=1) > 0")
        w.line(f"m_new = _max_nan(m_run, tl.where(nan_blk, float('nan'), m_blk)).to({md})")
    w.line("m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)")
    c = exprs.render_scalar(sm.scale, sm.m.dtype)
    w.line(f"alpha = tl.exp2((m_run - m_safe).to(tl.float32) * {c})")
    overrides[sm.bcast] = "m_safe"
    e = ev.value(ap.e, full, "mask2", 1)
    del overrides[sm.bcast]
    p = w.bind(f"tl.where(mask2, {e}, 0.0)", "p", 1)
    w.line(f"l_run = l_run * alpha + tl.sum({p}.to({sd}), axis=1)")
    if ap.pushed:
        # the value product's own copy of the numerator, in C2's domain at head index 0
        state["in_loop"] = True
        e2 = ev.value(ap.e2, place(c2, {c2.batch_dims: bidx, c2.m_dims: q2, c2.k_dims: k2}),
                      "mask2", 1)
        state["in_loop"] = False
        p = w.bind(f"tl.where(mask2, {e2}, 0.0)", "p", 1)
    v_idx = place(c2, {c2.batch_dims: bidx,
                       c2.k_dims: bind_all(w, unravel("rn[:, None]", c2.shape_of(c2.k_dims)), "vn", 1),
                       c2.n_dims: bind_all(w, unravel("rdv[None, :]", c2.shape_of(c2.n_dims)), "vd", 1)})
    w.line(f"v_mask = nmask[:, None] & (rdv[None, :] < {DV})")
    v = load_operand(c2.b, v_idx, "v_mask", 1, "rdv[None, :]", 1, DV)
    pv = attention_dot(w, w.fresh("pv"), f"{p}.to({exprs.tl_dtype(c2.b.dtype)})", v, c2.b.dtype, 1)
    w.line(f"acc = acc * alpha[:, None] + {pv}")
    w.line("m_run = m_new")
    w.close()
    # the softmax's statistics per row, then the row factor G, then C2 and its epilogue
    row_vals[sm.m] = "m_run"
    row_vals[sm.s] = w.bind(f"tl.where(m_run == float('-inf'), float('nan'), l_run)"
                            f".to({exprs.tl_dtype(sm.s.dtype)})", "red")
    state["row_eval"] = True
    if ap.pushed:
        q2r = bind_all(w, unravel("rm", c2.shape_of(c2.m_dims)), "gq")
        g = ev.value(ap.g2, place(c2, {c2.batch_dims: bidx, c2.m_dims: q2r}), "rmask", 0)
    else:
        g = ev.value(ap.g, row_idx, "rmask", 0)
    state["row_eval"] = False
    out = f"acc * {g}[:, None]" if g not in ("", None) else "acc"
    if c2.node.dtype != dt.f32:
        out = f"({out}).to({exprs.tl_dtype(c2.node.dtype)})"
    state["out"] = w.bind(out, "o")
    fr2 = tuple(1 if d in c2.k_dims else s_ for d, s_ in enumerate(c2.full))
    o_idx = place(c2, {c2.batch_dims: bidx,
                       c2.m_dims: bind_all(w, unravel("rm[:, None]", c2.shape_of(c2.m_dims)), "om"),
                       c2.n_dims: bind_all(w, unravel("rdv[None, :]", c2.shape_of(c2.n_dims)), "od")})
    w.line(f"o_mask = rmask[:, None] & (rdv[None, :] < {DV})")
    addr = flat_index(o_idx, fr2)
    if not (c2.m_dims and c2.n_dims):
        addr = f"{addr} + tl.zeros([BLOCK_M, BLOCK_DV], {'tl.int64' if big else 'tl.int32'})"
    rows_out = {name: o for name, o in kernel.meaning.outputs.items() if o in ap.row_outputs}
    for name, o in kernel.meaning.outputs.items():
        if name in rows_out:
            continue
        val = ev.value(o, reshape_index(o_idx, fr2, o.shape), "o_mask", 0)
        w.line(f"tl.store({name}_ptr + ({addr}), {val}, mask=o_mask)")
    if rows_out:
        # row values of the softmax's statistics (``max < lowest``: a row with every key masked),
        # one per query of this program, at the statistics' own shape
        state["row_eval"] = True
        raddr = flat_index(row_idx, plan.reduced_shape)
        for name, o in rows_out.items():
            val = ev.value(o, reshape_index(row_idx, plan.reduced_shape, o.shape), "rmask", 0)
            w.line(f"tl.store({name}_ptr + ({raddr}), {val}, mask=rmask)")
        state["row_eval"] = False
    problem = {"M": LQ, "N": LK, "D": D, "DV": DV, "batch": B, "BLOCK_D": BD, "BLOCK_DV": BDV,
               "itemsize": c1.a.dtype.itemsize, "dot_dtype": dot_dtype(c1.a.dtype),
               "SCORE_BYTES": score_bytes(nodes, (c1.a, c1.b, c2.b))}
    notes = [f"attention batch={B} queries={LQ} keys={LK} head={D}/{DV}; softmax scale "
             f"{sm.scale!r} (exp2 base)"]
    if big:
        notes.append("int64 indexing (a tensor or address passes 2**31)")
    return KernelParts(
        form=kernel.form, variant="flash", params=params,
        constexprs=("BLOCK_M", "BLOCK_N", "PRECISION"),
        body=w.body(), grid=f"triton.cdiv({LQ}, BLOCK_M), {B}", problem=problem,
        config_space="attention", constants=consts, notes=notes,
        extra_constexprs={"BLOCK_D": BD, "BLOCK_DV": BDV})


