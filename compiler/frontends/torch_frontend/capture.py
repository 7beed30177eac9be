"""Capturing a PyTorch module: ``torch.export`` to a core-ATen FX graph plus its weights and specs.

:func:`capture_module` exports the module (``torch.export.export``, then ``run_decompositions``
with the default core-ATen table less ``scaled_dot_product_attention``, which lumc lowers whole),
copies every parameter, buffer and lifted constant into numpy, records the user inputs with their
dims (ints, or named symbols from ``torch.export.Dim``, with their ranges), and keeps only the FX
graph: the :class:`CapturedProgram` holds no reference to the module, its parameters, or the
``ExportedProgram``.

:meth:`CapturedProgram.specialize` lowers the graph at one set of concrete input shapes (lumc graphs
are concrete; a new shape is a new specialization, see ``compiled.py``).
"""
from __future__ import annotations

import contextlib
import io
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import ml_dtypes
import numpy as np
import sympy
import torch
from torch.utils import _pytree as pytree

from lumc.compiler.frontends.onnx_frontend import ImportedModel, TensorSpec
from lumc.compiler.frontends.torch_frontend.dims import (DimInfo, bind_multiple, finite,
                                                          multiple_dims)
from lumc.compiler.frontends.torch_frontend.lowering import FxLowering, check_supported, grad_outputs
from lumc.compiler.frontends.torch_frontend.registry import lumc_dtype
from lumc.ir import dtypes as dt
from lumc.ir.errors import InputError, ModelError, UnsupportedOpError
from lumc.ir.graph import Graph, input_node
from lumc.ir.symbolic import probing_active
from lumc.ir.tensor import Tensor

# kept whole by the decomposition (lowered by handlers_nn): the decomposed CPU attention also
# trips a stride bug of PyTorch 2.13 under dynamic shapes
KEEP_UNDECOMPOSED = (
    torch.ops.aten.scaled_dot_product_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    # their decompositions lose eager's range checks (handlers_select: a negative index of
    # index_add/index_copy counted from the end, one_hot's dropped _assert_async)
    torch.ops.aten.index_add.default,
    torch.ops.aten.index_copy.default,
    torch.ops.aten.one_hot.default,
    # decomposed, a detach is an alias, and which outputs never require gradients is lost
    # (``torch_state.grad_outputs``); imported, it is the identity either way
    torch.ops.aten.detach.default,
)


def _export_hint(e: Exception) -> str:
    """What to change for an export failure that has a known cause, or ''."""
    text = str(e)
    if "Cache" in text and "in output" in text:
        # transformers decoders return their KV cache object (DynamicCache) by default
        return " (a transformers model returns its KV cache: build it with use_cache=False)"
    if "in output, which is not a known type" in text:
        return (" (return a tuple or dict, or register the output's class with torch before "
                "compiling: torch.export.register_dataclass(C) for a dataclass)")
    if "data-dependent" in text or type(e).__name__.startswith("GuardOnDataDependent"):
        return DATA_DEPENDENT_HINT
    return ""


# a tensor's value used as an index, a size or a branch (``cache[:, idx] = x`` with ``idx`` a
# tensor, ``.item()``): torch cannot trace it without knowing the value
DATA_DEPENDENT_HINT = (" (the module uses a tensor's value as an index, size or condition, e.g. "
                       "cache[:, idx] = x with idx a tensor, or .item(): lumc compiles for indices "
                       "and sizes known at compile time; pass it as a Python int)")


@contextlib.contextmanager
def quiet_tracing():
    """Hold back what torch prints while it traces (a failing ``torch.export`` prints its partial
    FX graph to stderr, ``_trace.py``): stdout and stderr are shown after a successful trace (the
    module's own prints), dropped after a failure, which the caller reports in one line. torch's
    deprecation of ``isinstance(treespec, LeafSpec)``, which torch.export's own deep copies of
    pytree specs trip, is not shown (nothing a user can act on; under ``-W error`` it failed the
    export)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                                category=FutureWarning)
        yield
    sys.stdout.write(out.getvalue())
    sys.stderr.write(err.getvalue())


def decomposition_table():
    """The core-ATen decomposition table, less the ops in :data:`KEEP_UNDECOMPOSED`."""
    table = torch.export.default_decompositions()
    for op in KEEP_UNDECOMPOSED:
        table.pop(op, None)
    return table


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view (or copy, off CPU) of a tensor; bf16 is reinterpreted as ``ml_dtypes.bfloat16``."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def from_numpy(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A new torch tensor holding a copy of ``a``, on ``device`` (a tensor already: moved there,
    not copied when it is, as a compiled plan's fresh outputs are)."""
    if isinstance(a, torch.Tensor):
        return a.to(device)
    a = np.array(a, copy=True, order="C")
    if a.dtype == ml_dtypes.bfloat16:
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(a)
    return t if device.type == "cpu" else t.to(device)


