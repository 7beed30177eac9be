"""``torch.compile(model, backend="lumc")``: a TorchDynamo backend that runs each captured graph
with lumc.

Registered through the ``torch_dynamo_backends`` entry point (``lumc = lumc.compiler.core.torch_backend:
lumc_backend``); passing :func:`lumc_backend` itself as ``backend=`` works too. Options:
``torch.compile(model, backend="lumc", options={"budget": "2m"})``; the default budget is
``lumc.compiler.core.torch_compile.DEFAULT_BUDGET``. It is one deadline (and one grace) for a
graph's first call: the trace, the range compile and, where that fails, the compile at the first
call's shape; a later compile (another shape outside the range) has a budget of its own.

How a Dynamo graph is lowered: Dynamo hands over a Torch-level FX graph (``torch.*`` functions and
methods, parameters lifted to inputs) and example inputs. The backend traces that graph to core
ATen with ``make_fx`` (``torch.func.functionalize`` removes in-place ops and views; the
decomposition table is the frontend's, which keeps attention whole) at concrete shapes, then
lowers it with the same handlers as the ``torch.export`` path. Parameters stay graph inputs
(Dynamo passes them on every call), so in-place updates of the weights are seen. Python floats
Dynamo passes as 0-d tensors (``dynamic=True`` makes ``eps``, dropout ``p`` and such inputs) are
traced as the constants they were at capture; a call with another value compiles afresh.

**Static graphs** compile at their one shape, once.

**Dynamic graphs** (``dynamic=True``, ``torch._dynamo.mark_dynamic``, or Dynamo's automatic
dynamic shapes on a second size) compile **once for a size range**
(``lumc.compiler.core.buckets.compile_ranges``): each distinct ``SymInt`` among the input sizes
(the same symbol on several inputs is one dim; Dynamo's replacements are applied) is a ranged dim,
named by its symbol (``s27``). Its range is Dynamo's value range from the ``ShapeEnv`` where that
is finite (``mark_dynamic(x, 1, min=2, max=512)``); an unbounded end is ``lo`` = Dynamo's lower
bound (2 where it specializes 0 and 1) and ``hi`` = :data:`DEFAULT_MAX_SIZE` (1024). Options
change it: ``options={"max_size": 256}`` for every unbounded dim, ``options={"shapes": {"x.1":
(2, 128)}}`` per dim (keyed by the symbol, ``s27``, or ``INPUT.AXIS`` with the input's placeholder
name, Dynamo's ``L_x_`` or just ``x``; always clipped to Dynamo's own range). The graph is traced
at the range's probe and check primes, the e-graph runs once and each size bucket is searched;
every call in the range then re-sizes its bucket's plan (``VariantModel``): no trace, no search,
no lumc compile. ``DynamoGraph.compiles`` (and the module's :data:`counters`) count lumc compiles.

A call **outside the range** (or with another baked float) is compiled for its exact shapes alone
and cached by shape, as a static graph would be (counted too; ``counters["outside_range"]``).
A graph whose sizes do not re-size (``compile_ranges`` refuses it: its sizes are not products of
the dims, a dim that no tensor input has, a size output, a range too narrow to probe, a trace
failing at a probe size, too small a budget for the buckets, a bucket's numerics check failing)
**falls back** to one compile per distinct shape, and ``DynamoGraph.per_shape_reason`` says why.
A size the model cannot take makes the range fail its check: GPT-2's 1024 default top indexes
past a shorter position table (``n_positions=128``); ``max_size`` is the fix there. With
``search=False`` (the reference executor) dynamic graphs are lowered per shape too.
"""
from __future__ import annotations

import collections
import time

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from lumc.backends.reference import ReferenceExecutor
from lumc.backends.triton.launch import torch_dtype
from lumc.compiler.core.budget import Deadline, parse_duration
from lumc.compiler.core.torch_compile import DEFAULT_BUDGET
from lumc.compiler.frontends.torch_frontend import decomposition_table
from lumc.compiler.frontends.torch_frontend.capture import (CapturedProgram, InputSlot, from_numpy,
                                                             int_examples, refuse_meta_tensors,
                                                             to_numpy)
from lumc.compiler.core.torch_compile import Specialization, same_constant
from lumc.compiler.frontends.torch_frontend.lowering import check_supported
from lumc.compiler.frontends.torch_frontend.registry import lumc_dtype
from lumc.ir.errors import BudgetError, InputError, LumcError, UnsupportedOpError
from lumc.compiler.runtime.no_backward import InferenceOnly
from lumc.compiler.core.torch_state import (eager_requires_grad, lift_input_writes, output_aliases,
                                             refuse_overlapping_writes, restore_aliases,
                                             write_back)
