"""The compiled callable of a PyTorch module: torch tensors in, torch tensors out.

:func:`compile_module` captures the module once (:func:`~.capture.capture_module`).

**Static shapes** (no ``dynamic_shapes``) give a :class:`CompiledTorchModule`: each call flattens
its arguments the way the capture did and runs the specialization for their shapes, compiled by the
search pipeline (``lumc.compiler.core.pipeline.compile_graph``: e-graph candidates, roofline-pruned
timing, the tuning database) within the budget; with ``search=False`` it runs on the reference
executor (numpy) instead, which is what frontend tests use (a new shape within the captured dynamic
dims is then lowered once more and cached by shape).

**Size ranges** (``dynamic_shapes`` with ``torch.export.Dim`` s, and the search on) compile **once
for every size of each Dim's range** (:func:`compile_module_range`, through
``lumc.compiler.core.buckets.compile_ranges``): each Dim is a ranged dim named by the Dim's name
(:func:`dim_ranges`), the captured graph is lowered at the range's probe and check primes (the
lowering a new shape gets, under ``lumc.ir.symbolic.probing``), the e-graph runs once and each size
bucket is searched. The result is that compile's ``VariantModel``: every call in the range re-sizes
its bucket's plan (no capture, no search), ``f.save(path)`` writes one artifact ``lumc.load``
reads back. A module whose sizes are not products of the Dims (``L + 1``: ``transformers``'
GPT-2 called without an ``attention_mask`` concatenates L + 1 positions to look for packed
sequences) is refused in one line, never compiled at the example's sizes instead.
"""
from __future__ import annotations

import time
from collections import Counter
from types import SimpleNamespace
from dataclasses import dataclass
import torch
from torch.utils import _pytree as pytree

from lumc.backends.reference import ReferenceExecutor
from lumc.backends.triton.launch import input_to_numpy, torch_dtype
from lumc.compiler.runtime.compiled import dense_tensor
from lumc.compiler.runtime.no_backward import output_reads, refuse_backward
from lumc.compiler.runtime.out_structure import OutputStructure
from lumc.compiler.runtime.in_structure import InputStructure, same_constant  # noqa: F401
from lumc.compiler.runtime.report_text import eager_text
from lumc.compiler.core.torch_args import call_shape as _call_shape
from lumc.compiler.core.torch_args import nested_difference as _nested_difference
from lumc.compiler.core.budget import parse_duration
from lumc.compiler.frontends.onnx_frontend import ImportedModel
from lumc.compiler.core import torch_plan_cache as plan_cache
from lumc.compiler.core.buckets import DimRange, ranges_in
from lumc.compiler.core.workers import with_workers
from lumc.compiler.frontends.torch_frontend.capture import (CapturedProgram, _as_args, capture_module,
                                                  example_shapes, from_numpy, int_examples,
                                                  refuse_meta_module, to_numpy)
from lumc.compiler.core.torch_state import ModuleWatch
from lumc.ir.errors import InputError

# The compile budget when the caller gives none: lumc.compiler.core.torch_compile.compile_module and
# torch.compile(model, backend="lumc") (per captured graph) both read it from here.
DEFAULT_BUDGET = "1m"


@dataclass
class Specialization:
    """One concrete-shape lowering: the imported graph, its executor, and what it took.

    ``program`` is set where each specialization has its own trace (``torch.compile``)."""
    key: tuple
    imported: ImportedModel
    executor: ReferenceExecutor
    op_counts: dict[str, int]
    seconds: float
    flat_outputs: list
    program: CapturedProgram | None = None
    compiled: object = None          # the CompiledModel when the search ran