@dataclass
class InputSlot:
    """One flat user input of the captured graph.

    Attributes:
        name: the placeholder name (also the lumc graph input name).
        dims: per dim an int or a sympy expression over the symbols of :attr:`CapturedProgram.dims`;
            None for a non-tensor input.
        dtype: the lumc dtype (None for a non-tensor input).
        value: the traced value of a non-tensor input (PyTorch bakes it into the graph).
    """
    name: str
    dims: tuple | None
    dtype: dt.DType | None
    value: Any = None


@dataclass
class CapturedProgram:
    """An ATen-level FX graph with its weights and input/output interface.

    Attributes:
        graph_module: the FX GraphModule PyTorch built (not the user's module); its ``graph`` has
            placeholders for weights then user inputs, and each node's ``meta["val"]``.
        weights: ``{placeholder name or get_attr target: array}`` for parameters, buffers and
            lifted constants.
        inputs: the flat user inputs, in call order.
        dims: ``{sympy symbol: DimInfo}`` of the dynamic dims.
        in_spec, out_spec: pytree specs of ``(args, kwargs)`` and of the outputs (None: flat).
        output_index: positions of the user outputs among the graph's outputs.
        grad_outputs: per graph output, whether eager's can require gradients (not detached).
        output_names: a readable name per user output.
        device: where inputs come from and outputs go.
        source: how the graph was captured (for reports).
    """
    graph_module: torch.fx.GraphModule
    weights: dict[str, np.ndarray]
    inputs: list[InputSlot]
    dims: dict[sympy.Symbol, DimInfo]
    in_spec: Any
    out_spec: Any
    output_index: list[int]
    output_names: list[str]
    device: torch.device
    source: str = "torch.export"
    warnings: list[str] = field(default_factory=list)
    grad_outputs: list[bool] | None = None    # per graph output (lowering.grad_outputs)
    _weight_tensors: dict[str, Tensor] = field(default_factory=dict, repr=False)

    @property
    def graph(self) -> torch.fx.Graph:
        return self.graph_module.graph

    # ---- the interface ----------------------------------------------------------------------------
    def dim_spec(self, d) -> int | str:
        """An int, or the name of a dim (``seq``; ``2*seq`` for a derived one)."""
        if isinstance(d, int):
            return d
        names = {s: sympy.Symbol(info.name) / info.step for s, info in self.dims.items()}
        return str(d.xreplace(names))

    def input_specs(self) -> list[TensorSpec]:
        return [TensorSpec(s.name, tuple(self.dim_spec(d) for d in s.dims), s.dtype)
                for s in self.inputs if s.dims is not None]

    def bind(self, shapes: Sequence[tuple[int, ...] | None]) -> dict:
        """``{symbol: int}`` for concrete input shapes (None for non-tensor inputs).

        Raises:
            InputError: a static dim differs, a dynamic dim is out of its range, or two inputs
                disagree on the same dim.
        """
        env: dict = {}
        derived = []
        for slot, shape in zip(self.inputs, shapes):
            if slot.dims is None:
                continue
            if shape is None or len(shape) != len(slot.dims):
                got = "a non-tensor" if shape is None else f"rank {len(shape)}"
                raise InputError(f"input {slot.name!r} expects rank {len(slot.dims)}, got {got}",
                                 node=slot.name)
            for k, (d, n) in enumerate(zip(slot.dims, shape)):
                if isinstance(d, int):
                    if d != n:
                        raise InputError(f"input {slot.name!r} dim {k} is {n}, but the module was "
                                         f"captured with a static {d} (mark it dynamic with "
                                         "torch.export.Dim)", node=slot.name)
                elif isinstance(d, sympy.Symbol):
                    info = self.dims.get(d)
                    if d in env and env[d] != n:
                        raise InputError(f"dim {self.dim_spec(d)!r} is {env[d]} in one input and "
                                         f"{n} in {slot.name!r}", node=slot.name)
                    if info is not None and not probing_active() and (
                            n < info.min_value or
                            (info.max_value is not None and n > info.max_value)):
                        hi = "inf" if info.max_value is None else info.max_value
                        raise InputError(f"dim {info.name!r} of {slot.name!r} is {n}, outside its "
                                         f"range [{info.min_value}, {hi}]", node=slot.name)
                    env[d] = n
                else:
                    derived.append((slot, k, d, n))
        for slot, k, d, n in derived:     # a Dim the inputs have only as step * d
            bind_multiple(self.dims, env, slot.name, d, n)
        for slot, k, d, n in derived:
            if not d.free_symbols <= set(env) or int(d.xreplace(env)) != n:
                raise InputError(f"input {slot.name!r} dim {k} is {n}, expected "
                                 f"{self.dim_spec(d)}", node=slot.name)
        return env

    # ---- specialization -------------------------------------------------------------------------
    def weight_tensors(self) -> dict[str, Tensor]:
        """The weights as Constant tensors, built once (hashing a large weight takes time)."""
        if not self._weight_tensors:
            self._weight_tensors = {k: Tensor.const(v) for k, v in self.weights.items()}
        return self._weight_tensors

    def specialize(self, shapes: Sequence[tuple[int, ...] | None]) -> tuple[ImportedModel, dict]:
        """Lower the graph at concrete input shapes.

        Returns:
            ``(imported, info)``: the :class:`ImportedModel` (concrete graph; input specs with the
            named dynamic dims; output specs with named dims) and ``{"op_counts", "seconds"}``.
        Raises:
            InputError: shapes that do not fit the captured interface (see :meth:`bind`).
            UnsupportedOpError: an op or argument lumc cannot lower (all listed at once).
        """
        t0 = time.perf_counter()
        env = self.bind(shapes)
        bindings: dict[str, Any] = dict(self.weight_tensors())
        inputs = {}
        for slot, shape in zip(self.inputs, shapes):
            if slot.dims is None:
                bindings[slot.name] = slot.value
                continue
            n = input_node(slot.name, tuple(shape), slot.dtype)
            inputs[slot.name] = n
            bindings[slot.name] = Tensor(n)
        # weights bind placeholders (torch.export) or get_attr targets (make_fx), by name
        lowering = FxLowering(self.graph, bindings, env, self.weight_tensors())
        flat = lowering.run()
        outputs, out_specs = {}, []
        out_node = next(n for n in reversed(self.graph.nodes) if n.op == "output")
        traced = out_node.args[0]
        for name, i in zip(self.output_names, self.output_index):
            v = flat[i]
            if not isinstance(v, Tensor):
                continue
            outputs[name] = v.node
            meta = traced[i].meta.get("val") if isinstance(traced[i], torch.fx.Node) else None
            dims = tuple(self.dim_spec(_sym_or_int(d)) for d in meta.shape) if meta is not None \
                else v.shape
            out_specs.append(TensorSpec(name, dims, v.dtype))
        graph = Graph(inputs, outputs)
        imported = ImportedModel(graph, self.input_specs(), out_specs, None, list(self.warnings))
        info = {"op_counts": dict(lowering.op_counts), "seconds": time.perf_counter() - t0,
                "flat_outputs": flat}
        return imported, info


