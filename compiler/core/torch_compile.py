"""The compiled callable of a PyTorch module: torch tensors in, torch tensors out.

:func:`compile_module` captures the module once (:func:`~.capture.capture_module`) and returns a
:class:`CompiledTorchModule`. Each call flattens its arguments the way the capture did, and looks up
the specialization for their shapes: lumc graphs are concrete, so a new shape within the captured
dynamic dims is lowered once (re-specialization) and cached by shape. Each specialization is
compiled by the search pipeline (``lumc.compiler.core.pipeline.compile_graph``: e-graph candidates,
roofline-pruned timing, the tuning database) within the budget; with ``search=False`` it runs on the
reference executor (numpy) instead, which is what frontend tests use.
"""
from __future__ import annotations

import time
from collections import Counter
from types import SimpleNamespace
from dataclasses import dataclass
import torch
from torch.utils import _pytree as pytree

from lumc.backends.reference import ReferenceExecutor
from lumc.compiler.core.budget import parse_duration
from lumc.compiler.frontends.onnx_frontend import ImportedModel
from lumc.compiler.core import torch_plan_cache as plan_cache
from lumc.compiler.frontends.torch_frontend.capture import (CapturedProgram, _as_args, capture_module,
                                                  from_numpy, to_numpy)
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

    @property
    def input_specs(self):
        return self.program.input_specs()

    @property
    def specializations(self) -> list[Specialization]:
        return list(self._cache.values())

    def _leaves(self, args, kwargs) -> list:
        in_spec = self.program.in_spec
        if in_spec is not None and in_spec.num_children == 2:
            # keyword arguments in the captured order, whatever order the caller used
            kw_spec = in_spec.child(1)
            if kw_spec.type is dict and set(kw_spec.context) == set(kwargs):
                kwargs = {k: kwargs[k] for k in kw_spec.context}
        leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        if in_spec is not None and spec != in_spec:
            raise InputError(f"the call's arguments do not match the captured ones: expected "
                             f"{in_spec}, got {spec}")
        return leaves

    def specialization(self, leaves, feed: dict | None = None) -> Specialization:
        """The (cached) lowering for the shapes of these flat inputs; ``feed`` (the call's inputs as
        numpy arrays) drives the compile's numerics checks."""
        key = _shape_key(leaves)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        for slot, leaf in zip(self.program.inputs, leaves):
            if slot.dims is None and leaf != slot.value:
                raise InputError(f"input {slot.name!r} was traced as the constant {slot.value!r}; "
                                 f"got {leaf!r}", node=slot.name)
        shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else None for t in leaves]
        imported, info = self.program.specialize(shapes)
        if self.search:
            from lumc.compiler.core.pipeline import compile_graph
            compiled = compile_graph(imported.graph, budget=self.budget_s, device=self.device,
                                     example_inputs=feed, name=self.program.source,
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
        leaves = self._leaves(args, kwargs)
        feed = {}
        for slot, leaf in zip(self.program.inputs, leaves):
            if slot.dims is None:
                continue
            if not isinstance(leaf, torch.Tensor):
                raise InputError(f"input {slot.name!r} must be a tensor, got "
                                 f"{type(leaf).__name__}", node=slot.name)
            arr = to_numpy(leaf)
            if arr.dtype != slot.dtype.np:
                raise InputError(f"input {slot.name!r} has dtype {leaf.dtype}, expected "
                                 f"{slot.dtype}", node=slot.name)
            feed[slot.name] = arr
        spec = self.specialization(leaves, feed)
        results = spec.executor(feed)
        device = self.program.device
        flat_out = []
        for name, i in zip(self.program.output_names, self.program.output_index):
            if name in results:
                flat_out.append(from_numpy(results[name], device))
            else:
                flat_out.append(spec.flat_outputs[i])
        if self.program.out_spec is None:
            return tuple(flat_out)
        return pytree.tree_unflatten(flat_out, self.program.out_spec)

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
        if not self._cache:
            lines.append("  no specialization yet (call it once)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        ins = ", ".join(f"{s.name}: {s.dtype}[{', '.join(map(str, s.shape))}]"
                        for s in self.input_specs)
        return f"CompiledTorchModule({ins}; {len(self._cache)} specializations)"


def compile_module(module: torch.nn.Module, example_inputs, budget=None, dynamic_shapes=None,
                   example_kwargs: dict | None = None, search: bool = True,
                   device: str | None = None, reuse_plan: bool = True, precision: str = "fp32",
                   weights: str = "same", tolerance: float | None = None,
                   max_kl: float | None = None, logits=()) -> CompiledTorchModule:
    """Capture a PyTorch module and return a callable that runs it with lumc.

    Args:
        module: the module (``.eval()`` it first); it is not referenced after this returns.
        example_inputs: a tensor or tuple of positional example inputs (their shapes are lowered
            at once, so unsupported ops and shape errors surface here).
        budget: a duration (``"2m"``, ``90``) or None for :data:`DEFAULT_BUDGET`.
        dynamic_shapes: as for ``torch.export.export``.
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
    Returns:
        :class:`CompiledTorchModule`: ``f(*args, **kwargs)`` on torch tensors on the module's
        device, returning the module's output structure; ``f.report()``.
    Raises:
        BudgetError: a malformed, zero or negative budget.
        ModelError: ``torch.export`` failed.
        UnsupportedOpError: ATen ops lumc cannot lower, all listed in one line.
    """
    from lumc.compiler.core.precision import PrecisionPolicy
    policy = PrecisionPolicy(precision, weights, tolerance, max_kl, tuple(logits))
    budget_s = parse_duration(DEFAULT_BUDGET if budget is None else budget)
    args = _as_args(example_inputs)
    t_start = time.monotonic()
    stored = None
    if search and reuse_plan and dynamic_shapes is None:
        stored = _stored_plan(module, args, dict(example_kwargs or {}), budget_s, device, t_start,
                              policy)
        if isinstance(stored, CompiledTorchModule):
            return stored
    t0 = time.perf_counter()
    program = capture_module(module, args, example_kwargs, dynamic_shapes)
    compiled = CompiledTorchModule(program, budget_s, time.perf_counter() - t0, search, device,
                                   policy)
    leaves = compiled._leaves(args, dict(example_kwargs or {}))
    feed = {slot.name: to_numpy(leaf) for slot, leaf in zip(program.inputs, leaves)
            if slot.dims is not None and isinstance(leaf, torch.Tensor)}
    spec = compiled.specialization(leaves, feed)
    if stored is not None and spec.compiled is not None and \
            spec.compiled.report_dict().get("best_time_s") is not None:
        plan_cache.store(stored[0], stored[1], compiled, spec)
    return compiled


def _stored_plan(module, args, kwargs, budget_s, device, t_start, policy=None):
    """The reused :class:`CompiledTorchModule`, or ``(plans dir, key)`` to store the result under."""
    from lumc.compiler.core.budget import Deadline
    from lumc.compiler.core.pipeline import _reuse_plan
    from lumc.compiler.runtime.targets import resolve_target, versions
    from lumc.compiler.runtime.tuning_db import TuningDatabase
    target = resolve_target(device)
    plans = TuningDatabase().plans_dir
    # the precision policy is part of what the plan was compiled for
    where = target.name if policy is None else f"{target.name} {sorted(policy.as_dict().items())}"
    key = plan_cache.module_key(module, args, kwargs, None, where,
                                versions(gpu=not target.simulated))
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
    spec = Specialization(shell["key"], SimpleNamespace(graph=cm.graph), cm.run,
                          shell["op_counts"], shell["seconds"], shell["flat_outputs"], compiled=cm)
    compiled._cache[spec.key] = spec
    compiled.reused = f"{key}.lumc ({time.monotonic() - t_start:.2f} s, nothing captured or re-timed)"
    cm._report["compile_s"] = time.monotonic() - t_start
    return compiled

