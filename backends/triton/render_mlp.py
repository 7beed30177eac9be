"""Back-to-back contractions (the ``mlp`` form): ``out = epi2(act(epi1(A @ W1)) @ W2)`` with the
intermediate ``h`` kept on chip.

The meaning holds two contractions (``lumc.compiler.core.fusion_chain`` decides which): ``C1``
(``M x K``, ``K x F``) whose elementwise epilogue ``h`` (bias, GELU) is read only as the left
operand of ``C2`` (``M x F``, ``F x N``), then ``C2``'s epilogue (bias, residual). Two
``@triton.jit`` kernels:

* stage 1, grid ``cdiv(M, BLOCK_M) x S`` with ``S = cdiv(F, BLOCK_F * F_TILES)`` splits: each
  program walks its ``F_TILES`` blocks of ``h``, computing each ``BLOCK_M x BLOCK_F`` block over
  the whole ``K`` (``tl.dot``, fp32 accumulator, the normalization of ``A`` formed on load when
  ``C1`` has one: ``norm_prologue``) and applying ``C1``'s epilogue, then multiplying it by
  ``W2``'s ``BLOCK_F`` rows into :data:`~lumc.backends.triton.configs.MLP_ACCS` column-tile
  accumulators (``BLOCK_N`` columns each, unrolled, live across the F blocks); it stores them as
  fp32 partial tiles to a workspace ``[S, M, N]``. Programs of the first split also store their
  rows' statistics (for the residual, below) and the row values other kernels read;
* stage 2 (``KERNEL_finish``), grid ``cdiv(M, BLOCK_M) x cdiv(N, BLOCK_N)``: sums the ``S`` partial
  tiles in a fixed order (the same bits on every run) and runs ``C2``'s epilogue; a residual
  normalized on load (post-LN BERT: ``LN(x1) + down(h)``) reads the statistics stage 1 stored.

So ``h`` (``M x F``) is never written: the kernel moves ``A``, the weights, the output and
``2 * S * M * N * 4`` bytes of partial tiles (the report's ``workspace_bytes``). The split is over
``F``, as split-K is over ``K`` (``render_matmul``): sums reassociate (``reassociating`` in
DESIGN.md). FLOPs ``2 M K F + 2 M F N``.
"""
from __future__ import annotations

from lumc.ir import dtypes as dt
from lumc.ir.graph import Node, toposort
from lumc.ir.kernels import Kernel
from lumc.backends.triton import exprs
from lumc.backends.triton.codegen import Evaluator, RenderError, SourceWriter, reads_of
from lumc.backends.triton.configs import MLP_ACCS, MLP_MAX_N
from lumc.backends.triton.contraction import Contraction, tensor_core_contractions
from lumc.backends.triton.dot_precision import dot_dtype, emit_dot
from lumc.backends.triton.indexing import needs_int64, unravel
from lumc.backends.triton.norm_epilogue import aligned_reads, row_broadcasts
from lumc.backends.triton.norm_prologue import (RowStatistics, plan_row_prologue,
                                                reads_operand_rows)
from lumc.backends.triton.render_matmul import (DOT_DTYPES, _epilogue, bind_all, check_epilogue,
                                                dependents, place)
from lumc.backends.triton.source import KernelParts, Workspace, make_params

KNOBS = ("BLOCK_M", "BLOCK_F", "BLOCK_K", "BLOCK_N", "F_TILES", "PRECISION")


def chained_contractions(nodes: list[Node]) -> tuple[Contraction, Contraction]:
    """``(C1, C2)`` of an mlp meaning: two ``tl.dot`` contractions, ``C2``'s left operand a view
    of a value computed from ``C1``'s product, neither with batch dims, ``C1.N == C2.K``,
    ``C1.M == C2.M``, ``C2`` reading its operand as ``[M, F]`` rows and ``C1``'s product laid
    out rows before columns (so an ``h`` block is the operand tile, position for position).

    Raises:
        RenderError: naming what does not fit.
    """
    cs = tensor_core_contractions(nodes)
    if len(cs) != 2:
        raise RenderError(f"an mlp kernel needs two chained contractions, found {len(cs)}")
    c1, c2 = cs
    if c1.node in set(toposort([c2.a])):
        pass
    elif c2.node in set(toposort([c1.a])):
        c1, c2 = c2, c1
    else:
        raise RenderError("an mlp kernel's contractions are not chained (neither reads the other)")
    if c1.batch_dims or c2.batch_dims:
        raise RenderError("an mlp kernel's contractions have batch dims")
    if not c1.m_dims:
        raise RenderError("an mlp kernel of one row (a GEMV chain)")
    if not c1.n_dims:
        raise RenderError("an mlp kernel of F = 1 (the first product has no column dim)")
    if c2.N > MLP_MAX_N:
        raise RenderError(f"an mlp kernel's N = {c2.N} is over {MLP_ACCS} column tiles "
                          f"({MLP_MAX_N})")
    if c1.N != c2.K or c1.M != c2.M:
        raise RenderError(f"chained contractions of mismatched sizes: M {c1.M} / {c2.M}, "
                          f"F {c1.N} / {c2.K}")
    if c1.a.dtype not in DOT_DTYPES or c2.a.dtype not in DOT_DTYPES:
        raise RenderError(f"chained contractions of dtype {c1.a.dtype} / {c2.a.dtype}")
    if not reads_operand_rows(c2) or max(c1.m_dims) > min(c1.n_dims):
        raise RenderError("the intermediate is not read as [M, F] rows of the first product")
    return c1, c2