def _sym_or_int(d):
    if isinstance(d, torch.SymInt):
        e = d.node.expr
        return int(e) if e.is_number else e
    return int(d)


# ---- capture with torch.export ---------------------------------------------------------------------
def _first_line(e: BaseException) -> str:
    # the first two lines of PyTorch's messages carry the what and the why (constraint violations)
    text = [t.strip(" -") for t in str(e).strip().splitlines() if t.strip()]
    return f"{type(e).__name__}: {' '.join(text[:2])}"


def _dim_names(module, args, kwargs, dynamic_shapes) -> dict[int, dict[int, str]]:
    """``{id(example tensor): {axis: Dim name}}`` from the ``dynamic_shapes`` argument."""
    if dynamic_shapes is None:
        return {}
    try:
        from torch.export.dynamic_shapes import _combine_args
        combined = _combine_args(module, args, kwargs)
    except Exception:
        return {}
    if isinstance(dynamic_shapes, dict):
        pairs = [(combined[k], v) for k, v in dynamic_shapes.items() if k in combined]
    else:
        pairs = list(zip(combined.values(), dynamic_shapes))
    out: dict[int, dict[int, str]] = {}

    def walk(val, spec):
        if isinstance(val, torch.Tensor):
            items = spec.items() if isinstance(spec, dict) else \
                enumerate(spec) if isinstance(spec, (list, tuple)) else ()
            names = {int(a): getattr(d, "__name__") for a, d in items
                     if isinstance(getattr(d, "__name__", None), str)}
            if names:
                out[id(val)] = names
        elif isinstance(val, (list, tuple)) and isinstance(spec, (list, tuple)):
            for v, s in zip(val, spec):
                walk(v, s)
        elif isinstance(val, dict) and isinstance(spec, dict):
            for k, v in val.items():
                if k in spec:
                    walk(v, spec[k])

    for val, spec in pairs:
        walk(val, spec)
    return out


