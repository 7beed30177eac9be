"""Matmul, batched matmul and convolution (im2col views) kernels: ``tl.dot`` tiles, fp32 accumulator,
fused prologue and epilogue.

The meaning's ``SumReduce(Mul(a, b))`` is classified by ``contraction`` into ``M``/``N``/``K``/batch
dims. A program computes one ``BLOCK_M x BLOCK_N`` output tile of one batch, walking ``K`` in
``BLOCK_K`` steps. Its operand tiles are ``a`` and ``b`` evaluated at the tile's indices through their
view chains, so transposed operands (swapped strides), broadcast batch dims (stride 0) and a
convolution's padded sliding windows (offset, mask) are all read in place. Programs are ordered in
groups of ``GROUP_M`` row tiles so neighbouring programs share ``b`` tiles in L2 (Triton tutorial 03).

The epilogue (bias, activation, residual: anything elementwise over the product, through pure
reshapes) runs on the accumulator tile before the single store. fp16/bf16 operands multiply on
tensor cores and accumulate in fp32; the operand precision of the ``tl.dot`` is the config's
``PRECISION`` knob (``dot_precision.py``: fp32 operands default to split TF32, ``tf32x3``, on tensor
cores). Other dtypes (fp64, integers) go through the row engine.

FLOPs ``2*M*N*K`` per batch; bytes at least ``A + B + C`` once; the target is the tensor-core peak.
"""
from __future__ import annotations

from lumc.ir import dtypes as dt
from lumc.ir.graph import Node, toposort
from lumc.ir.kernels import Kernel
from lumc.ir.ops import ELEMENTWISE
from lumc.ir.views import View
from lumc.backends.triton import exprs
from lumc.backends.triton.codegen import Evaluator, RenderError, SourceWriter, reads_of
from lumc.backends.triton.contraction import Contraction, find_contractions, paired_contractions
from lumc.backends.triton.dot_precision import dot_dtype, emit_dot
from lumc.backends.triton.indexing import (flat_index, is_pure_reshape, needs_int64,
                                           reshape_index, served_size, store_order, store_through,
                                           unravel)
from lumc.backends.triton.norm_epilogue import aligned_reads, plan_row_epilogue, row_broadcasts
from lumc.backends.triton.norm_prologue import RowStatistics, plan_row_prologue
from lumc.backends.triton.configs import splitk_useful
from lumc.backends.triton.source import KernelParts, Workspace, make_params

DOT_DTYPES = (dt.f16, dt.bf16, dt.f32)


def dependents(nodes: list[Node], root: Node) -> set[Node]:
    """Nodes of ``nodes`` (topological) that depend on ``root``, ``root`` included."""
    dep = {root}
    for n in nodes:
        if any(s in dep for s in n.srcs):
            dep.add(n)
    return dep


def _scalar_read(x: Node) -> bool:
    """``x`` is one value broadcast (a scalar constant, or a view of one)."""
    while x.op == "View":
        x = x.srcs[0]
    return x.numel == 1


def _spans(x: Node, dim_groups) -> bool:
    """``x`` (a contraction operand: the product's full shape) is a view of an input that steps
    along some dim of each group that has one (its tile's rows and columns: ``tl.load`` gives the
    tile both axes). False for a scalar broadcast (a ConstantOfShape weight), a vector expanded
    along a tile axis, a view of a view, or a computed value: their tile may lack an axis."""
    from lumc.ir.views import View as ViewArg
    if x.op != "View" or x.srcs[0].op != "Input" or not isinstance(x.arg, ViewArg):
        return False
    st = x.arg.strides
    return all(not dims or any(st[d] != 0 for d in dims) for dims in dim_groups)


def _whole(w: SourceWriter, x: Node, expr: str, dim_groups, shape: str, prefix: str,
           level: int) -> str:
    """``expr`` (operand ``x``'s tile) broadcast to ``[shape]`` where ``x`` may not span it
    (``tl.dot`` takes whole tiles only; the broadcast of a whole tile is free)."""
    if _spans(x, dim_groups):
        return expr
    return w.bind(f"tl.broadcast_to({expr}, ({shape}))", prefix, level)