def _shape_key(leaves) -> tuple:
    return tuple((tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else ("value", repr(t))
                 for t in leaves)


def _output_inputs(spec) -> dict[str, set[str]]:
    """``{output name: names of the graph inputs it reads}`` of a specialization (once)."""
    hit = getattr(spec, "_reads", None)
    if hit is None:
        hit = spec._reads = output_reads(spec.imported.graph)
    return hit


class CompiledTorchModule:
    """A captured PyTorch module, callable on torch tensors.

    Holds the ATen graph and a numpy copy of the weights, never the module itself.

    Attributes:
        program: the :class:`CapturedProgram`.
        budget_s: the compile budget in seconds (for the search pipeline; the reference executor
            spends none of it).
        input_specs: the flat user inputs, dynamic dims by name.
    """

    def __init__(self, program: CapturedProgram, budget_s: float, capture_s: float = 0.0,
                 search: bool = True, device: str | None = None, policy=None):
        self.policy = policy             # the precision policy (lumc.compiler.core.precision)
        self.program = program
        self.budget_s = budget_s
        self.capture_s = capture_s
        self.search = search
        self.device = device
        self.reused: str | None = None   # the stored plan a recompile reused (plan_cache)
        self._cache: dict[tuple, Specialization] = {}
        # the module it was compiled from, unchanged since? (torch_state.ModuleWatch)
        self.watch = None
        # the module's class name, the compile report's model (an artifact's inspect and bench)
        self.model_name: str | None = None

    @property
    def input_specs(self):
        return self.program.input_specs()

    def __reduce__(self):
        raise InputError("a compiled torch module cannot be pickled or copied (it compiles each "
                         "new input shape from its captured program); save a compiled shape "
                         "(f.save(path)) and pickle lumc.load(path), which is picklable")

    @property
    def specializations(self) -> list[Specialization]:
        return list(self._cache.values())

    def _leaves(self, args, kwargs) -> list:
        in_spec = self.program.in_spec
        args, kwargs = self._by_position(args, kwargs)
        if in_spec is not None and in_spec.num_children == 2:
            # keyword arguments in the captured order, whatever order the caller used
            kw_spec = in_spec.child(1)
            if kw_spec.type is dict and set(kw_spec.context) == set(kwargs):
                kwargs = {k: kwargs[k] for k in kw_spec.context}
        leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        if in_spec is not None and spec != in_spec:
            want, got = _call_shape(in_spec), _call_shape(spec)
            if want == got:     # the same counts and names: a nested structure differs
                raise InputError(f"the call's arguments do not match the captured ones: "
                                 f"{_nested_difference(in_spec, spec)}")
            raise InputError(f"the call's arguments do not match the captured ones: expected "
                             f"{want}, got {got}")
        return leaves

    def _by_position(self, args, kwargs) -> tuple[tuple, dict]:
        """``f(x=t)`` for a module captured with ``x`` positional (``example_inputs=(t,)``), as
        the module itself takes it: a keyword naming a missing positional tensor argument (its
        input's name is the parameter's, as ``torch.export`` names it) moves into place."""
        spec = self.program.in_spec
        if spec is None or spec.num_children != 2 or not kwargs:
            return tuple(args), dict(kwargs)
        pos, kw = spec.child(0), spec.child(1)
        captured_kw = set(kw.context or []) if kw.num_children else set()
        args, kwargs = list(args), dict(kwargs)
        flat = sum(pos.child(i).num_leaves for i in range(min(len(args), pos.num_children)))
        for i in range(len(args), pos.num_children):
            child = pos.child(i)
            name = self.program.inputs[flat].name if flat < len(self.program.inputs) else None
            if not child.is_leaf() or name is None or name not in kwargs or name in captured_kw:
                break
            args.append(kwargs.pop(name))
            flat += 1
        return tuple(args), kwargs

    def specialization(self, leaves, feed: dict | None = None) -> Specialization:
        """The (cached) lowering for the shapes of these flat inputs; ``feed`` (the call's inputs as
        numpy arrays) drives the compile's numerics checks."""
        key = _shape_key(leaves)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        for slot, leaf in zip(self.program.inputs, leaves):
            if slot.dims is None and not same_constant(leaf, slot.value):
                raise InputError(f"input {slot.name!r} was traced as the constant {slot.value!r}; "
                                 f"got {leaf!r}", node=slot.name)
        shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else None for t in leaves]
        imported, info = self.program.specialize(shapes)
        if self.search:
            from lumc.compiler.core.pipeline import compile_graph
            compiled = compile_graph(imported.graph, budget=self.budget_s, device=self.device,
                                     example_inputs=feed,
                                     name=self.model_name or self.program.source,
                                     policy=self.policy)
            executor = compiled.run
        else:
            compiled, executor = None, ReferenceExecutor(imported.graph)
        spec = Specialization(key, imported, executor, info["op_counts"], info["seconds"],
                              info["flat_outputs"], compiled=compiled)
        self._cache[key] = spec
        return spec

    def __call__(self, *args, **kwargs):
        """Run on torch tensors; returns the module's output structure with torch tensors.

        Raises:
            InputError: arguments of another structure, dtype, or a shape outside the captured
                dynamic dims.
        """
        if self.watch is not None:
            self.watch.check()
        leaves = self._leaves(args, kwargs)
        tensors = {}
        for slot, leaf in zip(self.program.inputs, leaves):
            if slot.dims is None:
                continue
            if not isinstance(leaf, torch.Tensor):
                raise InputError(f"input {slot.name!r} must be a tensor, got "
                                 f"{type(leaf).__name__}", node=slot.name)
            if not dense_tensor(leaf):
                input_to_numpy(leaf, slot.name, to_numpy)     # raises: no data to read
            if leaf.dtype != torch_dtype(slot.dtype):
                raise InputError(f"input {slot.name!r} has dtype {leaf.dtype}, expected "
                                 f"{torch_dtype(slot.dtype)}", node=slot.name)
            tensors[slot.name] = leaf
        spec = self._cache.get(_shape_key(leaves))
        feed = None
        if spec is None or spec.compiled is None:
            feed = {k: input_to_numpy(v, k, to_numpy) for k, v in tensors.items()}
            spec = self.specialization(leaves, feed)
        # a compiled plan takes the tensors as they are (on a GPU: no host round trip)
        results = spec.compiled.run_tensors(tensors) if spec.compiled is not None else \
            spec.executor(feed)
        device = self.program.device
        flat_out = []
        for name, i in zip(self.program.output_names, self.program.output_index):
            if name in results:
                flat_out.append(from_numpy(results[name], device))
            else:
                flat_out.append(spec.flat_outputs[i])
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors.values()):
            # outputs reading an input that requires gradients refuse a backward (no_backward)
            live = self.program.grad_outputs     # x.detach(): none (lowering.grad_outputs)
            guarded = refuse_backward(lambda: _output_inputs(spec), tensors, dict(
                (n, t) for n, i, t in zip(self.program.output_names, self.program.output_index,
                                          flat_out)
                if n in results and (live is None or live[i])))
            flat_out = [guarded.get(n, t) if n in results else t
                        for n, t in zip(self.program.output_names, flat_out)]
        if self.program.out_spec is None:
            return tuple(flat_out)
        return pytree.tree_unflatten(flat_out, self.program.out_spec)

    def save(self, path) -> str:
        """Write the compiled specialization as a self-contained ``.lumc`` artifact (atomically;
        returns its hash). ``lumc.load(path)`` gives a :class:`CompiledModel`: it takes the flat
        inputs by name (or position) as numpy arrays or tensors and returns the module's output
        structure (``lumc.compiler.runtime.out_structure``; tensors for tensors, arrays for
        arrays). A structure that cannot be stored (a namedtuple) is said in a warning; that
        artifact returns one array for one output, else a tuple in output order.

        Raises:
            InputError: nothing compiled yet (call it once), compiled without the kernel search,
                or several shapes compiled (save one: ``f.specializations[i].compiled.save(path)``).
        """
        done = [s for s in self._cache.values() if s.compiled is not None]
        if self._cache and not done:
            raise InputError("compiled with no kernel search (the reference executor): there is "
                             "no plan to save; compile with lumc.compile")
        if len(done) != 1:
            shapes = "; ".join(", ".join("x".join(map(str, k[0])) for k in s.key if k[0] != "value")
                               for s in done)
            raise InputError("nothing compiled yet: call the module once (or compile with "
                             "example_inputs=)" if not done else
                             f"{len(done)} shapes compiled ({shapes}); save one with "
                             "f.specializations[i].compiled.save(path)")
        p = self.program
        structure = OutputStructure.of_capture(p.out_spec, p.output_names, p.output_index,
                                               done[0].flat_outputs, done[0].compiled.graph.outputs)
        if structure is not None:     # lumc.load's callable takes the module's arguments too
            structure.inputs = InputStructure.of_capture(p.in_spec, p.inputs)
        return done[0].compiled.save(path, structure)

    def report(self) -> str:
        """A short text: inputs and outputs, the ATen ops lowered, node counts per specialization."""
        p = self.program
        how = "kernel search per shape" if self.search else "reference executor, no kernel search"
        lines = [f"lumc: PyTorch module captured with {p.source} in {self.capture_s:.2f} s; "
                 f"budget {self.budget_s:g} s ({how})"]
        if self.reused:
            lines[0] = (f"lumc: PyTorch module: reused the stored plan {self.reused}; "
                        f"budget {self.budget_s:g} s")
        for s in p.input_specs():
            lines.append(f"  input  {s.name}: {s.dtype}[{', '.join(map(str, s.shape))}]")
        for info in p.dims.values():
            hi = "inf" if info.max_value is None else info.max_value
            lines.append(f"  dim    {info.name} in [{info.min_value}, {hi}]")
        aten: Counter[str] = Counter()
        for s in self._cache.values():
            for k, v in s.op_counts.items():
                aten[k] = max(aten[k], v)
        if aten:
            top = ", ".join(f"{k.removeprefix('aten.')} {v}" for k, v in aten.most_common())
            lines.append(f"  ATen ops lowered: {len(aten)} kinds, {sum(aten.values())} nodes: {top}")
        for s in self._cache.values():
            g = s.imported.graph
            counts = Counter(g.op_counts())
            prim = ", ".join(f"{k} {v}" for k, v in counts.most_common())
            shapes = "; ".join(f"{k}={'x'.join(map(str, n.shape)) or 'scalar'}"
                               for k, n in g.inputs.items())
            outs = "; ".join(f"{k}: {n.dtype}[{', '.join(map(str, n.shape))}]"
                             for k, n in g.outputs.items())
            lines.append(f"  specialization {shapes}: {sum(counts.values())} primitive nodes "
                         f"({prim}); lowered in {s.seconds:.2f} s -> {outs}")
            if s.compiled is not None:
                lines.append("    " + s.compiled.report().replace("\n", "\n    "))
                ec = eager_text(s.compiled.report_dict().get("eager_check"))
                if ec:
                    lines.append("    " + ec)
        if not self._cache:
            lines.append("  no specialization yet (call it once)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        ins = ", ".join(f"{s.name}: {s.dtype}[{', '.join(map(str, s.shape))}]"
                        for s in self.input_specs)
        return f"CompiledTorchModule({ins}; {len(self._cache)} specializations)"