from lumc.compiler.core.buckets import compile_range
from lumc.compiler.core.torch_dynamic_dims import (DEFAULT_MAX_SIZE, DynamicDim,  # noqa: F401
                                                   dim_ranges, dynamic_dims, where_used)


# lumc compiles made by this backend, over every graph: "graphs" (DynamoGraphs made), "compiles"
# (lumc compiles of any kind), "range_compiles", "shape_compiles", "outside_range" (calls outside
# a compiled range), "per_shape_fallbacks" (dynamic graphs that could not compile as a range)
counters: collections.Counter = collections.Counter()


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
        specializations: ``{shape key: Specialization}`` (static graphs, the per-shape fallback,
            calls outside the range).
        dims: ``{name: DynamicDim}`` of a dynamic graph (empty for a static one).
        ranged: the :class:`~lumc.compiler.runtime.variants.VariantModel` serving the range (None:
            no range compile).
        per_shape_reason: why a dynamic graph is compiled per shape instead (None otherwise).
        compiles: lumc compiles made for this graph (a range compile counts one).
        range_compile_s: the range compile's wall time.
    """

    def __init__(self, gm: torch.fx.GraphModule, example_inputs, budget_s: float,
                 search: bool = True, device: str | None = None, policy=None,
                 max_size: int | None = None, shapes: dict | None = None, workers=None):
        # the first call's budget: the range compile and, where it fails, the fallback's compile
        # at the first shape share it (each had a budget of its own, and its own grace: a 10 s
        # budget's first call took 39.5 s)
        first = Deadline(budget_s)
        self.policy = policy             # the precision policy (lumc.compiler.core.precision)
        self.workers = workers           # --workers of every compile (lumc.compiler.core.workers)
        self.gm = gm
        self.budget_s = budget_s
        self.search = search
        self.device = device
        self.names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
        self.specializations: dict[tuple, Specialization] = {}
        self.compiles = 0
        self.ranged = None
        self.range_compile_s = None
        self.per_shape_reason: str | None = None
        self.outside_calls = 0
        self._range_program: CapturedProgram | None = None
        # [(argument index, placeholder)] the graph writes in place (``lift_input_writes``)
        self._writes: list[tuple[int, str]] = []
        self._table = decomposition_table()
        self._placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        refuse_meta_tensors([f"input {n!r}" for n in self.names], example_inputs)
        self._aliases = output_aliases(gm)    # outputs that are inputs or views of them
        self._examples = list(example_inputs)
        self._baked = self._baked_floats()
        counters["graphs"] += 1
        self.dims, why = self._dynamic_dims()
        if self.dims or why:
            if not search:
                why = "search=False: the reference executor lowers each shape"
            if why is None:
                ranges = self._dim_ranges(max_size, shapes)    # the options' errors raise
                try:
                    self._compile_range(ranges, first)
                except (InputError, BudgetError) as e:
                    why = str(e)
                    if "out of range" in why and any(d.hi is None for d in self.dims.values()):
                        why += (" (a range Dynamo leaves open ends at max_size; "
                                "options={'max_size': N} or 'shapes' narrow it)")
            if self.ranged is None:
                self.per_shape_reason = why
                counters["per_shape_fallbacks"] += 1
                if search:
                    # the backend's compile is silent and its report out of the user's reach: a
                    # Llama graph dynamic in batch and sequence (1..1024 each: a 16 GiB score at
                    # the top) searched its kernels again at every new shape, seconds each
                    import warnings
                    warnings.warn(f"lumc: torch.compile graph: not compiled for a size range "
                                  f"({why}); each new shape is compiled on its own", stacklevel=2)
        elif shapes:
            raise InputError("options['shapes'] names dynamic dims, but Dynamo captured this "
                             "graph with static shapes (use dynamic=True or mark_dynamic)")
        self._examples = None            # the examples hold the module's parameters
        if self.ranged is None:
            example = [_hint(x) for x in example_inputs]
            if not any(x is None or _is_fake(x) for x in example):
                self._specialize(example, first)    # surface unsupported ops at compile time

    # ---- the graph's inputs -----------------------------------------------------------------------
    def _baked_floats(self) -> dict[int, tuple]:
        """``{argument index: (value, dtype, device)}`` of the Python floats Dynamo passes as 0-d
        tensors: traced as constants (``.item()`` of a fake tensor has no value)."""
        out = {}
        for i, (p, ex) in enumerate(zip(self._placeholders, self._examples)):
            ga = p.meta.get("grapharg")
            if ga is not None and getattr(ga, "pass_arg_as_tensor", False) and \
                    isinstance(ex, torch.Tensor) and not _is_fake(ex) and ex.numel() == 1:
                out[i] = (ex.item(), ex.dtype, ex.device)
        return out

    def _dynamic_dims(self) -> tuple[dict[str, DynamicDim], str | None]:
        """The graph's dynamic dims and, when they cannot be compiled as a range, why."""
        dims, why, self._shape_env = dynamic_dims(self._placeholders, self._examples)
        return dims, why

    def _dim_ranges(self, max_size, shapes) -> dict:
        """``{dim name: DimRange}``: Dynamo's ranges, unbounded ends set by the options."""
        return dim_ranges(self.dims, self.names, max_size, shapes)

    def _where(self, d: DynamicDim) -> str:
        return where_used(d, self.names)

    # ---- tracing ----------------------------------------------------------------------------------
    def _trace(self, args) -> tuple[CapturedProgram, object, dict]:
        """``make_fx`` of the graph at these concrete inputs, lowered: ``(program, imported, info)``.
        The baked floats are constants inside the trace; ``program.inputs`` are the others."""
        n = len(self._placeholders)
        baked = self._baked
        fn = torch.func.functionalize(self.gm, remove="mutations_and_views")

        def with_constants(*rest):
            it = iter(rest)
            full = [torch.tensor(baked[i][0], dtype=baked[i][1], device=baked[i][2])
                    if i in baked else next(it) for i in range(n)]
            return fn(*full)
        kept = [a for i, a in enumerate(args) if i not in baked]
        # outside Dynamo's tracing context, make_fx makes its own static-shape fake mode instead
        # of reusing Dynamo's symbolic one: the trace is at exactly these shapes
        from lumc.compiler.frontends.torch_frontend.capture import (DATA_DEPENDENT_HINT,
                                                                    quiet_tracing)
        try:
            with torch._guards.tracing(None), quiet_tracing():
                aten_gm = make_fx(with_constants if baked else fn, decomposition_table=self._table,
                                  tracing_mode="fake")(*kept)
        except Exception as e:       # make_fx raises many unrelated exception types
            if "data-dependent" not in str(e):
                raise
            raise UnsupportedOpError(f"the graph cannot be traced at fixed sizes: "
                                     f"{str(e).splitlines()[0]}{DATA_DEPENDENT_HINT}") from None
        self._writes = lift_input_writes(aten_gm, [i for i in range(n) if i not in baked])
        check_supported(aten_gm.graph)
        slots = []
        placeholders = [p for p in aten_gm.graph.nodes if p.op == "placeholder"]
        for p, a in zip(placeholders, kept):
            if isinstance(a, torch.Tensor):
                slots.append(InputSlot(p.name, tuple(a.shape), lumc_dtype(a.dtype)))
            else:
                slots.append(InputSlot(p.name, None, None, a))
        n_out = len(next(p for p in reversed(aten_gm.graph.nodes) if p.op == "output").args[0])
        weights = {}
        for p in aten_gm.graph.nodes:
            if p.op == "get_attr":
                weights[p.target] = to_numpy(getattr(aten_gm, p.target)).copy()
        program = CapturedProgram(aten_gm, weights, slots, {}, None, None, list(range(n_out)),
                                  [f"output_{k}" for k in range(n_out)], _device(kept),
                                  source="torch.compile (make_fx)")
        imported, info = program.specialize([tuple(a.shape) if isinstance(a, torch.Tensor)
                                             else None for a in kept])
        return program, imported, info

    def _kept(self, args) -> list:
        return [a for i, a in enumerate(args) if i not in self._baked]

    # ---- one compile for the size range -----------------------------------------------------------
    def _example_at(self, sizes: dict[str, int]) -> list:
        """Example inputs with the dynamic dims at ``sizes`` (``{dim name: size}``)."""
        env = {d.symbol: sizes[d.name] for d in self.dims.values()}

        def size(d) -> int:
            if not isinstance(d, torch.SymInt):
                return int(d)
            e = d.node.expr
            if self._shape_env is not None:
                e = self._shape_env.replace(e)
            return int(e.xreplace(env))
        out = []
        for p, ex in zip(self._placeholders, self._examples):
            ev = p.meta.get("example_value", ex)
            if isinstance(ev, torch.SymInt):
                out.append(size(ev))
            elif isinstance(ev, torch.Tensor):
                shape = tuple(size(d) for d in ev.shape)
                if isinstance(ex, torch.Tensor) and not _is_fake(ex) and tuple(ex.shape) == shape:
                    out.append(ex)
                else:
                    out.append(torch.zeros(shape, dtype=ev.dtype, device=ev.device))
            else:
                out.append(_hint(ex))
        return out

    def _frontend(self, model, sizes: dict):
        """``compile_ranges``' frontend: the graph traced and lowered at ``sizes``."""
        from lumc.compiler.core.onnx_stage import Frontend
        try:
            program, imported, info = self._trace(self._example_at(sizes))
        except LumcError:
            raise
        except Exception as e:     # a guard Dynamo took (L even, L != 3) a probe size breaks
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise InputError(f"tracing the graph at {sizes} failed ({type(e).__name__}: "
                             f"{first[:160]})") from None
        from lumc.ir.tensor import Tensor
        if not all(isinstance(v, Tensor) for v in info["flat_outputs"]):
            raise InputError("the graph returns values that are not tensors (sizes), which "
                             "differ per size")
        if self._range_program is None:
            self._range_program = program
        kept = [x for i, x in enumerate(self._examples or []) if i not in self._baked]
        return Frontend(imported.graph, None, "torch.compile graph", list(imported.warnings),
                        examples=int_examples(program.inputs, kept))   # the first call's ints

    def _compile_range(self, ranges: dict, deadline: Deadline | None = None) -> None:
        t0 = time.perf_counter()
        from lumc.compiler.core.workers import use_workers
        with use_workers(self.workers):
            vm = compile_range(self.gm, ranges, self._frontend, self.budget_s, self.device,
                               self.policy, deadline)
        self.range_compile_s = time.perf_counter() - t0
        say_fallbacks(vm.report_dict())
        self.compiles += 1
        counters["compiles"] += 1
        counters["range_compiles"] += 1
        # the plans read each dim at the axes the trace gave it, nowhere else
        slot_of = {}
        kept = [i for i in range(len(self._placeholders)) if i not in self._baked]
        for slot, i in zip(self._range_program.inputs, kept):
            slot_of[i] = slot.name
        for key, _ in vm.variants:
            for d in self.dims.values():
                want = sorted([slot_of[i], ax] for i, ax in d.uses)
                if sorted(list(a) for a in key.axes.get(d.name, [])) != want:
                    raise InputError(f"dim {d.name}: the plans read it at {key.axes.get(d.name)}, "
                                     f"the graph has it at {want}")
        self.ranged = vm

    def _in_range(self, args) -> bool:
        for i, (v, _, _) in self._baked.items():
            if not isinstance(args[i], torch.Tensor) or not same_constant(args[i].item(), v):
                return False
        for d in self.dims.values():
            for i, ax in d.uses:
                n = int(args[i].shape[ax])
                if not (d.range.lo <= n <= d.range.hi):
                    return False
        return True

    # ---- one compile per shape --------------------------------------------------------------------
    def _key(self, args) -> tuple:
        return tuple(("baked", repr(a.item())) if i in self._baked and isinstance(a, torch.Tensor)
                     else (tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor)
                     else ("value", a) for i, a in enumerate(args))

    def _specialize(self, args, deadline: Deadline | None = None) -> Specialization:
        """The (cached) specialization at ``args``' shapes; its compile spends ``deadline`` (the
        first call's), else a budget of its own."""
        key = self._key(args)
        hit = self.specializations.get(key)
        if hit is not None:
            return hit
        t0 = time.perf_counter()
        baked = self._baked
        if any(isinstance(args[i], torch.Tensor) and not same_constant(args[i].item(), v)
               for i, (v, _, _) in baked.items()):
            # another value of a float Dynamo passes as a tensor: traced at this call's value
            self._baked = {i: (args[i].item(), dt, dev) for i, (_, dt, dev) in baked.items()}
        try:
            program, imported, info = self._trace(args)
        finally:
            self._baked = baked
        kept = self._kept(args)
        compiled = None
        if self.search and not any(_is_fake(a) for a in kept if isinstance(a, torch.Tensor)):
            # every compile goes through the kernel search and the tuning database
            from lumc.compiler.core.pipeline import compile_graph
            feed = {slot.name: to_numpy(a) for slot, a in zip(program.inputs, kept)
                    if slot.dims is not None}
            compiled = compile_graph(imported.graph, budget=self.budget_s, device=self.device,
                                     example_inputs=feed, name="torch.compile graph",
                                     policy=self.policy, workers=self.workers,
                                     deadline=deadline)
            say_fallbacks(compiled.report_dict())
            self.compiles += 1
            counters["compiles"] += 1
            counters["shape_compiles"] += 1
            executor = compiled.run
        else:
            executor = ReferenceExecutor(imported.graph)
        spec = Specialization(key, imported, executor, info["op_counts"],
                              time.perf_counter() - t0, info["flat_outputs"], program, compiled)
        self.specializations[key] = spec
        return spec

    # ---- calls ------------------------------------------------------------------------------------
    def _feed(self, program: CapturedProgram, kept, tensors: bool = False) -> dict:
        """``{input name: array}`` of the call (``tensors``: the torch tensors themselves)."""
        feed = {}
        for slot, a in zip(program.inputs, kept):
            if slot.dims is not None:
                if a.dtype != torch_dtype(slot.dtype):
                    raise InputError(f"input {slot.name!r} has dtype {a.dtype}, expected "
                                     f"{slot.dtype}", node=slot.name)
                feed[slot.name] = a if tensors else to_numpy(a)
        return feed

    def __call__(self, *args):
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                           for a in args):
            # lumc compiles for inference: outputs that need a gradient get one that refuses
            # (else a loss through them would silently leave this graph's parameters without one)
            grads = eager_requires_grad(self.gm)   # y * 2 of a y that needs none: detached
            out = tuple(t.detach() if k < len(grads) and not grads[k] else t
                        for k, t in enumerate(InferenceOnly.apply(self._run, *args)))
        else:
            out = self._run(*args)
        return restore_aliases(self._aliases, self.gm, args, out) if self._aliases else out

    def _run(self, *args):
        refuse_overlapping_writes(self._writes, args, self.names)
        if self.ranged is not None:
            if self._in_range(args):
                program = self._range_program
                # the tensors as they are: the bucket is picked by their shapes, and its re-sized
                # plan runs them on their device (on a GPU, no host round trip)
                feed = self._feed(program, self._kept(args), True)
                results = self.ranged.select(feed).run_tensors(feed)
                return write_back(self._writes, args, tuple(
                    from_numpy(results[name], program.device) for name in program.output_names))
            self.outside_calls += 1
            counters["outside_range"] += 1
        spec = self._specialize(list(args))
        program = spec.program
        if spec.compiled is not None:     # the tensors as they are: on a GPU, no host round trip
            results = spec.compiled.run_tensors(self._feed(program, self._kept(args), True))
        else:
            results = spec.executor(self._feed(program, self._kept(args)))
        out = []
        for name, v in zip(program.output_names, spec.flat_outputs):
            out.append(from_numpy(results[name], program.device) if name in results else v)
        return write_back(self._writes, args, tuple(out))

    def report(self) -> str:
        how = "kernel search per shape" if self.search else "reference executor, no kernel search"
        if self.ranged is not None:
            how = "kernel search once for the size range, per bucket"
        lines = [f"lumc torch.compile graph: {len(self.names)} input{'s' * (len(self.names) != 1)}; "
                 f"budget {self.budget_s:g} s "
                 f"({how}); {self.compiles} lumc compile{'s' * (self.compiles != 1)}"]
        for d in self.dims.values():
            rng = d.range.describe() if d.range is not None else "-"
            lines.append(f"  dynamic dim {d.name} ({self._where(d)}): Dynamo's range "
                         f"{d.lo}..{d.hi if d.hi is not None else 'inf'}, compiled {rng}")
        if self.ranged is not None:
            r = self.ranged.report_dict()
            lines.append(f"  range compile: {len(r.get('variants', []))} buckets "
                         f"({'; '.join(v['describe'] for v in r.get('variants', []))}) in "
                         f"{self.range_compile_s:.1f} s; {self.outside_calls} calls outside it")
        if self.per_shape_reason:
            lines.append(f"  compiled per shape: {self.per_shape_reason}")
        for s in self.specializations.values():
            counts = s.imported.graph.op_counts()
            aten = ", ".join(f"{k.removeprefix('aten.')} {v}" for k, v in sorted(
                s.op_counts.items(), key=lambda kv: -kv[1]))
            lines.append(f"  specialization {s.key}: ATen {aten}; "
                         f"{sum(counts.values())} primitive nodes; lowered in {s.seconds:.2f} s")
        return "\n".join(lines)