def stored_view(o: Node, dep: set[Node]) -> View | None:
    """The view through which output ``o`` of a contraction kernel's meaning reads the product's
    side (``dep``: the nodes that depend on the product), when that view moves elements (a
    slice, a permutation: a model output read off the product); None when ``o`` reads it in the
    product's order (through reshapes only). The kernel then computes ``o`` at the index the view
    gives each tile position and stores it there
    (:func:`~lumc.backends.triton.indexing.store_through`), instead of a copy kernel re-reading
    the product.

    Raises:
        RenderError: ``o`` reads the product's side through several such views, through one that
            is not ``o``'s shape or that :func:`~lumc.backends.triton.indexing.store_order`
            cannot invert, or both through one and in the product's order.
    """
    found = _stored_view_nodes(o, dep)
    return found[0].arg if found else None


def _stored_view_nodes(o: Node, dep: set[Node]) -> list[Node]:
    """The ``View`` nodes of :func:`stored_view` (one view, perhaps over several sources in the
    product's order); none when ``o`` reads the product in its order. Nodes, not their views:
    the product below another such view (``T(2 * T(p))`` with one ``View`` object twice) is read
    at the tile's transposed position, which the kernel does not hold."""
    views, direct, seen, stack = [], False, set(), [o]
    while stack:
        x = stack.pop()
        if id(x) in seen or x not in dep:
            continue
        seen.add(id(x))
        if x.op == "View" and x.srcs[0] in dep and not is_pure_reshape(x.arg, x.srcs[0].shape):
            views.append(x)
            continue
        direct |= not x.srcs or not any(s in dep for s in x.srcs)    # the product itself
        stack.extend(x.srcs)
    if not views:
        return []
    v = views[0].arg
    if len({x.arg for x in views}) > 1 or direct or v.shape != o.shape or store_order(v) is None:
        raise RenderError(f"output {o!r} reads the product through views it cannot be stored "
                          f"through ({len(views)} views, in the product's order too: {direct})")
    return views


def stored_view_ops(kernel: Kernel) -> int:
    """Integer ops per output tile element that a matmul kernel spends finding where its
    :func:`stored_view` outputs go and storing them: per such output, seven per non-unit dim of
    the view (a signed division by a constant is a multiply-high, a shift and a sign fix:
    Granlund and Montgomery, "Division by invariant integers using multiplication", PLDI 1994;
    the remainder's multiply-subtract; the bound's compare and its ``&``; the address term), two
    for the offset and its mask, and one store instruction per element: an address computed
    through divisions is not proven contiguous (Triton's axis analysis), so the store is not
    vectorized. Its DRAM bytes are the output's (partial sectors merge in L2, which is
    write-back). The contraction is the one :func:`render_matmul` tiles (a normalization formed
    on load adds its sums of squares)."""
    nodes = kernel.meaning.nodes()
    try:
        c, c2 = _tiled_contractions(nodes)
    except RenderError:
        return 0
    if c2 is not None:        # a paired kernel stores no output through a view
        return 0
    dep = dependents(nodes, c.node)
    ops = 0
    for o in kernel.meaning.outputs.values():
        try:
            v = stored_view(o, dep)
        except RenderError:
            continue
        if v is not None:
            ops += 7 * sum(d > 1 for d in v.shape) + 3
    return ops


def check_epilogue(nodes: list[Node], dep: set[Node], root: Node,
                   outputs: tuple[Node, ...] = ()) -> None:
    """Raise ``RenderError`` for a node over the product that is not elementwise or a reshape,
    but the view through which an output in ``outputs`` is stored (:func:`stored_view`)."""
    stored = {id(v) for o in outputs for v in _stored_view_nodes(o, dep)}
    for n in nodes:
        if n not in dep or n is root or id(n) in stored:
            continue
        if n.op == "View":
            if not is_pure_reshape(n.arg, n.srcs[0].shape):
                raise RenderError(f"node {n!r}: the epilogue moves elements of the product "
                                  "(only reshapes may follow a contraction)")
        elif n.op not in ELEMENTWISE and n.op != "Contiguous":
            raise RenderError(f"node {n!r}: op {n.op} cannot be a matmul epilogue")


