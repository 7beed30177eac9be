"""Programs: ordered kernel calls bound to the nodes of a model's primitive graph.

A :class:`Program` is what extraction (or greedy fusion) hands to code generation and planning: a
list of :class:`KernelCall` in launch order, each binding its kernel's placeholders ``in0..`` to model
nodes it reads and ``out0..`` to model nodes it computes, plus the model's outputs.

Binding rules (checked by :meth:`Program.validate`):

* an input of a call is a model ``Input``, a model ``Constant`` (a weight), or an output of an earlier
  call; it has exactly the placeholder's shape and dtype;
* an output of the program is an output of some call, an ``Input`` or ``Constant``, or a ``View``
  whose arg is contiguous (a free reshape) over one of those.

:func:`run_program_reference` runs each kernel's meaning with the reference executor, in order: the
CPU execution path of a compiled plan, which must equal running the model graph directly.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lumc.backends.devices import DeviceSpec, get_device
from lumc.backends.precision import emulation
from lumc.backends.reference import ReferenceExecutor, checked_input
from lumc.ir.graph import Graph, Node
from lumc.ir.kernels import Kernel
from lumc.ir.ops import apply_view
from lumc.rewrites.cost import kernel_time_bound


@dataclass(eq=False)
class KernelCall:
    """One launch: ``kernel`` reading model nodes ``inputs`` (for ``in0..``) and writing ``outputs``
    (for ``out0..``). ``family``: for a call re-sized from a range's probe program
    (:func:`resize_program`), the kernel at the probe sizes it came from (one per structure)."""
    kernel: Kernel
    inputs: list[Node]
    outputs: list[Node]
    family: Kernel | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        ins = ", ".join(f"%{n.id}" for n in self.inputs)
        outs = ", ".join(f"%{n.id}" for n in self.outputs)
        return f"{outs} = {self.kernel.form}({ins})"


@dataclass(eq=False)
class Program:
    """Kernel calls in launch order, plus the model outputs ``{name: node}``.

    ``graph`` is the primitive graph whose nodes the calls bind: the model's own graph for greedy
    fusion, a rewritten one (same inputs and constants, same output names) for an e-graph
    candidate. Run ``ReferenceExecutor(program.graph)`` to get the value of any bound node.
    """
    calls: list[KernelCall]
    outputs: dict[str, Node]
    label: str = ""
    notes: list[str] = field(default_factory=list)
    graph: Graph | None = None
    origin: int | None = None    # the candidate it was made from (a size bucket's re-sized list)
    # {id(node): key} for nodes decoded from an e-class: two candidates' nodes with one key hold
    # the same value up to rounding (``lumc.compiler.core.reference_values`` shares them)
    value_keys: dict = field(default_factory=dict)
    # the row groups its fusion found (``lumc.compiler.core.fusion_rows``), each the ``Node.id``s
    # of its members, for ``why_not``: which consumers a '+rows' candidate computes with a row
    # value (None: not recorded, e.g. a re-sized program)
    row_groups: list | None = None

    def __len__(self) -> int:
        return len(self.calls)

    def kernels(self) -> list[Kernel]:
        return [c.kernel for c in self.calls]

    def form_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for c in self.calls:
            counts[c.kernel.form] = counts.get(c.kernel.form, 0) + 1
        return counts

    def signature(self) -> tuple:
        """A hashable summary that tells distinct programs apart (forms and the nodes they write)."""
        return tuple(sorted((c.kernel.form, tuple(n.id for n in c.outputs),
                             tuple(n.id for n in c.inputs)) for c in self.calls))

    def validate(self) -> None:
        """Check the binding rules of the module docstring.

        Raises:
            ValueError: naming the call and the first broken rule.
        """
        ready: set[int] = set()
        for i, c in enumerate(self.calls):
            k = c.kernel
            if len(c.inputs) != len(k.inputs) or len(c.outputs) != len(k.outputs):
                raise ValueError(f"call {i} ({k.form}): binds {len(c.inputs)}/{len(c.outputs)} nodes "
                                 f"to {len(k.inputs)}/{len(k.outputs)} placeholders")
            for ph, n in zip(k.inputs + k.outputs, c.inputs + c.outputs):
                if ph.shape != n.shape or ph.dtype != n.dtype:
                    raise ValueError(f"call {i} ({k.form}): placeholder {ph.shape}{ph.dtype} bound "
                                     f"to %{n.id} {n.shape}{n.dtype}")
            for n in c.inputs:
                if n.op not in ("Input", "Constant") and id(n) not in ready:
                    raise ValueError(f"call {i} ({k.form}): reads %{n.id} ({n.op}) before any "
                                     "call writes it")
            for n in c.outputs:
                ready.add(id(n))
        for name, n in self.outputs.items():
            base = output_source(n, ready)
            if base.op not in ("Input", "Constant") and id(base) not in ready:
                raise ValueError(f"output {name!r} (%{n.id} {n.op}) is not written by any call")

    def dump(self) -> str:
        """One line per call: ``%out = form(%in, ...)  # flops, bytes``."""
        lines = []
        for c in self.calls:
            lines.append(f"{c!r}  # {c.kernel.flops()} FLOP, {c.kernel.min_bytes()} B")
        lines += [f"-> {k}: %{n.id}" for k, n in self.outputs.items()]
        return "\n".join(lines)