def say_fallbacks(report: dict) -> None:
    """Warns (``UserWarning``), once per line, of each note of a graph's compile that the quality
    gate refused the precision or the weights asked for in ``options`` and compiled another: the
    backend's compile is silent and its report out of the user's reach, so a bf16 request that
    ran at fp32 said nothing."""
    import warnings
    for note in dict.fromkeys(report.get("warnings", [])):
        if note.startswith(("precision ", "weights ")) and "the quality gate" in note:
            warnings.warn(f"lumc: torch.compile graph: {note}", stacklevel=2)


def _device(args) -> torch.device:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    return torch.device("cpu")


_BACKEND_OPTIONS = ("budget", "search", "device", "precision", "weights", "tolerance", "max_kl",
                    "logits", "max_size", "shapes", "workers")


def lumc_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, **kw):
    """The TorchDynamo backend (see :func:`_lumc_backend` for the options): ``torch.compile``
    passes ``options={...}`` as one dict; calling it directly may pass them as keywords."""
    merged = {**dict(options or {}), **kw}
    unknown = sorted(set(merged) - set(_BACKEND_OPTIONS))
    if unknown:
        raise TypeError(f"unknown lumc backend options: {', '.join(unknown)}; known: "
                        f"{', '.join(_BACKEND_OPTIONS)}")
    if "search" in merged and not isinstance(merged["search"], bool):
        # "no" or "false" is truthy: it searched, the opposite of what was written
        raise InputError(f"options['search']={merged['search']!r}: expected True or False")
    return _lumc_backend(gm, example_inputs, **merged)