def plan_rtol(reports: list[dict], policy) -> float:
    """The tolerance the plans (their ``reports``) were gated at, the largest: a plan that fell
    back (bf16 to fp32, a weights format that stored nothing or missed the gate) is checked
    against eager at its own precision's tolerance, not the one asked for (``policy.rtol``)."""
    tols = [r.get("tolerance") for r in reports]
    return max(tols) if tols and None not in tols else policy.rtol


@with_workers
def compile_module(module: torch.nn.Module, example_inputs, budget=None, dynamic_shapes=None,
                   example_kwargs: dict | None = None, search: bool = True,
                   device: str | None = None, reuse_plan: bool = True, precision: str = "fp32",
                   weights: str = "same", tolerance: float | None = None,
                   max_kl: float | None = None, logits=()) -> CompiledTorchModule:
    """Capture a PyTorch module and return a callable that runs it with lumc.

    Args:
        module: the module (``.eval()`` it first); its weights are copied into the plan and it is
            not referenced after this returns, but for a weak reference: a call after its
            parameters, buffers or training flags changed is refused in one line
            (``torch_state.ModuleWatch``), never run on the weights compiled.
        example_inputs: a tensor or tuple of positional example inputs (their shapes are lowered
            at once, so unsupported ops and shape errors surface here).
        budget: a duration (``"2m"``, ``90``) or None for :data:`DEFAULT_BUDGET`; a range compile
            spends it once for all its size buckets.
        dynamic_shapes: as for ``torch.export.export`` (a tuple or dict per input of ``{axis:
            torch.export.Dim(name, min=, max=)}``). With the search on, one compile then serves
            every size of each Dim's range (see :func:`dim_ranges`: the same Dim on several inputs
            is one dim; sizes ``min..max``, 0 where the smallest bucket serves it
            (``torch_zero_size``); no ``max``: up to 1024, ``torch_backend.
            DEFAULT_MAX_SIZE``; a range of one size is that size). With ``search=False`` each new
            shape in the range is lowered on the reference executor.
        example_kwargs: keyword example inputs.
        search: compile each shape specialization with the kernel search (default); False runs
            the lowered graph on the reference executor.
        device: the compile target (``cuda[:N]``, ``sim:h100``, ``sim:h200``; default: the first
            GPU, else ``sim:h200``).
        reuse_plan: return the stored result of an identical earlier static-shape compile (same
            module class, structure, weights, inputs, device and versions: ``plan_cache``) without
            capturing the module again; ``f.reused`` then names the stored plan.
        precision, weights, tolerance, max_kl, logits: the precision policy and its quality gate
            (``lumc.compiler.core.precision``); bf16/fp16 tensors at the call boundary work as given.
        workers: where the compile's work units run (``"local:N"``, ``"ray"``,
            ``"ray://HOST:PORT"``: ``lumc.compiler.core.workers``); a shape first seen at call
            time is compiled with the default workers.
    Returns:
        :class:`CompiledTorchModule` (static shapes, or ``search=False``): ``f(*args, **kwargs)``
        on torch tensors on the module's device, returning the module's output structure;
        ``f.report()``.

        For Dim ranges, the range compile's
        :class:`~lumc.compiler.runtime.variants.VariantModel`: ``f(*tensors)`` or by input name
        (``f(ids, attention_mask=mask)``), torch tensors or numpy arrays at any size in the ranges,
        returns the module's output structure (a ``(y,)`` stays a 1-tuple); non-tensor arguments
        were traced as constants and are not passed. ``f.save(path)``; ``lumc.load(path)`` gives
        the same plans and the same output structure.
    Raises:
        BudgetError: a malformed, zero or negative budget; too small a budget for a range's buckets.
        ModelError: ``torch.export`` failed (a Dim the module specializes, an example outside its
            Dim's range).
        UnsupportedOpError: ATen ops lumc cannot lower, all listed in one line.
        InputError: ``max_kl`` when no output is a distribution and no ``logits`` names one
            (refused before the search), one line.
        InputError: a Dim range whose sizes do not re-size (the module's sizes are not products of
            the Dims), one line. A call outside the range later is an ``InputError`` naming the
            dim, its inputs and axes, and the range.
    """
    from lumc.compiler.core.precision import PrecisionPolicy
    policy = PrecisionPolicy.from_user(precision, weights, tolerance, max_kl, logits)
    policy.check_search(search)
    budget_s = parse_duration(DEFAULT_BUDGET if budget is None else budget)
    args = _as_args(example_inputs)
    if example_kwargs is not None and not isinstance(example_kwargs, dict):
        raise InputError("example_kwargs= is a dict {keyword: tensor}, got a "
                         f"{type(example_kwargs).__name__}")
    refuse_meta_module(module, args, example_kwargs)     # before the plan key reads the weights
    t_start = time.monotonic()
    stored = None
    digests: dict = {}    # of the module's tensors, taken once for the plan key and the watch
    if search and reuse_plan and dynamic_shapes is None:
        stored = _stored_plan(module, args, dict(example_kwargs or {}), budget_s, device, t_start,
                              policy, digests)
        if isinstance(stored, CompiledTorchModule):
            stored.watch = ModuleWatch(module, digests)
            return stored
    t0 = time.perf_counter()
    program = capture_module(module, args, example_kwargs, dynamic_shapes)
    capture_s = time.perf_counter() - t0
    if search and program.dims:
        ranges = dim_ranges(program, example_shapes(program, args, example_kwargs))
        if ranges_in(ranges):
            leaves = pytree.tree_flatten((tuple(args), dict(example_kwargs or {})))[0]
            ints = int_examples(program.inputs, leaves)
            vm = compile_module_range(program, ranges, budget_s, device, policy,
                                      type(module).__name__, ints)
            from lumc.compiler.core.torch_zero_size import serve_zero_sizes
            from_zero = [info.name for info in program.dims.values()
                         if info.min_value == 0 and info.name in ranges_in(ranges)]
            serve_zero_sizes(vm, from_zero,
                             _range_frontend(program, type(module).__name__, ints), ints)
            # the module's output structure, as a fixed compile (its artifact stores it too)
            vm.structure = OutputStructure.of_capture(
                program.out_spec, program.output_names, program.output_index, (),
                vm.first.graph.outputs)
            if vm.structure is not None:    # and it takes the module's arguments
                vm.structure.inputs = InputStructure.of_capture(program.in_spec, program.inputs)
            from lumc.compiler.core.eager_check import check_range_against_eager
            ec = check_range_against_eager(module, program, vm, args, dict(example_kwargs or {}),
                                           plan_rtol([cm._report for _, cm in vm.variants],
                                                     policy), type(module).__name__, policy)
            for rep in [vm._report] + [cm._report for _, cm in vm.variants]:
                rep["eager_check"] = ec
            vm.watch = ModuleWatch(module)      # after eager ran it: the module as compiled
            return vm
    compiled = CompiledTorchModule(program, budget_s, capture_s, search, device, policy)
    compiled.model_name = type(module).__name__
    leaves = compiled._leaves(args, dict(example_kwargs or {}))
    feed = {slot.name: to_numpy(leaf) for slot, leaf in zip(program.inputs, leaves)
            if slot.dims is not None and isinstance(leaf, torch.Tensor)}
    spec = compiled.specialization(leaves, feed)
    if spec.compiled is not None:   # the lowering itself, against the module (eager_check)
        from lumc.compiler.core.eager_check import check_against_eager
        from lumc.compiler.core.precision_gate import index_ties
        kw = dict(example_kwargs or {})
        ties = index_ties(spec.imported.graph, feed, program.output_names, policy)
        spec.compiled._report["eager_check"] = check_against_eager(
            module, args, kw, compiled(*args, **kw), plan_rtol([spec.compiled._report], policy),
            type(module).__name__, ties)
    compiled.watch = ModuleWatch(module, digests)
    if stored is not None and spec.compiled is not None and \
            spec.compiled.report_dict().get("best_time_s") is not None:
        plan_cache.store(stored[0], stored[1], compiled, spec)
    return compiled