def place(c: Contraction, groups: dict[tuple, list[str]]) -> list[str]:
    """Index list over the full shape from per-group index lists (other dims 0)."""
    idx = ["0"] * len(c.full)
    for dims, exprs_ in groups.items():
        for d, e in zip(dims, exprs_):
            idx[d] = e
    return idx


def bind_all(w: SourceWriter, es: list[str], prefix: str, level: int = 0) -> list[str]:
    return [e if (e == "0" or e.isidentifier()) else w.bind(e, prefix, level) for e in es]


def _tiled_contractions(nodes: list[Node]) -> tuple[Contraction, Contraction | None]:
    """The contraction a matmul kernel tiles, and the paired one sharing its left operand (a
    gated MLP's gate and up: two accumulators) or None.

    Raises:
        RenderError: none, or several besides a normalization's statistics.
    """
    pair = paired_contractions(nodes)
    if pair is not None:
        return pair
    cs = find_contractions(nodes)
    if len(cs) > 1:   # a sum of squares in a normalization prologue is a batch of dot products
        cs = [c for c in cs if max(c.M, c.N) > 1]
    if len(cs) > 1:   # a statistic of a scaled value (sum(2 s)) is a product with a scalar
        cs = [c for c in cs if not (_scalar_read(c.a) or _scalar_read(c.b))]
    if len(cs) != 1:
        raise RenderError(f"a matmul kernel needs exactly one SumReduce(Mul(a, b)), found {len(cs)}")
    return cs[0], None