def _lumc_backend(gm: torch.fx.GraphModule, example_inputs, budget=None, search: bool = True,
                  device: str | None = None, precision: str = "fp32", weights: str = "same",
                  tolerance: float | None = None, max_kl: float | None = None, logits=(),
                  max_size: int | None = None, shapes: dict | None = None, workers=None):
    """The TorchDynamo backend: returns a callable running ``gm`` with lumc.

    Args:
        gm: the graph Dynamo captured.
        example_inputs: Dynamo's example inputs (tensors, and ints for symbolic sizes).
        budget: the compile budget (``"2m"``, seconds); None for ``DEFAULT_BUDGET``. A dynamic
            graph's range compile spends it once for all its size buckets.
        search: run the kernel search (default); False runs the reference executor per shape.
        device: the compile target (default: the first GPU, else ``sim:h200``).
        precision, weights, tolerance, max_kl, logits: the precision policy and its quality gate
            (``lumc.compiler.core.precision``), as ``torch.compile(m, backend="lumc",
            options={"precision": "bf16"})``.
        max_size: the top of every dynamic dim Dynamo leaves unbounded (default
            :data:`DEFAULT_MAX_SIZE`).
        shapes: ``{dim: (lo, hi) or "lo..hi"}`` per dynamic dim, keyed by its symbol (``s27``)
            or ``INPUT.AXIS`` (``x.1``, ``L_x_.1``); clipped to Dynamo's range.
        workers: where each compile's work units run (``"local:N"``, ``"ray"``,
            ``"ray://HOST:PORT"``: ``lumc.compiler.core.workers``).
    Raises:
        InputError: an unknown precision or weights option, or weights other than ``same``
            where Dynamo lifted the parameters to inputs; a ``shapes`` key that is no dynamic
            dim, or a range that is not one.
        UnsupportedOpError: the graph uses ATen ops lumc cannot lower (Dynamo reports it as a
            backend compiler failure).
        BudgetError: a malformed budget.
    """
    budget_s = parse_duration(DEFAULT_BUDGET if budget is None else budget)
    from lumc.compiler.core.precision import PrecisionPolicy
    policy = PrecisionPolicy.from_user(precision, weights, tolerance, max_kl, logits)
    policy.check_search(search, "options['search']=False")
    if policy.weights != "same" and any(isinstance(a, torch.nn.Parameter) for a in example_inputs):
        # Dynamo lifts them to inputs read afresh at each call: none is stored, none quantized
        raise InputError(f"options['weights']={weights!r} cannot apply under torch.compile: "
                         "Dynamo passes the module's parameters as inputs on every call, so lumc "
                         f"stores no weight to quantize; use lumc.compile(module, "
                         f"weights={weights!r}, ...)")
    from lumc.compiler.core.workers import parse_workers
    return DynamoGraph(gm, example_inputs, budget_s, search, device, policy, max_size, shapes,
                       parse_workers(workers))