def _stored_plan(module, args, kwargs, budget_s, device, t_start, policy=None, digests=None):
    """The reused :class:`CompiledTorchModule`, or ``(plans dir, key)`` to store the result under;
    ``digests`` receives the module's tensor digests the key took."""
    from lumc.compiler.core.budget import Deadline
    from lumc.compiler.core.plan_reuse import _reuse_plan
    from lumc.compiler.runtime.targets import resolve_target, versions
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    target = resolve_target(device)
    plans = TuningDatabase().plans_dir
    # the precision policy is part of what the plan was compiled for
    where = target.name if policy is None else f"{target.name} {sorted(policy.as_dict().items())}"
    key = plan_cache.module_key(module, args, kwargs, None, where,
                                versions(gpu=not target.simulated), digests,
                                values=policy is not None and policy.reduced)
    shell = plan_cache.load_shell(plans, key)
    if shell is None:
        return plans, key
    cm = _reuse_plan(plans / f"{key}.lumc", budget_s, Deadline(budget_s, time.monotonic))
    if cm is None:
        return plans, key
    fields = {f: shell[f] for f in plan_cache.SHELL_FIELDS}
    program = CapturedProgram(graph_module=None, weights={}, device=torch.device(shell["device"]),
                              **fields)
    compiled = CompiledTorchModule(program, budget_s, 0.0, True, device, policy)
    try:
        leaves = compiled._leaves(args, kwargs)
        why = plan_cache.matches(shell, cm.graph, leaves, _shape_key(leaves))
    except InputError as e:
        why = str(e)
    if why is not None:     # a damaged or foreign stored pair: compile afresh (and overwrite it)
        plan_cache.log.info("torch plan %s not reused: %s", key, why)
        return plans, key
    spec = Specialization(shell["key"], SimpleNamespace(graph=cm.graph), cm.run,
                          shell["op_counts"], shell["seconds"], shell["flat_outputs"], compiled=cm)
    compiled._cache[spec.key] = spec
    compiled.reused = f"{key}.lumc ({time.monotonic() - t_start:.2f} s, nothing captured or re-timed)"
    cm._report["compile_s"] = time.monotonic() - t_start
    return compiled