def render_matmul(kernel: Kernel) -> KernelParts:
    """Render a matmul kernel (see module docstring).

    Raises:
        RenderError: no contraction, several, or an epilogue that is not elementwise.
    """
    from lumc.backends.triton.render_reduction import render_row
    nodes = kernel.meaning.nodes()
    c, c2 = _tiled_contractions(nodes)
    if c.a.dtype not in DOT_DTYPES or c.K == 0:
        return render_row(kernel, None)
    others = [n for n in nodes if n.op in ("SumReduce", "MaxReduce") and n is not c.node
              and (c2 is None or n is not c2.node)]
    under_a = set(toposort([c.a]))
    # a normalization formed on load: statistics of the operand's rows (prologue) and of a
    # residual's rows (epilogue)
    rowp = plan_row_prologue(c, nodes) if any(n in under_a for n in others) else None
    dep = dependents(nodes, c.node)
    check_epilogue(nodes, dep, c.node, tuple(kernel.meaning.outputs.values()))
    if c2 is not None:
        dep2 = dependents(nodes, c2.node)
        check_epilogue(nodes, dep2, c2.node)
        dep |= dep2
    e_stats = [n for n in others if rowp is None or n not in rowp.stats]
    if c2 is not None and e_stats:
        raise RenderError("a paired matmul does not normalize a residual in its epilogue")
    rowe = plan_row_epilogue(c, nodes, e_stats, dep) if e_stats else None
    plans = [p for p in (rowp, rowe) if p is not None]
    # outputs: the product's tile, or row values of the statistics (written once per row, for
    # other kernels that form the same normalization on load)
    row_outs: dict[str, tuple[Node, int]] = {}
    for name, o in kernel.meaning.outputs.items():
        if o in dep:
            continue
        owner = next((i for i, p in enumerate(plans) if o in p.rows), None)
        if owner is None:
            raise RenderError(f"output {name} does not depend on the product")
        row_outs[name] = (o, owner)
    aligned = aligned_reads(c, [o for name, o in kernel.meaning.outputs.items()
                                if name not in row_outs] + [r.srcs[0] for r in e_stats],
                            row_broadcasts(nodes, plans),
                            set(others) | ({c2.node} if c2 is not None else set())
                            ) if plans else set()
    reads = reads_of(nodes)
    params, ptrs, consts = make_params(kernel, reads)
    big = needs_int64(nodes, (c.M * c.N * c.batch, c.M * c.K, c.K * c.N), (c.full,))
    w = SourceWriter()
    acc_name = "acc"

    M, N, K, B = c.M, c.N, c.K, c.batch
    i64 = ".to(tl.int64)" if big else ""
    # split-K by the sizes the kernel serves (a size-generic kernel: its bucket's top, where the
    # search chose its config)
    split = not plans and c2 is None and splitk_useful(
        {"M": served_size(M), "N": served_size(N), "K": served_size(K), "batch": served_size(B)})
    stats: list[RowStatistics] = []

    def evaluator(wr: SourceWriter) -> Evaluator:
        def resolve(ev, n, idx, mask, level):
            for cc, name in ((c, acc_name), (c2, "acc2")):
                if cc is not None and n is cc.node:
                    if cc.node.dtype == dt.f32:
                        return name
                    return wr.bind(f"{name}.to({exprs.tl_dtype(cc.node.dtype)})", "t", level)
            for st in stats:
                got = st.resolve(ev, n, idx, mask, level)
                if got is not None:
                    return got
            return None
        return Evaluator(wr, ptrs, resolve, "tl.int64" if big else "tl.int32")

    ev = evaluator(w)
    bidx = _tile_header(w, ev, c, bool(plans), i64)
    if rowp is not None:
        lead = bind_all(w, unravel("rm_a[:, None]", rowp.lead), "am", 0)
        stats.append(RowStatistics(rowp, w, ev, lead, aligned))
        stats[-1].emit(K, i64)
    if rowe is not None:
        lead = bind_all(w, unravel("rm_a[:, None]", rowe.lead), "em", 0)
        stats.append(RowStatistics(rowe, w, ev, lead, aligned))
        stats[-1].emit(N, i64, "BLOCK_N")
    if row_outs:
        # one program per row block (the first column group) writes its rows' values
        cols = {name: ev.value(o, stats[owner].row_idx, None, 0)
                for name, (o, owner) in row_outs.items()}
        w.open("if pid_n == 0:")
        for name, col in cols.items():
            w.line(f"tl.store({name}_ptr + rm[:, None], {col}, mask=rm_mask[:, None])")
        w.close()
    if plans:
        w.open("for n_tile in range(0, N_TILES):")
        w.line(f"rn = (pid_n{i64} * N_TILES + n_tile) * BLOCK_N + tl.arange(0, BLOCK_N)")
    else:
        w.line(f"rn = pid_n{i64} * BLOCK_N + tl.arange(0, BLOCK_N)")
    lo = w.level          # the level of one output tile (the K loop is one deeper)
    w.line(f"rn_mask = rn < {N}")
    w.line(f"rn_b = rn % {N}")
    # operand tiles: a is [BLOCK_M, BLOCK_K], b is [BLOCK_K, BLOCK_N]
    w.line(f"acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)")
    if c2 is not None:
        w.line(f"acc2 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)")
    if split:   # this program's share of K: whole BLOCK_K steps, the last share ragged
        w.line("pid_k = tl.program_id(2)")
        w.line(f"k_chunk = tl.cdiv(tl.cdiv({K}, SPLIT_K), BLOCK_K) * BLOCK_K")
        w.line("k_lo = pid_k * k_chunk")
        w.line(f"k_hi = tl.minimum(k_lo + k_chunk, {K})")
        w.open("for k_start in range(k_lo, k_hi, BLOCK_K):")
    else:
        w.open(f"for k_start in range(0, {K}, BLOCK_K):")
    # (k_start + arange) as a whole: in the interpreter k_start is a Python int
    w.line("rk = (k_start + tl.arange(0, BLOCK_K)).to(tl.int64)" if big else
           "rk = k_start + tl.arange(0, BLOCK_K)")
    # where M (or N) is 1 no index spans the tile's rows: the mask gives the tile its shape
    w.line(f"a_mask = rk[None, :] < {K}" if c.m_dims else
           f"a_mask = (rk[None, :] < {K}) & (rm_a[:, None] < {M})")
    w.line(f"b_mask = rk[:, None] < {K}" if c.n_dims else
           f"b_mask = (rk[:, None] < {K}) & (rn_b[None, :] < {N})")
    lk = lo + 1           # inside the K loop
    a_idx = place(c, {c.batch_dims: bidx,
                      # row and column indices are loop-invariant: bound outside the K loop
                      c.m_dims: bind_all(w, unravel("rm_a[:, None]", c.shape_of(c.m_dims)), "am", lo),
                      c.k_dims: bind_all(w, unravel("rk[None, :]", c.shape_of(c.k_dims)), "ak", lk)}
                  ) if rowp is None else None
    b_idx = place(c, {c.batch_dims: bidx,
                      c.k_dims: bind_all(w, unravel("rk[:, None]", c.shape_of(c.k_dims)), "bk", lk),
                      c.n_dims: bind_all(w, unravel("rn_b[None, :]", c.shape_of(c.n_dims)), "bn", lo)})
    a = (ev.value(c.a, a_idx, "a_mask", lk) if rowp is None else
         ev.value(rowp.p, stats[0].p_index("rk[None, :]", "ak", lk), "a_mask", lk))
    b = ev.value(c.b, b_idx, "b_mask", lk)
    # a prologue may turn the zeros of masked-off lanes into something else: zero them again
    if c.a.op not in ("View", "Input"):
        a = w.bind(f"tl.where(a_mask, {a}, 0.0)", "a", lk)
    if c.b.op not in ("View", "Input"):
        b = w.bind(f"tl.where(b_mask, {b}, 0.0)", "b", lk)
    # an operand constant along a tile axis (a scalar weight: ConstantOfShape; an Expand of a
    # column) evaluates to a scalar or a [BLOCK_K, 1] tile, which tl.dot refuses: make it whole
    a = _whole(w, c.a if rowp is None else rowp.p, a, (c.m_dims, c.k_dims), "BLOCK_M, BLOCK_K",
               "a", lk)
    b = _whole(w, c.b, b, (c.k_dims, c.n_dims), "BLOCK_K, BLOCK_N", "b", lk)
    products = [(b, "acc")]
    if c2 is not None:   # the same a tile (and its prologue), the second right operand
        b2 = ev.value(c2.b, b_idx, "b_mask", lk)
        if c2.b.op not in ("View", "Input"):
            b2 = w.bind(f"tl.where(b_mask, {b2}, 0.0)", "b", lk)
        products.append((_whole(w, c2.b, b2, (c.k_dims, c.n_dims), "BLOCK_K, BLOCK_N", "b", lk),
                         "acc2"))
    emit_dot(w, a, products, c.a.dtype, lk)
    w.close()
    finish = None
    if split:
        w.line("c_mask = rm_mask[:, None] & rn_mask[None, :]")
        w.open("if SPLIT_K == 1:")
        _epilogue(w, ev, c, kernel, bidx, lo + 1, big)
        w.close()
        w.open("else:      # this share's partial tile, merged by the finish kernel")
        w.line(f"tl.store(ws_ptr + {_ws_addr(M, N, i64, 'pid_k')}, acc, mask=c_mask)")
        w.close()
        w2 = SourceWriter()
        ev2 = evaluator(w2)
        bidx2 = _tile_header(w2, ev2, c, False, i64)
        w2.line(f"rn = pid_n{i64} * BLOCK_N + tl.arange(0, BLOCK_N)")
        w2.line(f"rn_mask = rn < {N}")
        w2.line("c_mask = rm_mask[:, None] & rn_mask[None, :]")
        w2.line("# the partial tiles summed in a fixed order: the same bits on every run")
        w2.line(f"acc = tl.load(ws_ptr + {_ws_addr(M, N, i64, '0')}, mask=c_mask, other=0.0)")
        w2.open("for s in range(1, SPLIT_K):")
        w2.line(f"acc += tl.load(ws_ptr + {_ws_addr(M, N, i64, 's')}, mask=c_mask, other=0.0)")
        w2.close()
        _epilogue(w2, ev2, c, kernel, bidx2, 0, big)
        finish = w2.body()
    else:
        _epilogue(w, ev, c, kernel, bidx, lo, big, row_outs)
    if plans:
        w.close()
    problem = {"M": M, "N": N, "K": K, "batch": B, "itemsize": c.a.dtype.itemsize,
               "dot_dtype": dot_dtype(c.a.dtype)}
    notes = [f"GEMM M={M} (dims {list(c.m_dims)}) N={N} (dims {list(c.n_dims)}) "
             f"K={K} (dims {list(c.k_dims)}) batch={B} over {list(c.full)}"]
    stored = [name for name, o in kernel.meaning.outputs.items() if stored_view(o, dep)]
    if stored:
        notes.append(f"stores {', '.join(stored)} through views of the product (slices, "
                     "permutations: each tile position's index found from the view's strides)")
    if c2 is not None:
        problem["B_OPERANDS"] = 2      # two b tiles and two accumulators (configs._legal)
        notes.append("paired: two products of one left operand, each a tile loaded once for both "
                     "accumulators; neither product is written")
    if big:
        notes.append("int64 indexing (a tensor or address passes 2**31)")
    knobs = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "PRECISION")
    extra = {}
    if split:
        notes.append("split-K: SPLIT_K programs per output tile each reduce a share of K into a "
                     "workspace; a finish kernel sums the shares in order and runs the epilogue")
        knobs += ("SPLIT_K",)
        grid, space = f"triton.cdiv({M}, BLOCK_M) * triton.cdiv({N}, BLOCK_N), {B}", "matmul_splitk"
        extra = _splitk_launch(params, knobs, grid, M, N, B, finish)
    elif not plans:
        grid, space = f"triton.cdiv({M}, BLOCK_M) * triton.cdiv({N}, BLOCK_N), {B}", "matmul"
    else:
        if rowp is not None:
            notes.append(f"a normalization formed on load: {len(rowp.stats)} row statistics "
                         "over K, once per N_TILES column tiles")
        if rowe is not None:
            notes.append(f"a residual normalized on load in the epilogue: {len(rowe.stats)} row "
                         "statistics over N, once per N_TILES column tiles")
        knobs += ("N_TILES",)
        grid = (f"triton.cdiv({M}, BLOCK_M) * triton.cdiv(triton.cdiv({N}, BLOCK_N), N_TILES), "
                f"{B}")
        space = "matmul_rows"
    return KernelParts(
        form=kernel.form, variant="dot", params=params, constexprs=knobs, body=w.body(),
        grid=grid, problem=problem, config_space=space, constants=consts, notes=notes, **extra)