def _key_text(k) -> str:
    """One pytree path key as identifier text: a dict key, an attribute name, an index."""
    v = getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in str(v)).strip("_")


def _output_names(out_spec, n: int) -> list[str]:
    """``logits``, ``last_hidden_state``, ``output_0``... from the output pytree paths."""
    try:
        leaves = pytree.tree_flatten_with_path(pytree.tree_unflatten(list(range(n)), out_spec))[0]
        # each path key on its own, joined by '_': {'b': (y, z)} gives b_0, b_1 (the whole
        # keystr "['b'][0]" sanitized gave b___0)
        raw = ["_".join(_key_text(k) for k in p) for p, _ in leaves]
    except Exception:
        raw = [""] * n
    names, seen = [], set()
    for k, r in enumerate(raw):
        name = r if r and not r[0].isdigit() else (f"output_{r}" if r else f"output_{k}")
        if n == 1 and not r:
            name = "output"
        while name in seen:
            name += "_"
        seen.add(name)
        names.append(name)
    return names


def _device_of(module: torch.nn.Module, leaves) -> torch.device:
    for t in list(leaves) + list(module.parameters()) + list(module.buffers()):
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")


def _strip_meta(graph: torch.fx.Graph) -> None:
    """Keep only the traced values in node metadata (the rest can refer to module classes/code),
    and the name of the op a decomposition node came from (``original_aten``: the ``amax`` of a
    decomposed ``logsumexp`` is not the user's)."""
    for n in graph.nodes:
        val, orig = n.meta.get("val"), n.meta.get("original_aten")
        n.meta.clear()
        if val is not None:
            n.meta["val"] = val
        if orig is not None:
            n.meta["original_aten"] = str(orig)


_BN_STATS = ("running_mean", "running_var", "num_batches_tracked")


def _mutation_error(module, output_specs) -> UnsupportedOpError:
    """What a forward that writes state in place is told: the buffers and inputs it writes, and
    how to compile it; ``module.eval()`` only for batch norm running statistics in training mode
    (the one write that eval() stops)."""
    writes, stats = [], []
    for s in output_specs:
        kind, target = s.kind.name, str(s.target)
        if kind == "USER_OUTPUT":
            continue
        owner_name, _, attr = target.rpartition(".")
        try:
            owner = module.get_submodule(owner_name)
        except (AttributeError, TypeError):
            owner = None
        if kind == "BUFFER_MUTATION" and attr in _BN_STATS and owner is not None and \
                owner.training and isinstance(owner, torch.nn.modules.batchnorm._BatchNorm):
            stats.append(repr(target))
        elif kind == "BUFFER_MUTATION":
            writes.append(f"buffer {target!r}")
        elif kind == "USER_INPUT_MUTATION":
            writes.append(f"its input {target!r}")
        else:
            writes.append(f"{kind.lower().replace('_', ' ')} {target!r}")
    bn = f"batch norm running statistics {', '.join(stats)} in training mode"
    if not writes:
        return UnsupportedOpError(f"the module updates {bn} (call module.eval() before compiling)")
    return UnsupportedOpError(
        f"the module's forward writes to {', '.join(writes)} in place; lumc.compile compiles a "
        "pure function: pass the state in and return its new value, or use torch.compile(m, "
        "backend=\"lumc\"), which writes it back"
        + (f"; it also updates {bn} (module.eval() stops that)" if stats else ""))