# ---- one compile for the Dims' size ranges ---------------------------------------------------------
def dim_ranges(program: CapturedProgram, example: list | None = None) -> dict:
    """``{dim name: DimRange or int}``: each dynamic dim of the capture over its sizes.

    A dim is a ``torch.export.Dim`` of ``dynamic_shapes`` (the same Dim on several inputs is one
    dim, by its name; an unnamed ``Dim.AUTO`` / ``Dim.DYNAMIC`` one is ``INPUT_dimAXIS``), with the
    range ``torch.export`` reports for it (the Dim's ``min``/``max`` as the module's own guards
    leave them). Its sizes are ``max(min, 1)..max`` (size 0 of a Dim from 0 is added after the
    compile: ``torch_zero_size.serve_zero_sizes``); a Dim without a ``max`` ends at
    ``lumc.compiler.core.torch_backend.DEFAULT_MAX_SIZE`` (1024), or at the example's size where
    that is larger. A range of one size is that size (an int).

    Args:
        program: the capture.
        example: the flat example input shapes (for the open ends), as ``example_shapes`` gives.
    """
    from lumc.compiler.core.torch_backend import DEFAULT_MAX_SIZE
    seen: dict = {}
    for slot, shape in zip(program.inputs, example or [None] * len(program.inputs)):
        if slot.dims is None or shape is None:
            continue
        for d, n in zip(slot.dims, shape):
            if d in program.dims:
                seen[d] = max(seen.get(d, 0), int(n))
    out: dict = {}
    for sym, info in program.dims.items():
        lo = max(info.step, info.min_value)
        hi = info.max_value if info.max_value is not None else max(DEFAULT_MAX_SIZE,
                                                                   seen.get(sym, 0))
        hi -= hi % info.step
        out[info.name] = hi if hi == lo else DimRange(lo, hi, info.step)
    return out


