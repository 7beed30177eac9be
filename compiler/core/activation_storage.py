"""Activation storage: the fp32 values one kernel writes and a later kernel reads, stored in bf16 or
fp16 under a reduced-precision policy.

``--precision bf16`` promises activations and weights in bf16 with fp32 accumulation (the issue's
definition, and what TensorRT's ``--bf16`` and ``torch.autocast`` give). Weights are stored by
:func:`lumc.compiler.core.precision.store_weights`; this module does the same for the values that
cross HBM between kernels, on each candidate program after extraction, so that the search renders,
checks and times kernels that really read and write the narrow dtype, and the bound and the
simulator price their bytes at 2 per element.

The transform is a rewrite of each :class:`~lumc.compiler.runtime.program.Program`'s kernel meanings,
in primitives, so the reference executor, the numerics checks and the quality gate see exactly the
rounding the kernels do:

* the producing kernel's output ``out`` becomes ``Cast(out, bf16)`` (round to nearest even at the
  store, the only place the value is observed) and the call writes the new node
  ``Cast(x, bf16)`` of the model graph;
* every consuming kernel reads that node through a bf16 placeholder and computes on
  ``Cast(in, f32)``: inside a kernel everything stays fp32 (accumulation, softmax, normalization
  statistics).

What stays fp32 (the policy's "statistics and long reductions stay in fp32"):

* the model's outputs (the user asked for an fp32 model's dtypes; quality is measured on them);
* the outputs of ``reduction``-form kernels: per-row statistics (a LayerNorm mean or variance,
  a softmax maximum or sum that the e-graph split from its row kernel), read broadcast by the
  kernel that normalizes with them; and the row values a ``matmul`` kernel writes beside its
  product (a normalization formed on load, computed by the first kernel that forms it);
* values that are not f32 (integers, booleans, a bf16/fp16 model's own values).
"""
from __future__ import annotations

from lumc.ir import dtypes as dt
from lumc.ir.graph import Graph, Node, input_node, node
from lumc.ir.kernels import Kernel
from lumc.compiler.runtime.program import KernelCall, Program
from lumc.ir.provenance import rebuilt

# the storage dtype of activations under each policy (None: activations stay as the model has them)
ACTIVATION_DTYPE = {"fp32": None, "tf32": None, "bf16": dt.bf16, "fp16": dt.f16, "fp8": dt.bf16,
                    "auto": dt.bf16}


def _substitute(g: Graph, inputs: dict[str, Node], outputs_cast: set[str], to: dt.DType) -> Graph:
    """``g`` with placeholders replaced by ``inputs`` (``{name: new placeholder}``, read through
    ``Cast(ph, f32)``) and the outputs named in ``outputs_cast`` ending in ``Cast(., to)``."""
    memo: dict[int, Node] = {}
    for name, ph in g.inputs.items():
        memo[id(ph)] = node("Cast", (inputs[name],), ph.dtype) if name in inputs and \
            inputs[name] is not ph else ph
    for n in g.nodes():
        if id(n) in memo:
            continue
        if n.srcs:
            srcs = tuple(memo[id(s)] for s in n.srcs)
            memo[id(n)] = rebuilt(n, srcs)
        else:
            memo[id(n)] = n
    new_inputs = {k: inputs.get(k, ph) for k, ph in g.inputs.items()}
    outs = {}
    for k, o in g.outputs.items():
        v = memo[id(o)]
        outs[k] = node("Cast", (v,), to) if k in outputs_cast else v
    return Graph(new_inputs, outs)


def _row_statistic(k: Kernel, out: str) -> bool:
    """True for a kernel output that is a row statistic: any output of a ``reduction``-form kernel
    (a mean, a variance, a maximum or a sum over rows that the e-graph split from the kernel that
    uses it), or an output of a ``matmul`` kernel that does not depend on its contraction (the
    row values of a normalization formed on load it writes for other kernels)."""
    if k.form == "reduction":
        return True
    if k.form != "matmul":
        return False
    nodes = k.meaning.nodes()
    prods = [n for n in nodes if n.op == "SumReduce" and n.srcs[0].op == "Mul"]
    if not prods:
        return False
    dep = {id(max(prods, key=lambda n: n.srcs[0].numel))}
    for n in nodes:
        if any(id(s) in dep for s in n.srcs):
            dep.add(id(n))
    return id(k.meaning.outputs[out]) not in dep


def store_activations(program: Program, to: dt.DType | None) -> Program:
    """``program`` with its f32 kernel-to-kernel values stored in ``to`` (see the module docstring);
    ``program`` itself when ``to`` is None or nothing qualifies.

    Args:
        program: a validated program (calls in launch order).
        to: ``dt.bf16`` or ``dt.f16``, or None.
    Returns:
        A new :class:`Program` (same label, outputs and graph) whose calls bind the new
        ``Cast(x, to)`` nodes; ``notes`` gains one line saying how many values are stored narrow.
    """
    if to is None:
        return program
    out_ids = set()
    for n in program.outputs.values():
        out_ids.add(id(n))
        if n.op == "View":
            out_ids.add(id(n.srcs[0]))
    readers: dict[int, list[tuple[int, int]]] = {}       # id(node) -> [(call, input position)]
    for i, c in enumerate(program.calls):
        for j, n in enumerate(c.inputs):
            readers.setdefault(id(n), []).append((i, j))
    narrow: dict[int, Node] = {}                          # id(model node) -> Cast(node, to)
    for c in program.calls:
        for name, n in zip(c.kernel.meaning.outputs, c.outputs):
            rd = readers.get(id(n), [])
            if n.dtype != dt.f32 or id(n) in out_ids or not rd or _row_statistic(c.kernel, name):
                continue
            narrow[id(n)] = node("Cast", (n,), to)
    if not narrow:
        return program
    calls = []
    for c in program.calls:
        k = c.kernel
        in_names = list(k.meaning.inputs)
        new_ph = {}
        for name, n in zip(in_names, c.inputs):
            if id(n) in narrow:
                ph = k.meaning.inputs[name]
                new_ph[name] = input_node(ph.arg.name, ph.shape, to)
        out_names = list(k.meaning.outputs)
        cast_outs = {name for name, n in zip(out_names, c.outputs) if id(n) in narrow}
        if not new_ph and not cast_outs:
            calls.append(c)
            continue
        meaning = _substitute(k.meaning, new_ph, cast_outs, to)
        kernel = Kernel(k.form, meaning, k.attrs, k.covers)
        calls.append(KernelCall(kernel, [narrow.get(id(n), n) for n in c.inputs],
                                [narrow.get(id(n), n) for n in c.outputs]))
    notes = list(program.notes) + [f"{len(narrow)} kernel-to-kernel values stored in {to.name}"]
    return Program(calls, dict(program.outputs), program.label, notes, program.graph,
                   program.origin)
