"""Pointwise (and gather) kernels: any fused chain of elementwise primitives over views.

One program handles ``BLOCK`` consecutive elements of the output in row-major order. Each element's
index is unravelled into the output's dims, and every operand is read at the index its view chain
maps it to (broadcast = stride 0, transpose = permuted strides, slice/pad = offset and mask, gather =
a data-dependent index), so nothing between the placeholders and the outputs is materialized.
Several outputs of the same element count are written by the same program.

Bytes moved: each input element read once per output element that uses it (a broadcast input is read
from cache), each output written once; the kernel is memory-bound, so the target is the copy bandwidth.
"""
from __future__ import annotations

from lumc.ir.kernels import Kernel
from lumc.ir.views import prod
from lumc.backends.triton.codegen import Evaluator, RenderError, SourceWriter, reads_of
from lumc.backends.triton.indexing import needs_int64, reshape_index, unravel
from lumc.backends.triton.source import KernelParts, make_params


def render_pointwise(kernel: Kernel) -> KernelParts:
    """Render a pointwise/gather kernel.

    Raises:
        RenderError: when outputs differ in element count or the meaning contains a reduction.
    """
    nodes = kernel.meaning.nodes()
    outs = kernel.meaning.outputs
    first = next(iter(outs.values()))
    shape = first.shape
    numel = prod(shape)
    for name, o in outs.items():
        if o.numel != numel:
            raise RenderError(f"pointwise outputs differ in size: {name} has {o.numel}, "
                              f"expected {numel}")
    for n in nodes:
        if n.op in ("SumReduce", "MaxReduce") and n.srcs[0].shape != n.shape:
            raise RenderError(f"node {n!r}: a reduction inside a pointwise kernel")
    reads = reads_of(nodes)
    params, ptrs, consts = make_params(kernel, reads)
    big = needs_int64(nodes)
    w = SourceWriter()
    pid = "tl.program_id(0).to(tl.int64)" if big else "tl.program_id(0)"
    w.line(f"offs = {pid} * BLOCK + tl.arange(0, BLOCK)")
    w.line(f"mask = offs < {numel}")
    idx = [e if e == "0" else w.bind(e, "i") for e in unravel("offs", shape)]
    ev = Evaluator(w, ptrs, index_dtype="tl.int64" if big else "tl.int32")
    ev.flat_aliases[(tuple(idx), shape)] = "offs"
    for name, o in outs.items():
        oidx = reshape_index(idx, shape, o.shape)
        v = ev.value(o, oidx, "mask", 0)
        w.line(f"tl.store({name}_ptr + offs, {v}, mask=mask)")
    return KernelParts(
        form=kernel.form, variant="flat", params=params, constexprs=("BLOCK",), body=w.body(),
        grid=f"triton.cdiv({numel}, BLOCK)", problem={"N": numel, "itemsize": first.dtype.itemsize},
        config_space="pointwise", constants=consts,
        notes=["int64 indexing (a tensor or address passes 2**31)"] if big else [])