def _tile_header(w: SourceWriter, ev: Evaluator, c: Contraction, tiles_grouped: bool,
                 i64: str) -> list[str]:
    """The program's output tile: ``pid_m``, ``pid_n`` in grouped order (``GROUP_M`` row tiles
    share a column tile in L2, Triton tutorial 03), ``rm`` and its mask; returns the batch index."""
    M, N = c.M, c.N
    w.line("pid = tl.program_id(0)")
    w.line(f"pid_b = tl.program_id(1){i64}")
    w.line(f"num_pid_m = tl.cdiv({M}, BLOCK_M)")
    # with row statistics in the prologue a program computes them once for N_TILES column tiles
    w.line(f"num_pid_n = tl.cdiv({N}, BLOCK_N)" if not tiles_grouped else
           f"num_pid_n = tl.cdiv(tl.cdiv({N}, BLOCK_N), N_TILES)")
    w.line("# grouped ordering: GROUP_M row tiles share each column tile while it is in L2")
    w.line("group = pid // (GROUP_M * num_pid_n)")
    w.line("first_m = group * GROUP_M")
    w.line("group_m = tl.minimum(num_pid_m - first_m, GROUP_M)")
    w.line("pid_m = first_m + ((pid % (GROUP_M * num_pid_n)) % group_m)")
    w.line("pid_n = (pid % (GROUP_M * num_pid_n)) // group_m")
    w.line(f"rm = pid_m{i64} * BLOCK_M + tl.arange(0, BLOCK_M)")
    w.line(f"rm_mask = rm < {M}")
    w.line("# operand rows/columns wrap instead of masking (tutorial 03): reads stay in bounds,")
    w.line("# the extra rows and columns are never stored")
    w.line(f"rm_a = rm % {M}")
    bidx = bind_all(w, unravel("pid_b", c.shape_of(c.batch_dims)), "b")
    ev.scalar_names |= {b for b in bidx if b.isidentifier()} | {"pid_b"}
    return bidx