def refuse_meta_tensors(names: list[str], tensors) -> None:
    """Refuse tensors on the meta device (a module built with ``device="meta"`` and never loaded):
    they have sizes but no values to compile with or compare against.

    Raises:
        InputError: one line naming the first.
    """
    for name, t in zip(names, tensors):
        if isinstance(t, torch.Tensor) and t.device.type == "meta" and \
                not isinstance(t, torch._subclasses.FakeTensor):
            raise InputError(f"{name} is a tensor on the meta device, which has no values: lumc "
                             "compiles real weights and inputs (materialize the module first, e.g. "
                             "module.to_empty(device='cpu') and load_state_dict)")


def refuse_meta_module(module: torch.nn.Module, args: tuple, kwargs: dict | None) -> None:
    """:func:`refuse_meta_tensors` for a module's parameters and buffers and its example inputs."""
    named = ([(f"parameter {n!r}", t) for n, t in module.named_parameters()]
             + [(f"buffer {n!r}", t) for n, t in module.named_buffers()])
    refuse_meta_tensors([n for n, _ in named], [t for _, t in named])
    leaves = pytree.tree_flatten((tuple(args), dict(kwargs or {})))[0]
    refuse_meta_tensors([f"example input {k}" for k in range(len(leaves))], leaves)


def _unaliased(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The example inputs with each tensor that shares storage with an earlier one cloned:
    ``run_decompositions`` of PyTorch 2.13 fails on inputs that alias (``bmm(x.mT, x)``:
    "'NoneType' object has no attribute 'size' While executing %_guards_fn"), and the compiled
    graph copies its inputs anyway, so their aliasing changes nothing."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    seen: set = set()
    out = []
    for t in leaves:
        if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.numel():
            key = (t.device, t.untyped_storage().data_ptr())
            if key in seen:
                t = t.clone()
            seen.add(key)
        out.append(t)
    return pytree.tree_unflatten(out, spec)


def capture_module(module: torch.nn.Module, args: tuple, kwargs: dict | None = None,
                   dynamic_shapes=None) -> CapturedProgram:
    """Export ``module`` at ``(args, kwargs)`` and keep its core-ATen graph, weights and specs.

    Args:
        module: any ``torch.nn.Module`` that ``torch.export`` can trace (call ``.eval()`` first for
            inference: train-mode dropout and batch norm are reported as unsupported).
        args, kwargs: example inputs.
        dynamic_shapes: as for ``torch.export.export`` (``torch.export.Dim`` names become the dim
            names of the input specs).
    Raises:
        ModelError: ``torch.export`` or the decomposition failed (the first line of its error).
        UnsupportedOpError: the module mutates its buffers or takes script objects.
    """
    kwargs = dict(kwargs or {})
    refuse_meta_module(module, args, kwargs)
    args, kwargs = _unaliased(tuple(args), kwargs)
    try:
        with quiet_tracing():
            ep = torch.export.export(module, tuple(args), kwargs, dynamic_shapes=dynamic_shapes)
            ep = ep.run_decompositions(decomposition_table())
    except Exception as e:  # export raises many unrelated exception types
        raise ModelError(f"torch.export failed: {_first_line(e)}{_export_hint(e)}") from e
    check_supported(ep.graph)      # every unsupported op at once, before copying any weight
    sig = ep.graph_signature
    weights: dict[str, np.ndarray] = {}
    user = []
    for spec in sig.input_specs:
        kind = spec.kind.name
        name = spec.arg.name
        if kind == "USER_INPUT":
            user.append(name)
        elif kind in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
            src = ep.state_dict.get(spec.target)
            if src is None:
                src = ep.constants.get(spec.target)
            if not isinstance(src, torch.Tensor):
                raise UnsupportedOpError(f"{kind.lower()} {spec.target!r} is not a tensor")
            lumc_dtype(src.dtype)
            weights[name] = np.array(to_numpy(src), copy=True)
        else:
            raise UnsupportedOpError(f"graph input of kind {kind} ({spec.target!r})")
    if any(s.kind.name != "USER_OUTPUT" for s in sig.output_specs):
        raise _mutation_error(module, sig.output_specs)
    output_index = [i for i, s in enumerate(sig.output_specs) if s.kind.name == "USER_OUTPUT"]
    leaves = pytree.tree_flatten((tuple(args), kwargs))[0]
    names_by_tensor = _dim_names(module, tuple(args), kwargs, dynamic_shapes)
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    dims: dict[sympy.Symbol, DimInfo] = {}
    inputs = []
    for name, leaf in zip(user, leaves):
        val = placeholders[name].meta.get("val")
        if not isinstance(val, torch.Tensor):
            inputs.append(InputSlot(name, None, None, leaf))
            continue
        dtype = lumc_dtype(val.dtype)
        shape = []
        for k, d in enumerate(val.shape):
            d = _sym_or_int(d)
            shape.append(d)
            if isinstance(d, sympy.Symbol) and d not in dims:
                label = names_by_tensor.get(id(leaf), {}).get(k, f"{name}_dim{k}")
                vr = ep.range_constraints.get(d)
                lo = finite(vr.lower) if vr is not None else None
                hi = finite(vr.upper) if vr is not None else None
                lo = 0 if lo is None else lo
                dims[d] = DimInfo(label, lo, hi)
        inputs.append(InputSlot(name, tuple(shape), dtype))
    multiple_dims(inputs, dims, ep.range_constraints, names_by_tensor, leaves)
    gm = ep.graph_module
    graph = gm.graph
    _strip_meta(graph)
    out_names = _output_names(ep.call_spec.out_spec, len(output_index))
    device = _device_of(module, leaves)
    program = CapturedProgram(gm, weights, inputs, dims, ep.call_spec.in_spec,
                              ep.call_spec.out_spec, output_index, out_names, device,
                              grad_outputs=grad_outputs(gm))
    del ep
    return program



def _as_args(example_inputs) -> tuple:
    """The positional example inputs: a tensor alone, or a tuple or list of them.

    Raises:
        InputError: a dict (its keys were taken as the inputs: a module given the string 'x'),
            a numpy array (its rows were), a string or a single non-tensor value (one line).
    """
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, dict):
        raise InputError("example_inputs is a dict; give the positional inputs as a tuple and "
                         "keyword inputs as example_kwargs={...}")
    if isinstance(example_inputs, (np.ndarray, str, bytes)) or \
            not hasattr(example_inputs, "__iter__"):
        raise InputError(f"example_inputs is of type {type(example_inputs).__name__}; give a "
                         "tensor or a tuple of the module's positional inputs (torch tensors)")
    return tuple(example_inputs)