def _ceilings(device) -> dict:
    if isinstance(device, str):
        device = get_device(device)
    if isinstance(device, DeviceSpec):
        return device.as_ceilings()
    return device


def kernel_times(program: Program, device) -> list[float]:
    """Roofline bound of each call in seconds, launch overhead included (``device``: a
    :class:`DeviceSpec`, its name, or its plain ceilings dict)."""
    ceil = _ceilings(device)
    return [kernel_time_bound(c.kernel, ceil) for c in program.calls]


def program_time_bound(program: Program, device) -> float:
    """Sum over calls of ``max(flops / peak, min_bytes / bandwidth) + launch overhead``, seconds."""
    return float(sum(kernel_times(program, device)))


def ideal_bytes(graph: Graph, program: Program) -> int:
    """The bytes a perfect plan of ``graph`` moves: its inputs and outputs once, and each weight
    once, as much of it as the program addresses (an embedding table: the gathered rows; a table
    also read whole, as GPT-2's tied LM head reads its embedding: all of it). A re-sized plan's
    (a size range's call) is its size's, not the bucket's representative's."""
    weight_bytes: dict[int, int] = {}
    for c in program.calls:
        for n, b in zip(c.inputs, c.kernel.read_bytes()):
            if n.op == "Constant":
                weight_bytes[id(n)] = max(weight_bytes.get(id(n), 0), b)
    return int(sum(n.nbytes for n in graph.inputs.values()) + sum(weight_bytes.values())
               + sum(n.nbytes for n in graph.outputs.values()))


def output_source(n: Node, written) -> Node:
    """The node whose buffer holds model output ``n``: ``n`` itself when a call writes it
    (``id(n) in written``: a prefix slice a kernel copies out of a larger value), else for a
    contiguous view (a reshape, a prefix) the value it views, which the caller views again."""
    if n.op == "View" and n.arg.is_contiguous and id(n) not in written:
        return n.srcs[0]
    return n


def _value_of(n: Node, env: dict[int, np.ndarray]) -> np.ndarray:
    if id(n) in env:
        return env[id(n)]
    if n.op == "Constant":
        return n.arg.value
    if n.op == "View" and n.arg.is_contiguous:
        return apply_view(_value_of(n.srcs[0], env), n.arg)
    raise KeyError(f"%{n.id} ({n.op}) has no value yet")


