"""Scan kernels: a triangular contraction (``lumc.backends.scan_structure``) rendered as a prefix
sum.

One program per row (every dim of the result but the scan axis); it walks the scan axis in
``BLOCK``-wide chunks (backwards when reversed), computes the operand's pointwise prologue on load,
scans each chunk with ``tl.cumsum`` and adds the running sum carried from the chunks before, then
writes every output through the elementwise epilogue over the sum. Exclusive scans read the operand
one position behind (ahead when reversed), the first position reading nothing.

Bytes moved: the operand's inputs once, the outputs once (the ``[L, L]`` mask is never formed);
work: one add per element in the scan tree plus the prologue and epilogue ops. Each row's chunks are
a serial chain (the carry), so few long rows are latency-bound: ``ceil(L / BLOCK)`` load round trips
per row (``lumc.backends.simulator_scan``).

Sums: integers in their dtype (int8/int16 in int32, as the reference), exact and wrapping; floats
in the sum's dtype (fp16/bf16 operands arrive widened to fp32 by the library), in the tree order of
``tl.cumsum`` (reassociated against a sequential scan, as the contraction is). Every scan starts
from +0.0, as the contraction's sum (and the reference's): a zero sum is +0.0, never -0.0, whatever
the signs of the zero terms (the library's float ``cumsum`` gives a run of -0.0 its sign itself).
"""
from __future__ import annotations

import re

from lumc.ir.kernels import Kernel
from lumc.ir.views import prod
from lumc.backends.triton import exprs
from lumc.backends.triton.codegen import Evaluator, RenderError, SourceWriter, reads_of
from lumc.backends.triton.indexing import flat_index, needs_int64, reshape_index, unravel
from lumc.backends.triton.render_reduction import acc_dtype
from lumc.backends.scan_structure import ScanSpec, scan_of
from lumc.backends.triton.source import KernelParts, make_params


def kernel_scans(kernel: Kernel) -> list[ScanSpec]:
    """The scans of a ``scan`` kernel's meaning: one or more triangular contractions over the
    same rows (axis, length, direction and result shape), in meaning order. Attr
    ``finite_operand``: the operands were checked finite on the model graph (a realized operand
    is a placeholder here).

    Raises:
        RenderError: when a reduction of the meaning is not such a scan.
    """
    reds = [n for n in kernel.meaning.nodes() if n.op in ("SumReduce", "MaxReduce")]
    specs = [scan_of(r, bool(kernel.attr("finite_operand"))) for r in reds]
    if not specs or any(sp is None for sp in specs) or len({
            (sp.k, sp.n, sp.exclusive, sp.reverse, sp.red.shape) for sp in specs}) != 1:
        raise RenderError(f"scan kernel: expected triangular contractions of finite operands "
                          f"over the same rows, found reductions {reds!r}")
    return specs


def kernel_scan(kernel: Kernel) -> ScanSpec:
    """The first scan of a ``scan`` kernel (its rows, length and direction are every scan's).

    Raises:
        RenderError: as :func:`kernel_scans`.
    """
    return kernel_scans(kernel)[0]


def render_scan(kernel: Kernel) -> KernelParts:
    """Render a ``scan`` kernel (see the module docstring).

    Raises:
        RenderError: when the meaning is not a scan with an elementwise epilogue of its size.
    """
    specs = kernel_scans(kernel)
    spec = specs[0]
    red, k, n = spec.red, spec.k, spec.n
    outs = kernel.meaning.outputs
    for name, o in outs.items():
        if o.numel != red.numel:
            raise RenderError(f"scan kernel: output {name} has {o.numel} elements, the scan "
                              f"{red.numel}")
    nodes = kernel.meaning.nodes()
    reads = reads_of(nodes)
    params, ptrs, consts = make_params(kernel, reads)
    # the [..., L, L, ...] product and the [L, L] mask are never formed: addresses only
    big = needs_int64(nodes, (red.numel,), (tuple(red.srcs[0].shape), (n, n)))
    w = SourceWriter()
    rows = spec.rows
    pid = "tl.program_id(0).to(tl.int64)" if big else "tl.program_id(0)"
    r = w.bind(pid, "row") if rows else "0"
    ridx = [e if e == "0" else w.bind(e, "r") for e in unravel(r, rows)] if rows else []
    scanned: dict = {}      # reduction node -> its prefix sums in this block
    ev = Evaluator(w, ptrs, lambda ev_, x, idx, mask, level: scanned.get(x),
                   "tl.int64" if big else "tl.int32")
    ev.scalar_names.update(i for i in ridx if i.isidentifier())
    carries = []
    for j, sp in enumerate(specs):
        acc = acc_dtype(sp.red)
        carries.append(f"carry{j}")
        w.line(f"carry{j} = tl.full((), 0, {exprs.tl_dtype(acc)})")
    w.open(f"for k0 in range(0, {n}, BLOCK):")
    lvl = w.level
    w.line("offs = k0 + tl.arange(0, BLOCK)")
    w.line(f"inb = offs < {n}")
    # n - 1 - offs, not (n - 1) - offs: a range's probe size n is rewritten into an argument
    pos = w.bind(f"{n} - 1 - offs" if spec.reverse else "offs", "p", lvl)
    if spec.exclusive:   # the element one step behind (ahead when reversed); none at the start
        src = w.bind(f"{pos} + 1" if spec.reverse else f"{pos} - 1", "p", lvl)
        valid = w.bind("inb & (offs > 0)", "v", lvl)
    else:
        src, valid = pos, "inb"

    def big_index(j: str) -> list[str]:
        it = iter(ridx)
        return [j if a == k else "0" if a == k - 1 else next(it)
                for a in range(len(red.srcs[0].shape))]

    for sp, carry in zip(specs, carries):
        tacc = exprs.tl_dtype(acc_dtype(sp.red))
        x = ev.value(sp.operand, big_index(src), valid, lvl)
        zero = exprs.render_scalar(0, acc_dtype(sp.red))
        x = w.bind(f"tl.where({valid}, ({x}).to({tacc}), {zero})", "t", lvl)
        scanned[sp.red] = w.bind(f"tl.cumsum({x}, axis=0) + {carry}", "s", lvl)
        w.line(f"{carry} = {carry} + tl.sum({x}, axis=0)")
    it = iter(ridx)
    sidx = [pos if a == k - 1 else "0" if a == k else next(it) for a in range(len(red.shape))]
    for name, o in outs.items():
        oidx = reshape_index(list(sidx), red.shape, o.shape)
        v = ev.value(o, oidx, "inb", lvl)
        flat = flat_index(oidx, o.shape)
        if not re.search(rf"\b{pos}\b", flat):    # a scan of one element: the address is the row's, one lane
            flat = f"{flat} + 0 * offs"
        w.line(f"tl.store({name}_ptr + ({flat}), {v}, mask=inb)")
    w.close()
    problem = {"M": prod(rows), "K": n, "itemsize": acc_dtype(red).itemsize, "SCANS": len(specs)}
    variant = ("exclusive" if spec.exclusive else "inclusive") + ("-reverse" if spec.reverse else "")
    return KernelParts(
        form=kernel.form, variant=variant, params=params, constexprs=("BLOCK",), body=w.body(),
        grid=str(prod(rows)), problem=problem,
        config_space="scan", constants=consts,
        notes=["int64 indexing (a tensor or address passes 2**31)"] if big else [])