def _epilogue(w: SourceWriter, ev: Evaluator, c: Contraction, kernel: Kernel, bidx: list[str],
              lo: int, big: bool, skip: dict | None = None) -> None:
    """The epilogue on the output tile (``acc``) at block level ``lo``, and the stores."""
    fr = tuple(1 if d in c.k_dims else s for d, s in enumerate(c.full))
    o_idx = place(c, {c.batch_dims: bidx,
                      c.m_dims: bind_all(w, unravel("rm[:, None]", c.shape_of(c.m_dims)), "om", lo),
                      c.n_dims: bind_all(w, unravel("rn[None, :]", c.shape_of(c.n_dims)), "on", lo)})
    for d in c.k_dims:
        o_idx[d] = "0"
    w.line("c_mask = rm_mask[:, None] & rn_mask[None, :]", lo)
    addr = flat_index(o_idx, fr)
    if not (c.m_dims and c.n_dims):  # the pointer must span the whole tile even where M or N is 1
        addr = _whole_tile(addr, big)
    dep = dependents(kernel.meaning.nodes(), c.node)
    for name, o in kernel.meaning.outputs.items():
        if skip and name in skip:
            continue
        sv = stored_view(o, dep)
        if sv is not None:     # a slice or permutation of the epilogue: stored through the view
            idx, valid = store_through(w, sv, addr, lo)
            mask = "c_mask" if valid is None else w.bind(f"c_mask & {valid}", "vmask", lo)
            v = ev.value(o, idx, mask, lo)
            off = flat_index(idx, o.shape)
            if all(i == "0" for i in idx):    # one element: no digit spans the tile
                off = _whole_tile(off, big)
            w.line(f"tl.store({name}_ptr + ({off}), {v}, mask={mask})", lo)
            continue
        v = ev.value(o, reshape_index(o_idx, fr, o.shape), "c_mask", lo)
        w.line(f"tl.store({name}_ptr + ({addr}), {v}, mask=c_mask)", lo)