def run_program_reference(program: Program, graph: Graph, inputs: dict[str, np.ndarray],
                          precision: str = "native", configs: list | None = None
                          ) -> dict[str, np.ndarray]:
    """Run each kernel's meaning with the reference executor, in launch order.

    Args:
        program: the kernel calls (bound to ``graph``'s nodes).
        graph: the model graph (for its inputs).
        inputs: ``{input name: array}`` as for :class:`ReferenceExecutor`.
        precision: ``native`` or ``float64`` (per kernel).
        configs: the plan's config per call (None: all reference). A contraction whose config has
            a reduced ``PRECISION`` rounds its operands as the tensor cores do
            (``lumc.backends.precision``); a call whose config names an
            extern implementation (``IMPL``, ``lumc.backends.extern``) runs it through torch on the
            CPU (``lumc.compiler.runtime.extern``) instead, with ``native`` precision.
    Returns:
        ``{output name: contiguous array}`` in the graph's declared dtypes.
    Raises:
        InputError: on a missing input or one of the wrong shape or dtype.
    """
    env: dict[int, np.ndarray] = {}
    for n in graph.inputs.values():
        env[id(n)] = checked_input(n, inputs)
    for i, c in enumerate(program.calls):
        k = c.kernel
        cfg = configs[i] if configs is not None else None
        if cfg is not None and cfg.get("IMPL", "triton") != "triton" and precision == "native":
            from lumc.compiler.runtime.extern import run_extern_numpy
            outs = run_extern_numpy(k, cfg, [_value_of(n, env) for n in c.inputs])
            res = dict(zip(k.meaning.outputs, outs))
        else:
            feed = {ph.arg.name: _value_of(n, env) for ph, n in zip(k.inputs, c.inputs)}
            # a reduced-precision tl.dot (the config's PRECISION) rounds its operands first
            res = ReferenceExecutor(k.meaning, precision, **emulation(k, cfg))(feed)
        for (oname, _), n in zip(k.meaning.outputs.items(), c.outputs):
            env[id(n)] = res[oname].astype(n.dtype.np, copy=False)
    out = {}
    for name, n in program.outputs.items():
        out[name] = np.asarray(_value_of(n, env).astype(n.dtype.np, copy=False), order="C")
    return out


def reference_values(graph: Graph, programs: list[Program], inputs: dict[str, np.ndarray]
                     ) -> tuple[dict[str, np.ndarray], dict[int, np.ndarray]]:
    """One reference run of the model plus, for e-graph candidates whose calls bind nodes of a
    rewritten graph (``Program.graph``), a run of each such graph for the nodes the model's run
    does not hold. Returns ``(model outputs, {id(node): value})`` for every node any call reads
    or writes, so every candidate's kernels can be checked."""
    keep = {id(n) for p in programs for c in p.calls for n in (*c.inputs, *c.outputs)}
    out, values = ReferenceExecutor(graph).run_keeping(inputs, keep)
    others = {id(p.graph): p.graph for p in programs if p.graph is not None and p.graph is not graph}
    for g in others.values():
        here = {id(n) for n in g.nodes()}
        missing = {k for k in keep if k not in values and k in here}
        if missing:
            values.update(ReferenceExecutor(g).run_keeping(inputs, missing)[1])
    return out, values


def resize_program(program: Program, resizer) -> Program:
    """``program`` (bound to a graph imported at probe sizes, ``lumc.ir.symbolic``) at the sizes
    of ``resizer`` (a :class:`lumc.ir.symbolic.Resizer`): every bound node, kernel meaning and
    integer kernel attribute re-sized with the same memo, so calls still bind the resized graph's
    nodes. Raises ``lumc.ir.symbolic.NotSymbolic`` for a value that cannot be re-sized."""
    calls = []
    for c in program.calls:
        k = c.kernel
        kernel = Kernel(k.form, resizer.graph(k.meaning),
                        tuple((a, resizer.value(v)) for a, v in k.attrs), k.covers)
        calls.append(KernelCall(kernel, [resizer(n) for n in c.inputs],
                                [resizer(n) for n in c.outputs],
                                c.family if c.family is not None else k))
    graph = resizer.graph(program.graph) if program.graph is not None else None
    # the e-class keys of the boundary nodes carry over (the re-sized candidates share reference
    # values by e-class as the probe candidates would)
    keys = program.value_keys
    new_keys = {id(m): keys[id(n)] for c, rc in zip(program.calls, calls)
                for n, m in zip((*c.inputs, *c.outputs), (*rc.inputs, *rc.outputs))
                if id(n) in keys}
    return Program(calls, {k: resizer(v) for k, v in program.outputs.items()}, program.label,
                   list(program.notes), graph, program.origin, new_keys)
