"""``torch.compile(model, backend="lumc")``: a TorchDynamo backend that runs each captured graph
with lumc.

Registered through the ``torch_dynamo_backends`` entry point (``lumc = lumc.compiler.core.torch_backend:
lumc_backend``); passing :func:`lumc_backend` itself as ``backend=`` works too. Options:
``torch.compile(model, backend="lumc", options={"budget": "2m"})``; the default budget is
``lumc.compiler.core.torch_compile.DEFAULT_BUDGET``.

How a Dynamo graph is lowered: Dynamo hands over a Torch-level FX graph (``torch.*`` functions and
methods, parameters lifted to inputs) and example inputs. For each distinct set of input shapes the
backend traces that graph to core ATen with ``make_fx`` (``torch.func.functionalize`` removes
in-place ops and views; the decomposition table is the frontend's, which keeps attention whole),
at those concrete shapes, then lowers it with the same handlers as the ``torch.export`` path. lumc
graphs are concrete, so a graph Dynamo marks dynamic is re-traced and re-lowered per new shape and
cached by shape. Parameters stay graph inputs (Dynamo passes them on every call), so in-place
updates of the weights are seen.
"""
from __future__ import annotations

import time

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.core.budget import parse_duration
from lumc.compiler.core.torch_compile import DEFAULT_BUDGET
from lumc.compiler.frontends.torch_frontend import decomposition_table
from lumc.compiler.frontends.torch_frontend.capture import CapturedProgram, InputSlot, from_numpy, to_numpy
from lumc.compiler.core.torch_compile import Specialization
from lumc.compiler.frontends.torch_frontend.lowering import check_supported
from lumc.compiler.frontends.torch_frontend.registry import lumc_dtype
from lumc.ir.errors import InputError


def _is_fake(x) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    return isinstance(x, FakeTensor)


def _hint(x):
    """A SymInt example input as its traced int (None when it has none); others unchanged."""
    if isinstance(x, torch.SymInt):
        hint = getattr(x.node, "hint", None)
        return int(hint) if hint is not None else None
    return x


class DynamoGraph:
    """The callable lumc returns to Dynamo for one captured FX graph.

    Attributes:
        gm: Dynamo's graph module (its parameters are inputs, so it holds no weights).
        budget_s: the compile budget in seconds (unspent by the reference executor).
        specializations: ``{shape key: Specialization}``.
    """

    def __init__(self, gm: torch.fx.GraphModule, example_inputs, budget_s: float,
                 search: bool = True, device: str | None = None, policy=None):
        self.policy = policy             # the precision policy (lumc.compiler.core.precision)
        self.gm = gm
        self.budget_s = budget_s
        self.search = search
        self.device = device
        self.names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
        self.specializations: dict[tuple, Specialization] = {}
        self._table = decomposition_table()
        example = [_hint(x) for x in example_inputs]
        if not any(x is None or _is_fake(x) for x in example):
            self._specialize(example)    # surface unsupported ops at compile time

    def _key(self, args) -> tuple:
        return tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else ("value", a)
                     for a in args)

    def _specialize(self, args) -> Specialization:
        key = self._key(args)
        hit = self.specializations.get(key)
        if hit is not None:
            return hit
        t0 = time.perf_counter()
        fn = torch.func.functionalize(self.gm, remove="mutations_and_views")
        # outside Dynamo's tracing context, make_fx makes its own static-shape fake mode instead
        # of reusing Dynamo's symbolic one: the trace is at exactly these shapes
        with torch._guards.tracing(None):
            aten_gm = make_fx(fn, decomposition_table=self._table, tracing_mode="fake")(*args)
        check_supported(aten_gm.graph)
        slots = []
        placeholders = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
        for p, name, a in zip(placeholders, self.names, args):
            if isinstance(a, torch.Tensor):
                slots.append(InputSlot(p.name, tuple(a.shape), lumc_dtype(a.dtype)))
            else:
                slots.append(InputSlot(p.name, None, None, a))
        n_out = len(next(n for n in reversed(aten_gm.graph.nodes) if n.op == "output").args[0])
        weights = {}
        for n in aten_gm.graph.nodes:
            if n.op == "get_attr":
                weights[n.target] = to_numpy(getattr(aten_gm, n.target)).copy()
        program = CapturedProgram(aten_gm, weights, slots, {}, None, None, list(range(n_out)),
                                  [f"output_{k}" for k in range(n_out)], _device(args),
                                  source="torch.compile (make_fx)")
        imported, info = program.specialize([tuple(a.shape) if isinstance(a, torch.Tensor)
                                             else None for a in args])
        compiled = None
        if self.search and not any(_is_fake(a) for a in args if isinstance(a, torch.Tensor)):
            # every compile goes through the kernel search and the tuning database
            from lumc.compiler.core.pipeline import compile_graph
            feed = {slot.name: to_numpy(a) for slot, a in zip(program.inputs, args)
                    if slot.dims is not None}
            compiled = compile_graph(imported.graph, budget=self.budget_s, device=self.device,
                                     example_inputs=feed, name="torch.compile graph",
                                     policy=self.policy)
            executor = compiled.run
        else:
            executor = ReferenceExecutor(imported.graph)
        spec = Specialization(key, imported, executor, info["op_counts"],
                              time.perf_counter() - t0, info["flat_outputs"], program, compiled)
        self.specializations[key] = spec
        return spec

    def __call__(self, *args):
        spec = self._specialize(list(args))
        program = spec.program
        feed = {}
        for slot, a in zip(program.inputs, args):
            if slot.dims is not None:
                arr = to_numpy(a)
                if arr.dtype != slot.dtype.np:
                    raise InputError(f"input {slot.name!r} has dtype {a.dtype}, expected "
                                     f"{slot.dtype}", node=slot.name)
                feed[slot.name] = arr
        results = spec.executor(feed)
        out = []
        for name, v in zip(program.output_names, spec.flat_outputs):
            out.append(from_numpy(results[name], program.device) if name in results else v)
        return tuple(out)

    def report(self) -> str:
        how = "kernel search per shape" if self.search else "reference executor, no kernel search"
        lines = [f"lumc torch.compile graph: {len(self.names)} inputs; budget {self.budget_s:g} s "
                 f"({how})"]
        for s in self.specializations.values():
            counts = s.imported.graph.op_counts()
            aten = ", ".join(f"{k.removeprefix('aten.')} {v}" for k, v in sorted(
                s.op_counts.items(), key=lambda kv: -kv[1]))
            lines.append(f"  specialization {s.key}: ATen {aten}; "
                         f"{sum(counts.values())} primitive nodes; lowered in {s.seconds:.2f} s")
        return "\n".join(lines)