def _whole_tile(addr: str, big: bool) -> str:
    """``addr`` broadcast to a ``[BLOCK_M, BLOCK_N]`` tile of offsets (a store through a pointer
    that must span the tile: Triton refuses a tile stored through a scalar pointer)."""
    return f"{addr} + tl.zeros([BLOCK_M, BLOCK_N], {'tl.int64' if big else 'tl.int32'})"


def _ws_addr(M: int, N: int, i64: str, share: str) -> str:
    """Flat position of the output tile in share ``share``'s partial ``[batch, SPLIT_K, M, N]``."""
    return f"((pid_b * SPLIT_K + {share}){i64} * {M} + rm[:, None]) * {N} + rn[None, :]"


def _splitk_launch(params, knobs, grid: str, M: int, N: int, B: int, finish: str) -> dict:
    """The ``KernelParts`` fields of a split-K kernel: its fp32 workspace, the finish kernel and a
    launcher that runs one kernel at ``SPLIT_K = 1`` (the workspace argument unused) and both
    otherwise."""
    args = ", ".join(p.name for p in params)
    cfg = ", ".join(f"{k}={k}" for k in knobs)
    anchor = next(p.name for p in params if p.role == "out")
    launcher = (
        "    if SPLIT_K == 1:\n"
        f"        KERNEL_NAME[({grid}, 1)]({args}, {anchor},\n"
        f"            {cfg}, num_warps=num_warps, num_stages=num_stages)\n"
        "        return\n"
        f"    ws_ptr = torch.empty(({B} * SPLIT_K * {M} * {N},), dtype=torch.float32, "
        f"device={anchor}.device)\n"
        f"    KERNEL_NAME[({grid}, SPLIT_K)]({args}, ws_ptr,\n"
        f"        {cfg}, num_warps=num_warps, num_stages=num_stages)\n"
        f"    KERNEL_NAME_finish[({grid})]({args}, ws_ptr,\n"
        f"        {cfg}, num_warps=num_warps, num_stages=1)")
    return {"workspaces": [Workspace("ws_ptr", f"({B} * SPLIT_K * {M} * {N},)", dt.f32)],
            "extra_kernels": {"finish": finish}, "launcher": launcher,
            "knob_defaults": {"SPLIT_K": 1}}
