"""Row work for the simulated GPU (``lumc.backends.simulator``): what a row kernel and a
contraction with row statistics (a normalization formed on load, ``norm_prologue`` and
``norm_epilogue``) compute besides their main loop: rows and row length, prologue ops per element,
passes over the rows of a looped row kernel, and the statistics' passes in a matmul kernel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lumc.backends.row_moments import moment_pairs
from lumc.backends.triton.contraction import paired_contractions
from lumc.ir.graph import toposort
from lumc.ir.kernels import Kernel
from lumc.ir.views import prod

if TYPE_CHECKING:
    from lumc.backends.simulator import Contraction


@dataclass(frozen=True)
class RowWork:
    """The row statistics a contraction with a normalization formed on load computes per program.

    Attributes:
        prologue: passes over the operand's rows, a loop over ``K`` each, one per statistic but
            one for a layer norm's mean and variance (``lumc.backends.triton.norm_prologue``,
            ``lumc.backends.row_moments``).
        prologue_ops: elementwise ops per operand element (statistic bodies and the normalized
            tile, recomputed for every column tile).
        epilogue: passes over a residual's rows, a loop over ``N`` each
            (``lumc.backends.triton.norm_epilogue``).
        epilogue_ops: elementwise ops per residual element inside those loops.
        operand_buffers: buffers of the operand's size that forming one operand tile reads (two
            where the normalized value is itself a residual plus a normalization formed on load,
            ``fusion_norms``: Gemma's ``x + norm(s)``); a statistic's pass counts each buffer its
            body reads, so ``prologue`` and ``epilogue`` count buffer passes.
        store_ops: integer ops per output tile element that finding where outputs stored through
            a view go costs (``render_matmul.stored_view_ops``; ``fusion_stored``).
    """
    prologue: int = 0
    prologue_ops: int = 0
    epilogue: int = 0
    epilogue_ops: int = 0
    operand_buffers: int = 1
    store_ops: int = 0


def row_statistics_work(kernel: Kernel, c: Contraction) -> RowWork:
    """The :class:`RowWork` of a matmul kernel: its reductions other than the contraction, split
    into statistics under the contraction's operands (prologue) and the others (epilogue); all
    zero for a plain matmul (attention's reductions are its own, priced by its form)."""
    nodes = kernel.meaning.nodes()
    prods = [n for n in nodes if n.op == "SumReduce" and n.srcs[0].op == "Mul"]
    if not prods:
        return RowWork()
    main = max(prods, key=lambda x: x.srcs[0].numel)
    under = {id(x) for x in toposort(main.srcs[0].srcs)}
    pair = paired_contractions(nodes)
    mains = {id(p.node) for p in pair} if pair is not None else {id(main)}
    reds = [n for n in nodes if n.op in ("SumReduce", "MaxReduce") and id(n) not in mains]
    if not reds:
        return RowWork()
    a_size, o_size = c.batch * c.m * c.k, c.batch * c.m * c.n
    body = [n for n in nodes if n.op not in ("View", "Input", "Constant", "SumReduce",
                                              "MaxReduce")]
    pro = [r for r in reds if id(r) in under]
    epi = [r for r in reds if id(r) not in under]
    inside_epi: set[int] = set()        # the epilogue statistics' operands, up to other reductions
    stack = [r.srcs[0] for r in epi]
    while stack:
        x = stack.pop()
        if id(x) not in inside_epi and x.op not in ("SumReduce", "MaxReduce"):
            inside_epi.add(id(x))
            stack.extend(x.srcs)
    # a layer norm's mean and variance are one pass over the row (``row_moments``); each pass
    # reads every buffer its statistic's body reads; the pair's loop also subtracts the shift
    # from every element (``lumc.backends.triton.chan``): one op more per element
    pro_pairs, epi_pairs = moment_pairs(pro), moment_pairs(epi)
    paired = set(pro_pairs.values()) | set(epi_pairs.values())
    return RowWork(sum(len(_buffers_read(r.srcs[0], a_size)) for r in pro if r not in paired),
                   sum(1 for n in body if n.numel == a_size and id(n) in under) + len(pro_pairs),
                   sum(len(_buffers_read(r.srcs[0], o_size)) for r in epi if r not in paired),
                   sum(1 for n in body if n.numel == o_size and id(n) in inside_epi)
                   + len(epi_pairs),
                   max(1, len(_buffers_read(_left_operand(main), a_size))))


def _left_operand(main) -> object:
    """The left operand of contraction ``SumReduce(Mul(a, b))``."""
    return main.srcs[0].srcs[0]


def _buffers_read(x, size: int) -> set[int]:
    """Ids of the kernel inputs of ``size`` elements that ``x``'s elementwise body reads (through
    views; a gather of ``size`` elements reads that many of its table's), not looking past
    reductions (their row values are registers, not reads)."""
    out, seen, stack = set(), set(), [x]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.op in ("Input", "Gather"):
            if n.numel == size:
                out.add(id(n))
        elif n.op not in ("SumReduce", "MaxReduce"):
            stack.extend(n.srcs)
    return out


def _row_reductions(kernel: Kernel) -> tuple[list, list]:
    """``(mains, statistics)`` of a row kernel's reductions (``rowplan.main_reductions``: the
    statistics are those of an input normalized on load); all of them main when they do not split
    that way."""
    from lumc.backends.triton.rowplan import main_reductions
    nodes = kernel.meaning.nodes()
    reds = [n for n in nodes if n.op in ("SumReduce", "MaxReduce")]
    return (main_reductions(nodes, reds) or (reds, [])) if reds else ([], [])


def row_dims(kernel: Kernel) -> tuple[int, int]:
    """``(rows, row length)`` of a row kernel: from its main reduction, the reduced extent is the
    row and the rest are rows (a kernel without a reduction is one row per output element)."""
    mains, _ = _row_reductions(kernel)
    if mains:
        n = mains[0]
        src = n.srcs[0].shape
        row = prod(src[a] for a in n.arg) if n.arg else 1
        return max(prod(src) // max(row, 1), 1), max(row, 1)
    return max(sum(prod(n.shape) for n in kernel.outputs), 1), 1


def row_prologue_ops(kernel: Kernel) -> int:
    """Ops per element of a row kernel's main tile spent on the row statistics of the input it
    normalizes on load (``rowplan.RowPlan.prologue``): the statistics are taken again over every
    main row and the normalization formed on every tile, so each op of their expressions (the
    nodes of a statistic's operand size, and each statistic's add) is issued per tile element."""
    _, stats = _row_reductions(kernel)
    sizes = {r.srcs[0].numel for r in stats}
    ops = sum(1 for n in kernel.meaning.nodes() if n.op not in ("View", "Input", "Constant",
              "Iota", "SumReduce", "MaxReduce") and n.numel in sizes)
    return ops + len(stats)


def row_passes(kernel: Kernel) -> int:
    """Loops over its rows a looped row kernel runs (``rowplan.looped_passes``); 1 for a kernel
    the row engine does not plan."""
    from lumc.backends.triton.codegen import RenderError
    from lumc.backends.triton.rowplan import looped_passes, plan_rows
    try:
        plan = plan_rows(kernel)
    except (RenderError, ValueError):
        return 1
    return 1 if plan is None else looped_passes(plan)