def _range_frontend(program: CapturedProgram, name: str, examples: dict | None = None):
    """``compile_ranges``' frontend: the captured graph lowered at ``{dim name: size}`` (the
    re-specialization a new shape gets, at the sizes compile_ranges asks for, under its probing);
    ``examples`` (``Frontend.examples``) are the user's integer example values."""
    from lumc.compiler.core.onnx_stage import Frontend
    from lumc.ir.tensor import Tensor
    by_name = {info.name: sym for sym, info in program.dims.items()}

    def frontend(_model, sizes: dict):
        env = {by_name[k]: int(v) // program.dims[by_name[k]].step for k, v in sizes.items()
               if k in by_name}
        shapes = [None if slot.dims is None else
                  tuple(d if isinstance(d, int) else int(d.xreplace(env)) for d in slot.dims)
                  for slot in program.inputs]
        imported, info = program.specialize(shapes)
        if not all(isinstance(info["flat_outputs"][i], Tensor) for i in program.output_index):
            raise InputError("the module returns values that are not tensors (sizes), which "
                             "differ per size; one artifact for a range cannot return them")
        return Frontend(imported.graph, None, name, list(imported.warnings), examples=examples)
    return frontend


def compile_module_range(program: CapturedProgram, ranges: dict, budget_s: float,
                         device: str | None, policy, name: str = "torch module",
                         examples: dict | None = None):
    """One compile of a captured module for its Dims' ranges
    (``lumc.compiler.core.buckets.compile_ranges``); returns its ``VariantModel``. ``examples``:
    ``{input name: array}`` of the integer example inputs, which the inputs the buckets' checks
    draw at other sizes follow (a 0/1 mask stays 0/1).

    Raises:
        InputError: the module's sizes are not products of the dims (``L + 1``, a table sliced at
            the size), a non-tensor output, a bucket failing its numerics check, a dim the plans
            read at other axes than the capture has it: one line each, never a fallback to the
            example's sizes. BudgetError: too small a budget for the buckets.
    """
    from lumc.compiler.core.buckets import compile_range
    open_ended = [info.name for info in program.dims.values() if info.max_value is None]
    try:
        vm = compile_range(None, ranges, _range_frontend(program, name, examples), budget_s,
                           device, policy)
    except InputError as e:
        msg = str(e)
        if open_ended and "not products of" not in msg:
            msg += (f" (dim {', '.join(open_ended)} has no max: its range ends at "
                    f"{', '.join(ranges[k].describe() for k in open_ended if k in ranges)}; "
                    "give the Dim a max the module can take)")
            raise InputError(msg) from None
        raise
    # the plans read each dim at exactly the input axes the capture has it at
    for key, _ in vm.variants:
        for sym, info in program.dims.items():
            if info.name not in key.ranges:
                continue
            want = sorted([slot.name, ax] for slot in program.inputs if slot.dims is not None
                          for ax, d in enumerate(slot.dims) if d == info.step * sym)
            got = sorted(list(a) for a in key.axes.get(info.name, []))
            if got != want:
                raise InputError(f"dim {info.name!r}: the plans read it at {got}, the module has "
                                 f"it at {want}")
    return vm