def render_mlp(kernel: Kernel) -> KernelParts:
    """Render the two stages (see the module docstring).

    Raises:
        RenderError: the meaning is not two chained contractions with elementwise epilogues, or
            has a statistic other than the first operand's normalization.
    """
    nodes = kernel.meaning.nodes()
    c1, c2 = chained_contractions(nodes)
    h = c2.a
    while h.op == "View":
        h = h.srcs[0]
    between = dependents(nodes, c1.node) & set(toposort([h]))
    check_epilogue([n for n in nodes if n in between], between, c1.node)
    dep2 = dependents(nodes, c2.node)
    check_epilogue(nodes, dep2, c2.node)
    read_outside = {id(s) for u in nodes if u not in between for s in u.srcs}
    for n in between:
        if n is not h and id(n) in read_outside:
            raise RenderError(f"node {n!r}: the first product's epilogue is read outside the "
                              "intermediate")
    others = [n for n in nodes if n.op in ("SumReduce", "MaxReduce")
              and n is not c1.node and n is not c2.node]
    under_a = set(toposort([c1.a]))
    rowp = plan_row_prologue(c1, nodes) if any(n in under_a for n in others) else None
    if any(rowp is None or n not in rowp.stats for n in others):
        raise RenderError("an mlp kernel computes no statistic but its first operand's "
                          "normalization")
    row_outs = {name: o for name, o in kernel.meaning.outputs.items() if o not in dep2}
    if any(rowp is None or o not in rowp.rows for o in row_outs.values()):
        raise RenderError("an mlp kernel output does not depend on the second product")
    outs = [o for name, o in kernel.meaning.outputs.items() if name not in row_outs]
    aligned = aligned_reads(c2, outs, row_broadcasts(nodes, [rowp]), set(others)) \
        if rowp is not None else set()
    reads = reads_of(nodes)
    params, ptrs, consts = make_params(kernel, reads)
    M, K, F, N = c1.M, c1.K, c1.N, c2.N
    big = needs_int64(nodes, (M * N * ((F + 15) // 16), M * K, K * F, F * N), (c1.full, c2.full))
    i64 = ".to(tl.int64)" if big else ""
    idx_t = "tl.int64" if big else "tl.int32"
    stats: list[RowStatistics] = []

    def evaluator(wr: SourceWriter, acc: dict) -> Evaluator:
        def resolve(ev, n, idx, mask, level):
            if n in acc:
                return acc[n] if n.dtype == dt.f32 else \
                    wr.bind(f"{acc[n]}.to({exprs.tl_dtype(n.dtype)})", "t", level)
            for st in stats:
                got = st.resolve(ev, n, idx, mask, level)
                if got is not None:
                    return got
            return None
        return Evaluator(wr, ptrs, resolve, idx_t)

    # ---- stage 1: h blocks on chip, partial products of the second contraction ---------------
    w = SourceWriter()
    ev = evaluator(w, {c1.node: "acc"})
    w.line(f"pid_m = tl.program_id(0){i64}")
    w.line(f"pid_f = tl.program_id(1){i64}")
    _rows(w, M, "pid_m")
    if rowp is not None:
        lead = bind_all(w, unravel("rm_a[:, None]", rowp.lead), "am", 0)
        stats.append(RowStatistics(rowp, w, ev, lead, aligned))
        stats[0].emit(K, i64)
        w.open("if pid_f == 0:   # the first F block's programs store their rows' statistics")
        for i, r in enumerate(rowp.stats):
            w.line(f"tl.store(st_ptr + {i * M} + rm[:, None], {stats[0].vars[r]}.to(tl.float32), "
                   "mask=rm_mask[:, None])")
        for name, o in row_outs.items():
            col = ev.value(o, stats[0].row_idx, None, 1)
            w.line(f"tl.store({name}_ptr + rm[:, None], {col}, mask=rm_mask[:, None])")
        w.close()
    # integer arithmetic on the constexpr, not tl.cdiv: Triton 3.6 (the GPU image's) does not fold
    # a tl.cdiv of a constexpr at compile time, and refuses the assertion
    w.line(f"tl.static_assert(({N} + BLOCK_N - 1) // BLOCK_N <= {MLP_ACCS}, "
           "'an mlp config covers the output columns in MLP_ACCS column tiles')")
    w.line("# MLP_ACCS column tiles of the partial product, live across the F_TILES F blocks (one")
    w.line(f"# accumulator per BLOCK_N columns: a config has cdiv({N}, BLOCK_N) <= {MLP_ACCS})")
    for t in range(MLP_ACCS):
        w.line(f"acc2_{t} = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)")
    w.open("for f_tile in range(0, F_TILES):")
    w.line("rf = (pid_f * F_TILES + f_tile) * BLOCK_F + tl.arange(0, BLOCK_F)")
    w.line(f"rf_mask = rf < {F}")
    w.line(f"rf_b = rf % {F}")
    w.line("acc = tl.zeros([BLOCK_M, BLOCK_F], tl.float32)")
    w.open(f"for k_start in range(0, {K}, BLOCK_K):")
    w.line("rk = (k_start + tl.arange(0, BLOCK_K)).to(tl.int64)" if big else
           "rk = k_start + tl.arange(0, BLOCK_K)")
    w.line(f"a_mask = rk[None, :] < {K}")
    w.line(f"b_mask = rk[:, None] < {K}")
    a_idx = place(c1, {c1.m_dims: bind_all(w, unravel("rm_a[:, None]", c1.shape_of(c1.m_dims)),
                                           "am", 0),
                       c1.k_dims: bind_all(w, unravel("rk[None, :]", c1.shape_of(c1.k_dims)),
                                           "ak", 2)}) if rowp is None else None
    b_idx = place(c1, {c1.k_dims: bind_all(w, unravel("rk[:, None]", c1.shape_of(c1.k_dims)),
                                           "bk", 2),
                       c1.n_dims: bind_all(w, unravel("rf_b[None, :]", c1.shape_of(c1.n_dims)),
                                           "bn", 1)})
    a = (ev.value(c1.a, a_idx, "a_mask", 2) if rowp is None else
         ev.value(rowp.p, stats[0].p_index("rk[None, :]", "ak", 2), "a_mask", 2))
    b = ev.value(c1.b, b_idx, "b_mask", 2)
    if c1.a.op not in ("View", "Input"):
        a = w.bind(f"tl.where(a_mask, {a}, 0.0)", "a", 2)
    if c1.b.op not in ("View", "Input"):
        b = w.bind(f"tl.where(b_mask, {b}, 0.0)", "b", 2)
    emit_dot(w, a, [(b, "acc")], c1.a.dtype, 2)
    w.close()
    w.line("# the intermediate block: the first product's epilogue, zero past F")
    h_idx = place(c2, {c2.m_dims: bind_all(w, unravel("rm_a[:, None]", c2.shape_of(c2.m_dims)),
                                           "hm", 0),
                       c2.k_dims: bind_all(w, unravel("rf_b[None, :]", c2.shape_of(c2.k_dims)),
                                           "hf", 1)})
    hv = ev.value(c2.a, h_idx, None, 1)
    hv = w.bind(f"tl.where(rf_mask[None, :], {hv}, 0.0)", "h", 1)
    wf = bind_all(w, unravel("rf_b[:, None]", c2.shape_of(c2.k_dims)), "wf", 1)
    for t in range(MLP_ACCS):
        w.open(f"if {t} * BLOCK_N < {N}:   # column tile {t} (resolved at compile time)")
        w.line(f"rn = {t} * BLOCK_N + tl.arange(0, BLOCK_N)")
        w.line(f"rn_mask = rn < {N}")
        w.line(f"rn_b = rn % {N}")
        w.line("w_mask = rf_mask[:, None] & rn_mask[None, :]")
        w2_idx = place(c2, {c2.k_dims: wf,
                            c2.n_dims: bind_all(w, unravel("rn_b[None, :]",
                                                           c2.shape_of(c2.n_dims)), "wn", 2)})
        wv = ev.value(c2.b, w2_idx, "w_mask", 2)
        wv = w.bind(f"tl.where(w_mask, {wv}, 0.0)", "w", 2)
        emit_dot(w, hv, [(wv, f"acc2_{t}")], c2.a.dtype, 2)
        w.close()
    w.close()
    for t in range(MLP_ACCS):
        w.open(f"if {t} * BLOCK_N < {N}:")
        w.line(f"rn = {t} * BLOCK_N + tl.arange(0, BLOCK_N)")
        w.line(f"tl.store(ws_ptr + ({_ws('pid_f', M, N)}), acc2_{t}, "
               f"mask=rm_mask[:, None] & (rn[None, :] < {N}))")
        w.close()

    # ---- stage 2: the partial tiles summed in order, the second product's epilogue ------------
    w2 = SourceWriter()
    ev2 = evaluator(w2, {c2.node: "acc"})
    w2.line("pid = tl.program_id(0)")
    w2.line(f"num_pid_n = tl.cdiv({N}, BLOCK_N)")
    w2.line(f"pid_m = (pid // num_pid_n){i64}")
    w2.line(f"pid_n = (pid % num_pid_n){i64}")
    _rows(w2, M, "pid_m")
    w2.line("rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
    w2.line(f"rn_mask = rn < {N}")
    w2.line("c_mask = rm_mask[:, None] & rn_mask[None, :]")
    w2.line("# the partial tiles summed in a fixed order: the same bits on every run")
    w2.line(f"acc = tl.load(ws_ptr + ({_ws('0', M, N)}), mask=c_mask, other=0.0)")
    w2.open(f"for s in range(1, tl.cdiv({F}, BLOCK_F * F_TILES)):")
    w2.line(f"acc += tl.load(ws_ptr + ({_ws('s', M, N)}), mask=c_mask, other=0.0)")
    w2.close()
    if rowp is not None:
        lead2 = bind_all(w2, unravel("rm_a[:, None]", rowp.lead), "em", 0)
        st2 = RowStatistics(rowp, w2, ev2, lead2, aligned)
        for i, r in enumerate(rowp.stats):
            v = w2.bind(f"tl.load(st_ptr + {i * M} + rm_a[:, None])", "stat", 0)
            st2.vars[r] = v if r.dtype == dt.f32 else \
                w2.bind(f"{v}.to({exprs.tl_dtype(r.dtype)})", "stat", 0)
        stats[:] = [st2]
    _epilogue(w2, ev2, c2, kernel, [], 0, big, row_outs)
    finish = w2.body()

    split = f"triton.cdiv({F}, BLOCK_F * F_TILES)"
    wss = [Workspace("ws_ptr", f"({split} * {M} * {N},)", dt.f32),
           Workspace("st_ptr", f"({max(1, len(rowp.stats) if rowp else 1) * M},)", dt.f32)]
    args = ", ".join(p.name for p in params)
    cfg = ", ".join(f"{k}={k}" for k in KNOBS)
    anchor = next(p.name for p in params if p.role == "out")
    alloc = "\n".join(f"    {x.name} = torch.empty({x.shape}, dtype=torch.float32, "
                      f"device={anchor}.device)" for x in wss)
    launcher = (f"{alloc}\n"
                f"    KERNEL_NAME[(triton.cdiv({M}, BLOCK_M), {split})]({args}, ws_ptr, st_ptr,\n"
                f"        {cfg}, num_warps=num_warps, num_stages=num_stages)\n"
                f"    KERNEL_NAME_finish[(triton.cdiv({M}, BLOCK_M) * triton.cdiv({N}, BLOCK_N),)]"
                f"({args}, ws_ptr, st_ptr,\n"
                f"        {cfg}, num_warps=num_warps, num_stages=1)")
    notes = [f"mlp: C1 M={M} K={K} F={F} (dims {list(c1.full)}), C2 F={F} N={N} "
             f"(dims {list(c2.full)}); the intermediate h [M, F] stays on chip, split over F in "
             "BLOCK_F blocks whose fp32 partial products a finish kernel sums in order"]
    if rowp is not None:
        notes.append(f"the first operand's normalization formed on load: {len(rowp.stats)} row "
                     "statistics over K, stored once for the finish kernel's epilogue")
    problem = {"M": M, "K": K, "F": F, "N": N, "itemsize": c1.a.dtype.itemsize,
               "dot_dtype": dot_dtype(c1.a.dtype)}
    return KernelParts(form=kernel.form, variant="b2b-split-f", params=params, constexprs=KNOBS,
                       body=w.body(), grid=f"triton.cdiv({M}, BLOCK_M), {split}", problem=problem,
                       config_space="mlp", constants=consts, notes=notes, workspaces=wss,
                       extra_kernels={"finish": finish}, launcher=launcher,
                       knob_defaults={"F_TILES": 1})


def _rows(w: SourceWriter, M: int, pid: str) -> None:
    w.line(f"rm = {pid} * BLOCK_M + tl.arange(0, BLOCK_M)")
    w.line(f"rm_mask = rm < {M}")
    w.line("# operand rows wrap instead of masking (tutorial 03): extra rows are never stored")
    w.line(f"rm_a = rm % {M}")


def _ws(share: str, M: int, N: int) -> str:
    """Flat position of the tile ``(rm, rn)`` in F block ``share``'s partial ``[M, N]``."""
    return f"({share} * {M} + rm[:, None]) * {N} + rn[None, :]"