def int_examples(slots: Sequence, values: Sequence) -> dict[str, np.ndarray]:
    """``{slot name: array}`` of the real integer and bool tensors among ``values`` (the example
    inputs, zipped with the program's input ``slots``): a range compile's ``Frontend.examples``,
    which the inputs it draws at other sizes follow (``lumc.compiler.frontends.models``)."""
    return {s.name: to_numpy(v) for s, v in zip(slots, values)
            if s.dims is not None and isinstance(v, torch.Tensor) and v.numel()
            and not (v.is_floating_point() or v.is_complex())
            and not isinstance(v, torch._subclasses.FakeTensor) and v.device.type != "meta"}


def example_shapes(program: CapturedProgram, args: tuple, kwargs: dict | None) -> list:
    """The flat input shapes (None for non-tensors) of example inputs, in the program's order."""
    leaves = pytree.tree_flatten((tuple(args), dict(kwargs or {})))[0]
    return [tuple(t.shape) if isinstance(t, torch.Tensor) else None for t in leaves]


def import_torch(module: torch.nn.Module, example_inputs, dynamic_shapes=None,
                 example_kwargs: dict | None = None) -> ImportedModel:
    """A PyTorch module to a lumc primitive graph, specialized to the example input shapes.

    Args:
        module: the module (``.eval()`` it first for inference).
        example_inputs: a tensor or a tuple of positional example inputs.
        dynamic_shapes: as for ``torch.export.export``; named ``torch.export.Dim`` s become named
            dims of the returned input specs (``TensorSpec("input_ids", (2, "seq"), i64)``).
        example_kwargs: keyword example inputs.
    Returns:
        :class:`ImportedModel`: ``graph`` is concrete (the example shapes); ``inputs`` carry the
        dynamic dims by name; ``opset`` is None (no ONNX opset). For another shape, use
        :func:`capture_module` and :meth:`CapturedProgram.specialize`, or ``compile_module``.
    Raises:
        ModelError: ``torch.export`` failed.
        UnsupportedOpError: one line listing every ATen op lumc cannot lower (op, nodes, reason).
    """
    args = _as_args(example_inputs)
    program = capture_module(module, args, example_kwargs, dynamic_shapes)
    return program.specialize(example_shapes(program, args, example_kwargs))[0]