def _device(args) -> torch.device:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    return torch.device("cpu")


_BACKEND_OPTIONS = ("budget", "search", "device", "precision", "weights", "tolerance", "max_kl",
                    "logits")


def lumc_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, **kw):
    """The TorchDynamo backend (see :func:`_lumc_backend` for the options): ``torch.compile``
    passes ``options={...}`` as one dict; calling it directly may pass them as keywords."""
    merged = {**dict(options or {}), **kw}
    unknown = sorted(set(merged) - set(_BACKEND_OPTIONS))
    if unknown:
        raise TypeError(f"unknown lumc backend options: {', '.join(unknown)}; known: "
                        f"{', '.join(_BACKEND_OPTIONS)}")
    return _lumc_backend(gm, example_inputs, **merged)


def _lumc_backend(gm: torch.fx.GraphModule, example_inputs, budget=None, search: bool = True,
                  device: str | None = None, precision: str = "fp32", weights: str = "same",
                  tolerance: float | None = None, max_kl: float | None = None, logits=()):
    """The TorchDynamo backend: returns a callable running ``gm`` with lumc.

    Args:
        gm: the graph Dynamo captured.
        example_inputs: Dynamo's example inputs (tensors, and ints for symbolic sizes).
        budget: the compile budget (``"2m"``, seconds); None for ``DEFAULT_BUDGET``.
        search: run the kernel search per shape (default); False runs the reference executor.
        device: the compile target (default: the first GPU, else ``sim:h200``).
        precision, weights, tolerance, max_kl, logits: the precision policy and its quality gate
            (``lumc.compiler.core.precision``), as ``torch.compile(m, backend="lumc",
            options={"precision": "bf16"})``.
    Raises:
        InputError: an unknown precision or weights option.
        UnsupportedOpError: the graph uses ATen ops lumc cannot lower (Dynamo reports it as a
            backend compiler failure).
        BudgetError: a malformed budget.
    """
    budget_s = parse_duration(DEFAULT_BUDGET if budget is None else budget)
    from lumc.compiler.core.precision import PrecisionPolicy
    policy = PrecisionPolicy(precision, weights, tolerance, max_kl, tuple(logits))
    return DynamoGraph(gm, example_inputs, budget_s, search, device, policy)
